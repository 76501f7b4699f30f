"""One run's book of its named session: what the session carried in, what this run spent,
and the checkpoint that keeps both.

A run of a named session (``spec.session``) starts from the checkpoint its last run left
(``carried``: what the session spent since it last finished). Every checkpoint this run
saves — at each completed step, at the brain's end, and once more when the turn ends
whatever its outcome — keeps ``carried`` plus what this run spent so far, counted the way
a parent counts what it has left for its sub-agents (apply/midrun/allotment.run_spent): turns as
the larger of the engine's report and the model calls counted at the proxy, dollars
reported, the host's wall clock since the brain started, and each lease's time held and
renewals used. The next run is planned from what is left (plan/resume.py). A run that
succeeds ends the session's work: apply/records/record.py clears the checkpoint (script) or keeps
only the brain conversation with nothing spent (other engines).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from kagura_agent.apply.midrun.allotment import run_spent
from kagura_agent.apply.run.context import RunContext
from kagura_agent.membrane.leases import Lease
from kagura_agent.patterns.checkpoint import Checkpoint, save_checkpoint, session_owner
from kagura_agent.patterns.spent import Spent


class SessionBook:
    """The named session of one run (a book that saves nothing when the run names none)."""

    def __init__(
        self, ctx: RunContext, resumed: Checkpoint | None, leases: Sequence[Lease]
    ) -> None:
        self.ctx = ctx
        self.session: str | None = ctx.plan["task"]["session"]
        self.carried = resumed.spent if resumed is not None else Spent()
        self.first_step = resumed.step if resumed is not None else 0
        self.step = self.first_step
        self.brain_session_id = resumed.brain_session_id if resumed is not None else None
        self._leases = leases
        self._started = time.monotonic()  # the brain starts now: its wall budget runs

    def this_run(self) -> Spent:
        """What this run spent so far, by the host's count."""
        midrun = self.ctx.midrun
        steps = self.step - self.first_step if self.ctx.plan["brain"]["engine"] == "script" else 0
        return run_spent(
            turns=max(midrun.spent_turns if midrun is not None else 0, steps),
            usd=midrun.spent_usd if midrun is not None else 0.0,
            calls=midrun.model_calls if midrun is not None else None,
            children=midrun.children.used if midrun is not None else (0, 0.0),
            elapsed=time.monotonic() - self._started,
            leases=self._leases,
            now=self.ctx.clock.now(),
        )

    def save(self, step: int | None = None, brain_session_id: str | None = None) -> None:
        """Save the session's checkpoint: at ``step`` (None: where it stands), with the
        brain conversation ``brain_session_id`` (None: the one it has), and what the
        session spent with this run's spending so far."""
        if not self.session:
            return
        if step is not None:
            self.step = step
        if brain_session_id is not None:
            self.brain_session_id = brain_session_id
        plan = self.ctx.plan
        run = self.this_run()
        in_force = (self.ctx.midrun.plan if self.ctx.midrun is not None else plan)["budget"]
        steps = plan["task"]["steps"] or []
        save_checkpoint(
            self.ctx.store,
            Checkpoint(
                session=self.session,
                step=self.step,
                pending=tuple(steps[self.step :]),
                brain_session_id=self.brain_session_id,
                budget_left=_left(in_force, run),
                plan_fingerprint=plan["fingerprint"],
                owner=session_owner(plan["task"]["project_root"], plan["task"]["kind"]),
                spent=self.carried.plus(run),
            ),
            clock=self.ctx.clock,
        )


def _left(budget: Mapping[str, Any], run: Spent) -> dict[str, float | int | None]:
    """What is left of the budget in force (already the session's remainder) after this
    run's spending; None where there is no limit."""
    return {
        "turns": None if budget["turns"] is None else max(budget["turns"] - run.turns, 0),
        "wall_seconds": max(budget["wall_seconds"] - run.wall_seconds, 0),
        "cost_usd": (
            None
            if budget["cost_usd"] is None
            else max(round(budget["cost_usd"] - run.cost_usd, 6), 0)
        ),
    }
