"""A resumed session is planned from what it has left, never its whole budget again.

A named session that did not finish keeps a checkpoint of what it spent (turns, dollars,
wall time, and per credential the lease time and renewals; patterns/spent.py, counted
by the host). Its next run is planned with every limit of the budget cut to

    left = the limit this task gets now - what the session spent

and each credential's lease budget (seconds and renewals) likewise; ``budget.resumed``
shows both, and apply mints each lease under what is left (:func:`lease_left`). A
limit with nothing left refuses the plan, as does a lease with less left than its
provider can mint: the operator raises the task's budget (reviewed in git) or starts a
new session. Pure, like the rest of the planner.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kagura_agent.manifest.task import CredentialRequest
from kagura_agent.membrane.providers.traits import traits_of
from kagura_agent.patterns.spent import LeaseSpent, Spent
from kagura_agent.plan.model import Budget, Refusal, Resumed, ResumedLease
from kagura_agent.units import format_duration

DIMENSIONS = ("turns", "wall_seconds", "cost_usd")


def resumed(
    checkpoint: Mapping[str, Any] | None, credentials: Sequence[CredentialRequest]
) -> Resumed | None:
    """``budget.resumed`` for the session whose checkpoint fact is ``checkpoint`` (None:
    this run resumes nothing)."""
    if checkpoint is None:
        return None
    spent = Spent.from_json(checkpoint.get("spent"))
    leases: list[ResumedLease] = []
    for request in credentials:
        category = f"credential:{request.provider.name}/{request.scope}"
        held = spent.leases.get(category, LeaseSpent())
        leases.append(
            {
                "category": category,
                "spent_seconds": held.seconds,
                "spent_renewals": held.renewals,
                "budget_seconds": max(request.budget_seconds - held.seconds, 0),
                "renewals": max(request.renewals - held.renewals, 0),
            }
        )
    step = checkpoint.get("step")
    saved = checkpoint.get("saved")
    return {
        "session": str(checkpoint.get("session", "")),
        "step": step if isinstance(step, int) and not isinstance(step, bool) else 0,
        "saved": saved if isinstance(saved, str) else None,
        "spent": {
            "turns": spent.turns,
            "wall_seconds": spent.wall_seconds,
            "cost_usd": spent.cost_usd,
        },
        "leases": leases,
    }


def cut(limits: dict[str, Any], section: Resumed) -> bool:
    """Cut each of ``limits`` (turns, wall_seconds, cost_usd) to what the session has
    left, in place; True when any limit was cut."""
    spent: Mapping[str, Any] = section["spent"]
    changed = False
    for dim in DIMENSIONS:
        if limits[dim] is None or not spent[dim]:
            continue
        left = limits[dim] - spent[dim]
        limits[dim] = max(round(left, 6) if dim == "cost_usd" else int(left), 0)
        changed = True
    return changed


def refusals(budget: Budget, types: Mapping[str, str]) -> list[Refusal]:
    """A resumed session with nothing left of a limit, or less lease time left than its
    provider can mint (``types``: credential category -> provider type)."""
    section = budget.get("resumed")
    if section is None:
        return []
    name = section["session"]
    found: list[Refusal] = []
    limits: Mapping[str, Any] = budget
    spent: Mapping[str, Any] = section["spent"]
    for dim in DIMENSIONS:
        if limits[dim] is not None and limits[dim] <= 0:
            found.append(
                {
                    "code": "session-spent",
                    "message": (
                        f"session {name!r} has spent its {_what(dim)} budget"
                        f" ({_shown(dim, spent[dim])} spent since it last finished)"
                    ),
                    "source": "$.budget.resumed",
                }
            )
    for lease in section["leases"]:
        traits = traits_of(types.get(lease["category"], ""))
        shortest = traits.min_ttl if traits is not None else 1
        if lease["budget_seconds"] < shortest:
            found.append(
                {
                    "code": "session-spent",
                    "message": (
                        f"session {name!r} has {lease['budget_seconds']}s of its"
                        f" {lease['category']} lease budget left, under the shortest lease"
                        f" its provider mints ({format_duration(shortest)})"
                    ),
                    "source": "$.budget.resumed.leases",
                }
            )
    return found


def lease_left(budget: Mapping[str, Any], category: str) -> tuple[int, int] | None:
    """(seconds, renewals) a resumed session's lease of ``category`` is minted under, or
    None when the plan resumes nothing of it (then its own budget holds)."""
    section = budget.get("resumed")
    if not section:
        return None
    for lease in section["leases"]:
        if lease["category"] == category:
            return int(lease["budget_seconds"]), int(lease["renewals"])
    return None


def text(section: Resumed) -> str:
    """``resumed session 'nightly' at step 2: spent 3 turns, 1m wall, $0.2`` for the
    plan's budget line."""
    spent: Mapping[str, Any] = section["spent"]
    shown = [_shown(dim, spent[dim]) for dim in DIMENSIONS if spent[dim]]
    return (
        f"resumed session {section['session']!r} at step {section['step']}: spent"
        f" {', '.join(shown) or 'nothing'} since it last finished (each limit is what is left)"
    )


def _what(dim: str) -> str:
    return {"turns": "turn", "wall_seconds": "wall-time", "cost_usd": "dollar"}[dim]


def _shown(dim: str, value: float) -> str:
    if dim == "cost_usd":
        return f"${value:g}"
    if dim == "wall_seconds":
        return format_duration(int(value)) + " wall"
    return f"{int(value)} turns"
