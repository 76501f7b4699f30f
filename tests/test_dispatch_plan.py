"""Sub-agent dispatch in the planner: a child task (spec.parent) may only narrow its
parent's last applied plan. The parent plan arrives through facts (``parent_plan``), so
these tests plan in-process with a facts file and never touch the state store."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kagura_agent.brain.plan_turn import turn_from_plan
from kagura_agent.cli.main import main
from kagura_agent.paths import repo_root
from kagura_agent.plan.build import plan_tasks
from kagura_agent.plan.planner import fingerprint

ROOT = repo_root()
assert ROOT is not None
MANIFESTS = str(ROOT / "manifests")


def _task(folder: Path, name: str, extra: str = "") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "task.yml"
    path.write_text(
        "apiVersion: kagura.dev/v1\nkind: Task\n"
        f"metadata: {{name: {name}}}\n"
        'spec:\n  steps: ["echo hi > out.txt"]\n  verify: ["test -f out.txt"]\n' + extra,
        encoding="utf-8",
    )
    return path


def _plan(task: Path, facts: dict[str, Any], tmp_path: Path) -> dict[str, Any]:
    facts_file = tmp_path / "facts.json"
    facts_file.write_text(json.dumps(facts), encoding="utf-8")
    [plan] = plan_tasks(MANIFESTS, [str(task)], facts_file=str(facts_file))
    return plan


@pytest.fixture()
def parent_plan(tmp_path: Path) -> dict[str, Any]:
    """The parent: its project root holds the child's, and it may reach pypi."""
    task = _task(tmp_path / "proj", "parent", "  egress: [pypi]\n")
    return _plan(task, {}, tmp_path)


CHILD = "  parent: {task: parent, context: [mem-a, mem-b]}\n"


def test_a_narrower_child_is_applyable_and_records_its_parent(
    tmp_path: Path, parent_plan: dict[str, Any]
) -> None:
    child_task = _task(tmp_path / "proj" / "sub", "child", CHILD)
    facts = {"parent_plan": parent_plan, "parent_run": "run-parent1"}
    plan = _plan(child_task, facts, tmp_path)
    assert plan["task"]["parent"] == {
        "task": "parent",
        "run": "run-parent1",
        "context_memories": ["mem-a", "mem-b"],
        "narrowing": [],
    }
    assert plan["applyable"] is True
    assert plan["refusals"] == []
    # The brain receives the context by id, never as prompt text.
    assert turn_from_plan(plan).context.memory_ids == ("mem-a", "mem-b")
    # Pure: the same inputs give the same plan.
    assert _plan(child_task, facts, tmp_path)["fingerprint"] == plan["fingerprint"]
    assert plan["fingerprint"] == fingerprint(plan)


def test_a_child_that_widens_egress_is_not_applyable(
    tmp_path: Path, parent_plan: dict[str, Any]
) -> None:
    child_task = _task(tmp_path / "proj" / "sub", "child", CHILD + "  egress: [github]\n")
    plan = _plan(child_task, {"parent_plan": parent_plan}, tmp_path)
    narrowing = plan["task"]["parent"]["narrowing"]
    assert narrowing and all("not allowed to the parent" in v for v in narrowing)
    assert any("api.github.com" in v for v in narrowing)
    assert plan["applyable"] is False
    refused = [r for r in plan["refusals"] if r["code"] == "child-widens-parent"]
    assert len(refused) == len(narrowing) == len(plan["refusals"])
    assert all(r["source"] == "$.task.parent" for r in refused)
    assert not [w for w in plan["warnings"] if "refused" in w]


def test_a_child_outside_the_parents_mounts_is_not_applyable(
    tmp_path: Path, parent_plan: dict[str, Any]
) -> None:
    child_task = _task(tmp_path / "elsewhere", "child", CHILD)
    plan = _plan(child_task, {"parent_plan": parent_plan}, tmp_path)
    [violation] = plan["task"]["parent"]["narrowing"]
    assert "outside every parent mount" in violation
    assert plan["applyable"] is False


def test_a_parent_that_never_applied_bounds_nothing_so_the_child_is_refused(
    tmp_path: Path,
) -> None:
    child_task = _task(tmp_path / "proj" / "sub", "child", CHILD)
    plan = _plan(child_task, {}, tmp_path)
    assert plan["task"]["parent"]["narrowing"] is None
    assert plan["applyable"] is False
    [refusal] = plan["refusals"]
    assert refusal["code"] == "parent-not-applied" and "has no applied plan" in refusal["message"]


def test_plans_without_a_parent_are_unchanged(tmp_path: Path) -> None:
    plan = _plan(_task(tmp_path / "solo", "solo"), {}, tmp_path)
    assert "parent" not in plan["task"]  # golden plans keep their exact JSON


def test_widening_is_rendered_and_refused_by_apply(
    tmp_path: Path,
    parent_plan: dict[str, Any],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("NO_COLOR", "1")
    child_task = _task(tmp_path / "proj" / "sub", "child", CHILD + "  egress: [github]\n")
    facts_file = tmp_path / "facts.json"
    facts_file.write_text(json.dumps({"parent_plan": parent_plan}), encoding="utf-8")
    args = [str(child_task), "--manifests", MANIFESTS, "--facts", str(facts_file)]
    assert main(["plan", *args]) == 6  # refused: plan exits 6
    out = capsys.readouterr().out
    assert "parent       task parent; context memories: mem-a, mem-b" in out
    assert "WIDENS the parent: egress https://api.github.com:443" in out
    assert "applyable    NO" in out
    assert main(["plan", "--format", "markdown", *args]) == 6
    assert "| parent | task `parent` (egress https://api.github.com:443" in capsys.readouterr().out

    from kagura_agent.apply.run.executor import ApplyOptions, refuse_unapplyable
    from kagura_agent.errors import RefusedError

    plan = _plan(child_task, {"parent_plan": parent_plan}, tmp_path)
    with pytest.raises(RefusedError, match="child widens parent 'parent'"):
        refuse_unapplyable(plan, ApplyOptions())


def test_a_forgotten_context_memory_is_a_warning(
    tmp_path: Path, parent_plan: dict[str, Any]
) -> None:
    child_task = _task(tmp_path / "proj" / "sub", "child", CHILD)
    facts = {"parent_plan": parent_plan, "missing_memories": ["mem-b"]}
    plan = _plan(child_task, facts, tmp_path)
    assert (
        "context memory mem-b does not exist (forgotten?); the brain will not find it"
        in (plan["warnings"])
    )
    assert plan["applyable"] is True  # the handoff is thinner, not wider


@pytest.mark.parametrize("workdir", [".git", ".git/hooks", "tasks", "up"])
def test_a_child_cannot_write_what_the_parent_had_read_only(tmp_path: Path, workdir: str) -> None:
    """The attack: the parent's brain dispatches a child whose workdir is a folder the
    parent had mounted read-only over its root (its ``.git``, the folder of its task file),
    or a symlink it made to the root itself (``up -> .``: the child's root is the parent's,
    without the parent's task file protected). The child's root is its only writable
    mount, so the child would write the hooks the operator's next git command runs, or
    the task file the next run is planned from."""
    proj = tmp_path / "proj"
    (proj / ".git" / "hooks").mkdir(parents=True)
    (proj / "tasks").mkdir()
    (proj / "up").symlink_to(".")
    parent_task = proj / "tasks" / "parent.yml"
    parent_task.write_text(
        "apiVersion: kagura.dev/v1\nkind: Task\nmetadata: {name: parent}\n"
        'spec:\n  project_root: ..\n  steps: ["true"]\n',
        encoding="utf-8",
    )
    parent = _plan(parent_task, {}, tmp_path)
    assert {m["target"] for m in parent["mounts"] if m["kind"] == "protected"} >= {
        "/workspace/.git",
        "/workspace/tasks",
    }
    # Where apply/midrun/dispatch.py writes it: in the state directory, its root the workdir.
    child_task = _task(
        tmp_path / "state" / "children",
        "child",
        CHILD + f"  project_root: {proj / workdir}\n",
    )
    plan = _plan(child_task, {"parent_plan": parent, "parent_run": "run-p"}, tmp_path)
    narrowing = plan["task"]["parent"]["narrowing"]
    if workdir == "up":
        expected = f"mount {proj} makes {proj / 'tasks'} writable, read-only in the parent"
    else:
        expected = f"mount {proj / workdir} is rw but read-only in the parent"
    assert len(narrowing) == 1 and narrowing[0].startswith(expected), narrowing
    assert ("git metadata" if ".git" in workdir else "(this task file)") in narrowing[0]
    assert plan["applyable"] is False


def test_a_child_is_planned_from_what_its_parent_had_left_never_the_brains_defaults(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The parent held 2 turns and $0.05 (its own budget); the script brain's default is
    50 turns and no dollar limit. Before, the child got exactly those defaults."""
    parent_task = _task(
        tmp_path / "proj", "parent", "  budget: {turns: 2, cost_usd: 0.05, wall_time: 10m}\n"
    )
    parent = _plan(parent_task, {}, tmp_path)
    facts = {"parent_plan": parent, "parent_run": "run-parent1"}
    # A child task written by hand: its parent's plan bounds it.
    by_hand = _plan(_task(tmp_path / "proj" / "sub", "child", CHILD), facts, tmp_path)
    budget = by_hand["budget"]
    assert (budget["turns"], budget["cost_usd"], budget["wall_seconds"]) == (2, 0.05, 600)
    assert budget["source"] == "parent" and budget["parent"]["bound"] == "plan"
    # Dispatched: the host wrote what the running parent had left (1 turn, $0.02, 5m).
    left = "  parent: {task: parent, context: [], budget: {turns: 1, cost_usd: 0.02, wall_time: 300s}}\n"
    dispatched = _plan(_task(tmp_path / "proj" / "d", "child", left), facts, tmp_path)
    budget = dispatched["budget"]
    assert (budget["turns"], budget["cost_usd"], budget["wall_seconds"]) == (1, 0.02, 300)
    assert budget["parent"] == {
        "turns": 1,
        "wall_seconds": 300,
        "cost_usd": 0.02,
        "bound": "remaining",
    }
    assert dispatched["applyable"] is True
    # A share written larger than the parent's own plan is still cut to the plan.
    more = "  parent: {task: parent, context: [], budget: {turns: 40, cost_usd: 9}}\n"
    cut = _plan(_task(tmp_path / "proj" / "m", "child", more), facts, tmp_path)["budget"]
    assert (cut["turns"], cut["cost_usd"]) == (2, 0.05)
    monkeypatch.setenv("NO_COLOR", "1")
    facts_file = tmp_path / "facts.json"
    facts_file.write_text(json.dumps(facts), encoding="utf-8")
    task = str(tmp_path / "proj" / "d" / "task.yml")
    assert main(["plan", task, "--manifests", MANIFESTS, "--facts", str(facts_file)]) == 0
    text = capsys.readouterr().out
    assert "(from parent); at most what its parent had left: 1 turns, 5m wall, $0.02" in text
