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
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from types import FrameType
from typing import Any

from kagura_agent.apply.live import LiveView
from kagura_agent.apply.runs import apply_lock, close_run, new_run_id, open_run, sweep_dead_runs
from kagura_agent.clock import Clock, SystemClock
from kagura_agent.errors import ExitCode, KaguraError, RefusedError, SetupError, Terminated
from kagura_agent.membrane.secrets import Redactor
from kagura_agent.plan.model import Plan
from kagura_agent.state import StateStore

MINTED_CLASSES = ("baseline", "graduated")


@dataclass
class ApplyOptions:
    approve: tuple[str, ...] = ()
    allow_host_runtime: bool = False
    interactive: bool = False
    approval_timeout: float = 120.0
    as_json: bool = False
    who: str = ""
    clock: Clock = field(default_factory=SystemClock)
    prompt: str | None = None  # a follow-up prompt (repl) instead of the task's
    # Approvals for this plan recorded since then count (the cockpit asked in chat).
    accept_since: datetime | None = None


@dataclass
class RunResult:
    run_id: str
    outcome: str  # success | failed | interrupted | terminated
    exit_code: int
    verify: list[tuple[str, int, str]] = field(default_factory=list)
    brain_error: str | None = None
    cost_usd: float | None = None
    turns: int = 0
    input_tokens: int | None = None
    output_tokens: int | None = None
    retries: int = 0  # re-attempts the engine or executor made (never a constant)
    wall_seconds: float = 0.0
    denials: list[dict[str, Any]] = field(default_factory=list)
    resumed_from: int | None = None
    brain_session_id: str | None = None
    output_memory: str | None = None  # a dispatched child's output, for its parent to recall

    def to_json(self) -> dict[str, Any]:
        return {
            **dataclasses.asdict(self),
            "verify": [{"command": c, "exit_code": code} for c, code, _ in self.verify],
        }


def refuse_unapplyable(plan: Plan, options: ApplyOptions) -> None:
    """Refusals that need no side effect at all (exit 6)."""
    from kagura_agent.membrane.floor import floor_violations

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


def apply_plan(plan: Plan, options: ApplyOptions) -> RunResult:
    """Execute ``plan`` exactly; returns the run's result (exit code inside)."""
    from kagura_agent.memory.gate import check_ready

    refuse_unapplyable(plan, options)
    store = StateStore()
    live = LiveView(Redactor(), as_json=options.as_json)
    check_ready(plan["memory"])
    approved = _approvals(store, plan, options, live)
    runtime = _runtime() if plan["brain"]["runtime"] == "container" else None
    clock = options.clock
    with apply_lock(plan), _sigterm_as_exception():
        _sweep(store, runtime, clock, live)
        run_id = new_run_id()
        open_run(store, plan, run_id, clock)
        result = RunResult(run_id, "failed", int(ExitCode.TASK_FAILED))
        try:
            _run(store, plan, run_id, approved, runtime, options, live, result)
        except KeyboardInterrupt:
            result.outcome, result.exit_code = "interrupted", 130
            live.note("interrupted: everything of this run was released and removed", "yellow")
        except Terminated:
            result.outcome, result.exit_code = "terminated", 143
            live.note("terminated: everything of this run was released and removed", "yellow")
        except KaguraError as exc:
            result.outcome = "refused" if exc.exit_code == ExitCode.REFUSED else "failed"
            result.exit_code = int(exc.exit_code)
            close_run(store, run_id, result.outcome, result.exit_code, clock)
            raise
        close_run(store, run_id, result.outcome, result.exit_code, clock)
    return result


def _runtime() -> Any:
    from kagura_agent.membrane.runtime import DockerRuntime

    return DockerRuntime()


def _approvals(store: StateStore, plan: Plan, options: ApplyOptions, live: LiveView) -> set[str]:
    from kagura_agent.approvals.asking import obtain_approvals, operator_name, tty_prompt

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


def _sweep(store: StateStore, runtime: Any, clock: Clock, live: LiveView) -> None:
    """Whatever a killed apply left behind goes first: containers, networks, leases."""
    from kagura_agent.membrane.leases import Sweeper

    report = Sweeper(store, clock=clock).sweep()
    # Leases still held by other live applies are theirs, not news for this run.
    if report.revoked or report.expired or report.retry_later or report.poison or report.lapsing:
        live.note(f"lease sweep: {report.summary()}")
    if runtime is None:
        return
    swept = sweep_dead_runs(store, runtime, clock)
    from kagura_agent.membrane.egress import sweep_orphans

    removed = sweep_orphans(runtime.client, store)
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


def _run(
    store: StateStore,
    plan: Plan,
    run_id: str,
    approved: set[str],
    runtime: Any,
    options: ApplyOptions,
    live: LiveView,
    result: RunResult,
) -> None:
    from kagura_agent.apply.record import record_outcome
    from kagura_agent.membrane.leases import Broker, LeaseRequest

    started = time.monotonic()
    redactor = live.redactor
    with contextlib.ExitStack() as cleanup:
        broker = Broker(store, run_id=run_id, clock=options.clock, redactor=redactor)
        cleanup.callback(_release, broker, live)
        leases = []
        for entry in plan["credentials"]:
            klass = "approved" if entry["category"] in approved else entry["class"]
            live.phase(
                f"leasing {entry['provider']}/{entry['scope']} ({entry['ttl_seconds'] // 60}m)"
            )
            leases.append(broker.acquire(LeaseRequest.from_plan({**entry, "class": klass})))
        if runtime is None:
            from kagura_agent.apply.hostrun import run_on_host

            run_on_host(store, plan, run_id, leases, options, live, result)
        else:
            _run_in_container(store, plan, run_id, leases, runtime, options, live, result, cleanup)
        result.wall_seconds = round(time.monotonic() - started, 3)
        record_outcome(store, plan, run_id, approved, result, options.clock, live)


def _release(broker: Any, live: LiveView) -> None:
    if not broker.leases:
        return
    problems = broker.release_all()
    live.phase(f"released {len(broker.leases)} lease(s)")
    for problem in problems:
        live.note(f"release problem (kept for the sweeper): {problem}", "red")


def _run_in_container(
    store: StateStore,
    plan: Plan,
    run_id: str,
    leases: list[Any],
    runtime: Any,
    options: ApplyOptions,
    live: LiveView,
    result: RunResult,
    cleanup: contextlib.ExitStack,
) -> None:
    from kagura_agent.apply.tripwire import ContainerTraps, Tripwire
    from kagura_agent.apply.verify import stop_agent, verify_in_fresh_container
    from kagura_agent.membrane.egress.squid import ANTHROPIC_API
    from kagura_agent.plan.injection import PLACEHOLDER, injected_provider

    stoppable: list[str] = []  # the agent's container, once it exists
    tripwire = Tripwire(
        dict(plan.get("tripwires") or {}),
        lambda reason: _stop_now(runtime, stoppable, live, f"hijack tripwire: {reason}"),
    )

    knobs = dict(plan.get("tripwires") or {})
    traps = ContainerTraps(tripwire, knobs, str(plan["hardening"].get("user") or "1000:1000"))
    live.watchers.append(lambda event: tripwire.scan("the brain's output", event))
    live.redactor.add(tripwire.canary)  # fake, but shown like the secret it pretends to be

    def on_egress(event: dict[str, Any]) -> None:
        live.egress(event)
        tripwire.egress(event)

    network: str | None = None
    environment: dict[str, str] = {}
    egress_mounts: list[dict[str, Any]] = []
    egress_config = None
    # The brain's API key stays with the host and the proxy: never delivered inside.
    provider = injected_provider(plan)
    injected = [lease for lease in leases if provider and lease.request.provider == provider]
    held = leases  # every lease of the run (an incident revokes them all)
    leases = [lease for lease in leases if lease not in injected]
    secret = injected[0].minted.secrets[0] if injected and injected[0].minted else None
    if provider:
        environment["ANTHROPIC_API_KEY"] = PLACEHOLDER
    if plan["egress"]["mode"] == "proxy":
        from kagura_agent.membrane.egress import EgressSession

        live.phase(f"starting this run's egress proxy ({len(plan['egress']['allow'])} allowed)")
        egress = EgressSession.start(
            runtime.client,
            plan,
            run_id,
            on_egress,
            store=store,
            clock=options.clock,
            injection=ANTHROPIC_API if secret else None,
            injection_secret=secret,
        )
        cleanup.callback(_close_egress, egress, result, live)
        egress_config = egress.agent_network_config()
        network = egress_config.network
        environment = {**environment, **egress_config.environment}
        egress_mounts = egress_config.mounts()
    live.phase(f"starting container from {plan['image']['ref']}")
    container_id = runtime.create(
        plan, run_id, environment=environment, network=network, egress_mounts=egress_mounts
    )
    cleanup.callback(_remove_container, runtime, container_id, live)
    stoppable.append(container_id)
    watch = _watch_disk(plan, runtime, container_id, live)
    cleanup.callback(watch.stop)
    sock = runtime.attach_socket(container_id)
    cleanup.callback(_close_quietly, sock)
    runtime.start(container_id)
    if egress_config is not None:
        from kagura_agent.membrane.egress.session import start_forwarder

        start_forwarder(runtime.client, container_id, egress_config)
    cleanup.callback(traps.stop)
    _arm_traps(runtime, container_id, traps, bool(leases), live)
    asyncio.run(
        _drive(
            store, plan, run_id, leases, runtime, container_id, sock, options, live, result, traps
        )
    )
    # Nothing the agent started may run into verify: its container goes first.
    problem = stop_agent(runtime, container_id)
    traps.stop()
    watch.stop()
    if watch.exceeded:
        result.brain_error = f"disk: {watch.exceeded}"
    if problem:
        live.note(problem, "red")
    commands = plan["task"]["verify"]
    if tripwire.reason:
        result.brain_error = f"tripwire: {tripwire.reason}"
        problem = "not run: the run tripped a hijack tripwire"
        _record_incident(store, plan, run_id, held, tripwire, live, options)
    if commands:
        if problem:
            result.verify = [(command, -1, problem) for command in commands]
        else:
            live.phase(
                f"verifying: {len(commands)} command(s) in a fresh container"
                " (no network, no credentials)"
            )
            result.verify = verify_in_fresh_container(runtime, plan, run_id, commands)
        live.verify(result.verify)


async def _drive(
    store: StateStore,
    plan: Plan,
    run_id: str,
    leases: list[Any],
    runtime: Any,
    container_id: str,
    sock: Any,
    options: ApplyOptions,
    live: LiveView,
    result: RunResult,
    traps: Any = None,
) -> None:
    from kagura_agent.apply.hostmem import open_host_memory
    from kagura_agent.apply.session import BrainRun
    from kagura_agent.brain.channel import BrainChannel, ChannelLimits
    from kagura_agent.brain.streams import DockerAttachStream

    brain = plan["brain"]
    limits = ChannelLimits(
        max_line_bytes=int(brain.get("max_line_bytes", 1024 * 1024)),
        idle_seconds=float(brain.get("idle_timeout_seconds", 300)),
    )
    memory = open_host_memory(plan, run_id)
    channel = BrainChannel(
        DockerAttachStream(sock),
        memory=memory,
        limits=limits,
        on_stop=lambda: asyncio.to_thread(runtime.stop, container_id, 2),
        on_kill=lambda: asyncio.to_thread(runtime.kill, container_id),
    )
    channel.start()
    try:
        await BrainRun(store, plan, leases, channel, options, live, result).run()
    finally:
        # Wipe and release the credentials, then end the entrypoint (it wipes on its way
        # out too); verify runs elsewhere, after the container is gone.
        from kagura_agent.membrane.leases import withdraw

        names = _bundle_names(leases)
        for problem in await withdraw(None if channel.closed else channel, leases):
            live.note(f"release problem (kept for the sweeper): {problem}", "red")
        if traps is not None and leases and not channel.closed:
            await _watch_after_wipe(traps, names, live)
        await channel.stop()


def _bundle_names(leases: list[Any]) -> list[str]:
    """The file names the run's credentials had under /run/kagura/creds."""
    names: list[str] = []
    for lease in leases:
        with contextlib.suppress(Exception):
            names += list(lease.bundle.files)
    return names


async def _watch_after_wipe(traps: Any, names: list[str], live: LiveView) -> None:
    """Decoys take the wiped credentials' names, watched a moment before the stop."""
    from kagura_agent.apply.tripwire import CREDS_WATCH_SECONDS

    for problem in traps.after_wipe(names):
        live.note(problem, "yellow")
    if traps.wiped:
        await asyncio.sleep(CREDS_WATCH_SECONDS)


def _arm_traps(
    runtime: Any, container_id: str, traps: Any, delivered: bool, live: LiveView
) -> None:
    """Plant the canary (and the credential decoy of a run given none) before the turn."""
    if not traps.wanted:
        return
    try:
        pid = int(runtime.inspect(container_id)["State"]["Pid"])
    except (KaguraError, KeyError, TypeError, ValueError) as exc:
        live.note(f"canary and credential tripwires off: {exc}", "yellow")
        return
    for problem in traps.arm(pid, delivered):
        live.note(problem, "yellow")


def _stop_now(runtime: Any, containers: list[str], live: LiveView, reason: str) -> None:
    """Kill the agent's container at once (from a watcher thread)."""
    for container_id in containers:
        # SIGKILL to the container's init from the host first (no API round trip): its
        # PID namespace, and every process in it, ends at once; then Docker's kill.
        with contextlib.suppress(KaguraError, OSError, KeyError, TypeError):
            pid = int(runtime.inspect(container_id)["State"]["Pid"])
            if pid > 0:
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(KaguraError):
            runtime.kill(container_id)
    live.note(f"stopping the run: {reason}", "red")


def _record_incident(
    store: StateStore,
    plan: Plan,
    run_id: str,
    leases: list[Any],
    tripwire: Any,
    live: LiveView,
    options: ApplyOptions,
) -> None:
    from kagura_agent.apply.incidents import record_incident
    from kagura_agent.clock import iso

    actions = [
        "container killed",
        f"{len(leases)} lease(s) wiped and revoked",
        "verify not run",
        "run recorded as failed (graduated capabilities demoted)",
    ]
    incident_id = record_incident(
        store,
        at=iso(options.clock.now()),
        run_id=run_id,
        task=plan["task"]["name"],
        fingerprint=plan["fingerprint"],
        reason=str(tripwire.reason),
        actions=actions,
        egress=list(tripwire.egress_log),
        events=list(live.recent),
    )
    live.incident(incident_id, str(tripwire.reason))


def _watch_disk(plan: Plan, runtime: Any, container_id: str, live: LiveView) -> Any:
    """The run's writes to the project root, bounded by ``budget.disk_bytes``."""
    from kagura_agent.apply.diskwatch import DiskWatch

    def over(reason: str) -> None:
        _stop_now(runtime, [container_id], live, reason)

    budget = int(plan["budget"].get("disk_bytes") or 1024**3)
    return DiskWatch(plan["task"]["project_root"], budget, over).start()


def _close_egress(egress: Any, result: RunResult, live: LiveView) -> None:
    egress.close()
    result.denials = egress.denial_summary()
    live.phase("egress proxy and networks removed")
    for denial in result.denials:
        live.note(
            f"egress denied: {denial.get('host')}:{denial.get('port')} ({denial.get('count', 1)} times)",
            "yellow",
        )


def _remove_container(runtime: Any, container_id: str, live: LiveView) -> None:
    try:
        runtime.remove(container_id, force=True)
    except KaguraError as exc:
        live.note(f"could not remove container {container_id[:12]}: {exc.message}", "red")
        raise
    live.phase("container removed")


def _close_quietly(sock: Any) -> None:
    with contextlib.suppress(OSError):
        sock.close()


__all__ = ["ApplyOptions", "RunResult", "SetupError", "apply_plan"]
