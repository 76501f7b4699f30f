"""One brain turn over the channel: credentials in, events out, checkpoints, renewals."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from kagura_agent.brain.events import (
    CheckpointEvent,
    CostEvent,
    DoneEvent,
    ErrorEvent,
)
from kagura_agent.errors import RefusedError
from kagura_agent.plan.model import Plan
from kagura_agent.state import StateStore

RENEW_CHECK_SECONDS = 5.0


class BrainRun:
    def __init__(
        self,
        store: StateStore,
        plan: Plan,
        leases: list[Any],
        channel: Any,
        options: Any,
        live: Any,
        result: Any,
    ) -> None:
        self.store = store
        self.plan = plan
        self.leases = leases
        self.channel = channel
        self.options = options
        self.live = live
        self.result = result
        self.session = plan["task"].get("session")

    async def run(self) -> None:
        from kagura_agent.brain.plan_turn import turn_from_plan
        from kagura_agent.patterns.checkpoint import resume

        checkpoint = resume(self.store, self.session)
        completed, session_id = 0, None
        if checkpoint is not None:
            self.live.phase(checkpoint.message())
            self.result.resumed_from = checkpoint.step
            completed = checkpoint.step if self.plan["brain"]["engine"] == "script" else 0
            session_id = checkpoint.brain_session_id
        turn = turn_from_plan(
            self.plan, session_id=session_id, completed_steps=completed, prompt=self.options.prompt
        )
        from kagura_agent.membrane.leases import deliver

        for lease in self.leases:
            await deliver(self.channel, lease)
        renewer = asyncio.create_task(self._keep_fresh())
        try:
            async for event in self.channel.run_turn(turn):
                self.live.brain(event)
                self._observe(event)
        finally:
            renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await renewer
            self.live.flush_text()

    def _observe(self, event: Any) -> None:
        if isinstance(event, CostEvent):
            if event.usd is not None:
                self.result.cost_usd = event.usd
            if event.turns is not None:
                self.result.turns = event.turns
            if event.input_tokens is not None:
                self.result.input_tokens = event.input_tokens
            if event.output_tokens is not None:
                self.result.output_tokens = event.output_tokens
            if event.retries is not None:
                self.result.retries = event.retries
        elif isinstance(event, CheckpointEvent):
            self.result.turns = max(self.result.turns, event.step)
            self._checkpoint(event.step, event.session_id)
        elif isinstance(event, DoneEvent):
            self.result.brain_session_id = event.session_id
            if event.session_id and self.plan["brain"]["engine"] != "script":
                self._checkpoint(0, event.session_id)
        elif isinstance(event, ErrorEvent):
            self.result.brain_error = f"{event.code}: {event.message}"

    def _checkpoint(self, step: int, session_id: str | None) -> None:
        if not self.session:
            return
        from kagura_agent.patterns.checkpoint import Checkpoint, save_checkpoint

        steps = self.plan["task"].get("steps") or []
        budget = self.plan["budget"]
        save_checkpoint(
            self.store,
            Checkpoint(
                session=self.session,
                step=step,
                pending=tuple(steps[step:]),
                brain_session_id=session_id,
                budget_left={
                    "turns": budget.get("turns"),
                    "wall_seconds": budget.get("wall_seconds"),
                    "cost_usd": budget.get("cost_usd"),
                },
                plan_fingerprint=self.plan["fingerprint"],
            ),
            clock=self.options.clock,
        )

    async def _keep_fresh(self) -> None:
        """Renew leases inside their budget; exhaustion (already wiped) stops the run."""
        from kagura_agent.membrane.leases import keep_fresh

        try:
            await keep_fresh(self.channel, self.leases, poll_seconds=RENEW_CHECK_SECONDS)
        except RefusedError as exc:
            self.live.note(f"credential budget exhausted: {exc.message}; stopping", "red")
            self.result.brain_error = f"budget: {exc.message}"
            await self.channel.stop()
