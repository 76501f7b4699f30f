"""Apply a launch plan: the only place that sequences side effects.

    refuse (not applyable, host runtime not allowed)  → memory gate → approvals
    → lock → sweep what crashed runs left → run row
    → leases (ledger first) → egress (network + proxy) → container (hardened, no secrets
      in its config) → brain over the attached stdin/stdout → container stopped → verify
      in a fresh container (no network, no credentials, no brain channel)
    → record (memory, cost, graduation evidence, last applied plan)
    → release leases, remove container, proxy and networks

Every exit — success, failure, Ctrl-C, SIGTERM, a brain crash, a budget overrun, a
Docker error — leaves through the same ExitStack, so clean-up is one code path.

``apply_plan`` builds one frozen RunContext (context.py) and hands it to each step; the
steps return values, and ``apply_plan``'s sequence assembles the RunResult and decides
its outcome before ``record_result`` stores it. The runtime is a parameter (Docker by
default): tests/test_apply_sequence.py runs this whole sequence against an in-memory one.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
import time
from collections.abc import Callable, Iterator, Sequence
from types import FrameType

from kagura_agent.apply.context import (
    ApplyOptions,
    ApplyRuntime,
    BrainOutcome,
    EgressRun,
    Outcome,
    RunContext,
    RunReport,
    RunResult,
    VerifyResult,
    assemble,
)
from kagura_agent.apply.diskwatch import DiskWatch
from kagura_agent.apply.docker import DockerApplyRuntime
from kagura_agent.apply.hostmem import open_host_memory
from kagura_agent.apply.hostrun import run_on_host
from kagura_agent.apply.incidents import record_incident
from kagura_agent.apply.live import LiveView
from kagura_agent.apply.record import record_result
from kagura_agent.apply.runs import apply_lock, close_run, new_run_id, open_run, sweep_dead_runs
from kagura_agent.apply.tripwire import ContainerTraps, Tripwire
from kagura_agent.apply.turn import drive_brain
from kagura_agent.apply.verify import stop_agent, verify_in_fresh_container
from kagura_agent.approvals.asking import obtain_approvals, operator_name, tty_prompt
from kagura_agent.brain.channel import BrainChannel, ChannelLimits
from kagura_agent.brain.streams import DuplexStream
from kagura_agent.clock import Clock, iso
from kagura_agent.errors import ExitCode, KaguraError, RefusedError, SetupError, Terminated
from kagura_agent.membrane.egress.squid import ANTHROPIC_API
from kagura_agent.membrane.floor import floor_violations
from kagura_agent.membrane.hardening import LABEL_ROLE, LABEL_RUN
from kagura_agent.membrane.leases import Broker, Lease, LeaseRequest, Sweeper
from kagura_agent.membrane.secrets import Redactor
from kagura_agent.memory.gate import check_ready
from kagura_agent.patterns.checkpoint import foreign_checkpoint, session_owner
from kagura_agent.plan.injection import PLACEHOLDER, injected_provider
from kagura_agent.plan.model import Plan
from kagura_agent.state import StateStore

MINTED_CLASSES = ("baseline", "graduated")
Denials = list[dict[str, object]]


def refuse_unapplyable(plan: Plan, options: ApplyOptions) -> None:
    """Refusals that need no side effect at all (exit 6)."""
    # Recomputed, not read from the plan: a hand-edited plan file cannot drop it.
    broken = floor_violations(plan)
    if broken:
        raise RefusedError(
            "plan breaks the membrane floor: " + "; ".join(broken),
            hint="no manifest can grant this; fix the Image or task",
        )
    if plan["refusals"] or not plan["applyable"]:
        reasons = [r["message"] for r in plan["refusals"]]
        raise RefusedError("plan is not applyable: " + "; ".join(reasons or ["see the plan"]))
    if plan["brain"]["runtime"] == "host" and not options.allow_host_runtime:
        raise RefusedError(
            "this plan runs the brain on the host, unsandboxed",
            hint="re-run with --allow-host-runtime if that is really what you want",
        )


def apply_plan(
    plan: Plan,
    options: ApplyOptions,
    runtime: ApplyRuntime | None = None,
    *,
    store: StateStore | None = None,
) -> RunResult:
    """Execute ``plan`` exactly; returns the run's result (exit code inside).

    ``runtime`` runs the containers (Docker when not given; unused for ``runtime: host``
    plans); ``store`` is the state store (the state directory's when not given). What
    this opens itself (the store, the Docker client) it closes.
    """
    refuse_unapplyable(plan, options)
    with contextlib.ExitStack() as owned:
        if store is None:
            store = owned.enter_context(StateStore())
        live = LiveView(Redactor(), as_json=options.as_json)
        check_ready(plan["memory"])
        approved = _approvals(store, plan, options, live)
        if plan["brain"]["runtime"] != "container":
            runtime = None
        elif runtime is None:
            docker = DockerApplyRuntime()
            owned.callback(docker.client.close)
            runtime = docker
        ctx = RunContext(
            store=store,
            plan=plan,
            run_id=new_run_id(),
            runtime=runtime,
            live=live,
            clock=options.clock,
            approved=frozenset(approved),
            steer_stdin=options.steer_stdin,
        )
        return _locked(ctx)


def _locked(ctx: RunContext) -> RunResult:
    """Under the project-root lock: sweep, open the run's row, run, close the row."""
    store, clock = ctx.store, ctx.clock
    with apply_lock(ctx.plan), _sigterm_as_exception():
        _refuse_foreign_session(store, ctx.plan)
        _sweep(store, ctx.runtime, clock, ctx.live)
        open_run(store, ctx.plan, ctx.run_id, clock)
        denials: Denials = []  # filled when the egress proxy is removed, on every path
        try:
            result = _sequence(ctx, denials)
        except KeyboardInterrupt:
            result = _ended_early(ctx, "interrupted", 130, denials)
        except Terminated:
            result = _ended_early(ctx, "terminated", 143, denials)
        except KaguraError as exc:
            outcome = "refused" if exc.exit_code == ExitCode.REFUSED else "failed"
            close_run(store, ctx.run_id, outcome, int(exc.exit_code), clock)
            raise
        close_run(store, ctx.run_id, result.outcome, result.exit_code, clock)
    return result


def _refuse_foreign_session(store: StateStore, plan: Plan) -> None:
    """A named session resumes only for the task kind and project root that saved it."""
    task = plan["task"]
    owner = session_owner(task["project_root"], task["kind"])
    problem = foreign_checkpoint(store, task["session"], owner)
    if problem:
        raise RefusedError(
            f"cannot resume: {problem}",
            hint="name another session (spec.session / --session) for this task",
        )


def _sequence(ctx: RunContext, denials: Denials) -> RunResult:
    """Lease → run (container or host) → decide → record; clean-up on every exit."""
    started = time.monotonic()
    with contextlib.ExitStack() as cleanup:
        leases = _lease(ctx, cleanup)
        if ctx.runtime is None:
            report = run_on_host(ctx, leases)
        else:
            report = _run_in_container(ctx, ctx.runtime, leases, cleanup, denials)
        # Decided here, before anything is recorded; record_result only stores it.
        result = assemble(ctx.run_id, report, round(time.monotonic() - started, 3), ())
        result = dataclasses.replace(result, output_memory=record_result(ctx, result))
    return dataclasses.replace(result, denials=tuple(denials))


def _ended_early(ctx: RunContext, outcome: Outcome, code: int, denials: Denials) -> RunResult:
    ended = "interrupted" if outcome == "interrupted" else "terminated"
    ctx.live.note(f"{ended}: everything of this run was released and removed", "yellow")
    return RunResult(ctx.run_id, outcome, code, denials=tuple(denials))


def _approvals(store: StateStore, plan: Plan, options: ApplyOptions, live: LiveView) -> set[str]:
    needed = [a["category"] for a in plan["approvals"] if a["class"] == "needs-approval"]
    if not needed:
        return set()
    live.phase(f"approval needed for {len(needed)} capabilit{'y' if len(needed) == 1 else 'ies'}")
    obtain_approvals(
        store,
        needed,
        plan["fingerprint"],
        approve=options.approve,
        prompt_fn=tty_prompt if options.interactive else None,
        timeout=options.approval_timeout,
        who=options.who or operator_name(),
        clock=options.clock,
        reasons={a["category"]: a["reason"] for a in plan["approvals"]},
        accept_since=options.accept_since,
    )
    return set(needed)


def _sweep(store: StateStore, runtime: ApplyRuntime | None, clock: Clock, live: LiveView) -> None:
    """Whatever a killed apply left behind goes first: containers, networks, leases."""
    report = Sweeper(store, clock=clock).sweep()
    # Leases still held by other live applies are theirs, not news for this run.
    if report.revoked or report.expired or report.retry_later or report.poison or report.lapsing:
        live.note(f"lease sweep: {report.summary()}")
    if runtime is None:
        return
    swept = sweep_dead_runs(store, runtime, clock)
    removed = runtime.sweep_egress(store)
    if swept or removed:
        live.note(
            f"removed what crashed runs left: {len(swept)} runs, {len(removed)} egress objects"
        )


@contextlib.contextmanager
def _sigterm_as_exception() -> Iterator[None]:
    def handler(signum: int, frame: FrameType | None) -> None:
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _lease(ctx: RunContext, cleanup: contextlib.ExitStack) -> list[Lease]:
    """Every credential of the plan, in the ledger first; all released on the way out."""
    broker = Broker(ctx.store, run_id=ctx.run_id, clock=ctx.clock, redactor=ctx.live.redactor)
    cleanup.callback(_release, broker, ctx.live)
    leases = []
    for entry in ctx.plan["credentials"]:
        klass = "approved" if entry["category"] in ctx.approved else entry["class"]
        ctx.live.phase(
            f"leasing {entry['provider']}/{entry['scope']} ({entry['ttl_seconds'] // 60}m)"
        )
        leases.append(broker.acquire(LeaseRequest.from_plan({**entry, "class": klass})))
    return leases


def _release(broker: Broker, live: LiveView) -> None:
    if not broker.leases:
        return
    problems = broker.release_all()
    live.phase(f"released {len(broker.leases)} lease(s)")
    for problem in problems:
        live.note(f"release problem (kept for the sweeper): {problem}", "red")


def _run_in_container(
    ctx: RunContext,
    runtime: ApplyRuntime,
    leases: list[Lease],
    cleanup: contextlib.ExitStack,
    denials: Denials,
) -> RunReport:
    plan, run_id, live = ctx.plan, ctx.run_id, ctx.live
    # Last on the way out: a verify container whose own removal failed gets a second try
    # (its run's row is closed by then, so no later sweep looks for it).
    cleanup.callback(_remove_verify_leftovers, runtime, run_id, live)
    stoppable: list[str] = []  # the agent's container, once it exists
    tripwire = Tripwire(
        dict(plan["tripwires"]),
        lambda reason: _stop_now(runtime, stoppable, live, f"hijack tripwire: {reason}"),
    )
    knobs = dict(plan["tripwires"])
    traps = ContainerTraps(tripwire, knobs, plan["hardening"]["user"])
    live.watchers.append(lambda event: tripwire.scan("the brain's output", event))
    live.redactor.add(tripwire.canary)  # fake, but shown like the secret it pretends to be

    def on_egress(event: dict[str, object]) -> None:
        live.egress(event)
        tripwire.egress(event)

    # The brain's API key stays with the host and the proxy: never delivered inside.
    provider = injected_provider(plan)
    injected = [lease for lease in leases if provider and lease.request.provider == provider]
    inside = [lease for lease in leases if lease not in injected]
    secret = injected[0].minted.secrets[0] if injected and injected[0].minted else None
    environment: dict[str, str] = {"ANTHROPIC_API_KEY": PLACEHOLDER} if provider else {}
    egress = None
    if plan["egress"]["mode"] == "proxy":
        live.phase(f"starting this run's egress proxy ({len(plan['egress']['allow'])} allowed)")
        started = runtime.start_egress(
            plan,
            run_id,
            on_egress,
            store=ctx.store,
            clock=ctx.clock,
            injection=ANTHROPIC_API if secret else None,
            injection_secret=secret,
        )
        cleanup.callback(_close_egress, started, denials, live)
        egress = started.agent_network_config()
        environment = {**environment, **egress.environment}
    live.phase(f"starting container from {plan['image']['ref']}")
    container_id = runtime.create(
        plan,
        run_id,
        environment=environment,
        network=egress.network if egress else None,
        egress_mounts=egress.mounts() if egress else [],
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
    cleanup.callback(traps.stop)
    _arm_traps(runtime, container_id, traps, bool(leases), live)
    brain = asyncio.run(_drive(ctx, runtime, container_id, stream, inside, traps))
    # Nothing the agent started may run into verify: its container goes first.
    problem = stop_agent(runtime, container_id)
    traps.stop()
    if problem:
        live.note(problem, "red")
    if tripwire.reason:
        problem = "not run: the run tripped a hijack tripwire"
        _record_incident(ctx, leases, tripwire)
    if watch.exceeded:
        problem = problem or f"not run: {watch.exceeded}"
    verify = _verify(ctx, runtime, problem, watched.append)
    watch.stop()
    host_stop = f"disk: {watch.exceeded}" if watch.exceeded else None
    if tripwire.reason:
        host_stop = f"tripwire: {tripwire.reason}"
    return RunReport(brain, verify, host_stop)


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
) -> BrainOutcome:
    brain = ctx.plan["brain"]
    limits = ChannelLimits(
        max_line_bytes=brain["max_line_bytes"],
        idle_seconds=float(brain["idle_timeout_seconds"]),
    )
    channel = BrainChannel(
        stream,
        memory=open_host_memory(ctx.plan, ctx.run_id),
        limits=limits,
        on_stop=lambda: asyncio.to_thread(runtime.stop, container_id, 2),
        on_kill=lambda: asyncio.to_thread(runtime.kill, container_id),
    )
    return await drive_brain(ctx, channel, leases, traps=traps)


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

    def over(reason: str) -> None:
        _stop_now(runtime, list(containers), ctx.live, reason)

    budget = ctx.plan["budget"]["disk_bytes"]
    return DiskWatch(ctx.plan["task"]["project_root"], budget, over).start()


def _close_egress(egress: EgressRun, denials: Denials, live: LiveView) -> None:
    egress.close()
    denials.extend(egress.denial_summary())
    live.phase("egress proxy and networks removed")
    for denial in denials:
        live.note(
            f"egress denied: {denial.get('host')}:{denial.get('port')} ({denial.get('count', 1)} times)",
            "yellow",
        )


def _remove_verify_leftovers(runtime: ApplyRuntime, run_id: str, live: LiveView) -> None:
    try:
        for container_id in runtime.list({LABEL_RUN: run_id, LABEL_ROLE: "verify"}):
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


__all__ = ["ApplyOptions", "RunContext", "RunResult", "SetupError", "apply_plan"]
