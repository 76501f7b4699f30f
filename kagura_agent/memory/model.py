"""The memory protocol and the plain data it hands up and down.

Every memory carries its provenance: where it came from (a run, a task, a chat
transport or an import), its trust tier, and when it was created. Recall that can
influence behaviour returns trusted memories only unless the caller asks for
untrusted ones with ``include_untrusted=True``; each returned ``Memory`` says its
tier, so a caller can tell the planner which inputs were untrusted.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, Protocol, get_args

from kagura_agent.clock import iso

SourceKind = Literal["run", "task", "transport", "import"]
Trust = Literal["trusted", "untrusted"]

SOURCE_KINDS: tuple[str, ...] = get_args(SourceKind)
TRUST_TIERS: tuple[str, ...] = get_args(Trust)

# Edge types the patterns use. Backends may only store these, so that a cloud
# backend can map each one onto a type its server accepts.
EDGE_TYPES: tuple[str, ...] = ("prevents", "derived_from", "produced", "related_to")


@dataclass(frozen=True)
class Source:
    """Where a memory came from: ``kind`` is run|task|transport|import, ``id`` names it."""

    kind: SourceKind
    id: str

    def __post_init__(self) -> None:
        if self.kind not in SOURCE_KINDS:
            raise ValueError(f"source kind must be one of {SOURCE_KINDS}, not {self.kind!r}")

    def to_json(self) -> dict[str, str]:
        return {"kind": self.kind, "id": self.id}


def default_trust(source: Source) -> Trust:
    """Runs and tasks the operator wrote are trusted; chat transports and imports are not."""
    return "trusted" if source.kind in ("run", "task") else "untrusted"


def new_memory_id() -> str:
    return f"mem-{uuid.uuid4().hex}"


@dataclass(frozen=True)
class Memory:
    """One stored memory with its provenance. ``details`` is arbitrary JSON."""

    id: str
    type: str
    summary: str
    source: Source
    trust: Trust
    created: datetime
    details: Mapping[str, Any] = field(default_factory=dict)
    tags: tuple[str, ...] = ()
    task_kind: str | None = None

    @property
    def untrusted(self) -> bool:
        return self.trust == "untrusted"

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": self.type,
            "summary": self.summary,
            "details": dict(self.details),
            "tags": list(self.tags),
            "task_kind": self.task_kind,
            "source": self.source.to_json(),
            "trust": self.trust,
            "created": iso(self.created),
        }


@dataclass(frozen=True)
class Edge:
    """A directed link ``source_id -[type]-> target_id`` between two memories.

    ``details`` is the evidence the link stands on (a ``prevents`` edge keeps what the
    fixing run changed) and who made it (``by``: a run id for links the brain made).
    """

    source_id: str
    target_id: str
    type: str
    created: datetime
    details: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "source_id": self.source_id,
            "target_id": self.target_id,
            "type": self.type,
            "created": iso(self.created),
            "details": dict(self.details),
        }


@dataclass(frozen=True)
class Tombstone:
    """What remains of a forgotten memory: who, what kind, when and why — never the content."""

    memory_id: str
    type: str
    source: Source
    trust: Trust
    created: datetime
    forgotten: datetime
    reason: str
    cascade_of: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "memory_id": self.memory_id,
            "type": self.type,
            "source": self.source.to_json(),
            "trust": self.trust,
            "created": iso(self.created),
            "forgotten": iso(self.forgotten),
            "reason": self.reason,
            "cascade_of": self.cascade_of,
        }


def check_edge_type(edge_type: str) -> None:
    if edge_type not in EDGE_TYPES:
        raise ValueError(f"edge type must be one of {EDGE_TYPES}, not {edge_type!r}")


def untrusted_ids(memories: Sequence[Memory]) -> list[str]:
    """The ids of the untrusted memories among ``memories`` (for the plan's untrusted_inputs)."""
    return [m.id for m in memories if m.untrusted]


class MemoryStore(Protocol):
    """What every memory backend provides. Implementations: sqlite (embedded), postgres (team), cloud."""

    backend: str

    def remember(
        self,
        *,
        type: str,
        summary: str,
        source: Source,
        trust: Trust | None = None,
        details: Mapping[str, Any] | None = None,
        tags: Sequence[str] = (),
        task_kind: str | None = None,
    ) -> Memory:
        """Store a memory; ``trust`` defaults to ``default_trust(source)``."""
        ...

    def recall(
        self,
        query: str = "",
        *,
        k: int = 10,
        type: str | None = None,
        task_kind: str | None = None,
        source: Source | None = None,
        tags: Sequence[str] = (),
        include_untrusted: bool = False,
    ) -> list[Memory]:
        """Best ``k`` matches of ``query`` (newest first when empty) passing every filter.

        Untrusted memories are left out unless ``include_untrusted`` is set.
        """
        ...

    def get(self, memory_id: str) -> Memory | None:
        """The memory with this id, trusted or not, or None."""
        ...

    def create_edge(
        self,
        source_id: str,
        target_id: str,
        type: str,
        details: Mapping[str, Any] | None = None,
    ) -> Edge:
        """Link two existing memories; idempotent for the same (source, target, type)
        (the first link's details are kept)."""
        ...

    def edges(
        self,
        memory_id: str,
        *,
        type: str | None = None,
        direction: Literal["out", "in", "both"] = "both",
    ) -> list[Edge]:
        """Edges touching ``memory_id``, optionally of one type and direction."""
        ...

    def forget(
        self, memory_id: str, *, reason: str = "", cascade_of: str | None = None
    ) -> Tombstone | None:
        """Remove a memory and its edges, leaving a tombstone; None when it did not exist."""
        ...

    def tombstones(self) -> list[Tombstone]:
        """Every tombstone, oldest first."""
        ...

    def export(self) -> Iterator[Memory]:
        """Every memory, oldest first."""
        ...

    def close(self) -> None: ...
