"""How deep sub-agents nest and how many one run asks for: Policy ceilings ``depth`` and
``children_total`` (plan/budget.py sets the plan's limits; apply/midrun/dispatch.py refuses past
them). Planner part through facts; Docker part with real runs: a chain of sub-agents
dispatching sub-agents stops at the depth ceiling, and a fan-out at the total ceiling,
each with the reason as the refused dispatch's answer. Before, children dispatched
grandchildren without any depth limit and a run could ask for sub-agents without end.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

from apply_helpers import cli_env, kagura, last_json, make_project, manifest_set, write_task

from kagura_agent.apply.midrun.dispatch import _may_not_dispatch
from kagura_agent.paths import repo_root
from kagura_agent.plan.build import plan_tasks
from testing.agent_test_image import ensure_agent_test_image

ROOT = repo_root()
assert ROOT is not None
MANIFESTS = str(ROOT / "manifests")
MEMTOOL = "python3 -m kagura_agent.brain.memtool dispatch"
DEEPEST = (
    "this run is a sub-agent 2 deep, as deep as sub-agents may nest"
    " (Policy ceilings.depth 2): it may not dispatch"
)


def _task(folder: Path, name: str, extra: str = "") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "task.yml"
    path.write_text(
        f"apiVersion: kagura.dev/v1\nkind: Task\nmetadata: {{name: {name}}}\n"
        f'spec:\n  steps: ["true"]\n{extra}',
        encoding="utf-8",
    )
    return path


def _plan(task: Path, facts: dict[str, Any], tmp_path: Path) -> dict[str, Any]:
    facts_file = tmp_path / "facts.json"
    facts_file.write_text(json.dumps(facts), encoding="utf-8")
    [plan] = plan_tasks(MANIFESTS, [str(task)], facts_file=str(facts_file))
    return plan


def test_each_level_of_sub_agents_is_one_deeper_and_the_deepest_dispatches_none(
    tmp_path: Path,
) -> None:
    root = tmp_path / "proj"
    plan = _plan(_task(root, "top"), {}, tmp_path)
    limits = [
        (plan["budget"]["depth"], plan["budget"]["children"], plan["budget"]["children_total"])
    ]
    for name in ("one", "two", "three"):
        root = root / name
        child = f"  parent: {{task: {plan['task']['name']}, context: []}}\n"
        plan = _plan(_task(root, name, child), {"parent_plan": plan}, tmp_path)
        budget = plan["budget"]
        limits.append((budget["depth"], budget["children"], budget["children_total"]))
        assert budget["max_depth"] == 2  # the packaged membrane Policy
    # An operator's run and its children may dispatch (2 at once, 8 in all); a child's
    # child is as deep as sub-agents nest: it may not; one deeper is refused outright.
    assert limits == [(0, 2, 8), (1, 2, 8), (2, 0, 0), (3, 0, 0)]
    [refusal] = [r for r in plan["refusals"] if r["code"] == "dispatch-depth"]
    assert refusal["message"] == (
        "a sub-agent 3 deep is past the deepest sub-agents may nest, 2"
        " (Policy membrane (packaged); ceilings.depth)"
    )
    assert plan["applyable"] is False
    # The dispatching host's word on the depth counts when it is the deeper one.
    said = "  parent: {task: top, context: [], depth: 3}\n"
    top = _plan(_task(tmp_path / "proj", "top"), {}, tmp_path)
    deep = _plan(_task(tmp_path / "proj" / "x", "x", said), {"parent_plan": top}, tmp_path)
    assert deep["budget"]["depth"] == 3 and not deep["applyable"]


def test_past_a_dispatch_ceiling_every_request_is_refused_saying_which() -> None:
    budget: Any = {"depth": 1, "max_depth": 2, "children": 2, "children_total": 3}
    assert _may_not_dispatch(budget, 3) == []
    assert _may_not_dispatch(budget, 4) == [
        "this run has asked for 4 sub-agents, past the 3 it may ask for in all"
        " (Policy ceilings.children_total)"
    ]
    assert _may_not_dispatch({**budget, "depth": 2, "children": 0}, 1) == [DEEPEST]
    assert _may_not_dispatch({**budget, "children": 0}, 1) == [
        "this run may not dispatch sub-agents (Policy ceilings.children)"
    ]
    assert _may_not_dispatch({**budget, "depth": 0, "max_depth": 0}, 1) == [
        "this run may not dispatch sub-agents (Policy ceilings.depth 0)"
    ]


# --- real runs ------------------------------------------------------------------------


def _dispatch(name: str, step: str) -> str:
    return f"{MEMTOOL} {shlex.quote('do ' + name)} --name {name} --step {shlex.quote(step)}"


def _chain(names: list[str]) -> str:
    """A step dispatching ``names[0]``, whose own step dispatches ``names[1]``, and so on;
    each level keeps the answer it got in ``<name>.json`` and goes on."""
    name, rest = names[0], names[1:]
    step = _chain(rest) if rest else f"echo {name} > {name}.txt"
    return f"{_dispatch(name, step)} > {name}.json; true"


def _manifests(tmp_path: Path, docker_client: Any, *extra: dict[str, Any]) -> Path:
    image = {
        "kind": "Image",
        "metadata": {"name": "agent-test"},
        "spec": {"recipe": "images/agent", "tag": ensure_agent_test_image(docker_client)},
    }
    image["spec"]["baseline"] = True
    return manifest_set(tmp_path, image, *extra)


def test_a_chain_of_sub_agents_stops_at_the_depth_ceiling(
    docker_client: Any, tmp_path: Path, state_dir: Path
) -> None:
    manifests = _manifests(tmp_path, docker_client)
    project = make_project(tmp_path)
    spec = {"image": "agent-test", "brain": "script", "steps": [_chain(["one", "two", "three"])]}
    task = write_task(project, "top", spec)
    done = kagura(
        ["apply", "--yes", "--json", "--manifests", str(manifests), str(task)], cli_env(state_dir)
    )
    assert done.returncode == 0, done.stderr[-4000:]
    [one] = last_json(done.stdout)["children"]
    assert one["outcome"] == "success", one
    assert json.loads((project / "one.json").read_text())["outcome"] == "success"
    assert json.loads((project / "one" / "two.json").read_text())["outcome"] == "success"
    # Two is a sub-agent 2 deep: its dispatch is refused, nothing of three ran.
    refused = json.loads((project / "one" / "two" / "three.json").read_text())
    assert refused == {"outcome": "refused", "task": "three", "reasons": [DEEPEST]}
    assert not (project / "one" / "two" / "three").exists()
    [plan_file] = (state_dir / "dispatch").glob("*/two.plan.json")
    budget = json.loads(plan_file.read_text())["budget"]
    assert (budget["depth"], budget["max_depth"], budget["children"]) == (2, 2, 0)


def test_a_fan_out_stops_at_the_children_total_ceiling(
    docker_client: Any, tmp_path: Path, state_dir: Path
) -> None:
    few = {
        "kind": "Policy",
        "metadata": {"name": "few"},
        "spec": {"ceilings": {"children_total": 2}},
    }
    manifests = _manifests(tmp_path, docker_client, few)
    project = make_project(tmp_path)
    names = ("a", "b", "c", "d")
    fan = "; ".join(
        f"{_dispatch(name, f'echo {name} > {name}.txt')} > {name}.json" for name in names
    )
    spec = {"image": "agent-test", "brain": "script", "steps": [fan + "; true"]}
    task = write_task(project, "fan", spec)
    done = kagura(
        ["apply", "--yes", "--json", "--manifests", str(manifests), str(task)], cli_env(state_dir)
    )
    assert done.returncode == 0, done.stderr[-4000:]
    children = {c["task"]: c for c in last_json(done.stdout)["children"]}
    assert [children[n]["outcome"] for n in names] == ["success", "success", "refused", "refused"]
    for number, name in enumerate(("c", "d"), start=3):
        reason = (
            f"this run has asked for {number} sub-agents, past the 2 it may ask for in all"
            " (Policy ceilings.children_total)"
        )
        assert children[name]["reasons"] == [reason]
        assert json.loads((project / f"{name}.json").read_text())["reasons"] == [reason]
        assert children[name]["run"] is None and not (project / name).exists()
