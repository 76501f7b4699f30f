"""What a run's progress events are (records/progress.py renders them): a frozen
dataclass per meaning, its severity its type's, registered by its stable ``event`` name.
The events themselves are in run_events.py and turn_events.py."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import StrEnum
from typing import ClassVar, Literal, Protocol, TypeVar


class Severity(StrEnum):
    """How much an event matters to whoever watches the run."""

    QUIET = "quiet"  # a step reached, a detail: shown dim
    INFO = "info"
    GOOD = "good"  # something that could have failed worked
    WARNING = "warning"  # the run goes on, but something is off or will stop it
    PROBLEM = "problem"  # something failed, was refused or had to be stopped


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


EVENTS: dict[str, type[ProgressEvent]] = {}


E = TypeVar("E", bound=type["ProgressEvent"])


def register(cls: E) -> E:
    assert cls.event and cls.event not in EVENTS, cls
    assert not RESERVED & {f.name for f in dataclasses.fields(cls)}, cls
    EVENTS[cls.event] = cls
    return cls


@register
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


@register
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
