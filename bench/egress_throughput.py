"""Egress proxy cost: 100 MB through the run's squid proxy vs directly, and start time.

    python bench/egress_throughput.py

One upstream container serves a 100 MB file. The baseline client reaches it directly on a
test-only bridge network; the proxied client has no network, like a run's agent, and goes
through its proxy (CONNECT tunnel) via the in-container forwarder and the socket volume. Transfers alternate between the two paths and the
best time of each is kept. ``start_ms`` is the median wall time of ``EgressSession.start``
(sweep, socket volume, outbound network, proxy container, wait until squid listens).

Both paths are CPU-bound here (no link is slower than memory copies), so the bench also
reports the CPU time each path spends per transfer, summed over the processes on it
(curl, the upstream server, squid; socat and the in-container forwarder are not counted), from /proc: ``cpu_direct_ms`` and ``cpu_proxied_ms``.
With fewer cores than busy processes on a path, the wall-time ratio cannot beat their
quotient by much; ``cores`` says how many this machine has. Prints one line:

    RESULT egress_throughput ratio=<proxy throughput / direct throughput> start_ms=<ms>
        cpu_direct_ms=<ms> cpu_proxied_ms=<ms> cores=<n>
"""

from __future__ import annotations

import os
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
from testing.egress_images import ensure_egress_images, start_forwarder

SIZE_MB = 100
REPEAT = 15
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
# After curl, the shell prints its own stat line: fields 16-17 (cutime, cstime) are the CPU
# ticks of the curl it has just reaped.
CURL = "curl -sS -o /dev/null -w '%{time_total} %{size_download} ' "
STAT = "; cat /proc/$$/stat"
TICK_MS = 1000 / os.sysconf("SC_CLK_TCK")


def _wait_ready(container: Any) -> None:
    deadline = time.monotonic() + 30
    while b"ready" not in container.logs():
        if time.monotonic() > deadline:
            raise SystemExit("upstream never became ready")
        time.sleep(0.05)
    time.sleep(0.5)  # http.server binds right after the marker


def _transfer(client_container: Any, command: str) -> tuple[float, int]:
    """Seconds of one transfer and the CPU ticks its curl used."""
    result = client_container.exec_run(["sh", "-c", command + STAT])
    seconds, size, stat = result.output.decode().split(" ", 2)
    if result.exit_code != 0 or int(size) != SIZE_MB * 1024 * 1024:
        raise SystemExit(f"transfer failed: {result.output.decode()}")
    fields = stat.rsplit(")", 1)[1].split()  # after "pid (comm)": field 3 is fields[0]
    return float(seconds), int(fields[13]) + int(fields[14])


def _ticks(container: Any) -> int:
    """CPU ticks (user + system) of a container's main process so far, 0 if not visible."""
    container.reload()
    try:
        with open(f"/proc/{container.attrs['State']['Pid']}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:  # Docker in a VM: the process is not on this kernel
        return 0
    return int(fields[11]) + int(fields[12])


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
            start_forwarder(proxied, net)
            # Interleaved, best of each: load from other processes hits both paths alike.
            direct_runs, proxy_runs = [], []
            cpu = {"direct": 0, "proxied": 0}
            for _ in range(REPEAT):
                before = _ticks(upstream)
                seconds, curl_ticks = _transfer(direct, f"{CURL} http://{ip}:8443/blob")
                direct_runs.append(seconds)
                cpu["direct"] += curl_ticks + _ticks(upstream) - before
                before = _ticks(upstream) + _ticks(egress.proxy)
                seconds, curl_ticks = _transfer(
                    proxied, f"{CURL} -p http://upstream.test:8443/blob"
                )
                proxy_runs.append(seconds)
                cpu["proxied"] += curl_ticks + _ticks(upstream) + _ticks(egress.proxy) - before
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
    cpu_direct, cpu_proxied = (cpu[k] * TICK_MS / REPEAT for k in ("direct", "proxied"))
    print(f"start   {', '.join(f'{s:.0f}' for s in starts)} ms")
    print(f"cpu per transfer: direct {cpu_direct:.0f} ms, proxied {cpu_proxied:.0f} ms")
    print(
        f"RESULT egress_throughput ratio={ratio:.2f} start_ms={start_ms:.0f}"
        f" cpu_direct_ms={cpu_direct:.0f} cpu_proxied_ms={cpu_proxied:.0f} cores={os.cpu_count()}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
