"""What every memory backend shares, so that each keeps only its storage: a memory built
from what ``remember`` is given, the tombstone of a forgotten one, the trust and edge-end
checks, and recall's shape (rank the weighted terms, then fill up with the newest
memories that match only the common ones); and for the two SQL backends, the recall
filters and the rows as both store them."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, Literal, Protocol, cast

from kagura_agent.clock import Clock, iso, parse_iso
from kagura_agent.memory.model import (
    TRUST_TIERS,
    Edge,
    Memory,
    Source,
    SourceKind,
    Tombstone,
    Trust,
    default_trust,
    new_memory_id,
)


def stored_now(clock: Clock) -> datetime:
    """Now, at the second precision memories are stored with: a remembered Memory is then
    equal to the one read back."""
    return parse_iso(iso(clock.now()))


def new_memory(
    clock: Clock,
    *,
    type: str,
    summary: str,
    source: Source,
    trust: Trust | None,
    details: Mapping[str, Any] | None,
    tags: Sequence[str],
    task_kind: str | None,
) -> Memory:
    """The memory ``remember`` stores: a new id, the source's default tier unless one is
    given, created now, tags once each in their order."""
    return Memory(
        id=new_memory_id(),
        type=type,
        summary=summary,
        source=source,
        trust=trust or default_trust(source),
        created=stored_now(clock),
        details=dict(details or {}),
        tags=tuple(dict.fromkeys(tags)),
        task_kind=task_kind,
    )


def document_text(memory: Memory) -> tuple[str, str, str]:
    """What the SQL backends store and index of a memory: its summary, its details and
    its tags (both as JSON text)."""
    return (
        memory.summary,
        json.dumps(memory.details, sort_keys=True),
        json.dumps(list(memory.tags)),
    )


def tombstone_of(
    memory: Memory, forgotten: datetime, reason: str, cascade_of: str | None
) -> Tombstone:
    """What is kept of ``memory`` once forgotten: never its content."""
    return Tombstone(
        memory_id=memory.id,
        type=memory.type,
        source=memory.source,
        trust=memory.trust,
        created=memory.created,
        forgotten=forgotten,
        reason=reason,
        cascade_of=cascade_of,
    )


def check_trust(trust: str) -> None:
    if trust not in TRUST_TIERS:
        raise ValueError(f"trust must be one of {TRUST_TIERS}, not {trust!r}")


def check_ends(get: Callable[[str], Memory | None], *memory_ids: str) -> None:
    """An edge links stored memories only (``get``: the store's)."""
    for memory_id in memory_ids:
        if get(memory_id) is None:
            raise KeyError(f"no memory {memory_id}")


Matching = Callable[[list[str], int], list[Memory]]  # (terms, k) -> memories


def ranked_then_newest(
    weighted: list[str], common: list[str], k: int, ranked: Matching, newest: Matching
) -> list[Memory]:
    """Recall with a query: terms in more than half the memories carry no rank weight
    (terms.py) but would cost a read of their whole posting list, so rank by the others,
    then fill up with the newest memories that match only the common ones."""
    found = ranked(weighted, k) if weighted else []
    if len(found) < k and common:
        seen = {m.id for m in found}
        more = newest(common, k + len(found))
        found += [m for m in more if m.id not in seen][: k - len(found)]
    return found


def recall_filters(
    *,
    include_untrusted: bool,
    type: str | None,
    task_kind: str | None,
    source: Source | None,
    tags: Sequence[str],
    tag_clause: str,
) -> tuple[list[str], list[Any]]:
    """The WHERE clauses (on alias ``m``) and their parameters that every SQL backend's
    recall applies; ``tag_clause`` is the backend's test for one tag (one ``?``)."""
    where: list[str] = []
    params: list[Any] = []
    if not include_untrusted:
        where.append("m.trust = 'trusted'")
    if type is not None:
        where.append("m.type = ?")
        params.append(type)
    if task_kind is not None:
        where.append("m.task_kind = ?")
        params.append(task_kind)
    if source is not None:
        where.append("m.source_kind = ? AND m.source_id = ?")
        params += [source.kind, source.id]
    for tag in tags:
        where.append(tag_clause)
        params.append(tag)
    return where, params


def tombstone_row(
    memory: Memory, tombstone: Tombstone, reason: str, cascade_of: str | None
) -> tuple[Any, ...]:
    """A forgotten memory's tombstone as the SQL backends store it (in column order:
    memory_id, type, source_kind, source_id, trust, created, forgotten, reason, cascade_of)."""
    return (
        memory.id,
        memory.type,
        memory.source.kind,
        memory.source.id,
        memory.trust,
        iso(memory.created),
        iso(tombstone.forgotten),
        reason,
        cascade_of,
    )


class SqlRow(Protocol):
    """A result row of either SQL backend (sqlite3.Row or the state seam's Row)."""

    def __getitem__(self, key: str, /) -> Any: ...

    def keys(self) -> list[str]: ...


def memory_from_row(row: SqlRow) -> Memory:
    """A memory as both SQL backends store it (details and tags as JSON text)."""
    return Memory(
        id=row["id"],
        type=row["type"],
        summary=row["summary"],
        source=Source(cast(SourceKind, row["source_kind"]), row["source_id"]),
        trust=cast(Trust, row["trust"]),
        created=parse_iso(row["created"]),
        details=json.loads(row["details"]),
        tags=tuple(json.loads(row["tags"])),
        task_kind=row["task_kind"],
    )


def edge_from_row(row: SqlRow) -> Edge:
    # A SQLite store opened read-only before its v5 migration has no details column.
    details = json.loads(row["details"]) if "details" in row.keys() else {}  # noqa: SIM118 - a sqlite3.Row's `in` looks at values
    return Edge(row["source_id"], row["target_id"], row["type"], parse_iso(row["created"]), details)


def tombstone_from_row(row: SqlRow) -> Tombstone:
    return Tombstone(
        memory_id=row["memory_id"],
        type=row["type"],
        source=Source(cast(SourceKind, row["source_kind"]), row["source_id"]),
        trust=cast(Trust, row["trust"]),
        created=parse_iso(row["created"]),
        forgotten=parse_iso(row["forgotten"]),
        reason=row["reason"],
        cascade_of=row["cascade_of"],
    )


def edges_query(
    table: str, memory_id: str, type: str | None, direction: Literal["out", "in", "both"]
) -> tuple[str, list[str]]:
    """The SQL (``?`` placeholders) and parameters listing ``memory_id``'s edges in
    ``table``, oldest first."""
    clauses = {
        "out": "source_id = ?",
        "in": "target_id = ?",
        "both": "(source_id = ? OR target_id = ?)",
    }
    params = [memory_id] * (2 if direction == "both" else 1)
    sql = f"SELECT * FROM {table} WHERE {clauses[direction]}"
    if type is not None:
        sql += " AND type = ?"
        params.append(type)
    return sql + " ORDER BY created, source_id, target_id", params
