"""The container run's turn and what follows it: the brain over the agent's attached
stream, the agent stopped, its model calls held to the count at the proxy, a tripped
tripwire recorded, verify in a fresh container.

These are plain steps of the run's chain (executor.py ``_run``): each takes what the steps
before it produced and returns a value; what they use the chain opened and closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import signal
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from kagura_agent.apply.guards.modelcalls import mismatch
from kagura_agent.apply.guards.tripwire import ContainerTraps, Tripwire
from kagura_agent.apply.midrun.dispatch import ChildDispatcher
from kagura_agent.apply.midrun.hostmem import HostMemory
from kagura_agent.apply.midrun.injected import keep_injected_fresh
from kagura_agent.apply.records import progress
from kagura_agent.apply.records.incidents import Incident, record_incident
from kagura_agent.apply.run.context import (
    ApplyRuntime,
    BrainOutcome,
    RunContext,
    VerifyResult,
)
from kagura_agent.apply.run.steps import Agent, Egress, Leased
from kagura_agent.apply.run.turn import drive_brain
from kagura_agent.apply.run.verify import stop_agent, verify_in_fresh_container
from kagura_agent.brain.channel import BrainChannel, ChannelLimits
from kagura_agent.clock import iso
from kagura_agent.errors import Terminated

T = TypeVar("T")


def brain_turn(
    ctx: RunContext,
    agent: Agent,
    egress: Egress,
    traps: ContainerTraps,
    children: ChildDispatcher,
    memory: HostMemory,
    *,
    before_stop: Callable[[], Awaitable[None]] | None = None,
) -> BrainOutcome:
    """The plan's turn over the agent's stream (SIGTERM and Ctrl-C end it cleanly)."""
    return asyncio.run(
        _terminable(_drive(ctx, agent, egress, traps, children, memory, before_stop))
    )


def stop(ctx: RunContext, agent: Agent) -> str | None:
    """Stop the agent's container and wait until it has exited: a problem, or None."""
    problem = stop_agent(agent.runtime, agent.id)
    if problem:
        ctx.live.emit(progress.AgentStopProblem(problem))
    return problem


def held_to_count(ctx: RunContext, egress: Egress, brain: BrainOutcome) -> BrainOutcome:
    """The turn as the host reckons it, once the agent is stopped: held to the model calls
    counted at the proxy (when they are counted there)."""
    if egress.calls is None or egress.proxy is None:
        return brain
    # The agent is stopped: whatever it called is in the proxy's log now.
    egress.proxy.drain()
    return _held_to_count(ctx, brain, egress.calls.count)


def tripped(ctx: RunContext, wire: Tripwire, leased: Leased) -> str | None:
    """A tripped tripwire is an incident, recorded; why verify does not run (None: it
    did not trip)."""
    if not wire.reason:
        return None
    _record_incident(ctx, leased, wire)
    return "not run: the run tripped a hijack tripwire"


def _held_to_count(ctx: RunContext, brain: BrainOutcome, counted: int) -> BrainOutcome:
    """The brain's turn held to the model calls counted at the proxy: both figures shown,
    a large gap called out, and a run whose calls passed its turn budget is a budget stop
    even when its engine reported nothing of the kind."""
    live = ctx.live
    live.emit(progress.ModelCallsCounted(counted, brain.turns))
    if mismatch(counted, brain.turns):
        live.emit(progress.TurnsUnderReported(counted, brain.turns))
    why = ctx.midrun.past_counted() if ctx.midrun is not None else None
    if why is None or (brain.error or "").startswith("budget:"):
        return brain
    live.emit(progress.PastBudget(why))
    return dataclasses.replace(brain, error=f"budget: {why}, not extended")


def verify(
    ctx: RunContext,
    runtime: ApplyRuntime,
    problem: str | None,
    on_container: Callable[[str], None] | None = None,
) -> tuple[VerifyResult, ...]:
    """The task's verify commands in a fresh container; all failed when they cannot run."""
    commands = ctx.plan["task"]["verify"]
    if not commands:
        return ()
    if problem:
        results = [(command, -1, problem) for command in commands]
    else:
        ctx.live.emit(progress.Verifying(len(commands)))
        results = verify_in_fresh_container(
            runtime, ctx.plan, ctx.run_id, commands, on_container=on_container
        )
    ctx.live.verify(results)
    return tuple(results)


async def _drive(
    ctx: RunContext,
    agent: Agent,
    egress: Egress,
    traps: ContainerTraps,
    children: ChildDispatcher,
    memory: HostMemory,
    before_stop: Callable[[], Awaitable[None]] | None,
) -> BrainOutcome:
    brain = ctx.plan["brain"]
    limits = ChannelLimits(
        max_line_bytes=brain["max_line_bytes"],
        idle_seconds=float(brain["idle_timeout_seconds"]),
    )
    runtime, container_id = agent.runtime, agent.id
    channel = BrainChannel(
        agent.stream,
        memory=memory,
        limits=limits,
        on_stop=lambda: asyncio.to_thread(runtime.stop, container_id, 2),
        on_kill=lambda: asyncio.to_thread(runtime.kill, container_id),
        dispatcher=children,
        capabilities=ctx.midrun,
    )

    async def exhausted(why: str) -> None:
        ctx.live.emit(progress.CredentialBudgetExhausted(why))
        await channel.stop()

    # The brain's own credential lives in the proxy: its renewals go there.
    proxy = egress.proxy if egress.injecting else None
    keeper = asyncio.create_task(
        keep_injected_fresh(proxy, egress.injected, exhausted) if proxy else asyncio.sleep(0)
    )
    try:
        return await drive_brain(ctx, channel, egress.inside, traps=traps, before_stop=before_stop)
    finally:
        keeper.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await keeper


async def _terminable(coro: Coroutine[Any, Any, T]) -> T:
    """``coro``, with SIGTERM cancelling it and raising Terminated once it has unwound.

    The executor's SIGTERM handler raises from whatever frame runs; inside the loop that
    can be a callback or another task (a sub-agent's poll, the channel's reader), where
    asyncio logs and drops it and the run goes on. Here the loop takes the signal (as it
    takes SIGINT: Ctrl-C cancels the turn the same way), and the handler in force before
    is put back afterwards.
    """
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    previous = signal.getsignal(signal.SIGTERM)
    received: list[bool] = []

    def cancel() -> None:
        received.append(True)
        if task is not None:
            task.cancel()

    try:
        loop.add_signal_handler(signal.SIGTERM, cancel)
    except (ValueError, RuntimeError):  # not the main thread: signals are not ours
        return await coro
    try:
        return await coro
    except asyncio.CancelledError:
        if received:
            raise Terminated() from None
        raise
    finally:
        loop.remove_signal_handler(signal.SIGTERM)
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _record_incident(ctx: RunContext, leased: Leased, tripwire: Tripwire) -> None:
    actions = [
        "container killed",
        f"{len(leased.leases)} lease(s) wiped and revoked",
        "verify not run",
        "run recorded as failed (graduated capabilities demoted)",
    ]
    incident_id = record_incident(
        ctx.store,
        Incident(
            at=iso(ctx.clock.now()),
            run_id=ctx.run_id,
            task=ctx.plan["task"]["name"],
            fingerprint=ctx.plan["fingerprint"],
            reason=str(tripwire.reason),
            actions=actions,
            egress=list(tripwire.egress_log),
            events=list(ctx.live.recent),
        ),
    )
    ctx.live.incident(incident_id, str(tripwire.reason))
