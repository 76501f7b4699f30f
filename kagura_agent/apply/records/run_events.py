"""The events of the run's sequence (records/event.py): approvals, leases, the sweep of
what dead runs left, the project root's aftercare, the proxy and the container, the
watches, verify. Each reads as the line the run has always shown."""

from __future__ import annotations

from dataclasses import dataclass

from kagura_agent.apply.records.event import ProgressEvent, Severity, register

# The run's sequence: approvals, leases, the sweep of what dead runs left.


@register
@dataclass(frozen=True)
class ApprovalNeeded(ProgressEvent):
    event = "approval_needed"
    kind = "phase"
    level = Severity.QUIET
    count: int

    @property
    def message(self) -> str:
        return f"approval needed for {self.count} capabilit{'y' if self.count == 1 else 'ies'}"


@register
@dataclass(frozen=True)
class LeaseSwept(ProgressEvent):
    """The lease sweep at the start of a run found something (its summary)."""

    event = "lease_sweep"
    summary: str

    @property
    def message(self) -> str:
        return f"lease sweep: {self.summary}"


@register
@dataclass(frozen=True)
class DeadRunsRemoved(ProgressEvent):
    event = "dead_runs_removed"
    runs: int
    egress_objects: int

    @property
    def message(self) -> str:
        return (
            f"removed what crashed runs left: {self.runs} runs,"
            f" {self.egress_objects} egress objects"
        )


@register
@dataclass(frozen=True)
class Leasing(ProgressEvent):
    """A credential of the plan being leased (``ttl_minutes``), or one granted mid-run
    (None)."""

    event = "leasing"
    kind = "phase"
    level = Severity.QUIET
    provider: str
    scope: str
    ttl_minutes: int | None = None

    @property
    def message(self) -> str:
        when = "mid-run" if self.ttl_minutes is None else f"({self.ttl_minutes}m)"
        return f"leasing {self.provider}/{self.scope} {when}"


@register
@dataclass(frozen=True)
class LeasesReleased(ProgressEvent):
    event = "leases_released"
    kind = "phase"
    level = Severity.QUIET
    count: int

    @property
    def message(self) -> str:
        return f"released {self.count} lease(s)"


@register
@dataclass(frozen=True)
class ReleaseProblem(ProgressEvent):
    """A lease that could not be wiped or released (the sweeper retries it)."""

    event = "release_problem"
    level = Severity.PROBLEM
    problem: str

    @property
    def message(self) -> str:
        return f"release problem (kept for the sweeper): {self.problem}"


@register
@dataclass(frozen=True)
class EndedEarly(ProgressEvent):
    """The run was interrupted or terminated; its clean-up is done."""

    event = "ended_early"
    level = Severity.WARNING
    ended: str  # "interrupted" or "terminated"

    @property
    def message(self) -> str:
        return f"{self.ended}: everything of this run was released and removed"


@register
@dataclass(frozen=True)
class RootFinding(ProgressEvent):
    """One line of the project root's aftercare (apply/aftercare/root.py): what it
    repaired or moved aside (a warning), a hook input or a quarantine (a problem)."""

    event = "root_finding"
    text: str
    given: Severity

    @property
    def severity(self) -> Severity:
        return self.given

    @property
    def message(self) -> str:
        return self.text


# The container: proxy, start, watches, stop, removal.


@register
@dataclass(frozen=True)
class ProxyStarting(ProgressEvent):
    event = "proxy_starting"
    kind = "phase"
    level = Severity.QUIET
    allowed: int

    @property
    def message(self) -> str:
        return f"starting this run's egress proxy ({self.allowed} allowed)"


@register
@dataclass(frozen=True)
class ProxyReady(ProgressEvent):
    """A warm session's proxy taken from the pool."""

    event = "proxy_ready"
    kind = "phase"
    level = Severity.QUIET
    session: str

    @property
    def message(self) -> str:
        return f"egress proxy ready: warm session {self.session}"


@register
@dataclass(frozen=True)
class ProxyReloaded(ProgressEvent):
    """A mid-run egress grant put in force."""

    event = "proxy_reloaded"
    allowed: int

    @property
    def message(self) -> str:
        return f"egress proxy reloaded: {self.allowed} allowed"


@register
@dataclass(frozen=True)
class ProxyRemoved(ProgressEvent):
    """The run's proxy and networks are gone (``warm``: handed back to the pool keeper,
    which removes them)."""

    event = "proxy_removed"
    kind = "phase"
    level = Severity.QUIET
    warm: bool = False

    @property
    def message(self) -> str:
        if self.warm:
            return "egress proxy of the warm session handed to the pool keeper for removal"
        return "egress proxy and networks removed"


@register
@dataclass(frozen=True)
class EgressDenied(ProgressEvent):
    """One line of the run's denial summary, at its end."""

    event = "egress_denied"
    level = Severity.WARNING
    host: str
    port: int | str | None
    count: int

    @property
    def message(self) -> str:
        return f"egress denied: {self.host}:{self.port} ({self.count} times)"


@register
@dataclass(frozen=True)
class ContainerStarting(ProgressEvent):
    event = "container_starting"
    kind = "phase"
    level = Severity.QUIET
    image: str

    @property
    def message(self) -> str:
        return f"starting container from {self.image}"


@register
@dataclass(frozen=True)
class HostBrainStarting(ProgressEvent):
    event = "host_brain_starting"
    kind = "phase"
    level = Severity.QUIET

    @property
    def message(self) -> str:
        return "starting the brain ON THE HOST (runtime: host)"


@register
@dataclass(frozen=True)
class TripwiresOff(ProgressEvent):
    """The canary and credential tripwires could not be armed."""

    event = "tripwires_off"
    level = Severity.WARNING
    why: str

    @property
    def message(self) -> str:
        return f"canary and credential tripwires off: {self.why}"


@register
@dataclass(frozen=True)
class TrapProblem(ProgressEvent):
    """A canary or credential decoy that could not be planted or watched."""

    event = "trap_problem"
    level = Severity.WARNING
    problem: str

    @property
    def message(self) -> str:
        return self.problem


@register
@dataclass(frozen=True)
class DecoysUnwatched(ProgressEvent):
    """Decoys planted after the wipe, with no process of the agent's left to watch."""

    event = "decoys_unwatched"

    @property
    def message(self) -> str:
        return "credential decoys planted; no process of the agent's is left to watch"


@register
@dataclass(frozen=True)
class StoppingRun(ProgressEvent):
    """A watcher (a tripwire, the disk budget) kills the agent's container now."""

    event = "stopping_run"
    level = Severity.PROBLEM
    reason: str

    @property
    def message(self) -> str:
        return f"stopping the run: {self.reason}"


@register
@dataclass(frozen=True)
class AgentStopProblem(ProgressEvent):
    """The agent's container did not stop cleanly before verify."""

    event = "agent_stop_problem"
    level = Severity.PROBLEM
    problem: str

    @property
    def message(self) -> str:
        return self.problem


@register
@dataclass(frozen=True)
class DiskPassedAtEnd(ProgressEvent):
    """The last reading of the disk watch found the root past its budget."""

    event = "disk_passed_at_end"
    level = Severity.PROBLEM
    exceeded: str

    @property
    def message(self) -> str:
        return f"the run ended past its disk budget: {self.exceeded}"


@register
@dataclass(frozen=True)
class ModelCallsCounted(ProgressEvent):
    event = "model_calls_counted"
    counted: int
    turns: int | None

    @property
    def message(self) -> str:
        return (
            f"model calls counted at the proxy: {self.counted};"
            f" turns the brain reported: {self.turns}"
        )


@register
@dataclass(frozen=True)
class TurnsUnderReported(ProgressEvent):
    """The proxy counted far more model calls than the engine reported turns."""

    event = "turns_under_reported"
    level = Severity.PROBLEM
    counted: int
    turns: int | None

    @property
    def message(self) -> str:
        return (
            f"the proxy counted {self.counted} model calls, the brain reported {self.turns}"
            " turns: its engine under-reports (a sign it was tampered with)"
        )


@register
@dataclass(frozen=True)
class PastBudget(ProgressEvent):
    """The brain went on past a budget not extended (``stopping``: the run stops it now)."""

    event = "past_budget"
    why: str
    stopping: bool = False

    @property
    def message(self) -> str:
        return f"the brain went on past its budget ({self.why})" + (
            "; stopping" if self.stopping else ""
        )


@register
@dataclass(frozen=True)
class CredentialBudgetExhausted(ProgressEvent):
    event = "credential_budget_exhausted"
    level = Severity.PROBLEM
    why: str

    @property
    def message(self) -> str:
        return f"credential budget exhausted: {self.why}; stopping"


@register
@dataclass(frozen=True)
class Verifying(ProgressEvent):
    event = "verifying"
    kind = "phase"
    level = Severity.QUIET
    commands: int
    on_host: bool = False

    @property
    def message(self) -> str:
        where = "in a fresh container (no network, no credentials)"
        if self.on_host:
            where = "on the host"
        return f"verifying: {self.commands} command(s) {where}"


@register
@dataclass(frozen=True)
class VerifyExited(ProgressEvent):
    """One verify command's exit code (LiveView.verify; its output is the agent's and
    goes in a ``verify_output`` item of its own)."""

    event = "verify_exited"
    command: str
    exit_code: int

    @property
    def severity(self) -> Severity:
        return Severity.GOOD if self.exit_code == 0 else Severity.PROBLEM

    @property
    def message(self) -> str:
        mark = "✓" if self.exit_code == 0 else "✗"
        return f"{mark} verify {self.command!r} exited {self.exit_code}"


@register
@dataclass(frozen=True)
class ContainerNotRemoved(ProgressEvent):
    """A container of the run that could not be removed (``verify``: its verify
    container; else the agent's, by ``container`` id)."""

    event = "container_not_removed"
    level = Severity.PROBLEM
    why: str
    container: str = ""
    verify: bool = False

    @property
    def message(self) -> str:
        if self.verify:
            return f"could not remove this run's verify container: {self.why}"
        return f"could not remove container {self.container[:12]}: {self.why}"


@register
@dataclass(frozen=True)
class ContainerRemoved(ProgressEvent):
    event = "container_removed"
    kind = "phase"
    level = Severity.QUIET

    @property
    def message(self) -> str:
        return "container removed"
