"""Egress proxy cost: 100 MB through the run's squid proxy vs directly, and start time.

    python bench/egress_throughput.py

One upstream container serves a 100 MB file. The baseline client reaches it directly on a
test-only bridge network; the proxied client sits on a run's internal network and goes
through its proxy (CONNECT tunnel). Transfers alternate between the two paths and the best time of each is kept.
``start_ms`` is the median wall time of ``EgressSession.start`` (sweep, two networks,
proxy container, wait until squid listens). Prints one line:

    RESULT egress_throughput ratio=<proxy throughput / direct throughput> start_ms=<ms>
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import docker

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kagura_agent.membrane.egress import EgressSession
from kagura_agent.state import StateStore
from testing.egress_images import ensure_egress_images

SIZE_MB = 100
REPEAT = 7
LABELS = {"dev.kagura.test": "egress-bench"}
PRIVATE = ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"]
PLAN = {
    "egress": {
        "mode": "proxy",
        "allow": [{"host": "upstream.test", "port": 8443, "allow_addresses": PRIVATE}],
    }
}
SERVE = f"head -c {SIZE_MB}M /dev/zero > /tmp/blob && echo ready && exec python3 -m http.server"
SERVE += " 8443 --directory /tmp"
CURL = "curl -sS -o /dev/null -w '%{time_total} %{size_download}' "


def _wait_ready(container: Any) -> None:
    deadline = time.monotonic() + 30
    while b"ready" not in container.logs():
        if time.monotonic() > deadline:
            raise SystemExit("upstream never became ready")
        time.sleep(0.05)
    time.sleep(0.5)  # http.server binds right after the marker


def _seconds(client_container: Any, command: str) -> float:
    result = client_container.exec_run(["sh", "-c", command])
    seconds, size = result.output.decode().split()
    if result.exit_code != 0 or int(size) != SIZE_MB * 1024 * 1024:
        raise SystemExit(f"transfer failed: {result.output.decode()}")
    return float(seconds)


def main() -> int:
    client = docker.from_env(timeout=120)
    refs = ensure_egress_images(client)
    state = Path(tempfile.mkdtemp(prefix="kagura-bench-")) / "state.db"
    store = StateStore(state)
    created: list[Any] = []
    network = client.networks.create(f"kagura-bench-direct-{time.monotonic_ns()}", labels=LABELS)
    try:
        starts = []
        for i in range(REPEAT):
            began = time.monotonic()
            session = EgressSession.start(client, PLAN, f"bench-start-{i}", store=store)
            starts.append((time.monotonic() - began) * 1000)
            session.close()
        upstream = client.containers.run(
            refs["base"], ["sh", "-c", SERVE], detach=True, labels=LABELS, network=network.name
        )
        created.append(upstream)
        direct = client.containers.run(
            refs["base"], ["sleep", "600"], detach=True, labels=LABELS, network=network.name
        )
        created.append(direct)
        _wait_ready(upstream)
        upstream.reload()
        ip = upstream.attrs["NetworkSettings"]["Networks"][network.name]["IPAddress"]
        with EgressSession.start(client, PLAN, "bench-transfer", store=store) as egress:
            client.networks.get(egress.outbound_network).connect(
                upstream, aliases=["upstream.test"]
            )
            net = egress.agent_network_config()
            proxied = client.containers.run(
                refs["base"], ["sleep", "600"], detach=True, labels=LABELS, **net.docker_kwargs()
            )
            created.append(proxied)
            # Interleaved, best of each: load from other processes hits both paths alike.
            direct_runs, proxy_runs = [], []
            for _ in range(REPEAT):
                direct_runs.append(_seconds(direct, f"{CURL} http://{ip}:8443/blob"))
                proxy_runs.append(_seconds(proxied, f"{CURL} -p http://upstream.test:8443/blob"))
            direct_s, proxy_s = min(direct_runs), min(proxy_runs)
            proxied.remove(force=True)
            created.remove(proxied)
    finally:
        for container in created:
            container.remove(force=True)
        network.remove()
    ratio = direct_s / proxy_s
    start_ms = statistics.median(starts)
    mb = SIZE_MB
    print(f"direct  {mb} MB in {direct_s:.3f}s ({mb / direct_s:.0f} MB/s)")
    print(f"proxied {mb} MB in {proxy_s:.3f}s ({mb / proxy_s:.0f} MB/s)")
    print(f"start   {', '.join(f'{s:.0f}' for s in starts)} ms")
    print(f"RESULT egress_throughput ratio={ratio:.2f} start_ms={start_ms:.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
