"""Egress proxy cost: transfers through the run's proxy vs directly; CPU per GB; start time.

    python bench/egress_throughput.py [--repeat 5] [--no-variants]

One upstream container serves a 100 MB file at full speed (python's http.server) and,
on two more ports, a paced body at 100 Mbit/s and 1 Gbit/s (a small sender that keeps
to its rate). The direct client reaches it on a test-only bridge network; the proxied
client has no network, like a run's agent, and goes through the product path: the
in-container forwarder, the socket volume, socat and squid (an ``EgressSession``), with
a CONNECT tunnel (``curl -p``). Transfers alternate between the paths, so load from other
processes hits all of them alike; the best wall time of each is kept.

CPU is read from each container's cpuacct cgroup around every transfer: the client
(curl, and the forwarder on the proxied path), the proxy container (squid, socat) and the
upstream, so nothing on a path is left out. ``cpu_ms_per_gb_*`` is the median per
transfer scaled to 1 GiB. ``start_ms`` is the median wall time of ``EgressSession.start``
(sweep, socket volume, outbound network, proxy container, wait until squid listens).

Unless ``--no-variants``, the same run also measures variants of the proxied path, each
on the same upstream and interleaved with the others (bench only, nothing of it ships):
socat's buffer (``-b``), the forwarder's plain copy loop instead of splice, the proxy
pinned to one core and the client and upstream to the other, and tinyproxy from Debian
in squid's place behind the same socat (an image built once from kagura/egress-proxy,
``kagura-bench/tinyproxy``, needs Debian's package mirror). Prints a table, then:

    RESULT egress_throughput ratio=<proxied/direct throughput, 100 MB unpaced> start_ms=<ms>
        cpu_ms_per_gb_proxied=<ms> cpu_ms_per_gb_direct=<ms> ratio_100mbit=<..>
        ratio_1gbit=<..> cores=<n>
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import io
import os
import statistics
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kagura_agent.membrane.egress import forwarder
from kagura_agent.membrane.egress.policy import load_policy
from kagura_agent.membrane.egress.session import (
    PROXY_SOCKET_DIR,
    PROXY_TMPFS,
    PROXY_USER,
    SOCKET_NAME,
    AgentNetworkConfig,
    EgressRequest,
    EgressSession,
    start_forwarder,
)
from kagura_agent.membrane.egress.squid import render_squid_conf
from kagura_agent.state import StateStore
from testing.egress_images import ensure_egress_images

# KAGURA_BENCH_QUICK=1 (CI, tests/test_benches.py): one iteration at small sizes, to show
# the bench still runs and ends with its RESULT line; its numbers mean nothing then.
QUICK = os.environ.get("KAGURA_BENCH_QUICK") == "1"
REPO = Path(__file__).resolve().parents[1]
SIZE_MB = 4 if QUICK else 100
GIB_MB = 1024
LABELS = {"dev.kagura.test": "egress-bench"}
PRIVATE = ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"]
PORTS = {"full": 8443, "100mbit": 8444, "1gbit": 8445}
RATES = {"100mbit": 100e6 / 8, "1gbit": 1e9 / 8}  # bytes per second
PACED_MB = {"100mbit": 1, "1gbit": 4} if QUICK else {"100mbit": 25, "1gbit": 100}
PLAN = {
    "egress": {
        "mode": "proxy",
        "allow": [
            {"host": "upstream.test", "port": port, "allow_addresses": PRIVATE}
            for port in PORTS.values()
        ],
    }
}
TINYPROXY_IMAGE = "kagura-bench/tinyproxy:scale"
# A paced HTTP sender: each connection gets the body in 256 KiB writes, each write
# waiting for its slot at the port's rate. Stdlib only (runs in kagura/base).
PACED = r"""
import socket, sys, threading, time
rates = dict(zip(map(int, sys.argv[1::2]), map(float, sys.argv[2::2])))
CHUNK = 256 * 1024
body = bytes(CHUNK)
def serve(conn, rate):
    with conn:
        data = b""
        while b"\r\n\r\n" not in data:
            more = conn.recv(4096)
            if not more:
                return
            data += more
        size = int(data.split(b" ", 2)[1].rsplit(b"/", 1)[1]) * 1024 * 1024
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % size)
        start, sent = time.monotonic(), 0
        while sent < size:
            wait = start + sent / rate - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            n = min(CHUNK, size - sent)
            conn.sendall(body[:n])
            sent += n
def listen(port, rate):
    server = socket.create_server(("", port), backlog=16)
    while True:
        conn, _ = server.accept()
        threading.Thread(target=serve, args=(conn, rate), daemon=True).start()
for port, rate in rates.items():
    threading.Thread(target=listen, args=(port, rate), daemon=True).start()
print("paced", flush=True)
threading.Event().wait()
"""
SERVE = (
    f"head -c {SIZE_MB}M /dev/zero > /tmp/blob && echo ready &&"
    f" exec python3 -m http.server {PORTS['full']} --directory /tmp"
)
CURL = "curl -sS -o /dev/null -w '%{time_total} %{size_download}' "


def _cpu_ms(container: Any) -> float:
    """CPU charged to a container's cgroup so far, ms (0 where not visible: Docker in a VM)."""
    for path, scale in (
        (f"/sys/fs/cgroup/cpuacct/docker/{container.id}/cpuacct.usage", 1e-6),
        (f"/sys/fs/cgroup/system.slice/docker-{container.id}.scope/cpu.stat", 1e-3),
    ):
        try:
            text = Path(path).read_text()
        except OSError:
            continue
        if path.endswith("cpu.stat"):
            text = text.split("usage_usec", 1)[1].split()[0]
        return int(text) * scale
    return 0.0


@dataclass
class Path_:
    """One way from a client container to the upstream; its transfers and CPU."""

    name: str
    client: Any
    url_prefix: str  # "http://<ip>" direct, "-p http://upstream.test" proxied
    charged: list[Any]  # containers whose CPU this path costs (upstream included)
    note: str = ""
    seconds: dict[str, list[float]] = field(default_factory=dict)
    cpu: dict[str, list[float]] = field(default_factory=dict)
    split: dict[str, list[list[float]]] = field(default_factory=dict)

    def split_per_gb(self, kind: str) -> str:
        """Median CPU ms/GiB per charged container: client[, proxy], upstream."""
        columns = zip(*self.split[kind], strict=True)
        return "/".join(f"{statistics.median(c):.0f}" for c in columns)

    def transfer(self, kind: str) -> None:
        mb = SIZE_MB if kind == "full" else PACED_MB[kind]
        url = f"{self.url_prefix}:{PORTS[kind]}/" + ("blob" if kind == "full" else str(mb))
        before = [_cpu_ms(c) for c in self.charged]
        result = self.client.exec_run(["sh", "-c", CURL + url])
        after = [_cpu_ms(c) for c in self.charged]
        parts_ms = [
            (a - b) * GIB_MB / (SIZE_MB if kind == "full" else PACED_MB[kind])
            for a, b in zip(after, before, strict=True)
        ]
        self.split.setdefault(kind, []).append(parts_ms)
        before, after = [sum(before)], [sum(after)]
        text = result.output.decode(errors="replace")
        parts = text.split()
        if result.exit_code != 0 or len(parts) != 2 or int(parts[1]) != mb * 1024 * 1024:
            raise SystemExit(f"{self.name}: transfer {kind} failed: {text}")
        self.seconds.setdefault(kind, []).append(float(parts[0]))
        self.cpu.setdefault(kind, []).append((after[0] - before[0]) * GIB_MB / mb)

    def mb_s(self, kind: str) -> float:
        mb = SIZE_MB if kind == "full" else PACED_MB[kind]
        return mb / min(self.seconds[kind])

    def cpu_per_gb(self, kind: str) -> float:
        return statistics.median(self.cpu[kind])


def _wait_log(container: Any, marker: bytes, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while marker not in container.logs():
        if time.monotonic() > deadline:
            raise SystemExit(f"{container.name}: never printed {marker!r}: {container.logs()!r}")
        time.sleep(0.05)


def _entry_script(socat_buffer: int) -> str:
    """The product's entry script with another socat buffer size."""
    text = (REPO / "images/egress-proxy/entry.sh").read_text()
    if "socat -b 262144" not in text:
        raise SystemExit("entry.sh changed: update the bench's variant")
    return text.replace("socat -b 262144", f"socat -b {socat_buffer}")


TINYPROXY_SCRIPT = """set -eu
printf '%s\\n' 'Port 3128' 'Listen 127.0.0.1' 'Allow 127.0.0.1' 'MaxClients 64' \\
  'ConnectPort 8443' 'ConnectPort 8444' 'ConnectPort 8445' 'LogLevel Connect' \\
  'Filter "/tmp/filter"' 'FilterDefaultDeny Yes' 'FilterType fnmatch' > /tmp/tinyproxy.conf
echo 'upstream.test' > /tmp/filter
socat -b 262144 "UNIX-LISTEN:$KAGURA_EGRESS_SOCKET,fork,unlink-early,mode=0666,backlog=256" \\
  TCP4:127.0.0.1:3128,nodelay &
echo 'tinyproxy ready' >&2
exec tinyproxy -d -c /tmp/tinyproxy.conf
"""


def _manual_proxy(
    client: Any, image: str, script: str, network: str, tag: str, created: list[Any]
) -> tuple[Any, AgentNetworkConfig]:
    """A proxy container like the session's (same hardening, socket volume) running ``script``."""
    volume = f"kagura-bench-{tag}-{time.monotonic_ns()}"
    client.volumes.create(
        volume,
        driver="local",
        driver_opts={"type": "tmpfs", "device": "tmpfs", "o": "size=65536,uid=13,gid=13"},
        labels=LABELS,
    )
    created.append(client.volumes.get(volume))
    conf = render_squid_conf(load_policy(PLAN["egress"]), ["127.0.0.1/32"])
    proxy = client.containers.create(
        image,
        entrypoint=["sh", "-c", script],
        environment={
            "KAGURA_SQUID_CONF_B64": base64.b64encode(conf.encode()).decode(),
            "KAGURA_EGRESS_SOCKET": f"{PROXY_SOCKET_DIR}/{SOCKET_NAME}",
        },
        user=PROXY_USER,
        network=network,
        mounts=[docker.types.Mount(PROXY_SOCKET_DIR, volume, type="volume", no_copy=True)],
        read_only=True,
        cap_drop=["ALL"],
        tmpfs=PROXY_TMPFS,
        labels=LABELS,
    )
    created.insert(0, proxy)
    proxy.start()
    _wait_log(proxy, b"ready" if "tinyproxy" in script else b"Accepting HTTP Socket")
    net = AgentNetworkConfig(
        volume=volume,
        proxy_url="http://127.0.0.1:3128",
        socket_path=f"/run/kagura/egress/{SOCKET_NAME}",
        port=3128,
        environment={"http_proxy": "http://127.0.0.1:3128", "https_proxy": "http://127.0.0.1:3128"},
    )
    return proxy, net


# A forwarder with a thread per direction and blocking splice (no event loop): fewer
# syscalls per byte than the asyncio splice (which re-arms epoll at every EAGAIN), but
# two threads per connection count against the agent's pids limit.
THREADED_FORWARDER = r"""
import fcntl, os, socket, sys, threading
CHUNK = 1024 * 1024
def pump(src, dst):
    r, w = os.pipe()
    try:
        try:
            fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, CHUNK)
        except OSError:
            pass
        while True:
            n = os.splice(src.fileno(), w, CHUNK, flags=os.SPLICE_F_MOVE)
            if n == 0:
                break
            while n:
                n -= os.splice(r, dst.fileno(), n, flags=os.SPLICE_F_MOVE)
    except OSError:
        pass
    finally:
        os.close(r); os.close(w)
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass
def relay(client, path):
    up = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        up.connect(path)
        back = threading.Thread(target=pump, args=(up, client), daemon=True)
        back.start()
        pump(client, up)
        back.join()
    except OSError:
        pass
    finally:
        up.close(); client.close()
server = socket.create_server(("127.0.0.1", int(sys.argv[2])), backlog=256)
print("forwarder ready", file=sys.stderr, flush=True)
while True:
    c, _ = server.accept()
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    threading.Thread(target=relay, args=(c, sys.argv[1]), daemon=True).start()
"""


def _proxied_client(
    client: Any,
    base: str,
    net: AgentNetworkConfig,
    created: list[Any],
    copy_loop: bool = False,
    threaded: bool = False,
) -> Any:
    agent = client.containers.run(
        base, ["sleep", "3600"], detach=True, labels=LABELS, **net.docker_kwargs()
    )
    created.insert(0, agent)
    if copy_loop or threaded:
        # The forwarder's portable path: recv_into/sendall through Python, 1 MiB buffer.
        source = Path(forwarder.__file__).read_text()
        source = source.replace('hasattr(os, "splice")', "False")
        if threaded:
            source = THREADED_FORWARDER
        data = source.encode()
        archive = io.BytesIO()
        with tarfile.open(fileobj=archive, mode="w") as tar:
            info = tarfile.TarInfo("fwd.py")
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
        agent.put_archive("/tmp", archive.getvalue())
        run = client.api.exec_create(
            agent.id, ["python3", "/tmp/fwd.py", net.socket_path, str(net.port)]
        )
        client.api.exec_start(run["Id"], detach=True)
        time.sleep(1.5)
    else:
        start_forwarder(client, agent.id, net)
    return agent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=1 if QUICK else 5)
    parser.add_argument("--starts", type=int, default=1 if QUICK else 9)
    parser.add_argument("--no-variants", action="store_true")
    args = parser.parse_args()
    client = docker.from_env(timeout=180)
    refs = ensure_egress_images(client)
    state = Path(tempfile.mkdtemp(prefix="kagura-bench-")) / "state.db"
    store = StateStore(state)
    created: list[Any] = []
    network = client.networks.create(f"kagura-bench-direct-{time.monotonic_ns()}", labels=LABELS)
    sessions: list[EgressSession] = []
    paths: list[Path_] = []
    try:
        starts = []
        for i in range(args.starts):
            began = time.monotonic()
            session = EgressSession.start(
                client, EgressRequest(PLAN, f"bench-start-{i}"), store=store
            )
            starts.append((time.monotonic() - began) * 1000)
            session.close()
        upstream = client.containers.run(
            refs["base"], ["sh", "-c", SERVE], detach=True, labels=LABELS, network=network.name
        )
        created.append(upstream)
        rates = [str(x) for port in ("100mbit", "1gbit") for x in (PORTS[port], RATES[port])]
        client.api.exec_start(
            client.api.exec_create(upstream.id, ["python3", "-c", PACED, *rates])["Id"],
            detach=True,
        )
        direct = client.containers.run(
            refs["base"], ["sleep", "3600"], detach=True, labels=LABELS, network=network.name
        )
        created.append(direct)
        _wait_log(upstream, b"ready")
        time.sleep(1.0)  # http.server and the paced sender bind right after
        # The variants' proxies sit on the bench network: the upstream is upstream.test there.
        network.disconnect(upstream)
        network.connect(upstream, aliases=["upstream.test"])
        upstream.reload()
        ip = upstream.attrs["NetworkSettings"]["Networks"][network.name]["IPAddress"]
        paths.append(Path_("direct", direct, f"http://{ip}", [direct, upstream]))
        egress = EgressSession.start(client, EgressRequest(PLAN, "bench-transfer"), store=store)
        sessions.append(egress)
        client.networks.get(egress.outbound_network).connect(upstream, aliases=["upstream.test"])
        net = egress.agent_network_config()
        agent = _proxied_client(client, refs["base"], net, created)
        via = "-p http://upstream.test"
        paths.append(
            Path_(
                "proxied (product)",
                agent,
                via,
                [agent, egress.proxy, upstream],
                "squid+socat -b 256K",
            )
        )
        variants: list[tuple[str, Callable[[], Path_]]] = []
        if not args.no_variants:
            net_name = network.name

            def socat_variant(size: int) -> Callable[[], Path_]:
                def make() -> Path_:
                    proxy, pnet = _manual_proxy(
                        client, refs["proxy"], _entry_script(size), net_name, f"b{size}", created
                    )
                    agent = _proxied_client(client, refs["base"], pnet, created)
                    return Path_(f"socat -b {size // 1024}K", agent, via, [agent, proxy, upstream])

                return make

            def copy_loop() -> Path_:
                proxy, pnet = _manual_proxy(
                    client, refs["proxy"], _entry_script(262144), net_name, "copy", created
                )
                agent = _proxied_client(client, refs["base"], pnet, created, copy_loop=True)
                return Path_("forwarder copy loop", agent, via, [agent, proxy, upstream])

            def threaded() -> Path_:
                proxy, pnet = _manual_proxy(
                    client, refs["proxy"], _entry_script(262144), net_name, "thr", created
                )
                agent = _proxied_client(client, refs["base"], pnet, created, threaded=True)
                return Path_("forwarder threads+splice", agent, via, [agent, proxy, upstream])

            def pinned() -> Path_:
                proxy, pnet = _manual_proxy(
                    client, refs["proxy"], _entry_script(262144), net_name, "pin", created
                )
                agent = _proxied_client(client, refs["base"], pnet, created)
                return Path_(
                    "pinned", agent, via, [agent, proxy, upstream], "proxy cpu1, rest cpu0"
                )

            def tinyproxy() -> Path_:
                try:
                    client.images.get(TINYPROXY_IMAGE)
                except docker.errors.ImageNotFound:
                    build = (
                        f"FROM {refs['proxy']}\nUSER root\nRUN apt-get update && apt-get install"
                        " -y --no-install-recommends tinyproxy && rm -rf /var/lib/apt/lists/*\n"
                        "USER proxy\n"
                    )
                    client.images.build(fileobj=io.BytesIO(build.encode()), tag=TINYPROXY_IMAGE)
                proxy, pnet = _manual_proxy(
                    client, TINYPROXY_IMAGE, TINYPROXY_SCRIPT, net_name, "tiny", created
                )
                agent = _proxied_client(client, refs["base"], pnet, created)
                return Path_("tinyproxy 1.11", agent, via, [agent, proxy, upstream], "+socat 256K")

            variants = [
                ("socat8k", socat_variant(8192)),
                ("socat1m", socat_variant(1048576)),
                ("copy", copy_loop),
                ("threaded", threaded),
                ("pinned", pinned),
                # Another project's proxy, built from Debian's packages: not ours to check.
                *([] if QUICK else [("tinyproxy", tinyproxy)]),
            ]
            for name, make in variants:
                try:
                    paths.append(make())
                except Exception as exc:  # a variant that cannot run is reported, not fatal
                    print(f"variant {name} skipped: {exc}")
            for p in paths:
                if p.name == "pinned":
                    p.charged[1].update(cpuset_cpus="1")
                    p.client.update(cpuset_cpus="0")
        for round_no in range(args.repeat):
            for p in paths:
                pinned_path = p.name == "pinned"
                if pinned_path:
                    upstream.update(cpuset_cpus="0")
                p.transfer("full")
                if pinned_path:
                    upstream.update(cpuset_cpus="0-1")
            if round_no < 3:  # paced transfers take seconds each: three rounds
                for p in paths[:2]:
                    p.transfer("100mbit")
                    p.transfer("1gbit")
    finally:
        for session in sessions:
            session.close()
        for item in created:
            with contextlib.suppress(Exception):
                item.remove(force=True)
        network.remove()
    d, x = paths[0], paths[1]
    print(
        f"{'path':<26} {'best MB/s':>9} {'ratio':>6} {'cpu ms/GiB':>11} {'client/proxy/upstream':>22}  note"
    )
    for p in paths:
        print(
            f"{p.name:<26} {p.mb_s('full'):>9.0f} {p.mb_s('full') / d.mb_s('full'):>6.2f}"
            f" {p.cpu_per_gb('full'):>11.0f} {p.split_per_gb('full'):>22}  {p.note}"
        )
    for kind in ("100mbit", "1gbit"):
        print(
            f"paced {kind}: direct {d.mb_s(kind):.1f} MB/s cpu {d.cpu_per_gb(kind):.0f} ms/GiB;"
            f" proxied {x.mb_s(kind):.1f} MB/s cpu {x.cpu_per_gb(kind):.0f} ms/GiB"
        )
    start_ms = statistics.median(starts)
    print(f"start   {', '.join(f'{s:.0f}' for s in starts)} ms")
    print(
        f"RESULT egress_throughput ratio={x.mb_s('full') / d.mb_s('full'):.2f}"
        f" start_ms={start_ms:.0f} cpu_ms_per_gb_proxied={x.cpu_per_gb('full'):.0f}"
        f" cpu_ms_per_gb_direct={d.cpu_per_gb('full'):.0f}"
        f" ratio_100mbit={x.mb_s('100mbit') / d.mb_s('100mbit'):.2f}"
        f" ratio_1gbit={x.mb_s('1gbit') / d.mb_s('1gbit'):.2f}"
        f" cpu_ms_per_gb_proxied_1gbit={x.cpu_per_gb('1gbit'):.0f}"
        f" cpu_ms_per_gb_direct_1gbit={d.cpu_per_gb('1gbit'):.0f} cores={os.cpu_count()}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
