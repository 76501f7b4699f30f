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


def start_forwarder(container: Any, net: Any) -> None:
    """Start the egress forwarder in a running test container, as apply does."""
    from kagura_agent.membrane.egress.session import start_forwarder as start

    start(container.client, container.id, net)
