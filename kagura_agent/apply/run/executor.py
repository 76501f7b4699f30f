"""Apply a launch plan: the only place that sequences side effects.

    refuse (not applyable, host runtime not allowed)  → memory gate → approvals
    → lock → sweep what crashed runs left → run row
    → leases (ledger first) → egress (network + proxy) → container (hardened, no secrets
      in its config) → brain over the attached stdin/stdout → container stopped → verify
      in a fresh container (no network, no credentials, no brain channel)
    → release leases, remove container, proxy and networks
    → aftercare of the project root (setuid bits, write for others, ACLs, planted
      repositories; a root it cannot check to the end is quarantined and the run failed)
    → record (memory, cost, graduation evidence, last applied plan)

Every exit — success, failure, Ctrl-C, SIGTERM, a brain crash, a budget overrun, a
Docker error — leaves through the same ExitStack, so clean-up is one code path.

``apply_plan`` builds one frozen RunContext (context.py) and hands it to each step (the
container run is container.py, the host run hostrun.py); the steps return values, and ``apply_plan``'s sequence assembles the RunResult and decides
its outcome before ``record_result`` stores it. The runtime is a parameter (Docker by
default): tests/test_apply_sequence.py runs this whole sequence against an in-memory one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import FrameType

from kagura_agent.apply.aftercare import acl
from kagura_agent.apply.aftercare.gitlinks import (
    Snapshot,
    snapshot,
)
from kagura_agent.apply.aftercare.hookcheck import HookSnapshot
from kagura_agent.apply.aftercare.hookcheck import snapshot as hook_snapshot
from kagura_agent.apply.aftercare.quarantine import refuse_quarantined
from kagura_agent.apply.aftercare.root import tend
from kagura_agent.apply.midrun.amend import Amender
from kagura_agent.apply.midrun.grants import MidRun, announce
from kagura_agent.apply.records.journal import recording
from kagura_agent.apply.records.live import LiveView
from kagura_agent.apply.records.record import record_result
from kagura_agent.apply.records.runs import (
    apply_lock,
    close_run,
    new_run_id,
    open_run,
    sweep_dead_runs,
)
from kagura_agent.apply.run.container import Denials, run_in_container
from kagura_agent.apply.run.context import (
    ApplyOptions,
    ApplyRuntime,
    Outcome,
    RunContext,
    RunResult,
    assemble,
)
from kagura_agent.apply.run.docker import DockerApplyRuntime
from kagura_agent.apply.run.hostrun import run_on_host
from kagura_agent.approvals.asking import obtain_approvals, operator_name, tty_prompt
from kagura_agent.approvals.midrun import Asker, ChatAsker, NobodyAsker, TtyAsker
from kagura_agent.clock import Clock
from kagura_agent.errors import ExitCode, KaguraError, RefusedError, SetupError, Terminated
from kagura_agent.membrane.leases import Broker, Lease, LeaseRequest, Sweeper
from kagura_agent.membrane.leases.broker import Budget as LeaseBudget
from kagura_agent.membrane.secrets import Redactor
from kagura_agent.memory.gate import check_ready
from kagura_agent.patterns.checkpoint import foreign_checkpoint, session_owner
from kagura_agent.plan import resume
from kagura_agent.plan.admission import admit
from kagura_agent.plan.model import Plan
from kagura_agent.state import StateStore, open_store, owner_key


def refuse_unapplyable(plan: Plan, options: ApplyOptions) -> None:
    """Refusals that need no side effect at all (exit 6).

    ``admit`` (plan/admission.py) is the verdict every view of a plan shows: the floor
    recomputed, not read from the plan (a hand-edited plan file cannot drop it), plus the
    refusals the planner recorded."""
    admission = admit(plan)
    if admission.floor:
        raise RefusedError(
            "plan breaks the membrane floor: " + "; ".join(admission.floor),
            hint="no manifest can grant this; fix the Image or task",
        )
    if not admission.applyable:
        reasons = [r["message"] for r in admission.refusals]
        raise RefusedError("plan is not applyable: " + "; ".join(reasons))
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
            store = owned.enter_context(open_store())
        live = LiveView(Redactor(), as_json=options.as_json)
        check_ready(plan["memory"])
        approved = _approvals(store, plan, options, live)
        if plan["brain"]["runtime"] != "container":
            runtime = None
        elif runtime is None:
            docker = DockerApplyRuntime(owner_key=owner_key(store.location))
            owned.callback(docker.client.close)
            runtime = docker
        run_id = options.run_id or new_run_id()
        ctx = RunContext(
            store=store,
            plan=plan,
            run_id=run_id,
            runtime=runtime,
            live=live,
            clock=options.clock,
            approved=frozenset(approved),
            steer_stdin=options.steer_stdin,
            interactive=options.interactive,
            approval_timeout=options.approval_timeout,
            who=options.who,
            midrun=MidRun(
                store=store,
                run_id=run_id,
                live=live,
                clock=options.clock,
                asker=_mid_run_asker(options, live),
                amender=Amender(options.compiled, plan),
                timeout=options.approval_timeout,
                answer_floor=options.answer_floor,
            ),
        )
        return _locked(ctx)


def _locked(ctx: RunContext) -> RunResult:
    """Under the project-root lock: sweep, open the run's row, run, aftercare (the run's
    last container is gone), record, close the row."""
    store, clock = ctx.store, ctx.clock
    with apply_lock(ctx.plan), _sigterm_as_exception(), contextlib.ExitStack() as kept:
        _refuse_foreign_session(store, ctx.plan)
        _sweep(store, ctx.runtime, clock, ctx.live)
        refuse_quarantined(store, ctx.plan["task"]["project_root"])
        root_acl = acl.snapshot(ctx.plan["task"]["project_root"])
        since = open_run(store, ctx.plan, ctx.run_id, clock, root_acl=root_acl)
        # What the live view shows from here to the row's close is the run's timeline.
        kept.enter_context(recording(ctx.live, store.location, ctx.run_id, clock))
        gitlinks = snapshot(ctx.plan["task"]["project_root"])
        hooks = hook_snapshot(ctx.plan["task"]["project_root"])
        denials: Denials = []  # filled when the egress proxy is removed, on every path
        # Once, after the run's last container: on the normal end (before the record),
        # on an error or an interruption (then nothing is recorded).
        aftercare = functools.cache(lambda: _aftercare(ctx, since, gitlinks, hooks, root_acl))
        try:
            result = _sequence(ctx, denials, aftercare)
        except KeyboardInterrupt:
            result = _failed_by(aftercare(), _ended_early(ctx, "interrupted", 130, denials))
        except Terminated:
            result = _failed_by(aftercare(), _ended_early(ctx, "terminated", 143, denials))
        except KaguraError as exc:
            outcome = "refused" if exc.exit_code == ExitCode.REFUSED else "failed"
            aftercare()
            close_run(store, ctx.run_id, outcome, int(exc.exit_code), clock)
            raise
        close_run(
            store,
            ctx.run_id,
            result.outcome,
            result.exit_code,
            clock,
            turns=result.turns,
            model_calls=result.model_calls,
            cost_usd=result.cost_usd,
        )
    return result


@dataclass(frozen=True)
class Aftercare:
    """What the aftercare of a run's project root came to."""

    failed: str | None = None  # why the run failed: its root is quarantined
    moved_aside: tuple[dict[str, str], ...] = ()  # path, to, why (relative to the root)


def _aftercare(
    ctx: RunContext, since: int, gitlinks: Snapshot, hooks: HookSnapshot, root_acl: str
) -> Aftercare:
    """The run's last container (agent, verify) is gone: the aftercare of its project root
    (apply/aftercare/root.py) before the row closes (a kill -9 here leaves it to the next
    apply's sweep); a root it could not check to the end is quarantined and fails the run."""
    care = tend(
        ctx.store,
        ctx.plan["task"]["project_root"],
        ctx.run_id,
        since,
        ctx.clock,
        root_acl=root_acl,
        gitlinks=gitlinks,
        hooks=hooks,
    )
    for line, colour in care.lines:
        ctx.live.note(line, colour)
    return Aftercare(care.failed, care.moved_aside)


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


def _sequence(ctx: RunContext, denials: Denials, aftercare: Callable[[], Aftercare]) -> RunResult:
    """Lease → run (container or host) → decide → (every container gone) aftercare →
    record; clean-up on every exit. A teardown that fails (a proxy that will not go) is
    raised once the run is recorded."""
    started = time.monotonic()
    result = None
    try:
        with contextlib.ExitStack() as cleanup:
            leases = _lease(ctx, cleanup)
            if ctx.runtime is None:
                report = run_on_host(ctx, leases)
            else:
                report = run_in_container(ctx, ctx.runtime, leases, cleanup, denials)
            result = assemble(ctx.run_id, report, round(time.monotonic() - started, 3), ())
    finally:
        if result is not None:
            # Decided here, before anything is recorded; record_result only stores it.
            result = _failed_by(aftercare(), result)
            result = dataclasses.replace(result, output_memory=record_result(ctx, result))
    return dataclasses.replace(result, denials=tuple(denials))


def _failed_by(aftercare: Aftercare, result: RunResult) -> RunResult:
    """The run's result once its aftercare has spoken: what it moved aside is part of it,
    and a quarantined root fails it."""
    result = dataclasses.replace(result, moved_aside=aftercare.moved_aside)
    if aftercare.failed is None:
        return result
    return dataclasses.replace(
        result,
        outcome="failed",
        exit_code=int(ExitCode.TASK_FAILED),
        brain_error=aftercare.failed,
    )


def _ended_early(ctx: RunContext, outcome: Outcome, code: int, denials: Denials) -> RunResult:
    ended = "interrupted" if outcome == "interrupted" else "terminated"
    ctx.live.note(f"{ended}: everything of this run was released and removed", "yellow")
    # How long it ran before it was stopped (and cleaned up), as any other run says.
    took = round(time.monotonic() - ctx.live.started, 3)
    return RunResult(ctx.run_id, outcome, code, denials=tuple(denials), wall_seconds=took)


def _approvals(store: StateStore, plan: Plan, options: ApplyOptions, live: LiveView) -> set[str]:
    needed = [a["category"] for a in plan["approvals"] if a["class"] == "needs-approval"]
    if not needed:
        return set()
    live.phase(f"approval needed for {len(needed)} capabilit{'y' if len(needed) == 1 else 'ies'}")
    obtain_approvals(
        store,
        needed,
        plan["intent"],  # approvals bind to what the operator approves, not to host facts
        approve=options.approve,
        prompt_fn=tty_prompt if options.interactive else None,
        timeout=options.approval_timeout,
        who=options.who or operator_name(),
        clock=options.clock,
        reasons={a["category"]: a["reason"] for a in plan["approvals"]},
        accept_since=options.accept_since,
    )
    return set(needed)


def _mid_run_asker(options: ApplyOptions, live: LiveView) -> Asker:
    """Who answers mid-run questions: the cockpit (under serve, answers nudge stdin), the
    terminal, or nobody (then every question is denied, saying so)."""
    if options.steer_stdin:
        return ChatAsker(announce(live))
    if options.interactive:
        return TtyAsker(options.who or operator_name())
    return NobodyAsker()


def _sweep(store: StateStore, runtime: ApplyRuntime | None, clock: Clock, live: LiveView) -> None:
    """Whatever a killed apply left behind goes first: containers, networks, leases."""
    report = Sweeper(store, clock=clock).sweep()
    # Leases still held by other live applies are theirs, not news for this run.
    if report.revoked or report.expired or report.retry_later or report.poison or report.lapsing:
        live.note(f"lease sweep: {report.summary()}")
    if runtime is None:
        return
    removed: list[str] = []
    swept = sweep_dead_runs(
        store,
        runtime,
        clock,
        live.note,
        # A dead run's proxy: its log is salvaged before the run's containers go.
        before_removal=lambda: removed.extend(runtime.sweep_egress(store)),
    )
    removed += runtime.sweep_egress(store)
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
    if ctx.midrun is not None:  # a credential granted mid-run is this broker's too
        ctx.midrun.broker = broker
    leases = []
    for entry in ctx.plan["credentials"]:
        klass = "approved" if entry["category"] in ctx.approved else entry["class"]
        ctx.live.phase(
            f"leasing {entry['provider']}/{entry['scope']} ({entry['ttl_seconds'] // 60}m)"
        )
        # A resumed session holds it under what is left of its lease budget.
        left = resume.lease_left(ctx.plan["budget"], entry["category"])
        request = LeaseRequest.from_plan({**entry, "class": klass})
        leases.append(broker.acquire(request, LeaseBudget(*left) if left is not None else None))
    return leases


def _release(broker: Broker, live: LiveView) -> None:
    if not broker.leases:
        return
    problems = broker.release_all()
    live.phase(f"released {len(broker.leases)} lease(s)")
    for problem in problems:
        live.note(f"release problem (kept for the sweeper): {problem}", "red")


__all__ = ["ApplyOptions", "RunContext", "RunResult", "SetupError", "apply_plan"]
