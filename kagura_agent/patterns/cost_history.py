"""Cost history: every run records what the host measured (the model calls counted at
the proxy, its wall clock), what the engine reported (turns, tokens, dollars, retries),
the budget it was held to and its outcome; the planner forecasts the next run of the same
task kind from that history and learns its budget from the forecast (``forecast`` here is
pure: the planner calls it on the samples the facts carry; plan/budget.py bounds it).

What the engine reports is a claim from inside the agent's container (a tampered engine
says 999 turns, $99): it is kept and shown, never learnt. A dimension is learnt only
from the host's own figure (``MEASURED``):

    turns        the model calls counted at the injecting proxy (none counted: not learnt)
    wall_seconds the host's clock around the run
    tokens, cost_usd  not measured by the host: never learnt (the brain's defaults stay)

The forecast, per measured dimension:

    expected = median of the recorded runs          (what the run will probably take)
    limit    = max(floor, p_q of the runs * (1 + reserve))   (the budget it may take)

``q`` (default 0.8, nearest rank), ``reserve`` (default 0.3) and the floors come from the
Graduation manifest (``reserve``, ``budget_quantile``, ``budget_floors``); the planner
sets the budget from the limits once ``budget_min_runs`` (default 3) runs are recorded,
grows it by at most ``budget_step`` (x1.5) of the last run's budget a run, asks for
approval above the brain's default, and never goes above a Policy ceiling.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from kagura_agent.memory.model import Memory, MemoryStore, Source, Trust


def median(values: Sequence[float]) -> float:
    """The middle value (mean of the two middle ones for an even count).

    Local rather than ``statistics.median``: importing ``statistics`` pulls in
    ``fractions`` and ``decimal``, about 3 ms on every ``plan``.
    """
    ordered = sorted(values)
    if not ordered:
        raise ValueError("median of no values")
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return float(ordered[middle])
    return (ordered[middle - 1] + ordered[middle]) / 2


def fmean(values: Iterable[float]) -> float:
    items = list(values)
    if not items:
        raise ValueError("mean of no values")
    return math.fsum(items) / len(items)


RUN_COST = "run-cost"
HISTORY_RUNS = 20  # the newest runs of a task kind the forecast reads
DIMENSIONS = ("turns", "tokens", "wall_seconds", "cost_usd")
# The sample key holding the host's own figure for a dimension; the others are learnt
# from nothing (their forecast limit is None).
MEASURED = {"turns": "model_calls", "wall_seconds": "wall_seconds"}
# What engines report, shown next to the forecast (never a limit).
REPORTED = ("turns", "tokens", "cost_usd")
DEFAULT_QUANTILE = 0.8
DEFAULT_RESERVE = 0.3
# Fewer runs than this: the plan shows the forecast but keeps its budget (one fast run
# must not become a limit the next, ordinary run blows).
DEFAULT_MIN_RUNS = 3
# A learnt limit never drops below these: a run that took one turn and a second must not
# get a budget that start-up jitter alone would blow (a blown budget is a failed run,
# which demotes a graduated capability).
DEFAULT_FLOORS: dict[str, float] = {
    "turns": 5,
    "tokens": 20_000,
    "wall_seconds": 30,
    "cost_usd": 0.05,
}


@dataclass(frozen=True)
class RunCost:
    run_id: str
    task_kind: str
    turns: int
    wall_seconds: float
    cost_usd: float | None
    retries: int
    outcome: str  # "success" | "failure" | "refused" | "interrupted"
    input_tokens: int | None = None
    output_tokens: int | None = None
    # Model calls the host counted at the injecting proxy (None: the run's were not).
    model_calls: int | None = None
    # The limits the run was held to (turns, tokens, wall_seconds, cost_usd): the base the
    # next learnt budget grows from by at most one step.
    budget: Mapping[str, float | None] | None = None


def record_run(store: MemoryStore, cost: RunCost, *, trust: Trust = "trusted") -> Memory:
    """Remember one run's cost under its task kind; an ``untrusted`` one (a run whose task
    the agent wrote) never reaches ``history``, so it teaches no budget."""
    tokens = _tokens(asdict(cost))
    return store.remember(
        type=RUN_COST,
        summary=f"{cost.task_kind} run {cost.run_id}: {cost.outcome} in {cost.turns} turns,"
        f" {cost.wall_seconds:.1f}s"
        + (f", {cost.model_calls} model calls counted" if cost.model_calls is not None else "")
        + (f", {tokens} tokens" if tokens is not None else "")
        + (f", {cost.retries} retries" if cost.retries else ""),
        source=Source("run", cost.run_id),
        details={**asdict(cost), "budget": dict(cost.budget) if cost.budget else None},
        task_kind=cost.task_kind,
        trust=trust,
    )


def history(store: MemoryStore, task_kind: str, *, k: int = HISTORY_RUNS) -> dict[str, Any] | None:
    """The planner fact: the last ``k`` trusted runs of ``task_kind``; None without any.

    ``{"count": n, "runs": [{turns, input_tokens, output_tokens, tokens, wall_seconds,
    cost_usd, retries, outcome, model_calls, budget}, ...]}``, newest first.
    """
    memories = store.recall(type=RUN_COST, task_kind=task_kind, k=k)
    runs = [sample(m.details) for m in memories]
    if not runs:
        return None
    return {"count": len(runs), "runs": runs}


def sample(details: Mapping[str, Any]) -> dict[str, Any]:
    """One run's numbers, as the forecast reads them (older records lack tokens, the
    model calls and the budget: their turns are not learnt)."""
    return {
        "turns": _opt_int(details.get("turns")) or 0,
        "input_tokens": _opt_int(details.get("input_tokens")),
        "output_tokens": _opt_int(details.get("output_tokens")),
        "tokens": _tokens(details),
        "wall_seconds": _opt_float(details.get("wall_seconds")) or 0.0,
        "cost_usd": _opt_float(details.get("cost_usd")),
        "retries": _opt_int(details.get("retries")) or 0,
        "outcome": str(details.get("outcome", "")),
        "model_calls": _opt_int(details.get("model_calls")),
        "budget": _limits(details.get("budget")),
    }


def quantile(values: Sequence[float], q: float) -> float:
    """Nearest-rank quantile: the smallest value at or above ``q`` of the sorted values."""
    ordered = sorted(values)
    rank = max(1, math.ceil(q * len(ordered)))
    return ordered[rank - 1]


def forecast(
    runs: Sequence[Mapping[str, Any]],
    *,
    reserve: float = DEFAULT_RESERVE,
    q: float = DEFAULT_QUANTILE,
    floors: Mapping[str, float] | None = None,
) -> dict[str, Any] | None:
    """The next run's expected cost and learnt limits from ``runs``; None without runs.

    Pure. Returns ``{basis, runs, quantile, reserve, expected: {dim: v}, limits: {dim: v},
    reported: {dim: v}, retries}``. ``expected`` and ``limits`` read only what the host
    measured (``MEASURED``): a dimension without a measured figure is None in both.
    ``reported`` is the median of what the engines said (turns, tokens, dollars).
    """
    if reserve < 0:
        raise ValueError("reserve must be >= 0")
    if not 0 < q <= 1:
        raise ValueError("quantile must be in (0, 1]")
    if not runs:
        return None
    bounds = {**DEFAULT_FLOORS, **(floors or {})}
    expected: dict[str, float | int | None] = {}
    limits: dict[str, float | int | None] = {}
    for dim in DIMENSIONS:
        key = MEASURED.get(dim)
        values = [float(r[key]) for r in runs if key and _opt_float(r.get(key)) is not None]
        if not values:
            expected[dim] = limits[dim] = None
            continue
        top = quantile(values, q) * (1.0 + reserve)
        if dim == "cost_usd":
            expected[dim] = round(median(values), 4)
            limits[dim] = round(max(float(bounds[dim]), top), 4)
        else:
            expected[dim] = math.ceil(median(values))
            limits[dim] = max(math.ceil(bounds[dim]), math.ceil(top))
    return {
        "basis": f"p{round(q * 100)} of {len(runs)} run{'s' if len(runs) != 1 else ''}"
        f" + {round(reserve * 100)}%",
        "runs": len(runs),
        "quantile": q,
        "reserve": reserve,
        "expected": expected,
        "limits": limits,
        "reported": {dim: _reported(runs, dim) for dim in REPORTED},
        "retries": round(fmean(int(r.get("retries") or 0) for r in runs), 2),
    }


def _reported(runs: Sequence[Mapping[str, Any]], dim: str) -> float | int | None:
    values = [v for r in runs if (v := _opt_float(r.get(dim))) is not None]
    if not values:
        return None
    middle = median(values)
    return round(middle, 4) if dim == "cost_usd" else math.ceil(middle)


def _limits(value: object) -> dict[str, float | None] | None:
    """A recorded run's budget, each limit a number or None (anything else: no budget)."""
    if not isinstance(value, Mapping):
        return None
    return {dim: _opt_float(value.get(dim)) for dim in DIMENSIONS}


def _tokens(details: Mapping[str, Any]) -> int | None:
    parts = [_opt_int(details.get(key)) for key in ("input_tokens", "output_tokens")]
    known = [p for p in parts if p is not None]
    return sum(known) if known else None


def _opt_int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _opt_float(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None
