"""The images the egress tests and bench use, built once if missing."""

from __future__ import annotations

from typing import Any

from kagura_agent.membrane import build, images


def ensure_egress_images(client: Any) -> dict[str, str]:
    """Refs of kagura/base (agent and upstreams) and kagura/egress-proxy, building them if absent."""
    wanted = {"base": images.image_ref("base"), "egress-proxy": images.image_ref("egress-proxy")}
    missing = [name for name, ref in wanted.items() if images.local_image_digest(ref) is None]
    if missing:
        build.build(client, missing, log=lambda _name, _line: None)
    return {"base": wanted["base"], "proxy": wanted["egress-proxy"]}


def start_forwarder(container: Any, net: Any, timeout: float = 10.0) -> None:
    """Run the in-container egress forwarder in ``container`` (an image without
    kagura-agent, such as kagura/base) and wait until 127.0.0.1:PORT accepts."""
    import time

    from kagura_agent.brain import egress_forwarder

    container.exec_run(egress_forwarder.command(net.socket_path, net.port), detach=True)
    # Listening on 127.0.0.1:PORT, read from /proc (a probe connection would reach squid).
    wanted = f"0100007F:{net.port:04X} 00000000:0000 0A"
    deadline = time.monotonic() + timeout
    while wanted not in container.exec_run(["cat", "/proc/net/tcp"]).output.decode():
        if time.monotonic() > deadline:
            raise RuntimeError("the egress forwarder never listened")
        time.sleep(0.05)
