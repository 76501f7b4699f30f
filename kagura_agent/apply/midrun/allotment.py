"""What a running parent has left to hand a sub-agent, and what its sub-agents took.

A child is planned from its parent's *remaining* budget, never from the brain's defaults
(apply/midrun/dispatch.py writes :class:`Left` into the child's task as ``spec.parent.budget``;
plan/budget.py cuts every limit of the child's plan to it):

    turns left   = turns in force - max(turns reported, model calls counted) - children's
    dollars left = dollars in force - dollars reported - children's
    wall left    = wall in force - time since the brain started
    lease left   = per credential: the parent lease's budget end - now

where *children's* is what the run's sub-agents hold (:class:`Allotments`): a child's
whole limit, reserved from its dispatch on, becomes what it used once it ends (the larger
of its reported turns and its counted calls, never more than it held). A child gets an
even share of the turns and dollars left (:meth:`Left.shared`): divided by the child slots
(Policy ``ceilings.children``) no other child holds, so siblings dispatched at once all
get some. The parent's own budget check counts what its finished children used
(apply/midrun/grants.py), so the parent and its children together stay within the parent's
budget.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kagura_agent.membrane.leases import Lease
from kagura_agent.patterns.spent import LeaseSpent, Spent

# Less than this left of its wall budget, and a parent dispatches nothing: a child needs
# a container, a proxy and its verify in that time.
MIN_WALL_SECONDS = 10
MAX_RENEWALS = 100  # the Task schema's maximum
MAX_SECONDS = 999_999  # the most a duration in a task file says (schemas/task.json)


@dataclass(frozen=True)
class Left:
    """What the parent run has left of each limit (None: the parent has no such limit)."""

    turns: int | None
    cost_usd: float | None
    wall_seconds: int

    def shortfall(self) -> list[str]:
        """Why nothing is left to hand a sub-agent (empty: something is)."""
        found = []
        if self.turns is not None and self.turns < 1:
            found.append("the parent's turn budget is spent (or held by its running sub-agents)")
        if self.cost_usd is not None and self.cost_usd <= 0:
            found.append("the parent's dollar budget is spent (or held by its running sub-agents)")
        if self.wall_seconds < MIN_WALL_SECONDS:
            found.append(
                f"the parent has {max(self.wall_seconds, 0)}s of its wall budget left, under"
                f" the {MIN_WALL_SECONDS}s a sub-agent needs"
            )
        return found

    def shared(self, ways: int) -> Left:
        """An even share of the turns and dollars among ``ways`` children, at least one
        turn while one is left (the wall time passes for all of them at once: each gets
        all of it)."""
        ways = max(ways, 1)
        return Left(
            # A last turn goes whole to whoever asks for it first.
            turns=None if self.turns is None else max(self.turns // ways, min(self.turns, 1)),
            cost_usd=(
                None if self.cost_usd is None else math.floor(self.cost_usd / ways * 1e6) / 1e6
            ),
            wall_seconds=self.wall_seconds,
        )

    def to_spec(self) -> dict[str, Any]:
        """The child task's ``spec.parent.budget`` (schemas/task.json)."""
        spec: dict[str, Any] = {"wall_time": f"{self.wall_seconds}s"}
        if self.turns is not None:
            spec["turns"] = self.turns
        if self.cost_usd is not None:
            spec["cost_usd"] = self.cost_usd
        return spec


def left(
    budget: Mapping[str, Any],
    *,
    turns: int,
    usd: float,
    calls: int | None,
    held: tuple[int, float],
    elapsed: float,
) -> Left:
    """What is left of ``budget`` (the plan's, in force) after the brain's own ``turns``,
    ``usd`` and counted ``calls`` and what its sub-agents ``held``, ``elapsed`` seconds in."""
    limit_turns, limit_usd = budget["turns"], budget["cost_usd"]
    spent = run_spent(turns=turns, usd=usd, calls=calls, children=held, elapsed=elapsed)
    return Left(
        turns=None if not limit_turns else int(limit_turns) - spent.turns,
        cost_usd=None if limit_usd is None else round(float(limit_usd) - spent.cost_usd, 6),
        wall_seconds=min(int(budget["wall_seconds"]) - spent.wall_seconds, MAX_SECONDS),
    )


def run_spent(
    *,
    turns: int,
    usd: float,
    calls: int | None,
    children: tuple[int, float],
    elapsed: float,
    leases: Iterable[Lease] = (),
    now: datetime | None = None,
) -> Spent:
    """What a run spent so far by the host's count: the larger of the brain's reported
    ``turns`` and the model ``calls`` counted at the proxy, plus what its sub-agents took
    (``children``); the reported ``usd`` plus theirs; ``elapsed`` seconds of wall (whole,
    up); per credential category, the seconds its ``leases`` were held until ``now`` and
    the renewals they used. What :func:`left` subtracts, and what a session's checkpoint
    adds up (patterns/spent.py)."""
    held: dict[str, LeaseSpent] = {}
    for lease in leases:
        category = lease.request.category or lease.name
        until = now if now is not None else lease.broker.clock.now()
        seconds = max(
            math.ceil((min(until, lease.budget_ends_at) - lease.started_at).total_seconds()), 0
        )
        held[category] = held.get(category, LeaseSpent()).plus(
            LeaseSpent(seconds, lease.renewals_used)
        )
    return Spent(
        turns=max(turns, calls or 0) + children[0],
        cost_usd=round(max(usd, 0.0) + children[1], 6),
        wall_seconds=max(math.ceil(elapsed), 0),
        leases=held,
    )


class Allotments:
    """Turns and dollars the run's sub-agents hold: reserved while one runs, what it used
    once it ended. Thread-safe (the channel's loop and the parent's budget checks)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reserved: dict[int, tuple[int, float]] = {}
        self._used = (0, 0.0)

    def reserve(self, number: int, turns: int | None, usd: float | None) -> None:
        with self._lock:
            self._reserved[number] = (turns or 0, usd or 0.0)

    def settle(self, number: int, result: Mapping[str, Any]) -> None:
        """Child ``number`` ended with apply's ``result``: it used the larger of its
        reported turns and counted calls, and its reported dollars, never more than it
        held (a child that never started used nothing)."""
        with self._lock:
            held = self._reserved.pop(number, None)
            if held is None:
                return
            turns = max(_count(result.get("turns")), _count(result.get("model_calls")))
            usd = result.get("cost_usd")
            spent = float(usd) if isinstance(usd, int | float) and math.isfinite(usd) else 0.0
            self._used = (
                self._used[0] + min(turns, held[0]),
                round(self._used[1] + min(max(spent, 0.0), held[1]), 6),
            )

    def release(self, number: int) -> None:
        """Child ``number`` never started: it holds nothing."""
        with self._lock:
            self._reserved.pop(number, None)

    @property
    def held(self) -> tuple[int, float]:
        """Turns and dollars running children hold plus what finished ones used."""
        with self._lock:
            turns = self._used[0] + sum(t for t, _ in self._reserved.values())
            usd = self._used[1] + sum(u for _, u in self._reserved.values())
            return turns, round(usd, 6)

    @property
    def holding(self) -> int:
        """Children holding a reservation (planned, asked about or running)."""
        with self._lock:
            return len(self._reserved)

    @property
    def used(self) -> tuple[int, float]:
        """What finished children used: it counts against the parent's own budget."""
        with self._lock:
            return self._used


def lease_grants(
    asked: Iterable[Mapping[str, str]], leases: Iterable[Lease], now: datetime
) -> list[dict[str, Any]]:
    """The child task's ``credentials``: each ``{provider, scope}`` asked for, held no
    longer than what is left of the parent's lease of it (its ``budget``; the ttl and the
    renewals no more than the parent's). The broker ends a lease at its budget's end, and
    refuses one a provider cannot mint that short (STS: 15 min). A scope the parent does
    not hold is passed as asked (the planner's narrowing check refuses it). Raises
    ValueError naming a lease of the parent's that has run out."""
    held = {(lease.request.provider, lease.request.scope): lease for lease in leases}
    grants: list[dict[str, Any]] = []
    for grant in asked:
        lease = held.get((grant["provider"], grant["scope"]))
        if lease is None or lease.closed:
            grants.append(dict(grant))
            continue
        seconds = min(int((lease.budget_ends_at - now).total_seconds()), MAX_SECONDS)
        if seconds < 1:
            raise ValueError(
                f"the parent's lease of {grant['provider']}/{grant['scope']} has run out"
            )
        ttl = lease.request.ttl_seconds
        renewals = min(
            max(lease.budget.renewals - lease.renewals_used, 0),
            math.ceil(seconds / ttl) - 1,
            MAX_RENEWALS,
        )
        grants.append({**grant, "ttl": f"{ttl}s", "renewals": renewals, "budget": f"{seconds}s"})
    return grants


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0
