"""Hijack tripwire pieces without Docker: the inotify watcher, the canary value scan,
planting that never follows the agent's symlinks, the documented knobs and the cockpit's
incident line. The real-container proofs are in test_tripwires_traps.py."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any

import pytest
from apply_helpers import cli_env, kagura, make_project, manifest_set, write_task

from kagura_agent.apply.guards.inotify import Watcher, describe
from kagura_agent.apply.guards.tripwire import ContainerTraps, Tripwire

ROOT = Path(__file__).resolve().parents[1]
KNOBS = {"canary_file": "/home/agent/.git-credentials", "creds_after_wipe": True}


def _wait(items: list[Any], count: int = 1) -> None:
    deadline = time.monotonic() + 5
    while len(items) < count and time.monotonic() < deadline:
        time.sleep(0.01)


def test_the_watcher_reports_opens_and_reads_not_listings(tmp_path: Path) -> None:
    target = tmp_path / "secret"
    target.write_text("x")
    seen: list[tuple[str, str]] = []
    watcher = Watcher(lambda path, mask: seen.append((path, describe(mask))))
    watcher.add(str(target), label="/home/agent/secret")
    watcher.start()
    try:
        os.listdir(tmp_path)
        target.stat()
        time.sleep(0.2)
        assert seen == []
        target.read_text()
        _wait(seen, 2)
        assert ("/home/agent/secret", "open") in seen and ("/home/agent/secret", "read") in seen
    finally:
        watcher.stop()
    watcher.stop()  # idempotent


def _fake_container(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    (root / "home" / "agent").mkdir(parents=True)
    (root / "run" / "kagura").mkdir(parents=True)
    return root


def test_planting_then_touching_trips_once_and_never_on_the_hosts_own_writes(
    tmp_path: Path,
) -> None:
    root = _fake_container(tmp_path)
    trips: list[str] = []
    tripwire = Tripwire({}, trips.append)
    traps = ContainerTraps(tripwire, KNOBS, f"{os.getuid()}:{os.getgid()}")
    problems = traps.arm(0, delivered=True)
    assert problems and "canary tripwire off" in problems[0]
    traps.stop()

    traps = ContainerTraps(tripwire, KNOBS, f"{os.getuid()}:{os.getgid()}")
    traps.root = str(root)
    traps.watcher = Watcher(traps._touched)
    traps.watcher.start()
    try:
        assert traps.after_wipe(["aws/credentials", "token"]) == []
        time.sleep(0.2)
        assert trips == []  # planting and watching: no touch
        decoy = root / "run/kagura/creds/aws/credentials"
        assert decoy.read_text().strip() == tripwire.canary
        assert oct(decoy.stat().st_mode & 0o777) == "0o600"
        _wait(trips)
        assert trips == [
            "/run/kagura/creds/aws/credentials was touched after the credentials were wiped (open)"
        ]
    finally:
        traps.stop()


def test_planting_never_follows_a_symlink_the_agent_left(tmp_path: Path) -> None:
    root = _fake_container(tmp_path)
    outside = tmp_path / "host-etc"
    outside.mkdir()
    (root / "run/kagura/creds").symlink_to(outside)
    trips: list[str] = []
    traps = ContainerTraps(Tripwire({}, trips.append), KNOBS, f"{os.getuid()}:{os.getgid()}")
    traps.root = str(root)
    traps.watcher = Watcher(traps._touched)
    try:
        problems = traps.after_wipe(["token"])
    finally:
        traps.watcher.stop()
    assert problems and all("not planted" in p or "off" in p for p in problems), problems
    assert list(outside.iterdir()) == []


def test_the_canary_value_in_egress_or_output_trips() -> None:
    trips: list[str] = []
    tripwire = Tripwire({"denied_egress": 100}, trips.append)
    tripwire.scan("the brain's output", {"text": tripwire.canary})
    assert trips == []  # not planted: nothing to look for
    tripwire.planted = True
    assert re.fullmatch(r"ghp_[A-Za-z0-9]{36}", tripwire.canary)
    assert Tripwire({}, trips.append).canary != tripwire.canary  # per run
    event = {"type": "egress.decision", "decision": "allow", "host": f"{tripwire.canary}.x.test"}
    tripwire.egress(event)
    tripwire.scan("the brain's output", {"text": tripwire.canary})
    assert trips == ["the canary value appeared in the egress log"]  # once
    assert list(tripwire.egress_log) == [event]


@pytest.mark.usefixtures("without_docker")
def test_the_documented_knobs_plan_as_documented(tmp_path: Path, state_dir: Path) -> None:
    page = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    [block] = [b for b in re.findall(r"```yaml\n(.*?)```", page, re.S) if "canary_file" in b]
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    (manifests / "house-rules.yml").write_text(block)
    task = write_task(make_project(tmp_path), "t", {"steps": ["true"]})
    env = cli_env(state_dir)
    planned = kagura(["plan", "--manifests", str(manifests), str(task)], env)
    assert planned.returncode == 0, planned.stderr
    [quoted] = re.findall(r"\(`(tripwires .*?)`\)", page, re.S)
    line = " ".join(quoted.split())
    assert any(" ".join(row.split()) == line for row in planned.stdout.splitlines()), (
        line,
        planned.stdout,
    )
    off = {
        "kind": "Graduation",
        "metadata": {"name": "off"},
        "spec": {"tripwires": {"canary_file": False, "creds_after_wipe": False}},
    }
    planned = kagura(
        ["plan", "--json", "--manifests", str(manifest_set(tmp_path / "off", off)), str(task)], env
    )
    [entry] = json.loads(planned.stdout)["plans"]
    trip = entry["plan"]["tripwires"]
    assert (trip["canary_file"], trip["creds_after_wipe"]) == (None, False)


def test_the_cockpit_posts_the_incident_line() -> None:
    from kagura_agent.cockpit.runner import chat_line

    page = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    reason = "the canary file /home/agent/.git-credentials was touched (open)"
    line = chat_line(json.dumps({"kind": "incident", "id": "inc-0123", "reason": reason}))
    assert line == f"⚠ incident inc-0123: {reason} (kagura-agent incidents)"
    assert f"⚠ incident inc-…: {reason}" in " ".join(page.split())


def test_the_decoy_watch_is_skipped_only_for_the_entrypoints_own_processes(
    monkeypatch: Any,
) -> None:
    """Every process left after the wipe must have been there before the turn, with the
    same start, and be undumpable then and now; anything else keeps the watch."""
    import kagura_agent.apply.guards.tripwire as tripwire_module

    looks: list[dict[int, tuple[str, bool]] | None] = []
    monkeypatch.setattr(tripwire_module, "namespace_processes", lambda pid: looks.pop(0))
    entrypoint = {10: ("100", True), 11: ("101", True), 12: ("102", False)}

    def skipped(after: dict[int, tuple[str, bool]] | None) -> bool:
        traps = ContainerTraps(Tripwire({}, lambda reason: None), KNOBS, "1000:1000")
        traps.pid = 10
        looks[:] = [entrypoint, after]
        traps.before_turn()
        return traps.only_entrypoint_left()

    assert skipped({10: ("100", True), 11: ("101", True)})
    assert not skipped({10: ("100", True), 11: ("101", True), 13: ("300", True)})  # new, hidden
    assert not skipped({10: ("100", True), 12: ("102", False)})  # dumpable before the turn
    assert not skipped({10: ("100", True), 11: ("101", False)})  # ran a program since
    assert not skipped({10: ("100", True), 11: ("250", True)})  # the pid went to another
    assert not skipped(None)  # the host cannot see the container's processes
    traps = ContainerTraps(Tripwire({}, lambda reason: None), KNOBS, "1000:1000")
    assert not traps.only_entrypoint_left()  # never armed: nothing noted before the turn


def test_namespace_processes_sees_a_namespace_only_when_it_can_read_it() -> None:
    from kagura_agent.processes import namespace_processes

    # This process is in the host's own namespace: not a container's init.
    assert namespace_processes(os.getpid()) is None
    assert namespace_processes(2**22 + 7) is None  # no such process
