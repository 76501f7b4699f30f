"""One normalised, JSON-serialisable event model for every brain engine.

Events cross the container boundary as JSON lines, so the host treats them as untrusted:
``event_from_json`` checks every field's type and rejects unknown keys instead of
trusting whatever shape arrives.
"""

from __future__ import annotations

from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import Any, ClassVar

JSONValue = Any

# Caps that keep one event readable and bounded even when an engine is chatty.
MAX_TEXT_CHARS = 64 * 1024


class EventShapeError(ValueError):
    """A JSON object does not have the shape of any brain event."""


@dataclass(frozen=True)
class TextEvent:
    """Assistant prose (or a readable progress note from a deterministic engine)."""

    type: ClassVar[str] = "text"
    text: str


@dataclass(frozen=True)
class ToolCallEvent:
    """The engine started a tool: ``id`` pairs it with its ToolResultEvent."""

    type: ClassVar[str] = "tool_call"
    id: str
    name: str
    input: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ToolOutputEvent:
    """Output of a tool still running, whole lines as they come (a step's stdout and
    stderr), so the live view shows it line by line; its ToolResultEvent follows with
    the exit code and the output's capped tail. Shown, never the basis of a decision."""

    type: ClassVar[str] = "tool_output"
    id: str
    text: str


@dataclass(frozen=True)
class ToolResultEvent:
    """A tool finished; ``output`` is capped text, ``exit_code`` set for shell tools."""

    type: ClassVar[str] = "tool_result"
    id: str
    output: str
    is_error: bool = False
    exit_code: int | None = None


@dataclass(frozen=True)
class CostEvent:
    """What the turn cost so far: dollars and tokens where the engine knows them, and
    ``retries``: the re-attempts the engine made (an API call it had to repeat)."""

    type: ClassVar[str] = "cost"
    usd: float | None = None
    turns: int | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    retries: int | None = None


@dataclass(frozen=True)
class CheckpointEvent:
    """A resumable point: ``step`` steps are complete, ``pending`` remain."""

    type: ClassVar[str] = "checkpoint"
    step: int
    pending: int
    session_id: str | None = None


@dataclass(frozen=True)
class DoneEvent:
    """The turn ended normally. The agent's own claim; verify commands decide success."""

    type: ClassVar[str] = "done"
    result: str | None = None
    session_id: str | None = None


@dataclass(frozen=True)
class ErrorEvent:
    """The turn ended abnormally. ``code`` is a short machine word (see ERROR_CODES)."""

    type: ClassVar[str] = "error"
    message: str
    code: str = "engine"


ERROR_CODES = frozenset(
    {"engine", "step-failed", "timeout", "idle", "oversize", "protocol", "crash", "setup", "budget"}
)

BrainEvent = (
    TextEvent
    | ToolCallEvent
    | ToolOutputEvent
    | ToolResultEvent
    | CostEvent
    | CheckpointEvent
    | DoneEvent
    | ErrorEvent
)

TERMINAL_TYPES = frozenset({"done", "error"})

_CLASSES: dict[str, type[Any]] = {
    cls.type: cls
    for cls in (
        TextEvent,
        ToolCallEvent,
        ToolOutputEvent,
        ToolResultEvent,
        CostEvent,
        CheckpointEvent,
        DoneEvent,
        ErrorEvent,
    )
}

# Accepted JSON types per field. ``None`` in a tuple means the field may be null.
_SPEC: dict[str, dict[str, tuple[type | None, ...]]] = {
    "text": {"text": (str,)},
    "tool_call": {"id": (str,), "name": (str,), "input": (dict,)},
    "tool_output": {"id": (str,), "text": (str,)},
    "tool_result": {
        "id": (str,),
        "output": (str,),
        "is_error": (bool,),
        "exit_code": (int, None),
    },
    "cost": {
        "usd": (float, int, None),
        "turns": (int, None),
        "input_tokens": (int, None),
        "output_tokens": (int, None),
        "retries": (int, None),
    },
    "checkpoint": {"step": (int,), "pending": (int,), "session_id": (str, None)},
    "done": {"result": (str, None), "session_id": (str, None)},
    "error": {"message": (str,), "code": (str,)},
}


def is_terminal(event: BrainEvent) -> bool:
    """True for the events that end a turn (done, error)."""
    return event.type in TERMINAL_TYPES


def event_to_json(event: BrainEvent) -> dict[str, JSONValue]:
    """The wire form of an event: its fields plus ``type``."""
    return {"type": event.type, **asdict(event)}


def _type_ok(value: object, allowed: tuple[type | None, ...]) -> bool:
    if value is None:
        return None in allowed
    # bool is an int subclass: never let True stand in for a number, or 1 for a bool.
    if isinstance(value, bool):
        return bool in allowed
    return any(t is not None and t is not bool and isinstance(value, t) for t in allowed)


def event_from_json(obj: object) -> BrainEvent:
    """Validate an untrusted JSON object and build the event it describes.

    Raises EventShapeError naming the first problem: not an object, unknown type,
    unknown or missing field, or a field of the wrong JSON type.
    """
    if not isinstance(obj, dict):
        raise EventShapeError(f"event must be a JSON object, not {type(obj).__name__}")
    kind = obj.get("type")
    if not isinstance(kind, str) or kind not in _CLASSES:
        raise EventShapeError(f"unknown event type {kind!r}")
    cls = _CLASSES[kind]
    spec = _SPEC[kind]
    extra = set(obj) - set(spec) - {"type"}
    if extra:
        raise EventShapeError(f"{kind} event has unknown field(s) {sorted(extra)}")
    required = {
        f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING
    }
    kwargs: dict[str, Any] = {}
    for name, allowed in spec.items():
        if name not in obj:
            if name in required:
                raise EventShapeError(f"{kind} event lacks field {name!r}")
            continue
        value = obj[name]
        if not _type_ok(value, allowed):
            raise EventShapeError(f"{kind}.{name} has the wrong type ({type(value).__name__})")
        kwargs[name] = float(value) if name == "usd" and value is not None else value
    if kind == "error" and kwargs.get("code", "engine") not in ERROR_CODES:
        kwargs["code"] = "engine"
    event: BrainEvent = cls(**kwargs)
    return event
