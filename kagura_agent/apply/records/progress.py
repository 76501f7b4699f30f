"""A run's progress as typed events: what the run's steps tell the views.

A step of the run says what happened by emitting one event (``progress.emit(event)``):
a frozen dataclass per meaning (a lease being taken, the proxy removed, a budget not
extended…), carrying its facts as fields. The event knows its own severity (a property
of its type, or an explicit :class:`Severity` field where one type covers several) and
its words; the views decide how to show it:

- the terminal (records/live.py ``LiveView``): one line, styled by its severity;
- ``apply --json``: one JSON object, ``{"kind", "event", "severity", "message", …fields}``
  (``kind`` is ``phase`` for a step the run reached, ``note`` for anything else, as it
  always was; ``event`` names the type, stable across releases);
- the cockpit's chat (cockpit/runner.py) and the web timeline, which read the JSON back
  with :func:`from_json` (so ``queue follow`` shows a stored run as it was shown live).

No step passes a colour: severity is the event's, styling is the terminal's.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, ClassVar, Literal, Protocol, TypeVar


class Severity(StrEnum):
    """How much an event matters to whoever watches the run."""

    QUIET = "quiet"  # a step reached, a detail: shown dim
    INFO = "info"
    GOOD = "good"  # something that could have failed worked
    WARNING = "warning"  # the run goes on, but something is off or will stop it
    PROBLEM = "problem"  # something failed, was refused or had to be stopped


# The terminal's styling of each severity (ui.Style names). The only colours of the run's
# progress: a step says how much an event matters, never how it looks.
STYLES: dict[Severity, tuple[str, ...]] = {
    Severity.QUIET: ("dim",),
    Severity.INFO: (),
    Severity.GOOD: ("green",),
    Severity.WARNING: ("yellow",),
    Severity.PROBLEM: ("red",),
}
# The web timeline's tone of each (web/timeline.py Entry.tone).
TONES: dict[Severity, str] = {
    Severity.QUIET: "quiet",
    Severity.INFO: "quiet",
    Severity.GOOD: "good",
    Severity.WARNING: "warn",
    Severity.PROBLEM: "bad",
}
# Keys of the JSON shape every event has; no event's field may take one of them.
RESERVED = frozenset({"kind", "event", "severity", "message", "at"})


@dataclass(frozen=True)
class ProgressEvent:
    """One thing the run tells its views. Subclasses set ``event`` (the stable name),
    ``kind`` (``phase``: a step reached; ``note``: anything else), ``level`` (the type's
    severity) and ``message`` (its words)."""

    event: ClassVar[str] = ""
    kind: ClassVar[Literal["phase", "note"]] = "note"
    level: ClassVar[Severity] = Severity.INFO

    @property
    def severity(self) -> Severity:
        return self.level

    @property
    def message(self) -> str:
        raise NotImplementedError


class Progress(Protocol):
    """What a step of the run tells its views through (LiveView implements it)."""

    def emit(self, event: ProgressEvent) -> None: ...


# --- the JSON shape ---------------------------------------------------------------------

EVENTS: dict[str, type[ProgressEvent]] = {}


E = TypeVar("E", bound=type["ProgressEvent"])


def _register(cls: E) -> E:
    assert cls.event and cls.event not in EVENTS, cls
    assert not RESERVED & {f.name for f in dataclasses.fields(cls)}, cls
    EVENTS[cls.event] = cls
    return cls


def fields_of(event: ProgressEvent) -> dict[str, Any]:
    """The event's own facts (its fields), as JSON values."""
    shown: dict[str, Any] = {}
    for field in dataclasses.fields(event):
        value = getattr(event, field.name)
        if field.name == "given":
            continue
        shown[field.name] = list(value) if isinstance(value, tuple) else value
    return shown


def to_json(event: ProgressEvent) -> dict[str, Any]:
    """The event as ``apply --json`` prints it and the journal keeps it."""
    return {
        "kind": event.kind,
        "event": event.event,
        "severity": str(event.severity),
        "message": event.message,
        **fields_of(event),
    }


def from_json(item: dict[str, Any]) -> ProgressEvent | None:
    """The event an item of ``apply --json`` (or the journal) carries; None for an item
    of another kind. An item whose ``event`` is unknown here or whose fields do not fit its
    type (another version wrote it) comes back as a plain :class:`Phase` or :class:`Note`
    of its message."""
    kind = item.get("kind")
    if kind not in ("phase", "note"):
        return None
    cls = EVENTS.get(str(item.get("event") or ""))
    if cls is not None and cls.kind == kind:
        typed = _build(cls, item)
        if typed is not None:
            return typed
    text = str(item.get("message", ""))
    if kind == "phase":
        return Phase(text)
    try:
        severity = Severity(str(item.get("severity") or Severity.INFO))
    except ValueError:
        severity = Severity.INFO
    return Note(text, severity)


def _build(cls: type[ProgressEvent], item: dict[str, Any]) -> ProgressEvent | None:
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    for field in dataclasses.fields(cls):
        raw = item.get("severity") if field.name == "given" else item.get(field.name)
        value = _fit(hints[field.name], raw)
        if value is _MISFIT:
            return None
        values[field.name] = value
    return cls(**values)


_MISFIT = object()


def _fit(hint: Any, raw: Any) -> Any:
    """``raw`` (a JSON value) as a value of type ``hint``, or _MISFIT."""
    if isinstance(hint, types.UnionType):
        for option in typing.get_args(hint):
            value = _fit(option, raw)
            if value is not _MISFIT:
                return value
        return _MISFIT
    if typing.get_origin(hint) is Literal:
        return raw if raw in typing.get_args(hint) else _MISFIT
    if hint is type(None):
        return None if raw is None else _MISFIT
    if hint is Severity:
        try:
            return Severity(raw)
        except ValueError:
            return _MISFIT
    if typing.get_origin(hint) is tuple:
        if not isinstance(raw, list) or not all(isinstance(v, str) for v in raw):
            return _MISFIT
        return tuple(raw)
    if hint is bool:
        return raw if isinstance(raw, bool) else _MISFIT
    if hint is int:
        return raw if isinstance(raw, int) and not isinstance(raw, bool) else _MISFIT
    if hint is float:
        if isinstance(raw, int | float) and not isinstance(raw, bool):
            return float(raw)
        return _MISFIT
    if hint is str:
        return raw if isinstance(raw, str) else _MISFIT
    return _MISFIT


# --- the views' words ---------------------------------------------------------------------


def terminal_line(event: ProgressEvent, elapsed: str) -> tuple[str, tuple[str, ...]]:
    """The event's line on a terminal (``elapsed``: the run's clock, shown for a phase)
    and its styling."""
    if event.kind == "phase":
        return f"{elapsed} ● {event.message}", STYLES[event.severity]
    return f"        {event.message}", STYLES[event.severity]


def chat_line(event: ProgressEvent) -> str:
    """The event's line in the cockpit's chat (no colour there: the words carry it)."""
    if event.kind == "phase":
        return f"● {event.message}"
    return f"  {event.message}"


# --- the events ---------------------------------------------------------------------------
# Each reads as the line the run has always shown; grouped by the step that emits it.


@_register
@dataclass(frozen=True)
class Phase(ProgressEvent):
    """A step reached, in words only (a view reading an item it has no type for)."""

    event = "phase"
    kind = "phase"
    level = Severity.QUIET
    text: str

    @property
    def message(self) -> str:
        return self.text


@_register
@dataclass(frozen=True)
class Note(ProgressEvent):
    """Something said in words only, at a severity (a view reading an item it has no type
    for; LiveView.note, the compatibility path of a step not yet typed)."""

    event = "note"
    text: str
    given: Severity = Severity.INFO

    @property
    def severity(self) -> Severity:
        return self.given

    @property
    def message(self) -> str:
        return self.text


# The run's sequence: approvals, leases, the sweep of what dead runs left.


@_register
@dataclass(frozen=True)
class ApprovalNeeded(ProgressEvent):
    event = "approval_needed"
    kind = "phase"
    level = Severity.QUIET
    count: int

    @property
    def message(self) -> str:
        return f"approval needed for {self.count} capabilit{'y' if self.count == 1 else 'ies'}"


@_register
@dataclass(frozen=True)
class LeaseSwept(ProgressEvent):
    """The lease sweep at the start of a run found something (its summary)."""

    event = "lease_sweep"
    summary: str

    @property
    def message(self) -> str:
        return f"lease sweep: {self.summary}"


@_register
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


@_register
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


@_register
@dataclass(frozen=True)
class LeasesReleased(ProgressEvent):
    event = "leases_released"
    kind = "phase"
    level = Severity.QUIET
    count: int

    @property
    def message(self) -> str:
        return f"released {self.count} lease(s)"


@_register
@dataclass(frozen=True)
class ReleaseProblem(ProgressEvent):
    """A lease that could not be wiped or released (the sweeper retries it)."""

    event = "release_problem"
    level = Severity.PROBLEM
    problem: str

    @property
    def message(self) -> str:
        return f"release problem (kept for the sweeper): {self.problem}"


@_register
@dataclass(frozen=True)
class EndedEarly(ProgressEvent):
    """The run was interrupted or terminated; its clean-up is done."""

    event = "ended_early"
    level = Severity.WARNING
    ended: str  # "interrupted" or "terminated"

    @property
    def message(self) -> str:
        return f"{self.ended}: everything of this run was released and removed"


@_register
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


@_register
@dataclass(frozen=True)
class ProxyStarting(ProgressEvent):
    event = "proxy_starting"
    kind = "phase"
    level = Severity.QUIET
    allowed: int

    @property
    def message(self) -> str:
        return f"starting this run's egress proxy ({self.allowed} allowed)"


@_register
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


@_register
@dataclass(frozen=True)
class ProxyReloaded(ProgressEvent):
    """A mid-run egress grant put in force."""

    event = "proxy_reloaded"
    allowed: int

    @property
    def message(self) -> str:
        return f"egress proxy reloaded: {self.allowed} allowed"


@_register
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


@_register
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


@_register
@dataclass(frozen=True)
class ContainerStarting(ProgressEvent):
    event = "container_starting"
    kind = "phase"
    level = Severity.QUIET
    image: str

    @property
    def message(self) -> str:
        return f"starting container from {self.image}"


@_register
@dataclass(frozen=True)
class HostBrainStarting(ProgressEvent):
    event = "host_brain_starting"
    kind = "phase"
    level = Severity.QUIET

    @property
    def message(self) -> str:
        return "starting the brain ON THE HOST (runtime: host)"


@_register
@dataclass(frozen=True)
class TripwiresOff(ProgressEvent):
    """The canary and credential tripwires could not be armed."""

    event = "tripwires_off"
    level = Severity.WARNING
    why: str

    @property
    def message(self) -> str:
        return f"canary and credential tripwires off: {self.why}"


@_register
@dataclass(frozen=True)
class TrapProblem(ProgressEvent):
    """A canary or credential decoy that could not be planted or watched."""

    event = "trap_problem"
    level = Severity.WARNING
    problem: str

    @property
    def message(self) -> str:
        return self.problem


@_register
@dataclass(frozen=True)
class DecoysUnwatched(ProgressEvent):
    """Decoys planted after the wipe, with no process of the agent's left to watch."""

    event = "decoys_unwatched"

    @property
    def message(self) -> str:
        return "credential decoys planted; no process of the agent's is left to watch"


@_register
@dataclass(frozen=True)
class StoppingRun(ProgressEvent):
    """A watcher (a tripwire, the disk budget) kills the agent's container now."""

    event = "stopping_run"
    level = Severity.PROBLEM
    reason: str

    @property
    def message(self) -> str:
        return f"stopping the run: {self.reason}"


@_register
@dataclass(frozen=True)
class AgentStopProblem(ProgressEvent):
    """The agent's container did not stop cleanly before verify."""

    event = "agent_stop_problem"
    level = Severity.PROBLEM
    problem: str

    @property
    def message(self) -> str:
        return self.problem


@_register
@dataclass(frozen=True)
class DiskPassedAtEnd(ProgressEvent):
    """The last reading of the disk watch found the root past its budget."""

    event = "disk_passed_at_end"
    level = Severity.PROBLEM
    exceeded: str

    @property
    def message(self) -> str:
        return f"the run ended past its disk budget: {self.exceeded}"


@_register
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


@_register
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


@_register
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


@_register
@dataclass(frozen=True)
class CredentialBudgetExhausted(ProgressEvent):
    event = "credential_budget_exhausted"
    level = Severity.PROBLEM
    why: str

    @property
    def message(self) -> str:
        return f"credential budget exhausted: {self.why}; stopping"


@_register
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


@_register
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


@_register
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


@_register
@dataclass(frozen=True)
class ContainerRemoved(ProgressEvent):
    event = "container_removed"
    kind = "phase"
    level = Severity.QUIET

    @property
    def message(self) -> str:
        return "container removed"


# The brain's turn: resume, steering, the agent's branch, the kept conversation.


@_register
@dataclass(frozen=True)
class SessionResumed(ProgressEvent):
    event = "session_resumed"
    kind = "phase"
    level = Severity.QUIET
    text: str  # patterns/checkpoint.py Checkpoint.message

    @property
    def message(self) -> str:
        return self.text


@_register
@dataclass(frozen=True)
class BrainRunning(ProgressEvent):
    event = "brain_running"
    kind = "phase"
    level = Severity.QUIET
    brain: str
    engine: str

    @property
    def message(self) -> str:
        return f"brain {self.brain} ({self.engine}) running"


@_register
@dataclass(frozen=True)
class SteeringIgnored(ProgressEvent):
    event = "steering_ignored"

    @property
    def message(self) -> str:
        return 'steering: ignored a line that is not {"text": "..."}'


@_register
@dataclass(frozen=True)
class MessageDelivered(ProgressEvent):
    """An operator's message to the running brain: taken as its next user message, or
    not (``why``)."""

    event = "message_delivered"
    number: int
    reached: bool
    why: str = ""

    @property
    def message(self) -> str:
        if self.reached:
            return f"↳ message {self.number} reached the brain as its next user message"
        return f"↳ message {self.number} did not reach the brain: {self.why}"


@_register
@dataclass(frozen=True)
class AgentRepository(ProgressEvent):
    """The agent's repository made in the container."""

    event = "agent_repository"
    kind = "phase"
    level = Severity.QUIET
    branch: str
    seed: str

    @property
    def message(self) -> str:
        return f"the agent's repository: branch {self.branch} at {self.seed[:12]}"


@_register
@dataclass(frozen=True)
class BranchTaking(ProgressEvent):
    """The agent's branch being taken out of its container (``checking``: its commits
    being checked on the host)."""

    event = "branch_taking"
    kind = "phase"
    level = Severity.QUIET
    branch: str
    checking: bool = False

    @property
    def message(self) -> str:
        if self.checking:
            return f"checking the agent's commits for branch {self.branch}"
        return f"taking the agent's branch {self.branch} out of its container"


@_register
@dataclass(frozen=True)
class BranchTaken(ProgressEvent):
    """What became of the agent's branch (apply/run/agentbranch.py Imported.summary)."""

    event = "branch_taken"
    summary: str
    imported: bool

    @property
    def severity(self) -> Severity:
        return Severity.GOOD if self.imported else Severity.WARNING

    @property
    def message(self) -> str:
        return self.summary


@_register
@dataclass(frozen=True)
class Conversation(ProgressEvent):
    """What became of a session's kept brain conversation (apply/run/conversation.py):
    ``what`` is one of CONVERSATION's keys; ``why`` and ``size`` fill its words."""

    event = "conversation"
    session: str
    what: Literal["missing", "refused", "restored", "not_kept", "kept", "dropped"]
    why: str = ""
    size: str = ""

    @property
    def severity(self) -> Severity:
        return Severity.WARNING if self.what in ("refused", "not_kept") else Severity.INFO

    @property
    def message(self) -> str:
        said = CONVERSATION.get(self.what, "{what}")
        return f"session {self.session!r}: " + said.format(
            what=self.what, why=self.why, size=self.size
        )


CONVERSATION = {
    "missing": "its last conversation was not kept; the brain starts a new one",
    "refused": "the container did not take its conversation ({why}); the brain starts a new one",
    "restored": "its conversation ({size}) is back in the container's HOME;"
    " nothing else of the last run's HOME is",
    "not_kept": "its conversation was not kept ({why}); its next run starts a new one",
    "kept": "its conversation is kept for the next run ({size}, scrubbed of this run's secrets)",
    "dropped": "its conversation was dropped to keep at most {why}",
}


# Mid-run: sub-agents, requests, budgets.


@_register
@dataclass(frozen=True)
class SubAgent(ProgressEvent):
    """A sub-agent's course (apply/midrun/dispatch.py): ``what`` is one of SUB_AGENT's
    keys; ``detail`` fills its words."""

    event = "sub_agent"
    task: str
    what: Literal["refused", "waits", "ended", "killed"]
    detail: str = ""

    @property
    def severity(self) -> Severity:
        return Severity.PROBLEM if self.what in ("refused", "killed") else Severity.INFO

    @property
    def message(self) -> str:
        said = SUB_AGENT.get(self.what, "{what}")
        return f"sub-agent {self.task}" + said.format(what=self.what, detail=self.detail)


SUB_AGENT = {
    "refused": " refused: {detail}",
    "waits": " waits: {detail} already running",
    "ended": " {detail}",
    "killed": " overran its stop: killed",
}


@_register
@dataclass(frozen=True)
class SubAgentStep(ProgressEvent):
    """A sub-agent reached a step: ``starting`` (its plan), or ``approval`` (its plan
    needs the categories in ``detail``)."""

    event = "sub_agent_step"
    kind = "phase"
    level = Severity.QUIET
    task: str
    what: Literal["starting", "approval"]
    detail: str = ""
    plan: str = ""

    @property
    def message(self) -> str:
        if self.what == "starting":
            return f"sub-agent {self.task}: starting (plan {self.plan[:19]}…)"
        return f"sub-agent {self.task} needs approval for {self.detail} (plan {self.plan[:19]}…)"


@_register
@dataclass(frozen=True)
class SubAgentPhase(ProgressEvent):
    """A running sub-agent's phase, relayed from its own view."""

    event = "sub_agent_phase"
    task: str
    text: str

    @property
    def message(self) -> str:
        return f"  [{self.task}] {self.text}"


@_register
@dataclass(frozen=True)
class SubAgentsStopping(ProgressEvent):
    event = "sub_agents_stopping"
    kind = "phase"
    level = Severity.QUIET
    count: int
    stopped: bool = False

    @property
    def message(self) -> str:
        if self.stopped:
            return f"{self.count} sub-agent(s) stopped"
        return f"stopping {self.count} sub-agent(s)"


@_register
@dataclass(frozen=True)
class RequestsCapped(ProgressEvent):
    event = "requests_capped"
    level = Severity.WARNING
    limit: int

    @property
    def message(self) -> str:
        return (
            f"mid-run requests: this run made {self.limit}, the most it may; the rest are"
            " refused without being shown or recorded"
        )


@_register
@dataclass(frozen=True)
class MidRunRequest(ProgressEvent):
    """The brain asked for a capability mid-run (``name`` and ``reason`` are its words,
    neutralised and scrubbed)."""

    event = "midrun_request"
    request: str
    what: str  # egress, credential
    name: str
    reason: str

    @property
    def message(self) -> str:
        return f"mid-run request {self.request}: {self.what} {self.name!r} ({self.reason})"


@_register
@dataclass(frozen=True)
class BudgetRequest(ProgressEvent):
    """The brain ran out of a budget and asks for more."""

    event = "budget_request"
    request: str
    budget: str
    reason: str

    @property
    def message(self) -> str:
        return (
            f"budget request {self.request}: the brain ran out of its {self.budget} budget"
            f" ({self.reason})"
        )


@_register
@dataclass(frozen=True)
class RequestAnswered(ProgressEvent):
    """A mid-run request or extension settled: ``outcome`` granted (``said``: what is in
    force now), denied or timeout (``said``: who said so; ``category``), refused by the
    manifests or by kagura-agent before anyone was asked, or failed (approved, but it
    could not be put in force)."""

    event = "request_answered"
    request: str
    outcome: Literal["granted", "denied", "timeout", "refused", "failed"]
    said: str
    category: str = ""

    @property
    def severity(self) -> Severity:
        return Severity.PROBLEM if self.outcome == "failed" else Severity.INFO

    @property
    def message(self) -> str:
        if self.outcome == "refused":
            return f"↳ {self.request} refused: {self.said}"
        if self.outcome in ("denied", "timeout"):
            return f"↳ {self.request} {self.category}: {self.said}"
        return f"↳ {self.request}: {self.said}"


@_register
@dataclass(frozen=True)
class BudgetNotExtended(ProgressEvent):
    """A budget the run will stop at: the manifests refused its extension (``request``
    names it) or an operator did not grant it (``said``)."""

    event = "budget_not_extended"
    budget: str  # wall, lease, or a brain budget's words (BRAIN_BUDGETS)
    said: str
    request: str = ""

    @property
    def severity(self) -> Severity:
        return Severity.WARNING if self.request else Severity.INFO

    @property
    def message(self) -> str:
        if self.request:
            return f"↳ {self.request}: {self.budget} budget not extended: {self.said}"
        stops = "the run stops"
        if self.budget in ("wall", "lease"):  # the time budgets: they run out
            stops += " when it runs out"
        return f"{self.budget} budget not extended ({self.said}): {stops}"


# The record of the run: graduation, memory, the journal, the end.


@_register
@dataclass(frozen=True)
class GraduationNoEvidence(ProgressEvent):
    event = "graduation_no_evidence"

    @property
    def message(self) -> str:
        return "graduation: a sub-agent's own verify commands earn no evidence"


@_register
@dataclass(frozen=True)
class GraduationDemoted(ProgressEvent):
    event = "graduation_demoted"
    level = Severity.PROBLEM
    category: str
    reason: str

    @property
    def message(self) -> str:
        return (
            f"graduation: {self.category} demoted to ask-every-time, its count restarts"
            f" ({self.reason})"
        )


@_register
@dataclass(frozen=True)
class FailuresLinked(ProgressEvent):
    """A successful run and the earlier failures it fixes (``fixed``, its summary) or
    leaves open (``open``: it changed nothing recorded since)."""

    event = "failures_linked"
    fixed: int
    summary: str = ""
    open: int = 0

    @property
    def message(self) -> str:
        if self.open:
            return (
                f"{self.open} earlier failure(s) stay open: this run changed nothing recorded"
                " (steps, instruction, capabilities) since"
            )
        return f"linked this run as the fix of {self.fixed} earlier failure(s): {self.summary}"


@_register
@dataclass(frozen=True)
class TokensOverBudget(ProgressEvent):
    event = "tokens_over_budget"
    level = Severity.WARNING
    used: int
    limit: int

    @property
    def message(self) -> str:
        return f"the run used {self.used:,} tokens, over its learnt budget of {self.limit:,}"


@_register
@dataclass(frozen=True)
class RunFinished(ProgressEvent):
    event = "run_finished"
    kind = "phase"
    level = Severity.QUIET
    run_id: str
    succeeded: bool
    wall_seconds: float
    cost_usd: float | None = None

    @property
    def message(self) -> str:
        verdict = "succeeded" if self.succeeded else "FAILED"
        cost = f", cost ${self.cost_usd:.4f}" if self.cost_usd is not None else ""
        return f"run {self.run_id} {verdict} in {self.wall_seconds:.1f}s{cost}"


@_register
@dataclass(frozen=True)
class OutputMemory(ProgressEvent):
    """A dispatched child's output memory, for its parent."""

    event = "output_memory"
    memory: str

    @property
    def message(self) -> str:
        return (
            f"output memory {self.memory} (the parent recalls it:"
            f" kagura-agent memory show {self.memory})"
        )


@_register
@dataclass(frozen=True)
class TimelineIncomplete(ProgressEvent):
    """The store refused a batch of the run's journal."""

    event = "timeline_incomplete"
    level = Severity.WARNING
    problem: str

    @property
    def message(self) -> str:
        return f"the run's timeline is incomplete: {self.problem}"
