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

No step passes a colour: severity is the event's, styling is the terminal's. The base
and the registry are in event.py, the events in run_events.py (the run's sequence and its
container) and turn_events.py (the brain's turn, mid-run, the record); this module is
what the steps and the views import.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, Literal

from kagura_agent.apply.records.event import (
    EVENTS,
    Note,
    Phase,
    Progress,
    ProgressEvent,
    Severity,
)
from kagura_agent.apply.records.run_events import (
    AgentStopProblem,
    ApprovalNeeded,
    ContainerNotRemoved,
    ContainerRemoved,
    ContainerStarting,
    CredentialBudgetExhausted,
    DeadRunsRemoved,
    DecoysUnwatched,
    DiskPassedAtEnd,
    EgressDenied,
    EndedEarly,
    HostBrainStarting,
    LeasesReleased,
    LeaseSwept,
    Leasing,
    ModelCallsCounted,
    PastBudget,
    ProxyReady,
    ProxyReloaded,
    ProxyRemoved,
    ProxyStarting,
    ReleaseProblem,
    RootFinding,
    StoppingRun,
    TrapProblem,
    TripwiresOff,
    TurnsUnderReported,
    VerifyExited,
    Verifying,
)
from kagura_agent.apply.records.turn_events import (
    AgentRepository,
    BrainRunning,
    BranchTaken,
    BranchTaking,
    BudgetNotExtended,
    BudgetRequest,
    FailuresLinked,
    GraduationDemoted,
    GraduationNoEvidence,
    MessageDelivered,
    MidRunRequest,
    OutputMemory,
    RequestAnswered,
    RequestsCapped,
    RunFinished,
    SessionConversation,
    SessionResumed,
    SteeringIgnored,
    SubAgent,
    SubAgentPhase,
    SubAgentsStopping,
    SubAgentStep,
    TimelineIncomplete,
    TokensOverBudget,
)

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


def legacy_colour(severity: Severity) -> str:
    """The colour a severity was shown in, for a caller of LiveView.note's compatibility
    path (which reads it back as the same severity)."""
    return (STYLES[severity] or ("",))[0]


def chat_line(event: ProgressEvent) -> str:
    """The event's line in the cockpit's chat (no colour there: the words carry it)."""
    if event.kind == "phase":
        return f"● {event.message}"
    return f"  {event.message}"


__all__ = [
    "EVENTS",
    "STYLES",
    "TONES",
    "AgentRepository",
    "AgentStopProblem",
    "ApprovalNeeded",
    "BrainRunning",
    "BranchTaken",
    "BranchTaking",
    "BudgetNotExtended",
    "BudgetRequest",
    "ContainerNotRemoved",
    "ContainerRemoved",
    "ContainerStarting",
    "CredentialBudgetExhausted",
    "DeadRunsRemoved",
    "DecoysUnwatched",
    "DiskPassedAtEnd",
    "EgressDenied",
    "EndedEarly",
    "FailuresLinked",
    "GraduationDemoted",
    "GraduationNoEvidence",
    "HostBrainStarting",
    "LeaseSwept",
    "LeasesReleased",
    "Leasing",
    "MessageDelivered",
    "MidRunRequest",
    "ModelCallsCounted",
    "Note",
    "OutputMemory",
    "PastBudget",
    "Phase",
    "Progress",
    "ProgressEvent",
    "ProxyReady",
    "ProxyReloaded",
    "ProxyRemoved",
    "ProxyStarting",
    "ReleaseProblem",
    "RequestAnswered",
    "RequestsCapped",
    "RootFinding",
    "RunFinished",
    "SessionConversation",
    "SessionResumed",
    "Severity",
    "SteeringIgnored",
    "StoppingRun",
    "SubAgent",
    "SubAgentPhase",
    "SubAgentStep",
    "SubAgentsStopping",
    "TimelineIncomplete",
    "TokensOverBudget",
    "TrapProblem",
    "TripwiresOff",
    "TurnsUnderReported",
    "VerifyExited",
    "Verifying",
    "chat_line",
    "fields_of",
    "from_json",
    "legacy_colour",
    "terminal_line",
    "to_json",
]
