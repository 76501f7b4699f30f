"""One run's context, the runtime apply drives, and the values its steps hand back.

``apply_plan`` builds a frozen :class:`RunContext` once (store, plan, run id, runtime,
live view, clock, approvals) and passes it to every step. Steps return values
(:class:`BrainOutcome`, :class:`RunReport`); ``apply_plan`` alone assembles the
:class:`RunResult` and decides its outcome (:func:`decide`) before the record step
stores it.

:class:`ApplyRuntime` is exactly what apply asks of a container runtime: the Docker
implementation is ``apply/run/docker.py``; ``testing/memory_runtime.py`` keeps containers and
networks in dicts, so the whole sequence runs in tests without Docker.
"""

from __future__ import annotations

import builtins
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, BinaryIO, Literal, Protocol

from kagura_agent.apply.midrun.grants import MidRun
from kagura_agent.apply.records.live import LiveView
from kagura_agent.brain.streams import DuplexStream
from kagura_agent.clock import Clock, SystemClock
from kagura_agent.membrane.egress.modelport import Injection
from kagura_agent.membrane.egress.session import AgentNetworkConfig
from kagura_agent.plan.build import Compiled
from kagura_agent.plan.model import Plan
from kagura_agent.state import StateStore

Outcome = Literal["success", "failed", "interrupted", "terminated", "refused"]
VerifyResult = tuple[str, int, str]  # command, exit code, output tail
EgressSink = Callable[[dict[str, object]], None]


@dataclass
class ApplyOptions:
    approve: tuple[str, ...] = ()
    allow_host_runtime: bool = False
    interactive: bool = False
    approval_timeout: float = 120.0
    # A mid-run budget question is asked at least this long before the budget ends, so
    # the operator has that long to answer (capped by the budget itself).
    answer_floor: float = 30.0
    as_json: bool = False
    who: str = ""
    clock: Clock = field(default_factory=SystemClock)
    # Approvals for this plan recorded since then count (the cockpit asked in chat).
    accept_since: datetime | None = None
    # Messages for the running brain arrive on stdin, one JSON object a line (the cockpit),
    # and so do nudges that an operator answered a mid-run question.
    steer_stdin: bool = False
    # The run's id when the caller chose it (a team runner: the id the queue handed out).
    run_id: str | None = None
    # What the plan was compiled from: mid-run amendments compile from it (None: none).
    compiled: Compiled | None = None


@dataclass(frozen=True)
class ContainerState:
    """What apply needs to know of a container: running or not, and its init's pid."""

    running: bool
    pid: int = 0
    exit_code: int | None = None


class EgressRun(Protocol):
    """One run's started egress proxy (``EgressSession`` in production)."""

    def agent_network_config(self) -> AgentNetworkConfig: ...

    def denial_summary(self) -> list[dict[str, object]]: ...

    def drain(self) -> None:
        """Emit every decision the proxy logged so far that was not emitted yet."""
        ...

    def reload(self, egress: dict[str, Any]) -> None:
        """Put an amended plan's egress section in force, keeping the proxy running."""
        ...

    def limit_model_calls(self, turns: int | None) -> None:
        """Cap the key-injecting port's calls at an extended turn budget."""
        ...

    def renew_credential(self, secret: str) -> None:
        """Replace the credential the key-injecting port adds (a renewed lease)."""
        ...

    def close(self) -> None:
        """Remove the proxy, its network and socket (raises when something stayed)."""
        ...


class ApplyRuntime(Protocol):
    """The container operations apply uses, and nothing else."""

    def create(
        self,
        plan: Plan,
        run_id: str,
        *,
        environment: dict[str, str] | None = None,
        network: str | None = None,
        egress_mounts: builtins.list[dict[str, object]] | None = None,
        role: str = "agent",
        forward: Sequence[tuple[str, int]] = (),
    ) -> str:
        """Create the plan's container (``role`` agent or verify), not started; its id.
        ``forward``: the egress forwarder's (socket, port) pairs, started by the
        container's own command."""
        ...

    def start(self, container_id: str) -> None: ...

    def attach(self, container_id: str) -> AbstractContextManager[DuplexStream]:
        """The container's stdin/stdout as a brain stream (call before ``start``)."""
        ...

    def state(self, container_id: str) -> ContainerState: ...

    def wait(self, container_id: str, timeout: float | None = None) -> Mapping[str, object]: ...

    def stop(self, container_id: str, timeout: int | None = None) -> None: ...

    def kill(self, container_id: str, signal: str = "SIGKILL") -> None: ...

    def remove(self, container_id: str, *, force: bool = True) -> None:
        """Remove the container; one already gone is not an error."""
        ...

    def exec(
        self, container_id: str, argv: builtins.list[str], *, user: str, workdir: str
    ) -> tuple[int, bytes]:
        """Run ``argv`` in a running container: exit code (-1 unknown) and output."""
        ...

    def exec_stream(
        self,
        container_id: str,
        argv: builtins.list[str],
        *,
        user: str,
        workdir: str,
        into: BinaryIO,
        limit: int,
    ) -> tuple[int, int, bool]:
        """Run ``argv`` in a running container, its standard output written to ``into``
        as it comes, at most ``limit`` bytes: (exit code, -1 unknown; bytes written;
        whether that was all of it)."""
        ...

    def start_egress(
        self,
        plan: Plan,
        run_id: str,
        on_event: EgressSink,
        *,
        store: StateStore,
        clock: Clock,
        injection: Injection | None,
        injection_secret: str | None,
        scrub: Callable[[str], str] | None = None,
    ) -> EgressRun:
        """Start the run's egress proxy and its networks; ready when this returns.
        ``scrub`` (the run's redactor) cleans each decision before it is stored."""
        ...

    def start_forwarder(self, container_id: str, config: AgentNetworkConfig) -> None:
        """The agent's side of the egress path in its (running) container: ready when this
        returns (started by the container's command when it was created with
        ``forward``; the run's proxy has its configuration)."""
        ...

    def sweep_egress(self, store: StateStore) -> builtins.list[str]:
        """Remove egress objects whose owning process is gone; their names."""
        ...

    def list(self, labels: dict[str, str] | None = None, *, all: bool = True) -> builtins.list[str]:
        """Ids of containers carrying every given label."""
        ...


@dataclass(frozen=True)
class RunContext:
    """Everything a step of one run reads; built once by ``apply_plan``."""

    store: StateStore
    plan: Plan
    run_id: str
    runtime: ApplyRuntime | None  # None: ``runtime: host`` (the operator allowed it)
    live: LiveView
    clock: Clock
    approved: frozenset[str] = frozenset()
    steer_stdin: bool = False  # stdin carries messages for the running brain
    # Where a dispatched child's approvals are asked (apply/midrun/dispatch.py): as apply asks.
    interactive: bool = False
    approval_timeout: float = 120.0
    who: str = ""
    midrun: MidRun | None = None  # mid-run requests and budget extensions


@dataclass(frozen=True)
class BrainOutcome:
    """What the brain's turn came to, as the host saw it."""

    error: str | None = None
    cost_usd: float | None = None
    turns: int = 0
    input_tokens: int | None = None
    output_tokens: int | None = None
    retries: int = 0  # re-attempts the engine made (never a constant)
    resumed_from: int | None = None
    session_id: str | None = None
    answer: str | None = None  # the brain's final answer (its words: untrusted)


@dataclass(frozen=True)
class RunReport:
    """What the run step saw: the brain, verify, and why the host stopped it (if it did)."""

    brain: BrainOutcome
    verify: tuple[VerifyResult, ...] = ()
    host_stop: str | None = None  # "tripwire: …" or "disk: …"
    children: tuple[dict[str, object], ...] = ()  # sub-agents the brain dispatched
    model_calls: int | None = None  # counted at the proxy (None: not counted)
    # The agent's commits (spec.commits: branch): agentgit/importer.Imported.to_json().
    commits: dict[str, object] | None = None

    @property
    def error(self) -> str | None:
        """The run's error: the host stopping it outranks whatever the brain said."""
        return self.host_stop or self.brain.error


@dataclass(frozen=True)
class RunResult:
    run_id: str
    outcome: Outcome
    exit_code: int
    verify: tuple[VerifyResult, ...] = ()
    brain_error: str | None = None
    cost_usd: float | None = None
    turns: int = 0
    input_tokens: int | None = None
    output_tokens: int | None = None
    retries: int = 0  # re-attempts the engine or executor made (never a constant)
    wall_seconds: float = 0.0
    denials: tuple[dict[str, object], ...] = ()
    resumed_from: int | None = None
    brain_session_id: str | None = None
    output_memory: str | None = None  # a dispatched child's output, for its parent to recall
    answer: str | None = None  # the brain's final answer (kept in a child's output memory)
    children: tuple[dict[str, object], ...] = ()  # sub-agents dispatched: run, outcome, output
    # Model calls the host counted at the proxy (apply/guards/modelcalls.py), next to the turns
    # the brain reported; None when the run's model calls do not pass an injecting proxy.
    model_calls: int | None = None
    # What the aftercare moved aside in the project root (path, to, why; relative to the
    # root): repositories the run planted, files the operator's git hooks would have run.
    moved_aside: tuple[dict[str, str], ...] = ()
    # What came of the agent's commits (spec.commits: branch): the branch, whether it was
    # imported (or why not), how many commits; None when the task asked for none.
    commits: dict[str, object] | None = None

    @property
    def success(self) -> bool:
        return self.outcome == "success"

    def to_json(self) -> dict[str, object]:
        return {
            **dataclasses.asdict(self),
            "verify": [{"command": c, "exit_code": code} for c, code, _ in self.verify],
            "denials": list(self.denials),
            "children": list(self.children),
            "moved_aside": list(self.moved_aside),
        }


def decide(report: RunReport) -> tuple[Outcome, int]:
    """Success only when the brain finished without error and every verify command
    exited 0 (no verify commands: the brain's finish alone). Fail closed otherwise."""
    ok = report.error is None and all(code == 0 for _, code, _ in report.verify)
    return ("success", 0) if ok else ("failed", 1)


def assemble(
    run_id: str, report: RunReport, wall_seconds: float, denials: tuple[dict[str, object], ...]
) -> RunResult:
    """The run's result from what its steps returned, the outcome decided here."""
    outcome, exit_code = decide(report)
    brain = report.brain
    return RunResult(
        run_id=run_id,
        outcome=outcome,
        exit_code=exit_code,
        verify=report.verify,
        brain_error=report.error,
        cost_usd=brain.cost_usd,
        turns=brain.turns,
        input_tokens=brain.input_tokens,
        output_tokens=brain.output_tokens,
        retries=brain.retries,
        wall_seconds=wall_seconds,
        denials=denials,
        resumed_from=brain.resumed_from,
        brain_session_id=brain.session_id,
        answer=brain.answer,
        children=report.children,
        model_calls=report.model_calls,
        commits=report.commits,
    )
