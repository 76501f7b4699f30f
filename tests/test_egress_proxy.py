"""The per-run egress proxy against real containers: upstreams on the run's outbound network
under aliases such as ``allowed.test``; the agent is a hardened kagura/base container with
no network at all, reaching the proxy through the socket volume and the in-container
forwarder. Nothing is ever sent beyond these containers and the test's own listeners."""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from kagura_agent.errors import RefusedError, SetupError
from kagura_agent.membrane.egress import audit
from kagura_agent.membrane.egress.owner import LABEL_COMPONENT
from kagura_agent.membrane.egress.session import EgressRequest, EgressSession
from kagura_agent.state import StateStore, open_store
from testing.egress_images import ensure_egress_images, start_forwarder
from testing.fake_anthropic import SCRIPT as FAKE_ANTHROPIC_SCRIPT

pytestmark = pytest.mark.usefixtures("docker_client")

TEST_LABEL = {"dev.kagura.test": "egress"}
PRIVATE = ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"]
ALIASES = [
    "allowed.test",
    "private.test",
    "plain.test",
    "unlisted.test",
    "a.wild.test",
    "wild.test",
    "a.wild.test.evil.test",
    "evilwild.test",
]
# One upstream serving HTTP on three ports; it prints "ready" once all are bound.
UPSTREAM = """
import http.server, threading
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        # /big: 8 MB of a repeating, position-dependent pattern (a dropped or reordered
        # segment changes the digest).
        body = bytes(range(251)) * 33421 if self.path == "/big" else b"hello from upstream"
        self.send_response(200); self.send_header("Content-Length", str(len(body)))
        self.end_headers(); self.wfile.write(body)
    def log_message(self, *args): pass
servers = [http.server.ThreadingHTTPServer(("", p), H) for p in (8443, 8080, 8081)]
for s in servers: threading.Thread(target=s.serve_forever, daemon=True).start()
print("ready", flush=True)
threading.Event().wait()
"""
PLAN_EGRESS: dict[str, Any] = {
    "mode": "proxy",
    "allow": [
        {"host": "allowed.test", "port": 8443, "allow_addresses": PRIVATE, "policy": "t"},
        {"host": "plain.test", "port": 8080, "scheme": "http", "allow_addresses": PRIVATE},
        {"host": "*.wild.test", "port": 8443, "allow_addresses": PRIVATE},
        {"host": "private.test", "port": 8443},
    ],
    # What the planner writes: the union of every entry's ranges, for reviewers. It must
    # never act as an exception for another entry (private.test stays refused).
    "allow_addresses": PRIVATE,
}
# One address in each range a listed name may never resolve to, written independently of
# policy.FORBIDDEN_RANGES (so dropping a range there fails a test), with the documented
# cloud metadata addresses.
MUST_REFUSE = {
    "this-net": "0.1.2.3",
    "ten": "10.1.2.3",
    "cgnat": "100.64.0.1",
    "alibaba-metadata": "100.100.100.200",
    "loopback": "127.0.0.2",
    "link-local": "169.254.1.1",
    "aws-metadata": "169.254.169.254",
    "rfc1918-172": "172.16.0.1",
    "oracle-metadata": "192.0.0.192",
    "rfc1918-192": "192.168.1.1",
    "benchmark": "198.18.0.1",
    "multicast": "224.0.0.1",
    "reserved": "240.0.0.1",
    "v6-loopback": "::1",
    "v6-mapped": "::ffff:a00:1",
    "nat64": "64:ff9b::a00:1",
    "ula": "fd12::1",
    "aws-v6-metadata": "fd00:ec2::254",
    "v6-link-local": "fe80::1",
    "v6-multicast": "ff02::1",
}


@pytest.fixture(scope="session")
def egress_images(docker_client: Any) -> dict[str, str]:
    return ensure_egress_images(docker_client)


def _wait_log(container: Any, marker: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while marker not in container.logs().decode():
        assert time.monotonic() < deadline, f"{container.name} never printed {marker!r}"
        time.sleep(0.05)


@dataclass
class World:
    client: Any
    session: EgressSession
    upstream: Any
    agent: Any
    events: list[dict[str, Any]]

    def sh(self, command: str) -> tuple[int, str]:
        result = self.agent.exec_run(["sh", "-c", command])
        return result.exit_code, result.output.decode(errors="replace")

    def through_proxy(self, url: str, *, tunnel: bool = True) -> tuple[int, str]:
        """curl via the proxy; the last output line is the HTTP status curl saw."""
        flags = "-p " if tunnel else ""
        return self.sh(
            f"curl -sS {flags}--connect-timeout 3 --max-time 10 -w '\\n%{{http_code}}' {url} 2>&1"
        )

    def upstream_ip(self) -> str:
        self.upstream.reload()
        return str(
            self.upstream.attrs["NetworkSettings"]["Networks"][self.session.outbound_network][
                "IPAddress"
            ]
        )


def _leftovers(client: Any, run_id: str) -> list[str]:
    label = f"dev.kagura.run={run_id}"
    found = [c.name for c in client.containers.list(all=True, filters={"label": label})]
    volumes = client.api.volumes(filters={"label": label}).get("Volumes") or []
    found += [v["Name"] for v in volumes]
    return found + [n.name for n in client.networks.list(filters={"label": label})]


@contextlib.contextmanager
def _world(
    client: Any, egress_images: dict[str, str], store: StateStore | None = None
) -> Iterator[World]:
    """A run's proxy with an upstream behind it and an agent container in front."""
    run_id = f"test-{time.monotonic_ns()}"
    events: list[dict[str, Any]] = []
    session = EgressSession.start(
        client, EgressRequest({"egress": PLAN_EGRESS}, run_id), events.append, store=store
    )
    created: list[Any] = []
    try:
        upstream = client.containers.create(
            egress_images["base"],
            ["python3", "-c", UPSTREAM],
            labels=TEST_LABEL,
            network=session.outbound_network,
            networking_config={
                session.outbound_network: client.api.create_endpoint_config(aliases=ALIASES)
            },
        )
        created.append(upstream)
        net = session.agent_network_config()
        agent = client.containers.create(
            egress_images["base"],
            ["sleep", "3600"],
            labels=TEST_LABEL,
            user="1000:1000",
            cap_drop=["ALL"],
            security_opt=["no-new-privileges:true"],
            read_only=True,
            tmpfs={"/tmp": "rw,size=16m"},
            **net.docker_kwargs(),
        )
        created.append(agent)
        upstream.start()
        agent.start()
        start_forwarder(agent, net)
        _wait_log(upstream, "ready")
        yield World(client, session, upstream, agent, events)
    finally:
        for container in created:
            container.remove(force=True)
        session.close()
        session.close()  # a test may have closed it while the agent still mounted the socket
    assert _leftovers(client, run_id) == []


@pytest.fixture()
def world(docker_client: Any, egress_images: dict[str, str], state_dir: Any) -> Iterator[World]:
    """A world of the test's own: for tests that close, kill or count what it saw."""
    with _world(docker_client, egress_images) as made:
        yield made


@pytest.fixture(scope="module")
def probe_world(
    docker_client: Any,
    egress_images: dict[str, str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[World]:
    """One world for the tests that only probe it (they close, kill and count nothing):
    started once, on one pytest-xdist worker (tests/resources.py GROUPS)."""
    store = StateStore(tmp_path_factory.mktemp("probe-state") / "state.db")
    try:
        with _world(docker_client, egress_images, store) as made:
            yield made
    finally:
        store.close()


def _status(output: str) -> str:
    return output.strip().splitlines()[-1]


def test_allowed_host_and_port_passes_and_is_audited(world: World) -> None:
    code, out = world.through_proxy("http://allowed.test:8443/")
    assert code == 0, out
    assert "hello from upstream" in out
    assert _status(out) == "200"
    world.session.close()
    stored = audit.load_events(open_store(), world.session.run_id)
    assert [(e.decision, e.host, e.port, e.entry) for e in stored] == [
        ("allow", "allowed.test", 8443, "allowed.test:8443/https")
    ]
    assert stored[0].method == "CONNECT" and stored[0].bytes_out > 0
    kinds = [e["type"] for e in world.events]
    assert kinds == ["egress.decision", "egress.summary"]


HOLD_TUNNEL = """
import os, socket, sys, time, urllib.parse
proxy = urllib.parse.urlsplit(os.environ.get("https_proxy") or os.environ["HTTPS_PROXY"])
s = socket.create_connection((proxy.hostname, proxy.port))
s.sendall(b"CONNECT allowed.test:8443 HTTP/1.1\\r\\nHost: allowed.test:8443\\r\\n\\r\\n")
print(s.recv(200).split(b"\\r\\n")[0].decode(), flush=True)
s.sendall(b"GET / HTTP/1.1\\r\\nHost: allowed.test\\r\\n\\r\\n")
s.recv(4096)
time.sleep(600)
"""


def test_a_tunnel_still_open_when_the_run_ends_is_logged(world: World) -> None:
    """The agent holds a CONNECT open to the end of the run: the decision and what went
    through are in the run's egress log all the same."""
    exec_id = world.client.api.exec_create(
        world.agent.id, ["python3", "-c", HOLD_TUNNEL], user="1000:1000"
    )["Id"]
    stream = world.client.api.exec_start(exec_id, stream=True)
    first = next(iter(stream)).decode()
    assert "200" in first, first
    world.session.close()
    stored = audit.load_events(open_store(), world.session.run_id)
    assert [(e.decision, e.host, e.port, e.method) for e in stored] == [
        ("allow", "allowed.test", 8443, "CONNECT")
    ]
    assert stored[0].bytes_out > 0


def test_denied_host_gets_a_clear_denial(world: World) -> None:
    code, out = world.through_proxy("http://unlisted.test:8443/")
    assert code != 0 and "CONNECT tunnel failed, response 403" in out
    world.session.close()
    summary = world.events[-1]
    assert summary["type"] == "egress.summary" and summary["denied"] == 1
    assert summary["denials"][0]["host"] == "unlisted.test"
    assert summary["denials"][0]["reason"] == "host-not-listed"


def test_allowed_host_on_unlisted_port_is_denied(world: World) -> None:
    code, out = world.through_proxy("http://allowed.test:8081/")
    assert code != 0 and "response 403" in out
    world.session.close()
    assert world.events[0]["reason"] == "port-not-listed"


def test_ip_literal_is_denied(world: World) -> None:
    code, out = world.through_proxy(f"http://{world.upstream_ip()}:8443/")
    assert code != 0 and "response 403" in out
    world.session.close()
    assert world.events[0]["reason"] == "ip-literal"


def test_listed_name_resolving_to_a_private_address_is_denied(world: World) -> None:
    code, out = world.through_proxy("http://private.test:8443/")
    assert code != 0 and "response 403" in out
    # Same upstream, same address: allowed.test passes only because its entry allows it.
    code, out = world.through_proxy("http://allowed.test:8443/")
    assert code == 0 and _status(out) == "200", out
    world.session.close()
    denied = [e for e in world.events if e.get("decision") == "deny"]
    assert [(e["host"], e["reason"], e["entry"]) for e in denied] == [
        ("private.test", "private-address", "private.test:8443/https")
    ]


def test_plain_http_only_where_an_entry_says_so(world: World) -> None:
    code, out = world.through_proxy("http://allowed.test:8443/", tunnel=False)
    assert _status(out) == "403", out
    code, out = world.through_proxy("http://plain.test:8080/", tunnel=False)
    assert code == 0 and _status(out) == "200", out
    # An http entry does not open a CONNECT tunnel either.
    code, out = world.through_proxy("http://plain.test:8080/")
    assert "response 403" in out
    world.session.close()
    reasons = [e["reason"] for e in world.events if e["type"] == "egress.decision"]
    assert reasons == ["scheme-not-allowed", "allowed", "scheme-not-allowed"]


def test_wildcard_allows_subdomains_not_the_domain_itself(probe_world: World) -> None:
    code, out = probe_world.through_proxy("http://a.wild.test:8443/")
    assert code == 0 and _status(out) == "200", out
    code, out = probe_world.through_proxy("http://wild.test:8443/")
    assert "response 403" in out


def test_direct_tcp_from_the_agent_fails(probe_world: World) -> None:
    ip = probe_world.upstream_ip()
    code, out = probe_world.sh(f"curl -sS --noproxy '*' --connect-timeout 3 http://{ip}:8443/ 2>&1")
    assert code != 0, out
    probe = (
        f"import socket; s = socket.socket(); s.settimeout(3); print(s.connect_ex(('{ip}', 8443)))"
    )
    code, out = probe_world.sh(f'python3 -c "{probe}"')
    assert out.strip() != "0", out


def test_dns_lookup_from_the_agent_fails(probe_world: World) -> None:
    for name in ("allowed.test", "unlisted.test"):
        code, out = probe_world.sh(f"getent hosts {name}")
        assert code != 0 and out == "", out
    code, out = probe_world.sh(
        "python3 -c \"import socket; socket.getaddrinfo('allowed.test', 443)\" 2>&1"
    )
    assert code != 0 and "gaierror" in out


def test_killing_the_proxy_leaves_no_route_out(world: World) -> None:
    code, out = world.through_proxy("http://allowed.test:8443/")
    assert code == 0, out
    world.session.proxy.kill()
    code, out = world.through_proxy("http://allowed.test:8443/")
    assert code != 0, out
    ip = world.upstream_ip()
    code, out = world.sh(f"curl -sS --noproxy '*' --connect-timeout 3 http://{ip}:8443/ 2>&1")
    assert code != 0, out


def test_unbuilt_proxy_image_refuses_to_start_and_leaves_nothing(
    docker_client: Any, state_dir: Any
) -> None:
    run_id = f"test-noimage-{time.monotonic_ns()}"
    with pytest.raises(SetupError, match="not built"):
        EgressSession.start(
            docker_client,
            EgressRequest({"egress": PLAN_EGRESS}, run_id, image="kagura/egress-proxy:none"),
        )
    assert _leftovers(docker_client, run_id) == []


def test_unrenderable_allowlist_refuses_before_any_docker_object(
    docker_client: Any, state_dir: Any
) -> None:
    run_id = f"test-bad-{time.monotonic_ns()}"
    plan = {"egress": {"mode": "proxy", "allow": [{"host": "10.0.0.1"}]}}
    with pytest.raises(RefusedError, match="IP literal"):
        EgressSession.start(docker_client, EgressRequest(plan, run_id))
    assert _leftovers(docker_client, run_id) == []


def test_proxy_that_exits_at_start_is_a_setup_error(
    docker_client: Any, egress_images: dict[str, str], state_dir: Any
) -> None:
    # kagura/base has no squid entry point: the "proxy" exits at once.
    run_id = f"test-exit-{time.monotonic_ns()}"
    with pytest.raises(SetupError, match=r"exited|not ready"):
        EgressSession.start(
            docker_client,
            EgressRequest(
                {"egress": PLAN_EGRESS}, run_id, image=egress_images["base"], ready_timeout=5
            ),
        )
    assert _leftovers(docker_client, run_id) == []


def test_tunnel_carries_large_bodies_intact_through_the_socket(probe_world: World) -> None:
    expected = hashlib.sha256(bytes(range(251)) * 33421).hexdigest()
    code, out = probe_world.sh(
        "curl -sS -p --max-time 20 http://allowed.test:8443/big | sha256sum | cut -d' ' -f1"
    )
    assert (code, out.strip()) == (0, expected)
    # Several at once: each connection is its own pair of relays.
    code, out = probe_world.sh(
        "for i in 1 2 3 4; do (curl -sS -p --max-time 20 http://allowed.test:8443/big"
        " | sha256sum | cut -d' ' -f1) & done; wait"
    )
    assert (code, out.split()) == (0, [expected] * 4)


def test_components_are_labelled(probe_world: World) -> None:
    label = f"dev.kagura.run={probe_world.session.run_id}"
    nets = probe_world.client.networks.list(filters={"label": label})
    assert sorted(n.attrs["Labels"][LABEL_COMPONENT] for n in nets) == ["egress-outbound"]
    volumes = probe_world.client.api.volumes(filters={"label": label})["Volumes"]
    assert [v["Labels"][LABEL_COMPONENT] for v in volumes] == ["egress-socket"]
    probe_world.agent.reload()
    assert probe_world.agent.attrs["HostConfig"]["NetworkMode"] == "none"
    (mount,) = probe_world.agent.attrs["Mounts"]
    assert (mount["Name"], mount["RW"]) == (probe_world.session.socket_volume, False)


def _raw_reasons(world: World) -> list[tuple[str, str]]:
    """(host, squid's own kagura_reason note) of every request, straight from the proxy log:
    the audit's classification cannot hide which http_access rule denied a request."""
    text = world.session.proxy.logs(stdout=True, stderr=False).decode(errors="replace")
    found = [audit.parse_line(line) for line in text.splitlines()]
    return [(raw["host"], raw["reason"]) for raw in found if raw is not None]


def test_ip_literal_is_denied_by_its_own_rule_not_the_final_deny_all(world: World) -> None:
    ip = world.upstream_ip()
    for url in (f"http://{ip}:8443/", f"http://{ip}.:8443/"):
        code, out = world.through_proxy(url)
        assert code != 0 and "response 403" in out, out
    code, out = world.through_proxy(f"http://{ip}:8080/", tunnel=False)
    assert _status(out) == "403", out
    deadline = time.monotonic() + 5
    while len(_raw_reasons(world)) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [reason for _host, reason in _raw_reasons(world)] == ["ip-literal"] * 3


def test_suffix_and_prefix_attacks_on_a_wildcard_are_denied(world: World) -> None:
    # Both names resolve (the upstream answers to them), so only the name rule can refuse.
    for name in ("a.wild.test.evil.test", "evilwild.test"):
        code, out = world.through_proxy(f"http://{name}:8443/")
        assert code != 0 and "response 403" in out, out
    code, out = world.through_proxy("http://a.wild.test:8443/")
    assert code == 0 and _status(out) == "200", out
    world.session.close()
    decisions = [(e["host"], e["decision"], e["reason"]) for e in world.events[:-1]]
    assert decisions == [
        ("a.wild.test.evil.test", "deny", "host-not-listed"),
        ("evilwild.test", "deny", "host-not-listed"),
        ("a.wild.test", "allow", "allowed"),
    ]


def test_the_proxy_container_is_hardened_itself(probe_world: World) -> None:
    probe_world.session.proxy.reload()
    attrs = probe_world.session.proxy.attrs
    host = attrs["HostConfig"]
    assert host["CapDrop"] == ["ALL"] and not host.get("CapAdd")
    assert host["ReadonlyRootfs"] is True
    assert host["SecurityOpt"] == ["no-new-privileges:true"]
    assert host["Privileged"] is False
    assert 0 < host["PidsLimit"] <= 64
    assert 0 < host["Memory"] <= 512 * 1024 * 1024
    assert attrs["Config"]["User"] == "13:13"
    assert host["NetworkMode"] != "host" and not host.get("Binds")
    # And from inside: no capability in any set, and the root is really read-only.
    result = probe_world.session.proxy.exec_run(
        [
            "sh",
            "-c",
            "grep -E '^Cap(Inh|Prm|Eff|Bnd|Amb)' /proc/self/status; grep NoNewPrivs /proc/self/status; touch /etc/kagura-probe /usr/kagura-probe; echo rc=$?",
        ]
    )
    out = result.output.decode()
    assert all(
        line.split()[1] == "0000000000000000" for line in out.splitlines() if line.startswith("Cap")
    ), out
    assert "NoNewPrivs:\t1" in out and "rc=1" in out and "Read-only file system" in out, out


@pytest.fixture()
def forbidden_world(
    docker_client: Any, egress_images: dict[str, str], state_dir: Any
) -> Iterator[World]:
    """A proxy whose allowlist lists names that resolve (in the proxy's /etc/hosts) to one
    address in every forbidden range; nothing listens there and nothing may be tried."""
    run_id = f"test-forbidden-{time.monotonic_ns()}"
    events: list[dict[str, Any]] = []
    plan = {
        "egress": {
            "mode": "proxy",
            "allow": [{"host": "*.forbidden.test", "port": 8443}],
            # The planner's reviewer summary must not open anything either.
            "allow_addresses": [],
        }
    }
    hosts = {f"{name}.forbidden.test": address for name, address in MUST_REFUSE.items()}
    session = EgressSession.start(
        docker_client, EgressRequest(plan, run_id, extra_hosts=hosts), events.append
    )
    agent = None
    try:
        agent = _agent_behind(docker_client, egress_images["base"], session)
        yield World(docker_client, session, agent, agent, events)
    finally:
        if agent is not None:
            agent.remove(force=True)
        session.close()
        session.close()


def test_every_forbidden_range_and_metadata_address_is_refused(forbidden_world: World) -> None:
    names = [f"{name}.forbidden.test" for name in MUST_REFUSE]
    script = " ".join(
        f"curl -s -p -o /dev/null --connect-timeout 3 --max-time 5 -w '{n} %{{http_code}}\\n' http://{n}:8443/;"
        for n in names
    )
    _code, out = forbidden_world.sh(script)
    assert sorted(out.split()) == sorted([*names, *["000"] * len(names)]), out
    deadline = time.monotonic() + 5
    while len(_raw_reasons(forbidden_world)) < len(names) and time.monotonic() < deadline:
        time.sleep(0.05)
    got = dict(_raw_reasons(forbidden_world))
    v6 = {f"{name}.forbidden.test" for name, address in MUST_REFUSE.items() if ":" in address}
    v6 -= {"v6-mapped.forbidden.test"}  # squid reads ::ffff:a.b.c.d as IPv4
    assert {n: got.get(n) for n in names if n not in v6} == {
        n: "private-address" for n in names if n not in v6
    }
    # A proxy with IPv6 must refuse the IPv6 ranges by rule. Docker gives this one no IPv6
    # (squid warns "non-functional IPv6 loopback" and drops the v6 ACL ranges), so there
    # the requests above got no connection at all (000) and can reach nothing.
    disabled = forbidden_world.session.proxy.exec_run(
        ["cat", "/proc/sys/net/ipv6/conf/all/disable_ipv6"]
    )
    if disabled.output.decode().strip() != "1":
        assert {n: got.get(n) for n in v6} == {n: "private-address" for n in v6}


def _interface_address(name: str) -> str:
    """The IPv4 address of a host interface (SIOCGIFADDR), e.g. docker0's 172.17.0.1."""
    import fcntl
    import socket as sockets
    import struct

    with sockets.socket(sockets.AF_INET, sockets.SOCK_DGRAM) as sock:
        packed = fcntl.ioctl(sock.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))
    return sockets.inet_ntoa(packed[20:24])


def test_no_route_but_the_proxy_host_listeners_are_unreachable(probe_world: World) -> None:
    """Listeners the host binds on 0.0.0.0, on the run network's gateway and on docker0:
    a plain container reaches them (the control); the agent reaches none of them."""
    import socket as sockets

    outbound = probe_world.client.networks.get(probe_world.session.outbound_network)
    gateway = outbound.attrs["IPAM"]["Config"][0]["Gateway"]
    docker0 = _interface_address("docker0")
    listeners = []
    targets: list[tuple[str, int]] = []
    try:
        for bind, probe_at in (("0.0.0.0", (gateway, docker0)), (gateway, (gateway,))):
            listener = sockets.create_server((bind, 0), backlog=64)
            listeners.append(listener)
            targets += [(ip, listener.getsockname()[1]) for ip in probe_at]
        listener = sockets.create_server((docker0, 0), backlog=64)
        listeners.append(listener)
        targets.append((docker0, listener.getsockname()[1]))
        probe = (
            "import socket, sys\n"
            "for ip, port in ((a, int(p)) for a, p in (t.split(':') for t in sys.argv[1:])):\n"
            "    s = socket.socket(); s.settimeout(2)\n"
            "    print(ip, port, s.connect_ex((ip, port)))\n"
        )
        argv = ["python3", "-c", probe, *(f"{ip}:{port}" for ip, port in targets)]
        control = probe_world.upstream.exec_run(argv).output.decode().split("\n")
        assert all(line.endswith(" 0") for line in control if line), control
        result = probe_world.agent.exec_run(argv).output.decode().split("\n")
        codes = [line.rsplit(" ", 1)[1] for line in result if line]
        assert len(codes) == len(targets) and "0" not in codes, result
    finally:
        for listener in listeners:
            listener.close()
    # Loopback is the agent's only interface; the proxy path still works.
    assert probe_world.sh("ls /sys/class/net")[1].split() == ["lo"]
    code, out = probe_world.through_proxy("http://allowed.test:8443/")
    assert code == 0 and _status(out) == "200", out


CANARY_KEY = "sk-ant-canary-" + "Q7" * 20


def test_the_anthropic_key_is_injected_at_the_proxy_and_never_in_the_agent(
    docker_client: Any, egress_images: dict[str, str], state_dir: Any
) -> None:
    from kagura_agent.membrane.egress.modelport import Injection

    run_id = f"test-inject-{time.monotonic_ns()}"
    plan = {
        "egress": {"mode": "proxy", "allow": [{"host": "allowed.test", "port": 8443}]},
        "budget": {"turns": 10},
    }
    injection = Injection(host="api.anthropic.test", port=8080, tls=False)
    # squid resolves and probes its peer when it starts: the fake API must be reachable
    # by then. It lives on a test network the proxy joins before squid starts.
    side = docker_client.networks.create(f"kagura-test-inject-{run_id}", labels=TEST_LABEL)
    created: list[Any] = []
    session = None
    try:
        upstream = docker_client.containers.run(
            egress_images["base"],
            ["python3", "-c", FAKE_ANTHROPIC_SCRIPT],
            detach=True,
            labels=TEST_LABEL,
            network=side.name,
        )
        created.append(upstream)
        upstream.reload()
        address = upstream.attrs["NetworkSettings"]["Networks"][side.name]["IPAddress"]
        session = EgressSession.start(
            docker_client,
            EgressRequest(
                plan,
                run_id,
                injection=injection,
                injection_secret=CANARY_KEY,
                extra_hosts={"api.anthropic.test": address},
                extra_networks=(side.name,),
            ),
        )
        net = session.agent_network_config()
        agent = docker_client.containers.create(
            egress_images["base"],
            ["sleep", "600"],
            labels=TEST_LABEL,
            user="1000:1000",
            cap_drop=["ALL"],
            read_only=True,
            tmpfs={"/tmp": "rw,size=16m"},
            **net.docker_kwargs(),
        )
        created.append(agent)
        agent.start()
        start_forwarder(agent, net)
        _wait_log(upstream, "ready")
        # The agent calls the API the way the Claude CLI does: ANTHROPIC_BASE_URL, and a
        # key of its own choosing, which the proxy drops.
        call = (
            'curl -sS --max-time 10 -X POST -H "x-api-key: forged-by-agent"'
            ' -H "content-type: application/json" -d "{}"'
            ' "$ANTHROPIC_BASE_URL/v1/messages"'
        )
        result = agent.exec_run(["sh", "-c", call])
        assert result.exit_code == 0 and b'"type": "message"' in result.output, (
            upstream.logs().decode() + session.proxy.logs().decode()[-3000:]
        )
        deadline = time.monotonic() + 5
        while "KEYS" not in upstream.logs().decode():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert f'KEYS ["{CANARY_KEY}"] /v1/messages' in upstream.logs().decode()
        # The key goes with the Messages API's two calls only: no other path, no other
        # method (a batch is many calls in one; files and batches are the organisation's).
        for method, path, passes in (
            ("POST", "/v1/messages?beta=true", True),
            ("POST", "/v1/messages/count_tokens", True),
            ("GET", "/v1/messages", False),
            ("GET", "/v1/models", False),
            ("POST", "/v1/messages/batches", False),
            ("POST", "/v1/files", False),
            ("POST", "/v1/messages/../files", False),
            ("POST", "/api/event_logging/batch", False),
        ):
            before = upstream.logs().decode().count("KEYS")
            body = ' -d "{}"' if method == "POST" else ""
            probe = (
                f"curl -sS --path-as-is --max-time 10 -X {method}{body}"
                f' -o /dev/null -w "%{{http_code}}" "$ANTHROPIC_BASE_URL{path}"'
            )
            code = agent.exec_run(["sh", "-c", probe]).output.decode()
            if passes:
                _wait_log(upstream, f"KEYS {json.dumps([CANARY_KEY])} {path}")
            else:
                time.sleep(0.2)
            reached = upstream.logs().decode().count("KEYS") - before
            assert (code, reached) == (("200", 1) if passes else ("403", 0)), (method, path)
        # The injecting port is no way elsewhere: a CONNECT through it, or an absolute URI
        # naming another host, never opens a tunnel or reaches another host with the key.
        seen_before = upstream.logs().decode().count("KEYS")
        for probe in (
            "curl -sS -p -x http://127.0.0.1:3129 --max-time 10 http://unlisted.test:8080/",
            "curl -sS -p -x http://127.0.0.1:3129 --max-time 10 http://api.anthropic.test:8080/",
            "curl -sS -x http://127.0.0.1:3129 --max-time 10 http://127.0.0.1:3128/squid-internal-mgr/menu",
        ):
            result = agent.exec_run(["sh", "-c", probe + " -w '\\n%{http_code}' 2>&1"])
            shown = result.output.decode(errors="replace")
            assert shown.rsplit("\n", 1)[-1] in ("403", "400", "000"), (probe, shown)
        # Whatever reached the fake API through the injecting port went only there.
        assert upstream.logs().decode().count("KEYS") - seen_before <= 1
        # Nowhere the agent can look: environment, files, /proc, its docker inspect; and
        # not in the proxy's config either (it went in on stdin).
        # A pattern that matches the key without containing it (the grep's own argv is in /proc).
        pattern = "sk-ant-canary-(Q7){20}"
        sweep = (
            f"grep -rslE '{pattern}' /proc/[0-9]*/environ /proc/[0-9]*/cmdline /tmp /run"
            f" /etc /home /workspace 2>/dev/null; env | grep -cE '{pattern}'"
        )
        found = agent.exec_run(["sh", "-c", sweep]).output.decode().split()
        assert found == ["0"], found
        assert CANARY_KEY not in json.dumps(docker_client.api.inspect_container(agent.id))
        assert CANARY_KEY not in json.dumps(docker_client.api.inspect_container(session.proxy.id))
        assert agent.attrs["Config"]["Env"] and any(
            e.startswith("ANTHROPIC_BASE_URL=http://127.0.0.1:")
            for e in agent.attrs["Config"]["Env"]
        )
    finally:
        for container in created:
            container.remove(force=True)
        if session is not None:
            session.close()
        side.remove()
    assert _leftovers(docker_client, run_id) == []


def test_the_proxys_own_cache_manager_is_unreachable(world: World) -> None:
    """squid's cache manager by every spelling an agent might try: its internal URL on
    its own name, loopback and port, the old cache_object scheme as a request target, and
    a tunnel to its own port. Every one is refused by the allowlist's final deny."""
    proxy = "-x http://127.0.0.1:3128 --max-time 10 -w '\\n%{http_code}'"
    probes = [
        f"curl -sS {proxy} http://kagura-egress:3128/squid-internal-mgr/menu",
        f"curl -sS {proxy} http://localhost:3128/squid-internal-mgr/info",
        f"curl -sS {proxy} http://127.0.0.1:3128/squid-internal-mgr/info",
        f"curl -sS {proxy} --request-target cache_object://localhost/info http://localhost/",
        f"curl -sS -p {proxy} http://localhost:3128/",
    ]
    for probe in probes:
        _code, out = world.sh(probe + " 2>&1")
        assert out.rsplit("\n", 1)[-1] in ("403", "400", "000"), (probe, out)
    world.session.close()
    decisions = [e for e in world.events if e["type"] == "egress.decision"]
    assert decisions and all(e["decision"] == "deny" for e in decisions), decisions


def _host_ipv4_addresses() -> list[str]:
    """Every IPv4 address of this host's interfaces but loopback (docker0, eth0, …)."""
    with open("/proc/net/fib_trie") as trie:
        lines = trie.read().splitlines()
    local = {lines[i - 1].split()[-1] for i, line in enumerate(lines) if "/32 host LOCAL" in line}
    return sorted(a for a in local if not a.startswith("127."))


def test_a_listed_name_resolving_to_an_address_of_the_docker_host_is_refused(
    docker_client: Any, egress_images: dict[str, str], state_dir: Any
) -> None:
    """DNS rebinding onto the host itself: a listed name that resolves to one of the
    Docker host's own addresses — whatever range it lies in (a cloud VM's public
    address, a TEST-NET address here) — must not reach the host's listeners through the
    proxy. The private ranges alone do not cover a host whose address is public."""
    import http.server
    import threading

    class Hello(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b"host service"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("0.0.0.0", 0), Hello)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    run_id = f"test-hostself-{time.monotonic_ns()}"
    plan = {
        "egress": {
            "mode": "proxy",
            "allow": [{"host": "*.self.test", "port": port, "scheme": "http"}],
        }
    }
    addresses = _host_ipv4_addresses()
    names = {f"h{i}.self.test": address for i, address in enumerate(addresses)}
    session = EgressSession.start(
        docker_client, EgressRequest(plan, run_id, extra_hosts=names), [].append
    )
    agent = None
    try:
        # The control: a container on the proxy's network reaches the host's listener on
        # these addresses (other tests' bridges come and go: only those reached count).
        probe = " ".join(
            f"curl -s -o /dev/null -m 3 -w '{a} %{{http_code}}\\n' http://{a}:{port}/;"
            for a in addresses
        )
        control = docker_client.containers.run(
            egress_images["base"],
            ["sh", "-c", probe],
            labels=TEST_LABEL,
            network=session.outbound_network,
            detach=True,
        )
        try:
            control.wait(timeout=60)
            reached = {
                line.split()[0]
                for line in control.logs().decode().splitlines()
                if line.endswith(" 200")
            }
        finally:
            control.remove(force=True)
        names = {n: a for n, a in names.items() if a in reached}
        # The run's own outbound network's gateway (made after the policy) is the host too.
        outbound = docker_client.networks.get(session.outbound_network)
        gateway = outbound.attrs["IPAM"]["Config"][0]["Gateway"]
        assert gateway in {str(n.network_address) for n in session.policy.host}
        assert names, f"the host's listener is unreachable from a container at {addresses}"
        agent = _agent_behind(docker_client, egress_images["base"], session)
        script = " ".join(
            f"curl -s -o /dev/null -m 5 -w '{n} %{{http_code}}\\n' http://{n}:{port}/;"
            for n in names
        )
        out = agent.exec_run(["sh", "-c", script]).output.decode()
        assert sorted(out.split()) == sorted([*names, *["403"] * len(names)]), (addresses, out)
        # Refused by the private-address rule, not by the final deny-all.
        log = session.proxy.logs(stdout=True, stderr=False).decode(errors="replace")
        reasons = {
            raw["host"]: raw["reason"] for raw in map(audit.parse_line, log.splitlines()) if raw
        }
        assert {n: reasons.get(n) for n in names} == dict.fromkeys(names, "private-address")
    finally:
        if agent is not None:
            agent.remove(force=True)
        session.close()
        server.shutdown()
    assert _leftovers(docker_client, run_id) == []


def _agent_behind(client: Any, image: str, session: EgressSession) -> Any:
    """An unprivileged agent container whose only way out is ``session``'s proxy."""
    net = session.agent_network_config()
    agent = client.containers.run(
        image,
        ["sleep", "600"],
        detach=True,
        labels=TEST_LABEL,
        user="1000:1000",
        cap_drop=["ALL"],
        **net.docker_kwargs(),
    )
    start_forwarder(agent, net)
    return agent
