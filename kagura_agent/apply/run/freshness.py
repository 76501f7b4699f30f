"""Is a saved plan still what the current inputs would produce here? If not, say what changed.

A saved plan is re-planned from its inputs with this host's facts. The intent (manifests
and task, ``plan.intent``) must be the same, or the plan is stale. Facts may differ — the
plan was made in CI, on the serve host or on another runner — and each difference is a
``FactChange``: one that changes a capability refuses (exit 6), the others are shown and
the plan compiled here is the one applied (same intent, this host's facts).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kagura_agent.errors import RefusedError
from kagura_agent.facts import ImagePin
from kagura_agent.membrane.registry import pull_pinned
from kagura_agent.membrane.runtime import check_image_digest, check_proxy_digest
from kagura_agent.paths import NEUTRAL_CWD, workdir
from kagura_agent.plan.build import Compiled, compile_tasks
from kagura_agent.plan.diff import diff_plans
from kagura_agent.plan.intent import FactChange, fact_changes, intent_fingerprint, intent_view
from kagura_agent.plan.model import Inputs, Plan, TaskSection
from kagura_agent.state import history, state_location


@dataclass(frozen=True)
class Localized:
    """A saved plan made ready for this host: ``plan`` is what to apply here."""

    plan: Plan
    changes: tuple[FactChange, ...]
    compiled: Compiled  # what ``plan`` was compiled from (mid-run amendments start here)


def localize(saved: Plan, log: Callable[[str], None] | None = None) -> Localized:
    """Pull the pinned image when this Docker host lacks it, then ``check_saved_plan_fresh``.

    What a runner calls for a plan made elsewhere: exit 6 when the intent is stale or a
    fact here changes a capability (another image among them).
    """
    pull_pinned(saved, log=log or (lambda _line: None))
    if saved["brain"]["runtime"] == "container" and saved["image"]["digest"]:
        check_image_digest(saved)  # the pinned image, or exit 6 naming what is here
    if saved["brain"]["runtime"] == "container":
        check_proxy_digest(saved)  # the pinned egress proxy too
    return check_saved_plan_fresh(saved)


def check_saved_plan_fresh(plan: Plan) -> Localized:
    """Re-plan ``plan``'s task from the same inputs with this host's facts.

    RefusedError (exit 6) when the intent differs, or when a fact that differs changes a
    capability; otherwise the plan compiled here, the facts that differ, and the compile
    (what a mid-run amendment starts from).
    """
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
    with contextlib.chdir(_planned_from(plan)):
        current = [
            c
            for c in compile_tasks(
                manifests, [task_path], pin=_pin(plan), proxy_pin=_proxy_pin(plan)
            )
            if c.plan["task"]["name"] == plan["task"]["name"]
        ]
    if not current:
        raise RefusedError(f"saved plan is stale: task {plan['task']['name']} no longer exists")
    changes = check_fresh(plan, current[0].plan)
    return Localized(current[0].plan, tuple(changes), current[0])


def refuse_agent_written(plan_file: Path, plan: Plan) -> None:
    """RefusedError (exit 6) when the saved plan's file or its task file changed while a
    run could write it (run history, state/history.py): a saved plan names its own authority. (The
    manifest files it is re-planned from are checked by every compile.)"""
    history.refuse_written(
        "this saved plan",
        [str(plan_file), str(plan["task"].get("path") or "")],
        state_location(),
        plan_file=str(plan_file),
    )


def _pin(plan: Plan) -> ImagePin | None:
    image = plan["image"]
    return ImagePin(image["digest"], image["pull"]) if image["digest"] else None


def _proxy_pin(plan: Plan) -> ImagePin | None:
    proxy = plan["egress"].get("proxy")
    return ImagePin(proxy["digest"], proxy["pull"]) if proxy and proxy["digest"] else None


def _planned_from(plan: Plan) -> str:
    """The working directory ``plan`` ran in, as far as its input names tell: the task's
    absolute path minus its shown name; else, when every input is named absolutely (or as
    ``<packaged>/NAME``), a folder where they all are again (the neutral folder: nothing
    is under it); else the folder this apply works for (paths.workdir)."""
    task: TaskSection = plan["task"]
    path, shown = str(task.get("path") or ""), str(task.get("file") or "")
    if shown and not shown.startswith("/") and path.endswith("/" + shown):
        folder = path[: -len(shown) - 1] or "/"
        if Path(folder).is_dir():
            return folder
    names = plan["inputs"].get("files", {})
    if all(name.startswith(("/", "<packaged>/")) for name in names):
        # Planned outside the task's folder and the packaged set (a checkout's manifests/
        # would be named relative to a folder above it).
        return NEUTRAL_CWD
    return str(workdir())


def check_fresh(saved: Plan, current: Plan) -> list[FactChange]:
    """The facts that differ between ``saved`` and ``current`` (the same intent compiled
    here); RefusedError (exit 6) naming the inputs that changed when the intent differs,
    or the facts when one changes a capability."""
    if saved["fingerprint"] == current["fingerprint"]:
        return []
    # Recomputed, not read: the intent field is only as good as the content it hashes.
    if intent_fingerprint(saved) != intent_fingerprint(current):
        changed = changed_inputs(saved["inputs"], current["inputs"]) or changed_output(
            saved, current
        )
        raise RefusedError(
            "saved plan is stale: " + "; ".join(changed),
            hint="run `kagura-agent plan -o` again and review the new plan",
        )
    changes = fact_changes(saved, current)
    refused = [change.render() for change in changes if change.capability]
    if refused:
        raise RefusedError(
            "this host's facts change what the plan grants: " + "; ".join(refused),
            hint="plan again on this host (or one like the planning host) and review it",
        )
    return changes


def changed_output(saved: Plan, current: Plan) -> list[str]:
    """Same inputs, different intent: name the sections the planner now fills differently."""
    old = intent_view(saved)
    new = intent_view(current)
    keys = sorted(set(old) | set(new))
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
    return changes
