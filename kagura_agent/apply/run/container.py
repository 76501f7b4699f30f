"""The container run: egress proxy, the agent's hardened container, the brain over its
attached stream, the host's watches (tripwires, disk), then verify in a fresh container.

``run_in_container`` is one step of apply's sequence (executor.py): it takes the run's
context and returns a :class:`~kagura_agent.apply.run.context.RunReport`; everything it
creates is registered on the run's ExitStack, so every exit removes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, TypeVar

from kagura_agent.apply.guards.cgroupio import Freezer, WriteMeter
from kagura_agent.apply.guards.diskwatch import DiskWatch
from kagura_agent.apply.guards.modelcalls import ModelCalls, mismatch
from kagura_agent.apply.guards.tripwire import ContainerTraps, Tripwire
from kagura_agent.apply.midrun.dispatch import ChildDispatcher
from kagura_agent.apply.midrun.hostmem import HostMemory, open_host_memory
from kagura_agent.apply.midrun.injected import (
    CredentialHolder,
    injection_of,
    keep_injected_fresh,
    proxy_secret,
    renewed_in_run,
)
from kagura_agent.apply.records.incidents import record_incident
from kagura_agent.apply.records.live import LiveView
from kagura_agent.apply.run.agentbranch import AgentBranch
from kagura_agent.apply.run.context import (
    ApplyRuntime,
    BrainOutcome,
    EgressRun,
    RunContext,
    RunReport,
    VerifyResult,
)
from kagura_agent.apply.run.turn import drive_brain
from kagura_agent.apply.run.verify import stop_agent, verify_in_fresh_container
from kagura_agent.brain.channel import BrainChannel, ChannelLimits
from kagura_agent.brain.streams import DuplexStream
from kagura_agent.clock import iso
from kagura_agent.errors import KaguraError, Terminated
from kagura_agent.membrane.hardening import LABEL_ROLE, LABEL_RUN
from kagura_agent.membrane.leases import Lease
from kagura_agent.membrane.placeholders import held_absent
from kagura_agent.plan.injection import injected_provider
from kagura_agent.processes import namespace_processes

Denials = list[dict[str, object]]
T = TypeVar("T")


def run_in_container(
    ctx: RunContext,
    runtime: ApplyRuntime,
    leases: list[Lease],
    cleanup: contextlib.ExitStack,
    denials: Denials,
) -> RunReport:
    plan, run_id, live = ctx.plan, ctx.run_id, ctx.live
    # Absent host inputs (.git, ./manifests) held empty and read-only until every
    # container of the run, verify's too, is gone.
    cleanup.enter_context(held_absent(plan))
    # Last on the way out: a verify container whose own removal failed gets a second try
    # (its run's row is closed by then, so no later sweep looks for it). A task without
    # verify commands never makes one: no list request.
    cleanup.callback(_remove_verify_leftovers, runtime, ctx, live)
    stoppable: list[str] = []  # the agent's container, once it exists
    tripwire = Tripwire(
        dict(plan["tripwires"]),
        lambda reason: _stop_now(runtime, stoppable, live, f"hijack tripwire: {reason}"),
    )
    knobs = dict(plan["tripwires"])
    traps = ContainerTraps(tripwire, knobs, plan["hardening"]["user"])
    live.watchers.append(lambda event: tripwire.scan("the brain's output", event))
    live.redactor.add(tripwire.canary)  # fake, but shown like the secret it pretends to be

    # The brain's credential stays with the host and the proxy: never delivered inside.
    provider = injected_provider(plan)
    injected = [lease for lease in leases if provider and lease.request.provider == provider]
    inside = [lease for lease in leases if lease not in injected]
    secret = proxy_secret(injected[0]) if injected else None
    injection, endpoint_environment = injection_of(plan)
    # The CLI pointed at the key-injecting port with its documented switches, holding a
    # placeholder where it expects a credential (plan brain.model_endpoint).
    environment: dict[str, str] = endpoint_environment if provider else {}
    # The CLI's optional traffic off (plan brain.cli_environment): its model calls are all
    # that leave, through the key-injecting port.
    environment |= plan["brain"].get("cli_environment", {})
    # Every model call with the injected key passes the proxy: the host counts them there.
    calls = ModelCalls() if secret and plan["egress"]["mode"] == "proxy" else None

    def on_egress(event: dict[str, object]) -> None:
        live.egress(event)
        tripwire.egress(event)
        if calls is not None:
            calls.feed(event)

    egress, started = None, None
    if plan["egress"]["mode"] == "proxy":
        live.phase(f"starting this run's egress proxy ({len(plan['egress']['allow'])} allowed)")
        started = runtime.start_egress(
            plan,
            run_id,
            on_egress,
            store=ctx.store,
            clock=ctx.clock,
            injection=injection if secret else None,
            injection_secret=secret,
            # The agent chooses a request's host and path: its credentials may be there.
            scrub=live.redactor.scrub_any_case,
        )
        cleanup.callback(_close_egress, started, denials, live)
        if getattr(started, "warm", False):
            live.phase(f"egress proxy ready: warm session {getattr(started, 'pooled_name', '')}")
        if ctx.midrun is not None:  # a mid-run egress grant reloads this proxy
            ctx.midrun.egress = started
            ctx.midrun.calls = calls
        egress = started.agent_network_config()
        environment = {**environment, **egress.environment}
    live.phase(f"starting container from {plan['image']['ref']}")
    container_id = runtime.create(
        plan,
        run_id,
        environment=environment,
        network=egress.network if egress else None,
        egress_mounts=egress.mounts() if egress else [],
        forward=egress.forwards() if egress else (),
    )
    cleanup.callback(_remove_container, runtime, container_id, live)
    stoppable.append(container_id)
    # The budget holds until verify is done: verify runs code the agent may have written
    # (a Makefile, a test script), in a container that mounts the same root.
    watched = [container_id]
    watch = _watch_disk(ctx, runtime, watched)
    cleanup.callback(watch.stop)
    stream = cleanup.enter_context(runtime.attach(container_id))
    runtime.start(container_id)
    if egress is not None:
        runtime.start_forwarder(container_id, egress)
    branch = AgentBranch(ctx)  # spec.commits: branch (inert otherwise)
    cleanup.callback(branch.close)
    branch.seed(runtime, container_id)
    cleanup.callback(traps.stop)
    _arm_traps(runtime, container_id, traps, bool(leases), live)
    memory = open_host_memory(ctx.plan, ctx.run_id, ctx.live.redactor)
    children = ChildDispatcher(ctx, memory.store)
    cleanup.callback(children.close)  # a parent never leaves a child running
    proxy = started if secret is not None else None
    drive = _drive(
        ctx,
        runtime,
        container_id,
        stream,
        inside,
        traps,
        memory,
        children,
        (proxy, injected),
        before_stop=lambda: branch.export(runtime, container_id),
    )
    brain = asyncio.run(_terminable(drive))
    children.close()
    # Nothing the agent started may run into verify: its container goes first.
    problem = stop_agent(runtime, container_id)
    traps.stop()
    if problem:
        live.note(problem, "red")
    if calls is not None and started is not None:
        # The agent is stopped: whatever it called is in the proxy's log now.
        started.drain()
        brain = _held_to_count(ctx, brain, calls.count)
    if tripwire.reason:
        problem = "not run: the run tripped a hijack tripwire"
        _record_incident(ctx, leases, tripwire)
    if watch.exceeded:
        problem = problem or f"not run: {watch.exceeded}"
    verify = _verify(ctx, runtime, problem, watched.append)
    watch.stop()
    if watch.late:
        live.note(f"the run ended past its disk budget: {watch.exceeded}", "red")
    host_stop = f"disk: {watch.exceeded}" if watch.exceeded else None
    if tripwire.reason:
        host_stop = f"tripwire: {tripwire.reason}"
    commits = branch.take(host_stop)  # every container of the run is gone
    return RunReport(
        brain,
        verify,
        host_stop,
        tuple(c.to_json() for c in children.children),
        model_calls=None if calls is None else calls.count,
        commits=None if commits is None else commits.to_json(),
    )


def _held_to_count(ctx: RunContext, brain: BrainOutcome, counted: int) -> BrainOutcome:
    """The brain's turn held to the model calls counted at the proxy: both figures shown,
    a large gap called out, and a run whose calls passed its turn budget is a budget stop
    even when its engine reported nothing of the kind."""
    live = ctx.live
    live.note(
        f"model calls counted at the proxy: {counted}; turns the brain reported: {brain.turns}"
    )
    if mismatch(counted, brain.turns):
        live.note(
            f"the proxy counted {counted} model calls, the brain reported {brain.turns} turns:"
            " its engine under-reports (a sign it was tampered with)",
            "red",
        )
    why = ctx.midrun.past_counted() if ctx.midrun is not None else None
    if why is None or (brain.error or "").startswith("budget:"):
        return brain
    live.note(f"the brain went on past its budget ({why})")
    return dataclasses.replace(brain, error=f"budget: {why}, not extended")


def _verify(
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
        ctx.live.phase(
            f"verifying: {len(commands)} command(s) in a fresh container"
            " (no network, no credentials)"
        )
        results = verify_in_fresh_container(
            runtime, ctx.plan, ctx.run_id, commands, on_container=on_container
        )
    ctx.live.verify(results)
    return tuple(results)


async def _drive(
    ctx: RunContext,
    runtime: ApplyRuntime,
    container_id: str,
    stream: DuplexStream,
    leases: Sequence[Lease],
    traps: ContainerTraps,
    memory: HostMemory,
    children: ChildDispatcher,
    injected: tuple[CredentialHolder | None, Sequence[Lease]],
    *,
    before_stop: Callable[[], Awaitable[None]] | None = None,
) -> BrainOutcome:
    brain = ctx.plan["brain"]
    limits = ChannelLimits(
        max_line_bytes=brain["max_line_bytes"],
        idle_seconds=float(brain["idle_timeout_seconds"]),
    )
    channel = BrainChannel(
        stream,
        memory=memory,
        limits=limits,
        on_stop=lambda: asyncio.to_thread(runtime.stop, container_id, 2),
        on_kill=lambda: asyncio.to_thread(runtime.kill, container_id),
        dispatcher=children,
        capabilities=ctx.midrun,
    )
    proxy, held = injected
    if ctx.midrun is not None and proxy is not None:
        # Its budget is asked about before it runs out, as a container lease's is.
        ctx.midrun.at_proxy.extend(lease for lease in held if renewed_in_run(lease))

    async def exhausted(why: str) -> None:
        ctx.live.note(f"credential budget exhausted: {why}; stopping", "red")
        await channel.stop()

    # The brain's own credential lives in the proxy: its renewals go there.
    keeper = asyncio.create_task(
        keep_injected_fresh(proxy, held, exhausted) if proxy else asyncio.sleep(0)
    )
    try:
        return await drive_brain(ctx, channel, leases, traps=traps, before_stop=before_stop)
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


def _arm_traps(
    runtime: ApplyRuntime, container_id: str, traps: ContainerTraps, delivered: bool, live: LiveView
) -> None:
    """Plant the canary (and the credential decoy of a run given none) before the turn."""
    if not traps.wanted:
        return
    try:
        pid = runtime.state(container_id).pid
    except KaguraError as exc:
        live.note(f"canary and credential tripwires off: {exc}", "yellow")
        return
    if pid <= 0:
        live.note("canary and credential tripwires off: the container has no process", "yellow")
        return
    for problem in traps.arm(pid, delivered):
        live.note(problem, "yellow")


def _stop_now(runtime: ApplyRuntime, containers: list[str], live: LiveView, reason: str) -> None:
    """Kill the agent's container at once (from a watcher thread)."""
    for container_id in containers:
        # SIGKILL to the container's init from the host first (no API round trip): its
        # PID namespace, and every process in it, ends at once; then Docker's kill.
        with contextlib.suppress(KaguraError, OSError):
            pid = runtime.state(container_id).pid
            if pid > 0:
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(KaguraError):
            runtime.kill(container_id)
    live.note(f"stopping the run: {reason}", "red")


def _record_incident(ctx: RunContext, leases: list[Lease], tripwire: Tripwire) -> None:
    actions = [
        "container killed",
        f"{len(leases)} lease(s) wiped and revoked",
        "verify not run",
        "run recorded as failed (graduated capabilities demoted)",
    ]
    incident_id = record_incident(
        ctx.store,
        at=iso(ctx.clock.now()),
        run_id=ctx.run_id,
        task=ctx.plan["task"]["name"],
        fingerprint=ctx.plan["fingerprint"],
        reason=str(tripwire.reason),
        actions=actions,
        egress=list(tripwire.egress_log),
        events=list(ctx.live.recent),
    )
    ctx.live.incident(incident_id, str(tripwire.reason))


def _watch_disk(ctx: RunContext, runtime: ApplyRuntime, containers: list[str]) -> DiskWatch:
    """The run's writes to the project root, bounded by ``budget.disk_bytes``; past it,
    every container in ``containers`` (the agent's, then verify's) is stopped."""

    known: dict[str, int] = {}  # a container's init keeps its pid: asked of Docker once

    def inits() -> list[int]:
        for container_id in list(containers):
            if container_id not in known:
                with contextlib.suppress(KaguraError):
                    if pid := runtime.state(container_id).pid:
                        known[container_id] = pid
        return list(known.values())

    freezer = Freezer(inits)

    def over(reason: str) -> None:
        freezer.kill_all()  # called while they are held: none runs again
        _stop_now(runtime, list(containers), ctx.live, reason)

    meter = WriteMeter(inits)

    def holders() -> list[int]:
        """Every process of the run's containers (a deleted file they hold counts): their
        cgroups' members, else each PID namespace's (a walk of all of /proc)."""
        pids = meter.pids()
        if pids:
            return pids
        for init in inits():
            pids += list(namespace_processes(init) or {})
        return pids

    budget = ctx.plan["budget"]["disk_bytes"]
    root = ctx.plan["task"]["project_root"]
    return DiskWatch(
        root, budget, over, holders=holders, meter=meter.read, hold=freezer.hold
    ).start()


def _close_egress(egress: EgressRun, denials: Denials, live: LiveView) -> None:
    egress.close()
    denials.extend(egress.denial_summary())
    if getattr(egress, "warm", False):
        live.phase("egress proxy of the warm session handed to the pool keeper for removal")
    else:
        live.phase("egress proxy and networks removed")
    for denial in denials:
        live.note(
            f"egress denied: {denial.get('host')}:{denial.get('port')} ({denial.get('count', 1)} times)",
            "yellow",
        )


def _remove_verify_leftovers(runtime: ApplyRuntime, ctx: RunContext, live: LiveView) -> None:
    if not ctx.plan["task"]["verify"]:
        return
    try:
        for container_id in runtime.list({LABEL_RUN: ctx.run_id, LABEL_ROLE: "verify"}):
            runtime.remove(container_id, force=True)
    except KaguraError as exc:
        live.note(f"could not remove this run's verify container: {exc.message}", "red")


def _remove_container(runtime: ApplyRuntime, container_id: str, live: LiveView) -> None:
    try:
        runtime.remove(container_id, force=True)
    except KaguraError as exc:
        live.note(f"could not remove container {container_id[:12]}: {exc.message}", "red")
        raise
    live.phase("container removed")
