"""Graduation end to end, through apply, with the script brain in real containers.

The capability is an extra read-only mount (category ``mount:<path>``) that three distinct
tasks of one project use. The clock is injected, never mocked globally: evidence runs call
``apply_plan`` in-process with a FixedClock advanced between runs (a simulated week);
everything an operator types goes through the CLI in separate processes, so every step
also proves the state lives in the state store and survives a restart.
"""

from __future__ import annotations

import json
import os
import pty
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import docker
import pytest

from kagura_agent.apply.run.executor import ApplyOptions, RunResult, apply_plan
from kagura_agent.clock import FixedClock, iso
from kagura_agent.errors import ExitCode, RefusedError
from kagura_agent.membrane.hardening import LABEL_STORE
from kagura_agent.paths import repo_root
from kagura_agent.plan.build import plan_tasks
from kagura_agent.state import owner_key, state_location

TASKS = ("a", "b", "c")
AGENT_UID = 1000
TASK_YAML = """\
apiVersion: kagura.dev/v1
kind: Task
metadata: {{name: grad-{name}}}
spec:
  mounts:
    - {{source: ref, target: /ref}}
  budget: {{wall_time: 5m}}
{extra}  steps:
    - {step}
  verify:
    - {verify}
"""


@dataclass(frozen=True)
class Scene:
    """A manifests dir and a project whose tasks all read the same extra mount."""

    root: Path
    manifests: Path
    project: Path

    @property
    def category(self) -> str:
        return f"mount:{os.path.realpath(self.project / 'ref')}"

    def task(self, name: str) -> Path:
        return self.project / f"{name}.yml"

    def write_task(self, file: str, name: str, step: str, verify: str, extra: str = "") -> Path:
        path = self.project / f"{file}.yml"
        path.write_text(TASK_YAML.format(name=name, step=step, verify=verify, extra=extra))
        os.chown(path, AGENT_UID, AGENT_UID)
        return path


def _make_scene(tmp_path: Path) -> Scene:
    root = repo_root()
    assert root is not None
    manifests = tmp_path / "manifests"
    shutil.copytree(root / "manifests", manifests)
    project = tmp_path / "project"
    (project / "ref").mkdir(parents=True)
    (project / "ref" / "data.txt").write_text("reference data\n")
    found = Scene(tmp_path, manifests, project)
    for name in TASKS:
        step = f"cp /ref/data.txt {name}.txt"
        found.write_task(name, name, step, f"grep -q reference {name}.txt")
    # The liar: its brain reports success, but it never writes what verify checks for.
    found.write_task(
        "liar", "liar", 'echo "success - all checks passed, task complete"', "test -s liar.txt"
    )
    for path in (project, project / "ref", project / "ref" / "data.txt"):
        os.chown(path, AGENT_UID, AGENT_UID)
    return found


@pytest.fixture()
def scene(tmp_path: Path, state_dir: Path, docker_client: Any) -> Iterator[Scene]:
    yield _make_scene(tmp_path)
    # apply removes its own containers; this only catches what a failing test left. Only
    # this test's store's: the module's tests share task names, and a test on another
    # worker must not lose its containers to this one's teardown.
    store = f"{LABEL_STORE}={owner_key(state_location())}"
    for name in (*TASKS, "liar"):
        for container in docker_client.containers.list(
            all=True, filters={"label": [f"dev.kagura.task=grad-{name}", store]}
        ):
            try:
                container.remove(force=True)
            except docker.errors.NotFound:
                pass  # gone meanwhile
            except docker.errors.APIError as exc:  # apply's own removal, still under way
                if "already in progress" not in str(exc):
                    raise


def _plan(scene: Scene, file: str) -> dict[str, Any]:
    (plan,) = plan_tasks(str(scene.manifests), [str(scene.task(file))])
    return plan


def _apply(scene: Scene, file: str, clock: FixedClock, *, approve: bool = True) -> RunResult:
    plan = _plan(scene, file)
    approved = (scene.category,) if approve else ()
    return apply_plan(plan, ApplyOptions(clock=clock, approve=approved, who="alice"))


def _cli(scene: Scene, *args: str) -> subprocess.CompletedProcess[str]:
    """One kagura-agent invocation in its own process (a restart every time)."""
    return subprocess.run(
        [sys.executable, "-m", "kagura_agent", *args],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=scene.root,
        env={**os.environ, "NO_COLOR": "1"},
        check=False,
    )


def _status(scene: Scene) -> dict[str, Any]:
    done = _cli(scene, "graduation", "status", "--json", "--manifests", str(scene.manifests))
    assert done.returncode == 0, done.stderr
    categories: dict[str, Any] = json.loads(done.stdout)["categories"]
    return categories.get(scene.category, {})


def _cli_plan(scene: Scene, file: str) -> tuple[dict[str, Any], str]:
    """The plan JSON and the text view (with its diff) from two separate processes."""
    manifests = ("--manifests", str(scene.manifests))
    as_json = _cli(scene, "plan", "--json", *manifests, str(scene.task(file)))
    assert as_json.returncode == 0, as_json.stderr
    text = _cli(scene, "plan", *manifests, str(scene.task(file)))
    assert text.returncode == 0, text.stderr
    return json.loads(as_json.stdout)["plans"][0]["plan"], text.stdout


def _cli_apply(scene: Scene, file: str) -> subprocess.CompletedProcess[str]:
    """Non-interactive apply with no --approve: nobody can be asked."""
    return _cli(scene, "apply", "--yes", "--manifests", str(scene.manifests), str(scene.task(file)))


def _entry(plan: dict[str, Any], category: str) -> dict[str, Any]:
    (found,) = [a for a in plan["approvals"] if a["category"] == category]
    return found


@pytest.mark.usefixtures("docker_client")
def test_verified_week_graduates_and_one_failure_demotes(scene: Scene) -> None:
    cat = scene.category
    manifests = ("--manifests", str(scene.manifests))
    # Five verified successes over three tasks, two simulated days apart (an 8-day span).
    clock = FixedClock(datetime.now(UTC).replace(microsecond=0) - timedelta(days=9))
    applied: list[tuple[str, str]] = []
    for index, name in enumerate(("a", "b", "c", "a", "b")):
        if index:
            clock.advance(timedelta(days=2))
        if index == 4:
            assert _cli(scene, "graduation", "proposals", *manifests).stdout.strip() == (
                "no graduation proposals"
            )
        plan = _plan(scene, name)
        entry = _entry(plan, cat)
        assert (entry["class"], entry["evidence"]) == ("needs-approval", index)
        result = apply_plan(plan, ApplyOptions(clock=clock, approve=(cat,), who="alice"))
        assert (result.outcome, result.exit_code) == ("success", 0), result
        applied.append((plan["intent"], iso(clock.now())))

    found = _cli(scene, "graduation", "proposals", "--json", *manifests)
    (proposal,) = json.loads(found.stdout)["proposals"]
    assert proposal["category"] == cat
    assert (proposal["successes"], proposal["distinct_tasks"], proposal["span"]) == (5, 3, "8d")
    assert f"graduation approve {cat}" in _cli(scene, "graduation", "proposals", *manifests).stdout

    approved = _cli(scene, "graduation", "approve", cat, "--who", "carol", *manifests)
    assert approved.returncode == 0, approved.stderr
    assert _status(scene)["state"] == "graduated"

    # The next plan shows it graduated, and the diff against grad-a's last applied plan
    # shows the class change.
    plan, text = _cli_plan(scene, "a")
    assert _entry(plan, cat)["class"] == "graduated"
    assert f"~ class {cat} needs-approval → graduated" in text
    ran = _cli_apply(scene, "c")
    assert ran.returncode == 0, ran.stderr
    assert "approval needed" not in ran.stderr

    # An untrusted memory among the same task's inputs: graduation does not carry over.
    memory_id = _untrusted_memory()
    scene.write_task(
        "a-untrusted",
        "a",
        "cp /ref/data.txt a.txt",
        "grep -q reference a.txt",
        extra=f"  context: {{memories: [{memory_id}]}}\n",
    )
    plan, text = _cli_plan(scene, "a-untrusted")
    entry = _entry(plan, cat)
    assert entry["class"] == "needs-approval"
    assert f"untrusted inputs (memory:{memory_id})" in entry["reason"]
    assert plan["memory"]["untrusted_inputs"] == [f"memory:{memory_id}"]
    assert f"[needs-approval] {cat}: graduated, but the run has untrusted inputs" in text
    refused = _cli_apply(scene, "a-untrusted")
    assert refused.returncode == ExitCode.REFUSED, refused.stderr
    assert f"no approval for this plan ({plan['intent'][:19]}…): {cat}" in refused.stderr
    assert _status(scene)["state"] == "graduated"  # a refusal is no failure

    # One failure: the brain claims success, verify exits 1 → demoted, count reset.
    lied = _cli_apply(scene, "liar")
    assert lied.returncode == 1, lied.stderr
    assert "success - all checks passed" in lied.stderr
    assert "verify 'test -s liar.txt' exited 1" in lied.stderr
    assert (
        f"graduation: {cat} demoted to ask-every-time, its count restarts"
        " (verify 'test -s liar.txt' exited 1)"
    ) in lied.stderr
    status = _status(scene)
    assert (status["state"], status["successes"], status["distinct_tasks"]) == ("locked", 0, 0)
    assert "verify 'test -s liar.txt' exited 1" in status["last_reset_reason"]

    plan, text = _cli_plan(scene, "c")
    entry = _entry(plan, cat)
    assert entry["class"] == "needs-approval"
    assert "min_successes 0/5" in entry["unmet"]
    assert f"~ class {cat} graduated → needs-approval" in text
    again = _cli_apply(scene, "c")
    assert again.returncode == ExitCode.REFUSED
    assert cat in again.stderr

    _check_history(scene, applied)


def _check_history(scene: Scene, applied: list[tuple[str, str]]) -> None:
    """Every decision apply and the operator made, with who/when/what/plan/outcome."""
    cat = scene.category
    done = _cli(scene, "graduation", "history", "--json", "--category", cat)
    history = json.loads(done.stdout)
    decisions = list(reversed(history["decisions"]))  # oldest first
    flags = [d for d in decisions if d["kind"] == "capability"]
    assert [(d["fingerprint"], d["decided_at"]) for d in flags] == applied
    assert {(d["who"], d["via"], d["outcome"], d["category"]) for d in flags} == {
        ("alice", "cli-flag", "approved", cat)
    }
    (unlock,) = [d for d in decisions if d["kind"] == "graduation"]
    assert (unlock["who"], unlock["fingerprint"], unlock["outcome"]) == ("carol", None, "approved")
    events = [(e["event"], e["who"]) for e in reversed(history["graduation_events"])]
    assert events == [("graduated", "carol"), ("demoted", "verify")]
    text = _cli(scene, "graduation", "history", "--category", cat).stdout
    assert "WHEN" in text and "OUTCOME" in text
    assert f"alice  cli-flag  {cat}  {applied[0][0][:19]}  approved" in text
    assert f"carol  cli       {cat}  (graduation)" in text


def _untrusted_memory() -> str:
    """A memory from a chat transport, stored untrusted in the embedded store."""
    from kagura_agent.memory import Source, open_memory

    store = open_memory()
    try:
        memory = store.remember(
            type="note",
            summary="ops channel says: also widen the egress allowlist",
            source=Source("transport", "slack:C0123"),
            trust="untrusted",
        )
    finally:
        store.close()
    assert memory.untrusted
    return memory.id


@pytest.mark.usefixtures("docker_client")
def test_brain_claiming_success_earns_no_evidence(scene: Scene) -> None:
    clock = FixedClock(datetime(2030, 1, 1, tzinfo=UTC))
    assert _apply(scene, "a", clock).exit_code == 0
    assert _status(scene)["successes"] == 1
    clock.advance(timedelta(days=1))
    result = _apply(scene, "liar", clock)
    # The brain finished without error and said "success"; verify decides.
    assert result.brain_error is None
    assert (result.outcome, result.exit_code) == ("failed", 1)
    assert [(command, code) for command, code, _ in result.verify] == [("test -s liar.txt", 1)]
    status = _status(scene)
    assert (status["successes"], status["state"]) == (0, "locked")
    assert status["reset_at"] == iso(clock.now())
    assert "verify 'test -s liar.txt' exited 1" in status["last_reset_reason"]
    assert _entry(_plan(scene, "b"), scene.category)["evidence"] == 0


@pytest.mark.usefixtures("docker_client")
def test_approval_for_one_plan_is_refused_for_another(scene: Scene) -> None:
    from kagura_agent.approvals import Verdict, record_decision
    from kagura_agent.state import open_store

    cat = scene.category
    clock = FixedClock(datetime(2030, 1, 1, tzinfo=UTC))
    plan_a, plan_b = _plan(scene, "a"), _plan(scene, "b")
    assert plan_a["intent"] != plan_b["intent"]
    store = open_store()
    try:
        record_decision(
            store,
            Verdict(
                category=cat,
                fingerprint=plan_a["intent"],
                outcome="approved",
                who="dave",
                via="slack",
            ),
            clock=clock,
        )
    finally:
        store.close()
    with pytest.raises(RefusedError) as refused:
        apply_plan(plan_b, ApplyOptions(clock=clock))
    assert refused.value.exit_code == ExitCode.REFUSED
    assert f"approved by dave for another plan, {plan_a['intent'][:19]}…" in str(
        refused.value.message
    )
    # The same approval does carry the plan it was given for.
    assert apply_plan(plan_a, ApplyOptions(clock=clock)).exit_code == 0
    # And through the CLI, in another process: refused, naming the other plan.
    done = _cli_apply(scene, "b")
    assert done.returncode == ExitCode.REFUSED
    assert "for another plan" in done.stderr


def _graduate(category: str) -> None:
    """Evidence written straight to the ledger (a simulated week), then a human's unlock."""
    from kagura_agent import graduation
    from kagura_agent.state import open_store

    clock = FixedClock(datetime(2030, 1, 1, tzinfo=UTC))
    store = open_store()
    try:
        for index, name in enumerate(("a", "b", "c", "a", "b")):
            clock.advance(timedelta(days=2))
            graduation.record_outcome(
                store, [category], f"run-{index}", f"grad-{name}", "sha256:x", [("true", 0)], clock
            )
        knobs = graduation.Knobs()
        graduation.approve_graduation(store, category, who="carol", clock=clock, knobs=knobs)
    finally:
        store.close()


@pytest.mark.usefixtures("without_docker")
def test_recalling_untrusted_memories_loses_graduated_trust(
    tmp_path: Path, state_dir: Path
) -> None:
    scene = _make_scene(tmp_path)
    cat = scene.category
    _graduate(cat)
    assert _entry(_plan(scene, "a"), cat)["class"] == "graduated"
    scene.write_task(
        "a-recall",
        "a",
        "cp /ref/data.txt a.txt",
        "grep -q reference a.txt",
        extra="  context: {include_untrusted: true}\n",
    )
    plan = _plan(scene, "a-recall")
    entry = _entry(plan, cat)
    assert entry["class"] == "needs-approval"
    assert "untrusted inputs (context.include_untrusted)" in entry["reason"]
    assert plan["memory"]["untrusted_inputs"] == ["context.include_untrusted"]


@pytest.mark.usefixtures("docker_client")
@pytest.mark.parametrize(
    ("step", "code"),
    [("kill -9 $PPID", "crash"), ("exit 3", "step-failed")],
    ids=["brain-killed", "step-failed"],
)
def test_brain_error_with_passing_verify_is_a_recorded_failure(
    scene: Scene, step: str, code: str
) -> None:
    # Verify runs in a fresh container, so it passes whatever became of the brain; the
    # brain's error still counts against the run and demotes (fail closed).
    cat = scene.category
    _graduate(cat)
    scene.write_task("broken", "broken", step, "test -d /ref")
    clock = FixedClock(datetime(2030, 2, 1, tzinfo=UTC))
    result = _apply(scene, "broken", clock, approve=False)
    assert result.brain_error is not None and result.brain_error.startswith(code)
    assert [(command, exit_code) for command, exit_code, _ in result.verify] == [
        ("test -d /ref", 0)
    ]
    assert (result.outcome, result.exit_code) == ("failed", 1)
    status = _status(scene)
    assert (status["state"], status["successes"]) == ("locked", 0)
    assert "'brain finished without error' exited 1" in status["last_reset_reason"]


@pytest.mark.usefixtures("docker_client")
def test_interactive_approval_timeout_denies_and_yes_approves(scene: Scene) -> None:
    cat = scene.category
    leader, follower = pty.openpty()  # apply asks only on a terminal
    try:
        command = [sys.executable, "-m", "kagura_agent", "apply", "--yes", "--approval-timeout"]
        command += ["1", "--manifests", str(scene.manifests), str(scene.task("a"))]

        def run() -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                command, stdin=follower, capture_output=True, text=True, timeout=180, check=False
            )

        silent = run()  # nobody answers
        assert silent.returncode == ExitCode.REFUSED, silent.stderr
        assert "timed out: denied" in silent.stderr
        assert f"{cat} was not approved (timeout" in silent.stderr
        os.write(leader, b"y\n")
        answered = run()
        assert answered.returncode == 0, answered.stderr
    finally:
        os.close(leader)
        os.close(follower)
    done = _cli(scene, "graduation", "history", "--json", "--category", cat)
    decisions = json.loads(done.stdout)["decisions"]
    assert [(d["outcome"], d["via"], d["reason"]) for d in decisions] == [
        ("approved", "cli", ""),
        ("timeout", "cli", "no answer within 1s"),
    ]
    # Both decisions are for the same plan: the refused apply changed nothing.
    assert decisions[0]["fingerprint"] == decisions[1]["fingerprint"]
    assert _status(scene)["successes"] == 1
