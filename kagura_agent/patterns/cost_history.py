"""Cost history: every run records turns, wall time, cost (when the brain reports it),
retries and outcome; the planner reads the history of the same task kind and sets the
budget with a reserve over the mean."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from statistics import fmean
from typing import Any

from kagura_agent.memory.model import Memory, MemoryStore, Source

RUN_COST = "run-cost"


@dataclass(frozen=True)
class RunCost:
    run_id: str
    task_kind: str
    turns: int
    wall_seconds: float
    cost_usd: float | None
    retries: int
    outcome: str  # "success" | "failure" | "refused" | "interrupted"


def record_run(store: MemoryStore, cost: RunCost) -> Memory:
    """Remember one run's cost under its task kind."""
    return store.remember(
        type=RUN_COST,
        summary=f"{cost.task_kind} run {cost.run_id}: {cost.outcome} in {cost.turns} turns,"
        f" {cost.wall_seconds:.1f}s",
        source=Source("run", cost.run_id),
        details=asdict(cost),
        task_kind=cost.task_kind,
    )


def history(store: MemoryStore, task_kind: str, *, k: int = 50) -> dict[str, Any] | None:
    """Statistics over the last ``k`` trusted runs of ``task_kind``; None without any.

    Keys: count, mean_wall_seconds, worst_wall_seconds, mean_turns, worst_turns,
    mean_cost, worst_cost (None when no run reported cost), mean_retries, success_rate.
    """
    runs = [m.details for m in store.recall(type=RUN_COST, task_kind=task_kind, k=k)]
    if not runs:
        return None
    walls = [float(r["wall_seconds"]) for r in runs]
    turns = [int(r["turns"]) for r in runs]
    costs = [float(r["cost_usd"]) for r in runs if r.get("cost_usd") is not None]
    return {
        "count": len(runs),
        "mean_wall_seconds": round(fmean(walls), 3),
        "worst_wall_seconds": max(walls),
        "mean_turns": round(fmean(turns), 3),
        "worst_turns": max(turns),
        "mean_cost": round(fmean(costs), 6) if costs else None,
        "worst_cost": max(costs) if costs else None,
        "mean_retries": round(fmean(int(r["retries"]) for r in runs), 3),
        "success_rate": round(sum(r["outcome"] == "success" for r in runs) / len(runs), 3),
    }


def budget_with_reserve(history: dict[str, Any], reserve: float) -> dict[str, Any]:
    """The plan's ``budget`` section from history: mean * (1 + reserve), rounded up."""
    if reserve < 0:
        raise ValueError("reserve must be >= 0")
    factor = 1.0 + reserve
    cost = history.get("mean_cost")
    return {
        "turns": max(1, math.ceil(history["mean_turns"] * factor)),
        "wall_seconds": max(1, math.ceil(history["mean_wall_seconds"] * factor)),
        "cost_usd": round(cost * factor, 4) if cost is not None else None,
        "source": "history",
        "history": {
            "count": history["count"],
            "mean_wall_seconds": history["mean_wall_seconds"],
            "worst_wall_seconds": history["worst_wall_seconds"],
            "reserve": reserve,
        },
    }
