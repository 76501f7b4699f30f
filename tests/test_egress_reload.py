"""A running proxy's allowlist reloaded in place (a mid-run egress grant), real containers:
the new entry passes, the old ones still do, and a download in flight through the proxy
when it reloads finishes intact — the run's connections are not dropped."""

from __future__ import annotations

import base64
import hashlib
from typing import Any

import pytest
import test_egress_proxy as proxy_tests
from test_egress_proxy import PLAN_EGRESS, PRIVATE, World, _status

from kagura_agent.errors import RefusedError, SetupError
from kagura_agent.membrane.egress import reload as reload_mod
from kagura_agent.membrane.egress.policy import load_policy
from kagura_agent.membrane.egress.proxy import PROXY_USER
from kagura_agent.membrane.egress.squid import READY_MARKER, render_squid_conf
from kagura_agent.membrane.runtime import ContainerError

pytestmark = pytest.mark.usefixtures("docker_client")
# The proxy tests' own fixtures: a started session, an upstream and a no-network agent.
egress_images = proxy_tests.egress_images
world = proxy_tests.world

# Inside the agent, through the forwarder on 127.0.0.1:3128: CONNECT, GET /big, then read
# the body in 64 KiB pieces with a pause between them (TCP back-pressure keeps the tunnel
# busy for seconds), hashing it. Prints "started" after the first piece, then the digest.
SLOW_READER = """
import hashlib, socket, sys, time
s = socket.create_connection(("127.0.0.1", 3128))
s.sendall(b"CONNECT allowed.test:8443 HTTP/1.1\\r\\nHost: allowed.test:8443\\r\\n\\r\\n")
assert b" 200 " in s.recv(4096)
s.sendall(b"GET /big HTTP/1.0\\r\\nHost: allowed.test\\r\\n\\r\\n")
data = b""
while b"\\r\\n\\r\\n" not in data:
    data += s.recv(65536)
body = data.split(b"\\r\\n\\r\\n", 1)[1]
print("started", flush=True)
digest = hashlib.sha256(body)
while chunk := s.recv(65536):
    digest.update(chunk)
    time.sleep(0.05)
print(digest.hexdigest(), flush=True)
"""


def _amended(*entries: dict[str, Any]) -> dict[str, Any]:
    return {**PLAN_EGRESS, "allow": [*PLAN_EGRESS["allow"], *entries]}


def test_a_reload_allows_the_new_entry_and_keeps_a_download_in_flight(world: World) -> None:
    code, out = world.through_proxy("http://unlisted.test:8443/")
    assert _status(out) != "200", out
    script = base64.b64encode(SLOW_READER.encode()).decode()
    world.sh(
        f'(python3 -c "$(echo {script} | base64 -d)" > /tmp/big.log 2>&1; echo $? > /tmp/big.done)'
        " > /dev/null 2>&1 &"
    )
    code, _ = world.sh(
        "for i in $(seq 100); do grep -q started /tmp/big.log && exit 0; sleep 0.1; done; exit 1"
    )
    assert code == 0, world.sh("cat /tmp/big.log")
    world.session.reload(
        _amended({"host": "unlisted.test", "port": 8443, "allow_addresses": PRIVATE})
    )
    _, state = world.sh("test -e /tmp/big.done && echo done || echo running")
    assert state.strip() == "running", "the download ended before the reload: nothing proved"
    code, out = world.through_proxy("http://unlisted.test:8443/")
    assert code == 0 and _status(out) == "200", out
    code, out = world.through_proxy("http://allowed.test:8443/")
    assert _status(out) == "200", out
    _, done = world.sh(
        "for i in $(seq 600); do test -e /tmp/big.done && break; sleep 0.1; done;"
        " cat /tmp/big.done /tmp/big.log"
    )
    expected = hashlib.sha256(bytes(range(251)) * 33421).hexdigest()
    assert done.splitlines()[0] == "0" and expected in done, done
    decisions = [(e.get("host"), e.get("decision")) for e in world.events]
    assert ("unlisted.test", "allow") in decisions and ("unlisted.test", "deny") in decisions


def test_a_configuration_squid_refuses_leaves_the_old_one_in_force(world: World) -> None:
    broken = _amended({"host": "x.test", "port": 8443, "allow_addresses": ["10.0.0.0/33"]})
    with pytest.raises((RefusedError, SetupError)):  # refused; nothing changed
        world.session.reload(broken)
    _, out = world.through_proxy("http://allowed.test:8443/")
    assert _status(out) == "200", out
    _, out = world.through_proxy("http://unlisted.test:8443/")
    assert _status(out) != "200", out


def test_reload_refuses_when_squid_rejects_the_file(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = reload_mod.render_squid_conf
    monkeypatch.setattr(
        reload_mod,
        "render_squid_conf",
        lambda *a, **k: original(*a, **k) + "no_such_directive on\n",
    )
    with pytest.raises(SetupError, match="refused by squid"):
        world.session.reload(_amended())
    _, out = world.through_proxy("http://allowed.test:8443/")
    assert _status(out) == "200", out


def _ready_lines(world: World) -> int:
    logs = world.client.api.logs(world.session.proxy.id, stdout=False, stderr=True)
    return int(logs.decode(errors="replace").count(READY_MARKER))


def test_every_reload_waits_for_its_own_ready_line(world: World) -> None:
    """The ready count is taken relative to the lines before each reload: the second and
    third reloads of one proxy wait for squid's own new line too (a fixed "second line"
    would let the second one return before squid had reloaded at all)."""
    lines = _ready_lines(world)
    assert lines == 1  # squid's start
    hosts = ["unlisted.test", "other.test", "third.test"]
    for number, host in enumerate(hosts, start=1):
        conf = render_squid_conf(
            load_policy(_amended({"host": host, "port": 8443, "allow_addresses": PRIVATE})),
            ["127.0.0.1/32"],
        )
        wait = reload_mod.start_reload(
            world.client, world.session.proxy.id, conf, user=PROXY_USER, timeout=30
        )
        wait()  # returns only once this reload's own line is in the log
        assert _ready_lines(world) == lines + number
    # The last file is in force at once: the first entry went with the second reload.
    world.session.policy = load_policy(
        _amended({"host": "third.test", "port": 8443, "allow_addresses": PRIVATE})
    )
    _, out = world.through_proxy("http://allowed.test:8443/")
    assert _status(out) == "200", out
    _, out = world.through_proxy("http://unlisted.test:8443/")
    assert _status(out) != "200", out


def test_a_refused_file_leaves_squid_running_its_old_one_and_is_reported_by_wait(
    world: World,
) -> None:
    """The one mechanism checks every file before squid sees it, also on the warm path
    (start_reload is what a claimed pooled session gets): ``wait()`` says refused, no
    reload happened, and the old configuration is still in force."""
    lines = _ready_lines(world)
    conf = render_squid_conf(load_policy(_amended()), ["127.0.0.1/32"]) + "no_such_directive on\n"
    wait = reload_mod.start_reload(
        world.client, world.session.proxy.id, conf, user=PROXY_USER, timeout=30
    )
    with pytest.raises(SetupError, match="refused by squid"):
        wait()
    assert _ready_lines(world) == lines
    state = world.client.api.inspect_container(world.session.proxy.id)["State"]
    assert state["Running"]
    _, out = world.through_proxy("http://allowed.test:8443/")
    assert _status(out) == "200", out


def test_a_gone_proxy_fails_the_reload_at_once(world: World) -> None:
    """A pooled proxy that died while idle fails the claim before any thread starts (the
    run then starts cold)."""
    world.client.api.kill(world.session.proxy.id)
    world.client.api.wait(world.session.proxy.id, timeout=30)
    with pytest.raises(ContainerError):  # "is not running" from the exec's creation
        reload_mod.start_reload(
            world.client, world.session.proxy.id, "# nothing\n", user=PROXY_USER, timeout=30
        )
