"""Is a saved plan still what the current inputs would produce? If not, say what changed."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kagura_agent.errors import RefusedError
from kagura_agent.plan.build import plan_tasks
from kagura_agent.plan.diff import diff_plans
from kagura_agent.plan.model import Inputs, Plan, TaskSection


def check_saved_plan_fresh(plan: Plan) -> None:
    """Re-plan ``plan``'s task from the same inputs; RefusedError (exit 6) when it differs."""
    inputs = plan["inputs"]
    manifests = inputs.get("manifests_dir", "")
    task_path = plan["task"].get("path")
    if "@" in manifests or not task_path or not Path(task_path).exists():
        raise RefusedError(
            "saved plan is stale: its task file or manifest directory is gone",
            hint="make a new plan",
        )
    # Input files are named relative to the folder the plan was made in; re-plan from
    # there, so a plan applied from another working directory is not called stale.
    with contextlib.chdir(_planned_from(plan["task"])):
        current = [
            p
            for p in plan_tasks(manifests, [task_path])
            if p["task"]["name"] == plan["task"]["name"]
        ]
    if not current:
        raise RefusedError(f"saved plan is stale: task {plan['task']['name']} no longer exists")
    check_fresh(plan, current[0])


def _planned_from(task: TaskSection) -> str:
    """The working directory ``plan`` ran in: the task's absolute path minus its shown name."""
    path, shown = str(task.get("path") or ""), str(task.get("file") or "")
    if shown and not shown.startswith("/") and path.endswith("/" + shown):
        folder = path[: -len(shown) - 1] or "/"
        if Path(folder).is_dir():
            return folder
    return os.getcwd()


def check_fresh(saved: Plan, current: Plan) -> None:
    """Raise RefusedError (exit 6) naming the inputs that changed since ``saved`` was made."""
    if saved["fingerprint"] == current["fingerprint"]:
        return
    changed = changed_inputs(saved["inputs"], current["inputs"]) or changed_output(saved, current)
    raise RefusedError(
        "saved plan is stale: " + "; ".join(changed),
        hint="run `kagura-agent plan -o` again and review the new plan",
    )


def changed_output(saved: Plan, current: Plan) -> list[str]:
    """Same inputs, different plan: name the sections the planner now fills differently."""
    old: Mapping[str, Any] = saved
    new: Mapping[str, Any] = current
    keys = sorted(k for k in set(old) | set(new) if k != "fingerprint")
    sections = [k for k in keys if old.get(k) != new.get(k)] or ["fingerprint only"]
    details = [change.render() for change in diff_plans(saved, current)]
    text = "the compiled plan differs in " + ", ".join(sections)
    return [text + (": " + "; ".join(details) if details else "")]


def changed_inputs(old: Inputs, new: Inputs) -> list[str]:
    changes = []
    old_files, new_files = old.get("files", {}), new.get("files", {})
    for name in sorted(set(old_files) | set(new_files)):
        if name not in new_files:
            changes.append(f"{name} was removed")
        elif name not in old_files:
            changes.append(f"{name} was added")
        elif old_files[name] != new_files[name]:
            changes.append(f"{name} changed")
    for key in ("layers", "overrides"):
        if old.get(key) != new.get(key):
            changes.append(f"manifest {key} {old.get(key)} → {new.get(key)}")
    for key in ("tool_version", "schema_version"):
        if old.get(key) != new.get(key):
            changes.append(f"{key} {old.get(key)} → {new.get(key)}")
    old_facts, new_facts = old.get("facts", {}), new.get("facts", {})
    for key in sorted(set(old_facts) | set(new_facts)):
        if old_facts.get(key) != new_facts.get(key):
            changes.append(f"fact {key} {old_facts.get(key)} → {new_facts.get(key)}")
    return changes
