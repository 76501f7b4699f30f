"""Apply a launch plan: the only place that sequences side effects.

    refuse (not applyable, host runtime not allowed)  → memory gate → approvals
    → lock → sweep what crashed runs left → run row, the root as it was
    → the run (``_run``), one chain of steps (steps.py), each undone on every exit in the
      reverse order: leases (ledger first) → held inputs → egress (network + proxy) →
      the agent's container (hardened, no secrets in its config) → its branch → the disk
      watch → the brain's stream, the container started → tripwire traps → sub-agents →
      the brain's turn → the agent stopped → verify in a fresh container (no network, no
      credentials, no brain channel)
    → aftercare of the project root (setuid bits, write for others, ACLs, planted
      repositories; a root it cannot check to the end is quarantined and the run failed)
    → record (memory, cost, graduation evidence, last applied plan) → the row closed

Every exit — success, failure, Ctrl-C, SIGTERM, a brain crash, a budget overrun, a
Docker error — leaves through the same ``with`` chain, so clean-up is one code path, and
its order is the chain's reversed (tests/test_apply_sequence.py asserts it).

``apply_plan`` builds one frozen RunContext (context.py); each step receives what it
needs when that exists and returns what it produced as a value (the container run's turn
and verify are container.py, the host run hostrun.py); ``_run`` assembles the RunResult
and decides its outcome, ``_locked`` lets the aftercare speak and ``record_result`` stores
it. The runtime is a parameter (Docker by default): tests/test_apply_sequence.py runs this
whole sequence against an in-memory one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from types import FrameType

from kagura_agent.apply.aftercare.quarantine import refuse_quarantined
from kagura_agent.apply.aftercare.root import Care, RootBefore, tend
from kagura_agent.apply.midrun.amend import Amender
from kagura_agent.apply.midrun.grants import GrantTerms, announce
from kagura_agent.apply.midrun.hostmem import open_host_memory
from kagura_agent.apply.records import progress
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
from kagura_agent.apply.run import container, steps
from kagura_agent.apply.run.context import (
    ApplyOptions,
    ApplyRuntime,
    Outcome,
    RunContext,
    RunReport,
    RunResult,
    assemble,
)
from kagura_agent.apply.run.docker import DockerApplyRuntime
from kagura_agent.apply.run.hostrun import run_on_host
from kagura_agent.approvals.asking import (
    ApprovalRequest,
    obtain_approvals,
    operator_name,
    tty_prompt,
)
from kagura_agent.approvals.midrun import Asker, ChatAsker, NobodyAsker, TtyAsker
from kagura_agent.clock import Clock
from kagura_agent.errors import ExitCode, KaguraError, RefusedError, SetupError, Terminated
from kagura_agent.membrane.leases import Sweeper
from kagura_agent.membrane.placeholders import held_absent
from kagura_agent.membrane.secrets import Redactor
from kagura_agent.memory.gate import check_ready
from kagura_agent.patterns.checkpoint import foreign_checkpoint, session_owner
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
        ctx = RunContext(
            store=store,
            plan=plan,
            run_id=options.run_id or new_run_id(),
            runtime=runtime,
            live=live,
            clock=options.clock,
            approved=frozenset(approved),
            steer_stdin=options.steer_stdin,
            interactive=options.interactive,
            approval_timeout=options.approval_timeout,
            who=options.who,
        )
        terms = GrantTerms(
            asker=_mid_run_asker(options, live),
            amender=Amender(options.compiled, plan),
            timeout=options.approval_timeout,
            answer_floor=options.answer_floor,
        )
        return _locked(ctx, terms)


def _locked(ctx: RunContext, terms: GrantTerms) -> RunResult:
    """Under the project-root lock: sweep, open the run's row, run, aftercare (the run's
    last container is gone), record, close the row."""
    store, clock, root = ctx.store, ctx.clock, ctx.plan["task"]["project_root"]
    with apply_lock(ctx.plan), _sigterm_as_exception():
        _refuse_foreign_session(store, ctx.plan)
        _sweep(store, ctx.runtime, clock, ctx.live)
        refuse_quarantined(store, root)
        before = RootBefore.take(root)
        since = open_run(store, ctx.plan, ctx.run_id, clock, root_acl=before.acl)
        # What the live view shows from here to the row's close is the run's timeline.
        with recording(ctx.live, store.location, ctx.run_id, clock):
            try:
                if ctx.runtime is None:
                    ran = _run_on_host(ctx, terms)
                else:
                    ran = _run(ctx, ctx.runtime, terms)
            except KaguraError as exc:
                _aftercare(ctx, since, before)
                _close_failed(ctx, exc)
                raise
            # Every container of the run is gone: its root's aftercare has the last word.
            result = _failed_by(_aftercare(ctx, since, before), ran.result)
            if ran.finished:
                # Decided above, before anything is recorded; record_result only stores it.
                result = dataclasses.replace(result, output_memory=record_result(ctx, result))
            if ran.teardown is not None:
                # A teardown that failed (a proxy that will not go): raised once recorded.
                _close_failed(ctx, ran.teardown)
                raise ran.teardown
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
class Ran:
    """What a run's chain came to: its result before the aftercare; whether the run went
    to its end (then it is recorded; an interrupted one is not); a teardown that failed
    after the result was made."""

    result: RunResult
    finished: bool = True
    teardown: KaguraError | None = None


def _run(ctx: RunContext, runtime: ApplyRuntime, terms: GrantTerms) -> Ran:
    """The run in a container, top to bottom. Each ``with`` opens a step (steps.py) and
    undoes it on every exit, in the reverse order: the turn's sub-agents stop before the
    agent's container is stopped, its traps are disarmed before verify, the disk watch
    takes its last reading after verify, the container goes before the proxy, the proxy
    before the held inputs and the leases."""
    started = time.monotonic()
    containers = steps.RunContainers()
    wire = steps.tripwire(ctx, runtime, containers)
    egress: steps.Egress | None = None
    report: RunReport | None = None
    try:
        with (
            steps.leased(ctx) as leased,
            held_absent(ctx.plan),
            steps.verify_leftovers(ctx, runtime),
            steps.egress(ctx, runtime, leased, wire) as egress,
            steps.agent_container(ctx, runtime, egress, containers) as container_id,
            steps.agent_branch(ctx) as branch,
        ):
            with (
                steps.disk_watch(ctx, runtime, containers) as disk,
                steps.attached(runtime, container_id, egress) as agent,
            ):
                branch.seed(runtime, agent.id)
                with steps.traps(ctx, agent, wire, leased) as traps:
                    turn_ctx = steps.grants(ctx, terms, leased, egress)
                    memory = open_host_memory(ctx.plan, ctx.run_id, ctx.live.redactor)
                    with steps.children(turn_ctx, memory) as children:
                        brain = container.brain_turn(
                            turn_ctx,
                            agent,
                            egress,
                            traps,
                            children,
                            memory,
                            before_stop=lambda: branch.export(runtime, agent.id),
                        )
                    # Nothing the agent started may run into verify: its container goes
                    # first (its sub-agents are stopped, its traps still watch).
                    problem = container.stop(ctx, agent)
                brain = container.held_to_count(turn_ctx, egress, brain)
                problem = container.tripped(ctx, wire, leased) or problem
                if disk.exceeded:
                    problem = problem or f"not run: {disk.exceeded}"
                verify = container.verify(ctx, runtime, problem, containers.verify.append)
            # The disk watch took its last reading: a write between two readings counts.
            if disk.late:
                ctx.live.emit(progress.DiskPassedAtEnd(disk.exceeded or ""))
            host_stop = f"disk: {disk.exceeded}" if disk.exceeded else None
            if wire.reason:
                host_stop = f"tripwire: {wire.reason}"
            commits = branch.take(host_stop)  # every container of the run is gone
            took = round(time.monotonic() - started, 3)
            report = RunReport(
                brain,
                verify,
                host_stop,
                tuple(c.to_json() for c in children.children),
                model_calls=None if egress.calls is None else egress.calls.count,
                commits=None if commits is None else commits.to_json(),
            )
    except KeyboardInterrupt:
        return Ran(_ended_early(ctx, "interrupted", 130, egress), finished=False)
    except Terminated:
        return Ran(_ended_early(ctx, "terminated", 143, egress), finished=False)
    except KaguraError as exc:
        if report is None:
            raise
        return Ran(assemble(ctx.run_id, report, took, _denials(egress)), teardown=exc)
    return Ran(assemble(ctx.run_id, report, took, _denials(egress)))


def _run_on_host(ctx: RunContext, terms: GrantTerms) -> Ran:
    """``runtime: host``: the leases, then the brain and verify on this machine."""
    started = time.monotonic()
    try:
        with steps.leased(ctx) as leased:
            report = run_on_host(steps.grants(ctx, terms, leased, None), leased.leases)
    except KeyboardInterrupt:
        return Ran(_ended_early(ctx, "interrupted", 130, None), finished=False)
    except Terminated:
        return Ran(_ended_early(ctx, "terminated", 143, None), finished=False)
    return Ran(assemble(ctx.run_id, report, round(time.monotonic() - started, 3), ()))


def _denials(egress: steps.Egress | None) -> tuple[dict[str, object], ...]:
    return () if egress is None else egress.denials()


def _close_failed(ctx: RunContext, exc: KaguraError) -> None:
    outcome = "refused" if exc.exit_code == ExitCode.REFUSED else "failed"
    close_run(ctx.store, ctx.run_id, outcome, int(exc.exit_code), ctx.clock)


def _aftercare(ctx: RunContext, since: int, before: RootBefore) -> Care:
    """The run's last container (agent, verify) is gone: the aftercare of its project root
    (apply/aftercare/root.py) before the row closes (a kill -9 here leaves it to the next
    apply's sweep); a root it could not check to the end is quarantined and fails the run."""
    root = ctx.plan["task"]["project_root"]
    care = tend(ctx.store, root, ctx.run_id, since, ctx.clock, before=before)
    for finding in care.findings:
        ctx.live.emit(finding)
    return care


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


def _failed_by(care: Care, result: RunResult) -> RunResult:
    """The run's result once its aftercare has spoken: what it moved aside is part of it,
    and a quarantined root fails it."""
    result = dataclasses.replace(result, moved_aside=care.moved_aside)
    if care.failed is None:
        return result
    return dataclasses.replace(
        result,
        outcome="failed",
        exit_code=int(ExitCode.TASK_FAILED),
        brain_error=care.failed,
    )


def _ended_early(
    ctx: RunContext, outcome: Outcome, code: int, egress: steps.Egress | None
) -> RunResult:
    ended = "interrupted" if outcome == "interrupted" else "terminated"
    ctx.live.emit(progress.EndedEarly(ended))
    # How long it ran before it was stopped (and cleaned up), as any other run says.
    took = round(time.monotonic() - ctx.live.started, 3)
    return RunResult(ctx.run_id, outcome, code, denials=_denials(egress), wall_seconds=took)


def _approvals(store: StateStore, plan: Plan, options: ApplyOptions, live: LiveView) -> set[str]:
    needed = [a["category"] for a in plan["approvals"] if a["class"] == "needs-approval"]
    if not needed:
        return set()
    live.emit(progress.ApprovalNeeded(len(needed)))
    obtain_approvals(
        store,
        ApprovalRequest.for_plan(
            plan, who=options.who or operator_name(), timeout=options.approval_timeout
        ),
        approve=options.approve,
        prompt_fn=tty_prompt if options.interactive else None,
        clock=options.clock,
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
        live.emit(progress.LeaseSwept(report.summary()))
    if runtime is None:
        return
    removed: list[str] = []
    swept = sweep_dead_runs(
        store,
        runtime,
        clock,
        live.emit,
        # A dead run's proxy: its log is salvaged before the run's containers go.
        before_removal=lambda: removed.extend(runtime.sweep_egress(store)),
    )
    removed += runtime.sweep_egress(store)
    if swept or removed:
        live.emit(progress.DeadRunsRemoved(len(swept), len(removed)))


@contextlib.contextmanager
def _sigterm_as_exception() -> Iterator[None]:
    def handler(signum: int, frame: FrameType | None) -> None:
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


__all__ = ["ApplyOptions", "RunContext", "RunResult", "SetupError", "apply_plan"]
