"""The steps of a run, each a context manager: what it opens, it closes on every exit.

apply's run (executor.py ``_run``) is these steps chained in ``with`` statements, in the
order of time; Python closes them in the reverse order, on a normal end, an error, Ctrl-C
or SIGTERM alike. Each step receives what it needs when that exists and yields what it
produced, as a value:

    leased            the plan's credentials, ledger first         → Leased    released
    held_absent       absent .git, ./manifests held empty           (membrane/placeholders)
    verify_leftovers  —                                             a verify container's
                                                                    removal tried again
    egress            the run's proxy and networks                  → Egress    removed, its
                                                                    denials shown
    agent_container   the agent's hardened container, not started   → id        removed
    agent_branch      spec.commits: the branch's work folder        → branch    folder gone
    disk_watch        budget.disk over the run's containers         → DiskWatch stopped
    attached          the brain's stream; the container started     → stream    closed
    traps             canary and credential decoys in the container → traps     disarmed
    children          the dispatcher of sub-agents                  → dispatcher children
                                                                    stopped
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass, field

from kagura_agent.apply.guards.cgroupio import Freezer, WriteMeter
from kagura_agent.apply.guards.diskwatch import DiskWatch
from kagura_agent.apply.guards.modelcalls import ModelCalls
from kagura_agent.apply.guards.tripwire import ContainerTraps, Tripwire
from kagura_agent.apply.midrun.dispatch import ChildDispatcher
from kagura_agent.apply.midrun.grants import GrantTerms, Holdings, MidRun
from kagura_agent.apply.midrun.hostmem import HostMemory
from kagura_agent.apply.midrun.injected import injection_of, proxy_secret, renewed_in_run
from kagura_agent.apply.records import progress
from kagura_agent.apply.records.live import LiveView
from kagura_agent.apply.run.agentbranch import AgentBranch
from kagura_agent.apply.run.context import ApplyRuntime, EgressRun, RunContext
from kagura_agent.brain.streams import DuplexStream
from kagura_agent.errors import KaguraError
from kagura_agent.membrane.egress.session import AgentNetworkConfig
from kagura_agent.membrane.hardening import LABEL_ROLE, LABEL_RUN
from kagura_agent.membrane.leases import Broker, Lease, LeaseRequest
from kagura_agent.membrane.leases.broker import Budget as LeaseBudget
from kagura_agent.plan import resume
from kagura_agent.plan.injection import injected_provider
from kagura_agent.processes import namespace_processes


@dataclass(frozen=True)
class Leased:
    """The run's credentials: the broker that holds them (a credential granted mid-run is
    its too) and the leases the plan asked for, in the plan's order."""

    broker: Broker
    leases: tuple[Lease, ...]


@contextlib.contextmanager
def leased(ctx: RunContext) -> Iterator[Leased]:
    """Every credential of the plan, in the ledger first; all released on the way out
    (those a failed acquisition had already taken too)."""
    broker = Broker(ctx.store, run_id=ctx.run_id, clock=ctx.clock, redactor=ctx.live.redactor)
    try:
        leases = []
        for entry in ctx.plan["credentials"]:
            klass = "approved" if entry["category"] in ctx.approved else entry["class"]
            ctx.live.emit(
                progress.Leasing(entry["provider"], entry["scope"], entry["ttl_seconds"] // 60)
            )
            # A resumed session holds it under what is left of its lease budget.
            left = resume.lease_left(ctx.plan["budget"], entry["category"])
            request = LeaseRequest.from_plan({**entry, "class": klass})
            budget = LeaseBudget(*left) if left is not None else None
            leases.append(broker.acquire(request, budget))
        yield Leased(broker, tuple(leases))
    finally:
        _release(broker, ctx.live)


def _release(broker: Broker, live: LiveView) -> None:
    if not broker.leases:
        return
    problems = broker.release_all()
    live.emit(progress.LeasesReleased(len(broker.leases)))
    for problem in problems:
        live.emit(progress.ReleaseProblem(problem))


@dataclass
class RunContainers:
    """The run's containers as they come to exist (the agent's, then verify's): what the
    host's guards stop when they must. Only the steps that make a container add to it."""

    agent: list[str] = field(default_factory=list)
    verify: list[str] = field(default_factory=list)

    def all(self) -> list[str]:
        return [*self.agent, *self.verify]


def tripwire(ctx: RunContext, runtime: ApplyRuntime, containers: RunContainers) -> Tripwire:
    """The run's hijack tripwire: it watches the brain's output (and, once the proxy
    exists, its egress) and kills the agent's container when it trips."""
    wire = Tripwire(
        dict(ctx.plan["tripwires"]),
        lambda reason: stop_now(runtime, containers.agent, ctx.live, f"hijack tripwire: {reason}"),
    )
    ctx.live.watchers.append(lambda event: wire.scan("the brain's output", event))
    ctx.live.redactor.add(wire.canary)  # fake, but shown like the secret it pretends to be
    return wire


def stop_now(runtime: ApplyRuntime, containers: list[str], live: LiveView, reason: str) -> None:
    """Kill the run's containers at once (from a watcher thread)."""
    for container_id in list(containers):
        # SIGKILL to the container's init from the host first (no API round trip): its
        # PID namespace, and every process in it, ends at once; then Docker's kill.
        with contextlib.suppress(KaguraError, OSError):
            pid = runtime.state(container_id).pid
            if pid > 0:
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(KaguraError):
            runtime.kill(container_id)
    live.emit(progress.StoppingRun(reason))


@dataclass(frozen=True)
class Egress:
    """What the egress step produced: the proxy (None for a plan without one), the
    environment the agent's container gets, and whose credentials go where — the brain's
    own stays with the proxy, the rest are delivered inside."""

    proxy: EgressRun | None
    config: AgentNetworkConfig | None
    environment: dict[str, str]
    calls: ModelCalls | None  # model calls counted at the proxy (None: not counted)
    injected: tuple[Lease, ...]  # held by the proxy, injected into the brain's calls
    inside: tuple[Lease, ...]  # delivered into the container over the channel
    injecting: bool  # the proxy holds the brain's credential

    @property
    def at_proxy(self) -> tuple[Lease, ...]:
        """The proxy's leases that are renewed while the run goes on."""
        if not self.injecting:
            return ()
        return tuple(lease for lease in self.injected if renewed_in_run(lease))

    def denials(self) -> tuple[dict[str, object], ...]:
        """What the agent tried to reach and was refused (all of it, once the proxy is
        removed: its last decisions are read then)."""
        return () if self.proxy is None else tuple(self.proxy.denial_summary())


@contextlib.contextmanager
def egress(
    ctx: RunContext, runtime: ApplyRuntime, leased: Leased, wire: Tripwire
) -> Iterator[Egress]:
    """The run's egress proxy and networks (plan egress mode ``proxy``); removed on the
    way out, what it denied shown then."""
    plan, live = ctx.plan, ctx.live
    # The brain's credential stays with the host and the proxy: never delivered inside.
    provider = injected_provider(plan)
    injected = tuple(
        lease for lease in leased.leases if provider and lease.request.provider == provider
    )
    inside = tuple(lease for lease in leased.leases if lease not in injected)
    secret = proxy_secret(injected[0]) if injected else None
    injection, endpoint_environment = injection_of(plan)
    # The CLI pointed at the key-injecting port with its documented switches, holding a
    # placeholder where it expects a credential (plan brain.model_endpoint).
    environment: dict[str, str] = endpoint_environment if provider else {}
    # The CLI's optional traffic off (plan brain.cli_environment): its model calls are all
    # that leave, through the key-injecting port.
    environment |= plan["brain"].get("cli_environment", {})
    if plan["egress"]["mode"] != "proxy":
        yield Egress(None, None, environment, None, injected, inside, injecting=False)
        return
    # Every model call with the injected key passes the proxy: the host counts them there.
    calls = ModelCalls() if secret else None

    def on_egress(event: dict[str, object]) -> None:
        live.egress(event)
        wire.egress(event)
        if calls is not None:
            calls.feed(event)

    live.emit(progress.ProxyStarting(len(plan["egress"]["allow"])))
    proxy = runtime.start_egress(
        plan,
        ctx.run_id,
        on_egress,
        store=ctx.store,
        clock=ctx.clock,
        injection=injection if secret else None,
        injection_secret=secret,
        # The agent chooses a request's host and path: its credentials may be there.
        scrub=live.redactor.scrub_any_case,
    )
    try:
        if getattr(proxy, "warm", False):
            live.emit(progress.ProxyReady(str(getattr(proxy, "pooled_name", ""))))
        config = proxy.agent_network_config()
        yield Egress(
            proxy,
            config,
            {**environment, **config.environment},
            calls,
            injected,
            inside,
            injecting=secret is not None,
        )
    finally:
        _close_egress(proxy, live)


def _close_egress(proxy: EgressRun, live: LiveView) -> None:
    proxy.close()
    live.emit(progress.ProxyRemoved(warm=bool(getattr(proxy, "warm", False))))
    for denial in proxy.denial_summary():
        port = denial.get("port")
        live.emit(
            progress.EgressDenied(
                str(denial.get("host")),
                port if isinstance(port, int | str) else None,
                int(str(denial.get("count", 1))),
            )
        )


@contextlib.contextmanager
def verify_leftovers(ctx: RunContext, runtime: ApplyRuntime) -> Iterator[None]:
    """Nothing on the way in; on the way out, a verify container whose own removal failed
    gets a second try (its run's row is closed by then, so no later sweep looks for it).
    A task without verify commands never makes one: no list request."""
    try:
        yield
    finally:
        if ctx.plan["task"]["verify"]:
            try:
                for container_id in runtime.list({LABEL_RUN: ctx.run_id, LABEL_ROLE: "verify"}):
                    runtime.remove(container_id, force=True)
            except KaguraError as exc:
                ctx.live.emit(progress.ContainerNotRemoved(exc.message, verify=True))


@contextlib.contextmanager
def agent_container(
    ctx: RunContext, runtime: ApplyRuntime, egress: Egress, containers: RunContainers
) -> Iterator[str]:
    """The agent's hardened container, created (not started); removed on the way out."""
    ctx.live.emit(progress.ContainerStarting(ctx.plan["image"]["ref"]))
    config = egress.config
    container_id = runtime.create(
        ctx.plan,
        ctx.run_id,
        environment=egress.environment,
        network=config.network if config else None,
        egress_mounts=config.mounts() if config else [],
        forward=config.forwards() if config else (),
    )
    try:
        containers.agent.append(container_id)
        yield container_id
    finally:
        _remove_container(runtime, container_id, ctx.live)


def _remove_container(runtime: ApplyRuntime, container_id: str, live: LiveView) -> None:
    try:
        runtime.remove(container_id, force=True)
    except KaguraError as exc:
        live.emit(progress.ContainerNotRemoved(exc.message, container=container_id))
        raise
    live.emit(progress.ContainerRemoved())


@contextlib.contextmanager
def agent_branch(ctx: RunContext) -> Iterator[AgentBranch]:
    """The run's branch (spec.commits: branch; inert otherwise): its work folder goes on
    the way out, taken or not."""
    branch = AgentBranch(ctx)
    try:
        yield branch
    finally:
        branch.close()


@contextlib.contextmanager
def disk_watch(
    ctx: RunContext, runtime: ApplyRuntime, containers: RunContainers
) -> Iterator[DiskWatch]:
    """The run's writes to the project root, bounded by ``budget.disk_bytes`` from before
    the agent starts until verify is done (verify runs code the agent may have written, in
    a container that mounts the same root); past it, every container of the run is
    stopped. Stopped on the way out: its last reading is taken then."""
    known: dict[str, int] = {}  # a container's init keeps its pid: asked of Docker once

    def inits() -> list[int]:
        for container_id in containers.all():
            if container_id not in known:
                with contextlib.suppress(KaguraError):
                    if pid := runtime.state(container_id).pid:
                        known[container_id] = pid
        return list(known.values())

    freezer = Freezer(inits)

    def over(reason: str) -> None:
        freezer.kill_all()  # called while they are held: none runs again
        stop_now(runtime, containers.all(), ctx.live, reason)

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
    watch = DiskWatch(root, budget, over, holders=holders, meter=meter.read, hold=freezer.hold)
    watch.start()
    try:
        yield watch
    finally:
        watch.stop()


@dataclass(frozen=True)
class Agent:
    """The agent's started container: where it runs, and the brain's stream in it."""

    runtime: ApplyRuntime
    id: str
    stream: DuplexStream


@contextlib.contextmanager
def attached(runtime: ApplyRuntime, container_id: str, egress: Egress) -> Iterator[Agent]:
    """The brain's stream (attached before the start, so nothing it says is lost), the
    container started, its side of the egress path ready; the stream closed on the way
    out."""
    with runtime.attach(container_id) as stream:
        runtime.start(container_id)
        if egress.config is not None:
            runtime.start_forwarder(container_id, egress.config)
        yield Agent(runtime, container_id, stream)


@contextlib.contextmanager
def traps(
    ctx: RunContext, agent: Agent, wire: Tripwire, leased: Leased
) -> Iterator[ContainerTraps]:
    """The canary (and the credential decoy of a run given none) planted in the started
    container before the turn; watched until the agent is stopped, disarmed then."""
    container_traps = ContainerTraps(
        wire, dict(ctx.plan["tripwires"]), ctx.plan["hardening"]["user"]
    )
    try:
        _arm(agent, container_traps, bool(leased.leases), ctx.live)
        yield container_traps
    finally:
        container_traps.stop()


def _arm(agent: Agent, traps: ContainerTraps, delivered: bool, live: LiveView) -> None:
    if not traps.wanted:
        return
    try:
        pid = agent.runtime.state(agent.id).pid
    except KaguraError as exc:
        live.emit(progress.TripwiresOff(str(exc)))
        return
    if pid <= 0:
        live.emit(progress.TripwiresOff("the container has no process"))
        return
    for problem in traps.arm(pid, delivered):
        live.emit(progress.TrapProblem(problem))


def grants(ctx: RunContext, terms: GrantTerms, leased: Leased, egress: Egress | None) -> RunContext:
    """The run's context from its turn on: the mid-run desk (apply/midrun/grants.py) built
    from what the run holds now — the broker, the proxy and its count of model calls, the
    leases inside and the brain's own at the proxy (a host run: every lease, no proxy).
    The turn's channel joins it when it opens."""
    if egress is None:
        held = Holdings(broker=leased.broker, leases=leased.leases)
    else:
        held = Holdings(
            broker=leased.broker,
            egress=egress.proxy,
            calls=egress.calls,
            leases=egress.inside,
            at_proxy=egress.at_proxy,
        )
    midrun = MidRun(
        store=ctx.store, run_id=ctx.run_id, live=ctx.live, clock=ctx.clock, terms=terms, held=held
    )
    return dataclasses.replace(ctx, midrun=midrun)


@contextlib.contextmanager
def children(ctx: RunContext, memory: HostMemory) -> Iterator[ChildDispatcher]:
    """The dispatcher of the brain's sub-agents: a parent never leaves a child running."""
    dispatcher = ChildDispatcher(ctx, memory.store)
    try:
        yield dispatcher
    finally:
        dispatcher.close()
