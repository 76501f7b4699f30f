"""The plan's budget section: pure, like the rest of the planner.

Where each limit comes from, first match wins per dimension:

1. the task's own budget (``spec.budget``);
2. learnt from the task kind's cost history — only what the host measured (model calls
   counted at the proxy, its wall clock; patterns/cost_history.MEASURED), once
   ``budget_min_runs`` runs are recorded; grown by at most ``budget_step`` (x1.5) of the
   limit the newest run was held to; cut to the Policy ceiling;
3. the brain's budget, else the defaults (manifest/task.DEFAULT_BUDGET);

and a dispatched child's limits are then cut to what its parent had left for it
(``spec.parent.budget``, written by the host: apply/midrun/allotment.py), and never exceed the
parent's last applied plan: never the brain's defaults over a parent with less. A resumed
session's limits are last cut to what the session has left (plan/resume.py).

A learnt limit above the one step 3 (or 1) would give — the *default* — is a capability
the operator grants: ``budget_approvals`` names it ``budget:<dimension>`` and the planner
classifies it like any other (needs approval unless graduated or baseline). Engines
report turns and dollars from inside the agent's container; those are shown in the
forecast and never learnt, so a tampered engine cannot raise the next run's budget.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kagura_agent.facts import Facts
from kagura_agent.graduation.settings import graduation_settings
from kagura_agent.manifest.catalog import Catalog
from kagura_agent.manifest.ceilings import Ceiling, budget_ceilings, over_ceilings
from kagura_agent.manifest.task import ResolvedTask
from kagura_agent.patterns.cost_history import (
    DIMENSIONS,
    forecast,
)
from kagura_agent.plan import resume
from kagura_agent.plan.model import (
    Budget,
    BudgetSource,
    CostFigures,
    Forecast,
    ParentBudget,
    Refusal,
)
from kagura_agent.units import format_duration, parse_duration, parse_size

CEILING_KEYS = {"turns": "turns", "wall_seconds": "wall_time", "cost_usd": "cost_usd"}
PARENT_DIMENSIONS = ("turns", "wall_seconds", "cost_usd")
# Without a Policy saying otherwise: children may not dispatch, and a run asks for at most
# this many sub-agents in all.
DEFAULT_MAX_DEPTH = 1
DEFAULT_CHILDREN_TOTAL = 8


def plan_budget(task: ResolvedTask, facts: Facts, catalog: Catalog) -> Budget:
    """The run's limits (see the module docstring for where each comes from)."""
    budget = task.budget
    explicit = task.manifest.spec.get("budget", {})
    default: dict[str, Any] = {
        "turns": budget.get("turns"),
        "tokens": None,
        "wall_seconds": parse_duration(budget["wall_time"]),
        "cost_usd": budget.get("cost_usd"),
    }
    limits = dict(default)
    source: BudgetSource = (
        "task" if explicit else "brain" if task.brain.spec.get("budget") else "default"
    )
    knobs = graduation_settings(catalog).budget
    min_runs, step = knobs.min_runs, knobs.step
    runs = (facts.cost_history or {}).get("runs") or []
    predicted = forecast(runs, reserve=knobs.reserve, q=knobs.quantile, floors=knobs.floors)
    shown: Forecast | None = None
    if predicted is not None:
        own = {"wall_time" if dim == "wall_seconds" else dim for dim in explicit}
        # Too few runs: the forecast is shown, the budget is not set from it yet.
        learnt = [
            dim
            for dim in DIMENSIONS
            if predicted["limits"][dim] is not None
            and ("wall_time" if dim == "wall_seconds" else dim) not in own
            and predicted["runs"] >= min_runs
        ]
        previous = _previous(runs)
        ceilings = budget_ceilings(catalog)
        for dim in learnt:
            value = predicted["limits"][dim]
            base = previous.get(dim) if previous else None
            base = base if base is not None else default[dim]
            if base is not None:
                value = min(value, _grown(dim, base, step))
            # A learnt limit never makes the plan unapplyable: it stops at the ceiling.
            ceiling = ceilings.get(CEILING_KEYS.get(dim, dim))
            if ceiling is not None and value > ceiling.limit:
                value = ceiling.limit
            limits[dim] = round(value, 4) if dim == "cost_usd" else int(value)
        if learnt:
            source = "history"
        shown = {
            "basis": predicted["basis"] + ", host-measured",
            "runs": predicted["runs"],
            "quantile": predicted["quantile"],
            "reserve": predicted["reserve"],
            "expected": predicted["expected"],
            "limits": predicted["limits"],
            "reported": predicted["reported"],
            "retries": predicted["retries"],
            "min_runs": min_runs,
            "learnt": learnt,
            "step": step,
            "previous": _figures(previous) if previous else None,
            "default": _figures(default),
            "over_default": [
                dim for dim in learnt if default[dim] is not None and limits[dim] > default[dim]
            ],
        }
    dispatch = _dispatch(catalog, task, facts)
    parent = _parent_bound(task, facts)
    if parent is not None:
        bounds: dict[str, Any] = {**parent}
        for dim in PARENT_DIMENSIONS:
            bound = bounds[dim]
            if bound is not None and (limits[dim] is None or limits[dim] > bound):
                limits[dim] = bound
                source = "parent"
    session = resume.resumed(facts.checkpoint, task.credentials)
    if session is not None and resume.cut(limits, session):
        source = "session"
    planned: Budget = {
        "turns": limits["turns"],
        "tokens": limits["tokens"],
        "wall_seconds": int(limits["wall_seconds"]),
        "cost_usd": limits["cost_usd"],
        "disk_bytes": parse_size(str(budget.get("disk", "1g"))),
        "children": dispatch.children,
        "children_total": dispatch.children_total,
        "depth": dispatch.depth,
        "max_depth": dispatch.max_depth,
        "source": source,
        "forecast": shown,
        "parent": parent,
    }
    if session is not None:
        planned["resumed"] = session
    return planned


def _parent_bound(task: ResolvedTask, facts: Facts) -> ParentBudget | None:
    """A dispatched child's most: its share of what the running parent had left (the
    host wrote it into the task), never more than the parent's last applied plan gave the
    parent itself. None for a run without a parent, or a parent that never ran (the
    planner refuses that child anyway)."""
    if task.parent is None:
        return None
    bounds: list[Mapping[str, Any]] = []
    if task.parent.get("budget") is not None:
        bounds.append(task.parent["budget"])
    if facts.parent_plan is not None:
        bounds.append(facts.parent_plan["budget"])
    if not bounds:
        return None
    least: dict[str, Any] = {}
    for dim in PARENT_DIMENSIONS:
        given: list[Any] = [b[dim] for b in bounds if b.get(dim) is not None]
        least[dim] = min(given) if given else None
    return {
        "turns": least["turns"],
        "wall_seconds": least["wall_seconds"],
        "cost_usd": least["cost_usd"],
        "bound": "remaining" if task.parent.get("budget") is not None else "plan",
    }


def budget_approvals(budget: Budget) -> list[tuple[str, str]]:
    """``(category, why)`` for each learnt limit above its default: capabilities the
    operator grants (the planner classifies them like any other)."""
    shown = budget["forecast"]
    if shown is None:
        return []
    now: dict[str, Any] = {**budget}
    default: dict[str, Any] = {**shown["default"]}
    return [
        (
            f"budget:{dim}",
            f"learnt {_shown(dim, now[dim])} from {shown['basis']},"
            f" over the default {_shown(dim, default[dim])} (at most x{shown['step']:g} a run)",
        )
        for dim in shown["over_default"]
    ]


def ceiling_refusals(catalog: Catalog, budget: Budget) -> list[Refusal]:
    """A budget over an operator-granted ceiling (manifest.ceilings) is refused, and so is
    a sub-agent nested deeper than sub-agents may."""
    ceilings = budget_ceilings(catalog)
    asked = {
        "turns": budget["turns"],
        "wall_time": budget["wall_seconds"],
        "cost_usd": budget["cost_usd"],
        "disk": budget["disk_bytes"],
    }
    found: list[Refusal] = [
        {
            "code": "budget-ceiling",
            "message": f"{message} ({ceiling.source}; raise it in a Policy of yours: spec.ceilings)",
            "source": ceiling.source,
        }
        for ceiling, message in over_ceilings(asked, ceilings)
    ]
    if budget["depth"] > budget["max_depth"]:
        depth = ceilings.get("depth")
        source = depth.source if depth is not None else "the default"
        found.append(
            {
                "code": "dispatch-depth",
                "message": f"a sub-agent {budget['depth']} deep is past the deepest sub-agents"
                f" may nest, {budget['max_depth']} ({source}; ceilings.depth)",
                "source": source,
            }
        )
    return found


def _grown(dim: str, base: float, step: float) -> float:
    """The most one run lets ``base`` grow to (whole turns, seconds and tokens down)."""
    grown = base * step
    return round(grown, 4) if dim == "cost_usd" else float(math.floor(grown))


def _previous(runs: list[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The limits the newest recorded run was held to; None for an older record."""
    found = runs[0].get("budget") if runs else None
    if not isinstance(found, Mapping):
        return None
    figures: dict[str, Any] = {}
    for dim in DIMENSIONS:
        value = found.get(dim)
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
            or value <= 0
        ):
            value = None
        figures[dim] = value if value is None or dim == "cost_usd" else int(value)
    return figures


def _figures(values: Mapping[str, Any]) -> CostFigures:
    return {
        "turns": values["turns"],
        "tokens": values["tokens"],
        "wall_seconds": values["wall_seconds"],
        "cost_usd": values["cost_usd"],
    }


def _shown(dim: str, value: float | None) -> str:
    if value is None:
        return "none"
    if dim == "cost_usd":
        return f"${value:g}"
    if dim == "wall_seconds":
        return format_duration(int(value)) + " wall"
    return f"{int(value):,} {dim}"


@dataclass(frozen=True)
class _Dispatch:
    children: int
    children_total: int
    depth: int
    max_depth: int


def _dispatch(catalog: Catalog, task: ResolvedTask, facts: Facts) -> _Dispatch:
    """How many sub-agents the run may have at once and in all, how deep it nests and how
    deep they may: the Policy ceilings, else the defaults. A run as deep as sub-agents may
    nest dispatches nothing."""
    ceilings = budget_ceilings(catalog)
    depth = _depth(task, facts)
    max_depth = _ceiling(ceilings, "depth", DEFAULT_MAX_DEPTH)
    may = depth < max_depth
    return _Dispatch(
        children=_ceiling(ceilings, "children", 0) if may else 0,
        children_total=_ceiling(ceilings, "children_total", DEFAULT_CHILDREN_TOTAL) if may else 0,
        depth=depth,
        max_depth=max_depth,
    )


def _depth(task: ResolvedTask, facts: Facts) -> int:
    """0 for an operator's run; a child one below its parent's last applied plan, or as
    deep as the dispatching host says (``spec.parent.depth``), whichever is deeper (a plan
    recorded under the parent's name meanwhile never makes a chain shallower)."""
    if task.parent is None:
        return 0
    said = task.parent.get("depth") or 1
    parent = facts.parent_plan
    # A parent plan of an older format has no depth: it was an operator's run.
    above = int(parent["budget"].get("depth", 0)) + 1 if parent is not None else 1
    return max(said, above)


def _ceiling(ceilings: Mapping[str, Ceiling], key: str, default: int) -> int:
    ceiling = ceilings.get(key)
    return int(ceiling.limit) if ceiling is not None else default
