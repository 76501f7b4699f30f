"""Teardown on Ctrl-C, the crash sweep after kill -9, and ``kagura-agent egress log``."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import docker.errors
import pytest

from kagura_agent.cli.main import main
from kagura_agent.membrane.egress import audit
from kagura_agent.membrane.egress.owner import current_owner
from kagura_agent.membrane.egress.sweep import sweep_orphans
from kagura_agent.state import StateStore, open_store
from testing.egress_images import ensure_egress_images

# A stand-in for the applying process: it starts a run's egress, says so, and waits.
CHILD = """
import sys, time, docker
from kagura_agent.membrane.egress.session import EgressRequest, EgressSession
plan = {"egress": {"mode": "proxy", "allow": [{"host": "allowed.test", "port": 8443}]}}
with EgressSession.start(docker.from_env(), EgressRequest(plan, sys.argv[1])) as egress:
    print("ready", egress.proxy_name, flush=True)
    time.sleep(120)
"""


@pytest.fixture(scope="session")
def egress_images(docker_client: Any) -> dict[str, str]:
    return ensure_egress_images(docker_client)


def _objects(client: Any, run_id: str) -> list[str]:
    label = f"dev.kagura.run={run_id}"
    found = [c.name for c in client.containers.list(all=True, filters={"label": label})]
    found += [v["Name"] for v in client.api.volumes(filters={"label": label})["Volumes"] or []]
    return found + [n.name for n in client.networks.list(filters={"label": label})]


def _start_child(run_id: str, state: Path | None = None) -> subprocess.Popen[str]:
    env = dict(os.environ)
    if state is not None:
        env["KAGURA_AGENT_STATE_DIR"] = str(state)
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, run_id], stdout=subprocess.PIPE, text=True, env=env
    )
    assert child.stdout is not None
    line = child.stdout.readline()
    assert line.startswith("ready"), line
    return child


def test_ctrl_c_removes_proxy_network_and_socket_volume(
    docker_client: Any, egress_images: dict[str, str], state_dir: Path
) -> None:
    run_id = f"test-sigint-{time.monotonic_ns()}"
    child = _start_child(run_id)
    assert len(_objects(docker_client, run_id)) == 3
    child.send_signal(signal.SIGINT)
    assert child.wait(timeout=30) != 0
    assert _objects(docker_client, run_id) == []


def test_kill_9_leftovers_are_swept_on_next_start(
    docker_client: Any, egress_images: dict[str, str], state_dir: Path
) -> None:
    run_id = f"test-kill9-{time.monotonic_ns()}"
    child = _start_child(run_id)
    child.kill()  # SIGKILL: no finally, no __exit__
    child.wait(timeout=30)
    assert len(_objects(docker_client, run_id)) == 3
    store = audit.open_store(open_store())
    removed = sweep_orphans(docker_client, store)
    assert _objects(docker_client, run_id) == []
    assert any(name.endswith("-proxy") for name in removed)
    assert any(name.endswith("-socket") for name in removed)
    # A live owner's objects are never touched.
    live = f"test-live-{time.monotonic_ns()}"
    child = _start_child(live)
    try:
        sweep_orphans(docker_client, store)
        assert len(_objects(docker_client, live)) == 3
    finally:
        child.send_signal(signal.SIGINT)
        child.wait(timeout=30)
    assert _objects(docker_client, live) == []


def test_two_state_directories_on_one_daemon_never_sweep_each_other(
    docker_client: Any,
    egress_images: dict[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Two state directories (two operators, two parallel test workers) on one daemon:
    each one's sweep takes its own dead run's objects and leaves the other's, live or
    dead; only ``egress sweep --all`` takes every dead owner's, and never a live one's."""
    states = {"a": tmp_path / "a", "b": tmp_path / "b"}
    tag = time.monotonic_ns()
    children = {}
    for which, state in states.items():
        for status in ("live", "dead"):
            run_id = f"test-{which}-{status}-{tag}"
            children[which, status] = (run_id, _start_child(run_id, state))
    # Agent containers of a dead and a live apply (owner labels as DockerRuntime sets them).
    dead_owner = f"{socket.gethostname()}:{2**22 + 1}:0"  # above pid_max: no such process
    containers = {
        status: docker_client.containers.create(
            egress_images["base"],
            ["true"],
            labels={"dev.kagura.run": f"test-c-{status}-{tag}", "dev.kagura.owner": who},
        )
        for status, who in (("dead", dead_owner), ("live", current_owner()))
    }
    try:
        [b_dead_proxy] = docker_client.containers.list(
            all=True, filters={"label": f"dev.kagura.run={children['b', 'dead'][0]}"}
        )
        for which in states:
            _run_id, child = children[which, "dead"]
            child.kill()  # SIGKILL: no finally, no __exit__
            child.wait(timeout=30)

        def left(which: str, status: str) -> int:
            return len(_objects(docker_client, children[which, status][0]))

        assert {key: left(*key) for key in children} == dict.fromkeys(children, 3)
        monkeypatch.setenv("KAGURA_AGENT_STATE_DIR", str(states["a"]))
        assert main(["egress", "sweep", "--json"]) == 0
        body = json.loads(capsys.readouterr().out)
        assert body["scope"] == "store"
        assert f"kagura-egress-{children['a', 'dead'][0]}-proxy" in body["removed"]
        assert not [name for name in body["removed"] if "test-b-" in name], body
        assert {key: left(*key) for key in children} == {
            ("a", "live"): 3,
            ("a", "dead"): 0,
            ("b", "live"): 3,
            ("b", "dead"): 3,
        }
        # The operator's whole-daemon sweep (egress sweep --all): B's dead run goes (its
        # decisions are not A's to store: salvage keeps only runs the sweeping store
        # recorded); live ones stay. Other processes' objects on this shared daemon count
        # as alive here: this test must not sweep what a parallel test left on purpose.
        dead = {dead_owner, b_dead_proxy.labels["dev.kagura.owner"]}
        store = audit.open_store(StateStore(states["a"] / "state.db"))
        removed = sweep_orphans(
            docker_client, store, everyone=True, is_alive=lambda o: o not in dead
        )
        assert f"kagura-egress-{children['b', 'dead'][0]}-proxy" in removed
        assert {key: left(*key) for key in children} == {
            ("a", "live"): 3,
            ("a", "dead"): 0,
            ("b", "live"): 3,
            ("b", "dead"): 0,
        }
        # ... and the containers of dead runs, whatever store recorded them.
        assert containers["dead"].name in removed
        assert containers["live"].name not in removed
        assert _objects(docker_client, f"test-c-live-{tag}") == [containers["live"].name]
        assert _objects(docker_client, f"test-c-dead-{tag}") == []
        assert audit.run_allowlist(store, children["b", "dead"][0]) is None
        store.close()
    finally:
        for container in containers.values():
            with contextlib.suppress(docker.errors.NotFound):
                container.remove(force=True)
        for _run_id, child in children.values():
            if child.poll() is None:
                child.send_signal(signal.SIGINT)
                child.wait(timeout=30)
    assert [run_id for run_id, _child in children.values() if _objects(docker_client, run_id)] == []


def test_egress_log_cli(state_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from kagura_agent.membrane.egress.policy import load_policy

    store = audit.open_store(open_store())
    allow = {"mode": "proxy", "allow": [{"host": "api.github.com"}]}
    audit.record_run(store, "run-a", "2026-01-01T00:00:00Z", allow)
    log = (
        "KAGURA1 1767225600.000 172.18.0.3 CONNECT - api.github.com 443 200 TCP_TUNNEL 1 2 - -\n"
        "KAGURA1 1767225601.000 172.18.0.3 CONNECT - evil.test 443 403 TCP_DENIED 1 2 - "
        "not-allowed\n"
        "KAGURA1 1767225602.000 127.0.0.1 POST http api.anthropic.com 80 200 TCP_MISS 1 2"
        " 10.0.0.2 - 3129 /v1/messages%3Fbeta=true\n"
    )
    audit.record_events(store, audit.events_from_log(log, load_policy(allow), "run-a"))
    assert main(["egress", "log"]) == 0
    text = capsys.readouterr().out
    assert "ALLOW CONNECT api.github.com:443" in text and "api.github.com:443/https" in text
    # A model call through the injecting port: its path (no query) and where it went.
    assert "ALLOW POST    api.anthropic.com:80/v1/messages 200" in text
    assert text.rstrip().splitlines()[3].endswith("injected"), text
    assert "1x CONNECT evil.test:443 (host-not-listed)" in text
    assert main(["egress", "log", "run-a", "--json", "--denied"]) == 0
    body = json.loads(capsys.readouterr().out)
    assert (body["ok"], body["errors"], body["run_id"]) == (True, [], "run-a")
    assert [e["host"] for e in body["events"]] == ["evil.test"]
    assert body["denials"][0]["reason"] == "host-not-listed"
    assert main(["egress", "log", "nope"]) == 2


def test_egress_log_shows_what_the_agent_chose_on_one_line(
    state_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The host, path and method of a request are the agent's: squid logs them %-encoded
    and the log decodes them; ``egress log`` prints each decision on one line whatever
    they hold (hygiene.neutralise, as ``memory search`` prints an agent's note)."""
    from kagura_agent.membrane.egress.policy import load_policy

    store = audit.open_store(open_store())
    allow = {"mode": "proxy", "allow": [{"host": "api.github.com"}]}
    audit.record_run(store, "run-e", "2026-01-01T00:00:00Z", allow)
    forged = "%0a2026-01-01T00:00:09.000Z%20%20ALLOW%20GET%20%1b[2Jx"
    log = (
        "KAGURA1 1767225601.000 172.18.0.3 GET http evil.test 80 403 TCP_DENIED 1 2 -"
        f" not-allowed 3128 /{forged}\n"
    )
    audit.record_events(store, audit.events_from_log(log, load_policy(allow), "run-e"))
    assert main(["egress", "log", "run-e"]) == 0
    text = capsys.readouterr().out
    lines = text.splitlines()
    assert len(lines) == 4, lines  # the header, the one decision, the denied summary (2)
    assert "\x1b" not in text and "evil.test:80/\\x0a2026-01-01T00:00:09.000Z" in lines[1]
    assert not any(line.startswith("2026-01-01T00:00:09") for line in lines)


class _DeadProxy:
    """What salvage reads of a stopped proxy: its log, as Docker streams it."""

    def __init__(self, log: str) -> None:
        self.api = self
        self._log = log.encode()

    def logs(self, container_id: str, **_options: Any) -> Any:
        return iter([self._log[:50], self._log[50:]])


def test_salvage_withholds_what_the_agent_chose(
    state_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A dead run's decisions, stored without its redactor: the decision, entry, reason,
    ports and counts stay; a host, path or method the agent chose does not."""
    from kagura_agent.membrane.egress.sweep import salvage

    token = "tok3n5ecret9f8e7d"
    log = (
        "KAGURA1 1767225600.000 172.18.0.3 CONNECT - api.github.com 443 200 TCP_TUNNEL 1 2"
        " 140.82.112.5 - 3128 -\n"
        f"KAGURA1 1767225601.000 172.18.0.3 CONNECT - {token}.evil.test 443 403 TCP_DENIED"
        " 1 2 - not-allowed 3128 -\n"
        f"KAGURA1 1767225602.000 172.18.0.3 CONNECT - {token}.example.com 443 200 TCP_TUNNEL"
        " 1 2 93.184.216.34 - 3128 -\n"
        f"KAGURA1 1767225603.000 172.18.0.3 GET http evil.test 80 403 TCP_DENIED 1 2 -"
        f" not-allowed 3128 /leak/{token}\n"
        f"KAGURA1 1767225604.000 172.18.0.3 {token.upper()} http evil.test 80 403 TCP_DENIED"
        " 1 2 - not-allowed 3128 /\n"
        "KAGURA1 1767225605.000 127.0.0.1 POST http api.anthropic.com 80 200 TCP_MISS 1 2"
        " 10.0.0.2 - 3129 /v1/messages\n"
    )
    store = audit.open_store(open_store())
    allow = {"mode": "proxy", "allow": [{"host": "api.github.com"}, {"host": "*.example.com"}]}
    audit.record_run(store, "run-dead", "2026-01-01T00:00:00Z", allow)
    salvage(_DeadProxy(log), "proxy-id", "run-dead", store)
    events = audit.load_events(store, "run-dead")
    assert [(e.host, e.method, e.path) for e in events] == [
        ("api.github.com", "CONNECT", ""),  # exactly an allowlist entry's: the operator's
        ("(withheld)", "CONNECT", ""),
        ("(withheld)", "CONNECT", ""),  # below a wildcard: the agent chose the label
        ("(withheld)", "GET", "(withheld)"),
        ("(withheld)", "(withheld)", "(withheld)"),
        ("(withheld)", "POST", "/v1/messages"),
    ]
    assert [e.decision for e in events] == ["allow", "deny", "allow", "deny", "deny", "allow"]
    assert events[2].entry == "*.example.com:443/https" and events[2].server == "93.184.216.34"
    assert [e.reason for e in events][:2] == ["allowed", "host-not-listed"]
    assert events[5].inport == 3129 and events[3].port == 80
    assert main(["egress", "log", "run-dead"]) == 0
    text = capsys.readouterr().out
    assert "5 decision(s) stored after the run was killed" in text, text
    assert main(["egress", "log", "run-dead", "--json"]) == 0
    body = json.loads(capsys.readouterr().out)
    assert body["withheld"] == 5
    for form in (token, token.upper()):
        assert form not in text + json.dumps(body)
        for stored in state_dir.rglob("*"):  # state.db and its -wal, raw
            if stored.is_file():
                assert form.lower().encode() not in stored.read_bytes().lower(), stored
    # A run this store does not know (another state directory's): nothing stored here.
    salvage(_DeadProxy(log), "proxy-id", "run-elsewhere", store)
    assert audit.load_events(store, "run-elsewhere") == []
