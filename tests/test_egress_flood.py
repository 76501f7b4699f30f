"""What the agent makes the host keep through its proxy is bounded (audit.py ceilings):
a real agent container flooding the proxy is stopped at the log ceiling, the host reads no
more than the ceiling, and the run's stored decisions stop at theirs, the rest counted.
A request squid answered itself is no allow."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from kagura_agent.apply.guards.tripwire import Tripwire
from kagura_agent.cli.main import main
from kagura_agent.membrane.egress import audit
from kagura_agent.membrane.egress.policy import load_policy
from kagura_agent.membrane.egress.session import EgressRequest, EgressSession
from kagura_agent.state import open_store
from testing.egress_images import ensure_egress_images, start_forwarder

EGRESS: dict[str, Any] = {"mode": "proxy", "allow": [{"host": "allowed.test", "port": 8443}]}
# Junk as fast as one process can send it, through the forwarder: an origin-form GET (squid
# answers 400 itself), a CONNECT to a listed name that resolves nowhere (squid answers
# 500), and a connection that sends nothing. Each logs a line; none is an honest request.
FLOOD = r"""
import socket
junk = [b"GET / HTTP/1.1\r\n\r\n", b"CONNECT allowed.test:8443 HTTP/1.1\r\n\r\n", b""]
n = 0
while True:
    s = socket.create_connection(("127.0.0.1", 3128))
    s.sendall(junk[n % 3]); n += 1
    s.shutdown(socket.SHUT_WR)
    try: s.recv(4096)
    except OSError: pass
    s.close()
"""


def _line(**fields: str) -> str:
    base = {
        **{"time": "1767225600.000", "client": "127.0.0.1", "method": "-", "scheme": "-"},
        **{"host": "-", "port": "-", "status": "400", "squid_status": "NONE_NONE"},
        **{"bytes_in": "18", "bytes_out": "3555", "server": "-", "reason": "-"},
        **{"inport": "3128", "path": "-"},
    }
    return " ".join(["KAGURA1", *{**base, **fields}.values()])


def test_a_request_squid_answered_itself_is_not_an_allow() -> None:
    policy = load_policy(EGRESS)
    # The origin-form GET / as squid logs it: a method, no host, 400, no upstream.
    bare = audit.parse_line(_line(method="GET", path="/"))
    assert bare is not None
    event = audit.classify(bare, policy, "r", 0)
    assert (event.decision, event.reason, event.entry) == ("deny", "not-forwarded", None)
    # A listed name that did not resolve: squid answered 500, forwarded nothing.
    failed = _line(method="CONNECT", host="allowed.test", port="8443", status="500")
    event = audit.classify(audit.parse_line(failed) or {}, policy, "r", 1)
    assert (event.decision, event.reason) == ("deny", "not-forwarded")
    # What an upstream answered (a 404 with its address) stays an allow.
    served = _line(method="CONNECT", host="allowed.test", port="8443", status="404")
    served = served.replace(" 18 3555 - ", " 18 3555 10.0.0.2 ")
    event = audit.classify(audit.parse_line(served) or {}, policy, "r", 2)
    assert (event.decision, event.reason) == ("allow", "allowed")
    # A connection that sent nothing is no decision at all.
    assert audit.parse_line(_line()) is None
    # Not a hijack sign: an upstream that is down makes an honest tool retry.
    trips: list[str] = []
    wire = Tripwire({"denied_egress": 2, "window_seconds": 60}, trips.append)
    for _ in range(5):
        wire.egress({"type": "egress.decision", "decision": "deny", "reason": "not-forwarded"})
    assert trips == []


def test_reading_a_log_stops_at_the_ceiling_and_holds_one_line() -> None:
    chunks = (b"KAGURA1 line %d\n" % i for i in range(10**9))  # an endless log
    lines = list(audit.log_lines(chunks, limit=1000))
    assert 1000 / 20 < len(lines) < 1000 / 10
    # A line that never ends is not read past the ceiling (nor yielded: it is no whole line).
    taken: list[int] = []

    def endless_line() -> Iterator[bytes]:
        while True:
            taken.append(600)
            yield b"x" * 600

    assert list(audit.log_lines(endless_line(), limit=1000)) == []
    assert sum(taken) == 1200


def test_decisions_past_the_ceiling_are_counted_once_not_stored(
    state_dir: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    store = audit.open_store(open_store())
    audit.record_run(store, "r", "2026-01-01T00:00:00Z", EGRESS)
    log = "\n".join(
        _line(method="CONNECT", host=f"h{i}.test", port="443", squid_status="TCP_DENIED")
        for i in range(25)
    )
    events = audit.events_from_log(log, load_policy(EGRESS), "r")
    first = audit.record_events(store, events[:15], ceiling=10)
    assert [e.seq for e in first] == list(range(15))  # all new: handed on
    again = audit.record_events(store, events, ceiling=10)  # teardown reads it all again
    assert [e.seq for e in again] == list(range(15, 25))
    assert audit.record_events(store, events, ceiling=10) == []
    assert len(audit.load_events(store, "r")) == 10
    assert audit.unstored(store, "r") == {"allow": 0, "deny": 15}
    # Said, never dropped silently: in the log and in its JSON.
    assert main(["egress", "log", "r"]) == 0
    text = capsys.readouterr().out
    assert "not stored (past the run's ceiling of decisions): 0 allowed, 15 denied" in text
    assert main(["egress", "log", "r", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["unstored"] == {"allow": 0, "deny": 15}


def _rss_kib() -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))


def test_a_flooding_agent_is_stopped_at_the_log_ceiling(docker_client: Any, state_dir: Any) -> None:
    images = ensure_egress_images(docker_client)
    run_id = f"test-flood-{time.monotonic_ns()}"
    agent: Any = None
    stopped = threading.Event()

    def stop(_reason: str) -> None:  # what apply's tripwire does: kill the agent
        if agent is not None:
            agent.kill()
        stopped.set()

    tripwire = Tripwire({"denied_egress": 1000, "window_seconds": 1}, stop)
    ceiling, rows = 400_000, 300
    session = EgressSession.start(
        docker_client,
        EgressRequest({"egress": EGRESS}, run_id, log_ceiling=ceiling, event_ceiling=rows),
        tripwire.egress,
    )
    try:
        net = session.agent_network_config()
        agent = docker_client.containers.run(
            images["base"],
            ["sleep", "600"],
            detach=True,
            labels={"dev.kagura.test": "egress-flood"},
            user="1000:1000",
            cap_drop=["ALL"],
            **net.docker_kwargs(),
        )
        start_forwarder(agent, net)
        rss_before = _rss_kib()
        started = time.monotonic()
        agent.exec_run(["python3", "-c", FLOOD], detach=True)
        peak = rss_before
        while not stopped.wait(0.2):
            peak = max(peak, _rss_kib())
            assert time.monotonic() - started < 120, "the flood was never stopped"
        took = time.monotonic() - started
        assert tripwire.reason is not None and "past the run's ceiling" in tripwire.reason
        agent.reload()
        assert agent.status != "running"
        # Docker keeps a bounded log, far more than the ceiling (no line rotated away).
        logging = docker_client.api.inspect_container(session.proxy.id)["HostConfig"]["LogConfig"]
        assert logging == {
            "Type": "json-file",
            "Config": {"max-size": str(audit.LOG_FILE_SIZE), "max-file": str(audit.LOG_FILES)},
        }
        assert audit.LOG_KEEP >= 4 * audit.LOG_CEILING
        # The collector took in everything up to the ceiling: teardown and drain() do
        # not read the log again (a 32 MiB log took minutes of CPU to read again).
        reads: list[dict[str, Any]] = []
        logs = session.proxy.logs
        session.proxy.logs = lambda **kw: reads.append(kw) or logs(**kw)
        session.drain()
        session.close()
        assert reads == []
        with open_store() as store:
            stored = audit.load_events(store, run_id)
            over = audit.unstored(audit.open_store(store), run_id)
        assert len(stored) == rows and len(session.events) == rows
        assert over["deny"] > 0 and over["allow"] == 0
        assert {e.reason for e in stored} == {"not-forwarded"}
        print(
            f"\nflood stopped after {took:.1f}s at {ceiling} bytes;"
            # One line in three is a decision (the CONNECT); the others are none.
            f" ~{(rows + sum(over.values())) * 3 / took:.0f} lines/s;"
            f" stored {len(stored)}, counted {sum(over.values())};"
            f" RSS {rss_before} -> peak {peak} KiB"
        )
        assert peak - rss_before < 64 * 1024
    finally:
        if agent is not None:
            agent.remove(force=True)
        session.close()
        session.close()
