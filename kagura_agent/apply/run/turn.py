"""One brain turn over the channel: credentials in, events out, checkpoints, renewals.

:func:`drive_brain` is the one sequence both runtimes use (a container's attached stream,
or a local entrypoint for ``runtime: host``); it returns what the turn came to as a
:class:`~kagura_agent.apply.run.context.BrainOutcome` and always withdraws the credentials
and stops the channel on its way out.

(This module was apply/session.py; "session" now means the brain session a task names
with ``spec.session`` and resumes, as in ``run --session``.)
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import sys
import threading
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from kagura_agent.apply.guards.tripwire import CREDS_WATCH_SECONDS, ContainerTraps
from kagura_agent.apply.records.live import LiveView
from kagura_agent.apply.records.progress import (
    BrainRunning,
    CredentialBudgetExhausted,
    DecoysUnwatched,
    MessageDelivered,
    PastBudget,
    ReleaseProblem,
    SessionResumed,
    SteeringIgnored,
    TrapProblem,
)
from kagura_agent.apply.run.context import BrainOutcome, RunContext
from kagura_agent.apply.run.conversation import Conversation
from kagura_agent.apply.run.sessionbook import SessionBook
from kagura_agent.approvals.midrun import ChatAsker
from kagura_agent.brain.channel import BrainChannel
from kagura_agent.brain.events import (
    BrainEvent,
    CheckpointEvent,
    CostEvent,
    DoneEvent,
    ErrorEvent,
    ToolCallEvent,
)
from kagura_agent.brain.plan_turn import turn_from_plan
from kagura_agent.errors import RefusedError
from kagura_agent.membrane.leases import Lease, deliver, keep_fresh, withdraw
from kagura_agent.patterns.checkpoint import resume

RENEW_CHECK_SECONDS = 5.0
# How often the model calls counted at the proxy are held against the turn budget.
CALLS_CHECK_SECONDS = 0.25
ANSWER_CHARS = 4000  # of the final answer, kept for a dispatched child's parent
# How often a turn that went on after it was interrupted is asked again to stop.
STOP_AGAIN_SECONDS = 0.1

T = TypeVar("T")


async def drive_brain(
    ctx: RunContext,
    channel: BrainChannel,
    leases: Sequence[Lease],
    *,
    traps: ContainerTraps | None = None,
    before_stop: Callable[[], Awaitable[None]] | None = None,
) -> BrainOutcome:
    """Run the plan's turn on ``channel``; wipe and release ``leases``, stop the channel.

    With ``traps`` (a container's), decoys take the wiped credentials' names and are
    watched a moment before the stop. ``before_stop`` runs once the credentials are
    wiped, while the container still runs (the agent's branch is taken out then).
    """
    channel.start()
    if ctx.midrun is not None:
        # The run's leases, one list (the mid-run desk's): credentials granted mid-run join
        # it (renewed, wiped and released with the rest).
        ctx.midrun.attach(channel)
        leases = ctx.midrun.leases
    try:
        return await _interruptible(_Turn(ctx, channel, leases, traps).run())
    finally:
        # Wipe and release the credentials, then end the entrypoint (it wipes on its way
        # out too); verify runs elsewhere, after the brain is gone.
        names = _bundle_names(leases)
        for problem in await withdraw(None if channel.closed else channel, leases):
            ctx.live.emit(ReleaseProblem(problem))
        if traps is not None and leases and not channel.closed:
            await _watch_after_wipe(traps, names, ctx.live)
        if before_stop is not None:
            await before_stop()
        await channel.stop()


async def _interruptible(turn: Coroutine[Any, Any, T]) -> T:
    """``turn``, run so that an interruption of this task always ends it.

    Ctrl-C, SIGTERM, the cockpit's kill and a team runner's stop all cancel apply's main
    task once (asyncio.run's SIGINT handler, container.py ``_terminable``). Inside the turn
    that one cancellation can be lost: Python 3.11's ``asyncio.wait_for`` returns the
    awaited result instead of raising when both come in the same pass of the loop. The
    channel waited for each brain event that way (it uses ``asyncio.timeout`` now), so a
    signal that landed while the turn's own code ran (walking /proc before it, say) was
    delivered at that wait, with the brain's first event already there: the turn went on,
    to its idle timeout. Against any other code in the turn that swallows it, the turn runs
    in a task of its own, awaited through ``shield`` — a cancellation of this task always
    raises here — and is asked to stop again until it has ended. The clean-up after it (``drive_brain``'s ``finally``) runs in this task and
    is not cancelled again.
    """
    task = asyncio.create_task(_carried(turn))
    try:
        return await asyncio.shield(task)
    except _Carried as carried:
        # Raised where the turn's code raised it, in this task, as before the turn had a
        # task of its own (out of a task, asyncio would hand it straight to the loop's
        # caller, past every step still open, which then close only as the loop shuts).
        raise carried.exc from None
    except asyncio.CancelledError:
        while not task.done():
            task.cancel()
            await asyncio.wait({task}, timeout=STOP_AGAIN_SECONDS)
        if not task.cancelled():
            task.exception()  # retrieved: the interruption is what this run comes to
        raise


class _Carried(Exception):
    """A KeyboardInterrupt or SystemExit of the turn's task, carried to the task that
    awaits it."""

    def __init__(self, exc: BaseException) -> None:
        super().__init__(repr(exc))
        self.exc = exc


async def _carried(turn: Coroutine[Any, Any, T]) -> T:
    try:
        return await turn
    except (KeyboardInterrupt, SystemExit) as exc:
        raise _Carried(exc) from None


def _bundle_names(leases: Sequence[Lease]) -> list[str]:
    """The file names the run's credentials had under /run/kagura/creds."""
    names: list[str] = []
    for lease in leases:
        with contextlib.suppress(Exception):
            names += list(lease.bundle.files)
    return names


async def _watch_after_wipe(traps: ContainerTraps, names: list[str], live: LiveView) -> None:
    """Decoys take the wiped credentials' names, watched a moment before the stop."""
    for problem in traps.after_wipe(names):
        live.emit(TrapProblem(problem))
    if not traps.wiped:
        return
    if traps.only_entrypoint_left():
        # Nobody is left to look: every process in the container is one of the
        # entrypoint's own, there before the turn and out of the tools' reach since.
        live.emit(DecoysUnwatched())
        return
    await asyncio.sleep(CREDS_WATCH_SECONDS)


@dataclass
class _Tally:
    """What the events said so far (private to one turn; returned frozen)."""

    error: str | None = None
    cost_usd: float | None = None
    turns: int = 0
    input_tokens: int | None = None
    output_tokens: int | None = None
    retries: int = 0
    resumed_from: int | None = None
    session_id: str | None = None
    answer: str | None = None

    def frozen(self) -> BrainOutcome:
        return BrainOutcome(**dataclasses.asdict(self))


def _read_lines(loop: asyncio.AbstractEventLoop, into: asyncio.Queue[str | None]) -> None:
    """stdin's lines onto ``into`` (from a thread: reading a pipe blocks), then None."""
    try:
        for line in sys.stdin:
            loop.call_soon_threadsafe(into.put_nowait, line)
        loop.call_soon_threadsafe(into.put_nowait, None)
    except RuntimeError:  # the loop is gone: the run ended
        pass


class _Turn:
    def __init__(
        self,
        ctx: RunContext,
        channel: BrainChannel,
        leases: Sequence[Lease],
        traps: ContainerTraps | None = None,
    ) -> None:
        self.ctx = ctx
        self.traps = traps
        self.plan = ctx.plan
        self.channel = channel
        self.leases = leases
        self.session = ctx.plan["task"]["session"]
        self.tally = _Tally()

    async def _steer(self) -> None:
        """Steering (``--steer-stdin``): each stdin line ``{"text": ...}`` goes to the brain
        as its next user message; the run's record says whether the engine took it. A line
        ``{"answered": REQUEST}`` is the cockpit's nudge that a mid-run question has a
        decision in the approval log; the end of stdin means nobody can answer any more."""
        lines: asyncio.Queue[str | None] = asyncio.Queue()
        loop = asyncio.get_running_loop()
        threading.Thread(target=_read_lines, args=(loop, lines), daemon=True).start()
        asker = self.ctx.midrun.asker if self.ctx.midrun is not None else None
        number = 0
        while (line := await lines.get()) is not None:
            try:
                message = json.loads(line)
                if isinstance(message, dict) and isinstance(message.get("answered"), str):
                    if isinstance(asker, ChatAsker):
                        asker.nudged(message["answered"])
                    continue
                text = message["text"]
                if not isinstance(text, str):
                    raise TypeError
            except (ValueError, KeyError, TypeError):
                self.ctx.live.emit(SteeringIgnored())
                continue
            number += 1
            taken, reason = await self.channel.send_user_message(number, text)
            self.ctx.live.emit(MessageDelivered(number, taken, reason))
        if isinstance(asker, ChatAsker):
            asker.gone()

    async def run(self) -> BrainOutcome:
        checkpoint = resume(self.ctx.store, self.session)
        self.book = SessionBook(self.ctx, checkpoint, self.leases)
        completed, session_id = 0, None
        if checkpoint is not None:
            self.ctx.live.emit(SessionResumed(checkpoint.message()))
            self.tally.resumed_from = checkpoint.step
            completed = checkpoint.step if self.plan["brain"]["engine"] == "script" else 0
            session_id = checkpoint.brain_session_id
        conversation = Conversation.of(self.plan)  # the sdk CLI's, kept by the host
        if conversation is not None and session_id is not None:
            session_id = await conversation.hand_back(self.ctx, self.channel, session_id)
        turn = turn_from_plan(self.plan, session_id=session_id, completed_steps=completed)
        for lease in self.leases:
            await deliver(self.channel, lease)
        if self.traps is not None:
            self.traps.before_turn()  # the entrypoint's processes, before any tool's
        renewer = asyncio.create_task(self._keep_fresh())
        steering = asyncio.create_task(self._steer()) if self.ctx.steer_stdin else None
        midrun = self.ctx.midrun
        wall = asyncio.create_task(midrun.watch_wall()) if midrun is not None else None
        budgets = asyncio.create_task(midrun.watch_leases()) if midrun is not None else None
        counted = asyncio.create_task(self._watch_calls()) if midrun is not None else None
        # The container is up and the turn is sent: say so, or the run would still read
        # "starting container" while the brain works.
        self.ctx.live.emit(BrainRunning(self.plan["brain"]["name"], self.plan["brain"]["engine"]))
        try:
            async for event in self.channel.run_turn(turn):
                self.ctx.live.brain(event)
                self._observe(event)
                # The host is the authority on the turn and dollar budgets: a brain that acts
                # on past a spent one (no extension granted) is stopped here.
                why = midrun.past_budget() if isinstance(event, ToolCallEvent) and midrun else None
                if why is not None:
                    await self._stop_past_budget(why)
                    break
            if conversation is not None and not self.channel.stopped:
                # The conversation's id as the engine last said it (done, or a checkpoint
                # when it stopped on a budget nobody extended), else the one resumed.
                conversation_id = self.tally.session_id or self.book.brain_session_id
                await conversation.take_back(self.ctx, self.channel, conversation_id)
        finally:
            for task in (renewer, steering, wall, budgets, counted):
                if task is not None:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
            self.ctx.live.flush_text()
            # The executor's own re-attempts: lease renewals that failed and were retried.
            self.tally.retries += sum(lease.retries for lease in self.leases)
            # Whatever the outcome: the session keeps what this run spent (a success
            # clears it once verified, apply/records/record.py).
            self.book.save()
        return self.tally.frozen()

    def _observe(self, event: BrainEvent) -> None:
        tally = self.tally
        if isinstance(event, CostEvent):
            if self.ctx.midrun is not None:
                self.ctx.midrun.counted(event.turns, event.usd)
            if event.usd is not None:
                tally.cost_usd = event.usd
            if event.turns is not None:
                tally.turns = event.turns
            if event.input_tokens is not None:
                tally.input_tokens = event.input_tokens
            if event.output_tokens is not None:
                tally.output_tokens = event.output_tokens
            if event.retries is not None:
                tally.retries = event.retries
        elif isinstance(event, CheckpointEvent):
            tally.turns = max(tally.turns, event.step)
            self._checkpoint(event.step, event.session_id)
        elif isinstance(event, DoneEvent):
            tally.session_id = event.session_id
            tally.answer = event.result[:ANSWER_CHARS] if event.result else None
            if event.session_id and self.plan["brain"]["engine"] != "script":
                self._checkpoint(0, event.session_id)
        elif isinstance(event, ErrorEvent):
            tally.error = f"{event.code}: {event.message}"

    def _checkpoint(self, step: int, session_id: str | None) -> None:
        self.book.save(step, session_id)

    async def _watch_calls(self) -> None:
        """Stop the brain once more model calls went through the proxy than its turn
        budget allows, whatever its engine reports (or whether it reports at all)."""
        midrun = self.ctx.midrun
        if midrun is None or midrun.calls is None:
            return
        while (why := midrun.past_counted()) is None:
            await asyncio.sleep(CALLS_CHECK_SECONDS)
        await self._stop_past_budget(why)

    async def _stop_past_budget(self, why: str) -> None:
        """Today's budget stop, once (the turn's events and the proxy count both see it)."""
        if self.tally.error is not None and self.tally.error.startswith("budget:"):
            return
        self.ctx.live.emit(PastBudget(why, stopping=True))
        self.tally.error = f"budget: {why}, not extended"
        await self.channel.stop()

    async def _keep_fresh(self) -> None:
        """Renew leases inside their budget; exhaustion (already wiped) stops the run."""
        try:
            await keep_fresh(self.channel, self.leases, poll_seconds=RENEW_CHECK_SECONDS)
        except RefusedError as exc:
            self.ctx.live.emit(CredentialBudgetExhausted(exc.message))
            self.tally.error = f"budget: {exc.message}"
            await self.channel.stop()
