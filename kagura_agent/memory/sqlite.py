"""The embedded memory store: SQLite with FTS5, in its own file in the state directory.

The file (``<state_dir>/memory.db`` by default) is opened through ``StateStore``, so it
gets WAL, synchronous=FULL and versioned migrations. Full-text recall goes through an
external-content FTS5 index kept in step by triggers; every filter column has an index,
so recall never scans the table (the original's recall was a full scan). Query terms in
more than half the memories are left out of bm25 ranking (terms.py keeps the counts).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from kagura_agent.clock import Clock, SystemClock, iso
from kagura_agent.errors import SetupError
from kagura_agent.memory.common import (
    check_ends,
    check_trust,
    document_text,
    edge_from_row,
    edges_query,
    memory_from_row,
    new_memory,
    ranked_then_newest,
    recall_filters,
    stored_now,
    tombstone_from_row,
    tombstone_of,
    tombstone_row,
)
from kagura_agent.memory.model import (
    Edge,
    Memory,
    Source,
    Tombstone,
    Trust,
    check_edge_type,
)
from kagura_agent.memory.terms import MIGRATION as TERMS_MIGRATION
from kagura_agent.memory.terms import (
    count_added,
    count_removed,
    document_terms,
    match_expression,
    split_by_weight,
    tokens,
)
from kagura_agent.state import StateDbError, StateStore

COMPONENT = "memory"

_V1 = """
CREATE TABLE memories (
  rowid INTEGER PRIMARY KEY,
  id TEXT NOT NULL UNIQUE,
  type TEXT NOT NULL,
  summary TEXT NOT NULL,
  details TEXT NOT NULL DEFAULT '{}',
  tags TEXT NOT NULL DEFAULT '[]',
  source_kind TEXT NOT NULL CHECK (source_kind IN ('run', 'task', 'transport', 'import')),
  source_id TEXT NOT NULL,
  trust TEXT NOT NULL CHECK (trust IN ('trusted', 'untrusted')),
  task_kind TEXT,
  created TEXT NOT NULL
);
CREATE INDEX memories_type ON memories(type, trust, created);
CREATE INDEX memories_trust ON memories(trust, created);
CREATE INDEX memories_task_kind ON memories(task_kind, type, trust, created);
CREATE INDEX memories_source ON memories(source_kind, source_id, trust, created);
CREATE INDEX memories_created ON memories(created);
CREATE VIRTUAL TABLE memories_fts USING fts5(
  summary, details, tags, content='memories', content_rowid='rowid'
);
CREATE TRIGGER memories_ai AFTER INSERT ON memories BEGIN
  INSERT INTO memories_fts(rowid, summary, details, tags)
  VALUES (new.rowid, new.summary, new.details, new.tags);
END;
CREATE TRIGGER memories_ad AFTER DELETE ON memories BEGIN
  INSERT INTO memories_fts(memories_fts, rowid, summary, details, tags)
  VALUES ('delete', old.rowid, old.summary, old.details, old.tags);
END;
CREATE TABLE edges (
  source_id TEXT NOT NULL,
  target_id TEXT NOT NULL,
  type TEXT NOT NULL,
  created TEXT NOT NULL,
  PRIMARY KEY (source_id, target_id, type)
);
CREATE INDEX edges_target ON edges(target_id, type);
"""

# v2: tags get their own indexed table (tag filters were a JSON scan in v1), and
# erasure gets an auditable tombstone table. Existing rows' tags are backfilled.
_V2 = """
CREATE TABLE memory_tags (
  memory_rowid INTEGER NOT NULL REFERENCES memories(rowid) ON DELETE CASCADE,
  tag TEXT NOT NULL,
  PRIMARY KEY (tag, memory_rowid)
);
CREATE INDEX memory_tags_rowid ON memory_tags(memory_rowid);
INSERT OR IGNORE INTO memory_tags(memory_rowid, tag)
  SELECT memories.rowid, json_each.value FROM memories, json_each(memories.tags);
CREATE TABLE tombstones (
  memory_id TEXT PRIMARY KEY,
  type TEXT NOT NULL,
  source_kind TEXT NOT NULL,
  source_id TEXT NOT NULL,
  trust TEXT NOT NULL,
  created TEXT NOT NULL,
  forgotten TEXT NOT NULL,
  reason TEXT NOT NULL,
  cascade_of TEXT
);
CREATE TABLE health (id INTEGER PRIMARY KEY CHECK (id = 1), checked TEXT NOT NULL);
"""

# v4: every filter column next to the rowid, so the ranking window checks a match's
# filters in a narrow covering index instead of reading its (wide) row: half the cost.
_V4 = """
CREATE INDEX memories_filter ON memories(rowid, trust, type, task_kind, source_kind, source_id);
"""

# v5: an edge keeps its evidence and who made it (a prevents edge: what the fix changed).
_V5 = """
ALTER TABLE edges ADD COLUMN details TEXT NOT NULL DEFAULT '{}';
"""

# v3: document frequencies, so recall can leave out terms too common to rank by.
MIGRATIONS: tuple[str, ...] = (_V1, _V2, TERMS_MIGRATION, _V4, _V5)

RANK_WINDOW = 1000


def fts_query(text: str) -> str:
    """Turn free text into a safe FTS5 query: every term quoted, any term may match."""
    return match_expression(tokens(text))


class SqliteMemoryStore:
    """``MemoryStore`` on SQLite + FTS5. One instance per process; not thread-shared."""

    backend = "sqlite"

    def __init__(
        self, path: Path, *, clock: Clock | None = None, state: StateStore | None = None
    ) -> None:
        """Open (creating and migrating) the store at ``path``; or, with ``state``, use
        that already open store — ``StateStore.read_only(path)`` for a reader that never
        migrates (it raises ``SchemaBehind`` when the memory schema is not current)."""
        self.path = path
        self.clock: Clock = clock or SystemClock()
        self._state = state if state is not None else StateStore(path)
        try:
            self._state.migrate(COMPONENT, MIGRATIONS)
        except (sqlite3.Error, StateDbError) as exc:
            self._state.close()
            raise SetupError(f"memory store {path} cannot be migrated: {exc}") from exc
        self.conn = self._state.sqlite()

    # -- writes ----------------------------------------------------------------

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
        """Store one memory in one transaction (the row, its FTS entry and its tags)."""
        memory = new_memory(
            self.clock,
            type=type,
            summary=summary,
            source=source,
            trust=trust,
            details=details,
            tags=tags,
            task_kind=task_kind,
        )
        row_text = document_text(memory)
        with self._state.sqlite_transaction() as conn:
            cursor = conn.execute(
                "INSERT INTO memories(id, type, summary, details, tags, source_kind, source_id,"
                " trust, task_kind, created) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    memory.id,
                    memory.type,
                    *row_text,
                    source.kind,
                    source.id,
                    memory.trust,
                    task_kind,
                    iso(memory.created),
                ),
            )
            conn.executemany(
                "INSERT INTO memory_tags(memory_rowid, tag) VALUES (?, ?)",
                [(cursor.lastrowid, tag) for tag in memory.tags],
            )
            count_added(conn, document_terms(row_text))
        return memory

    def create_edge(
        self,
        source_id: str,
        target_id: str,
        type: str,
        details: Mapping[str, Any] | None = None,
    ) -> Edge:
        """Link two stored memories; a repeated link is kept once (with its first details)."""
        check_edge_type(type)
        check_ends(self.get, source_id, target_id)
        created = stored_now(self.clock)
        with self._state.sqlite_transaction() as conn:
            conn.execute(
                "INSERT OR IGNORE INTO edges(source_id, target_id, type, created, details)"
                " VALUES (?, ?, ?, ?, ?)",
                (source_id, target_id, type, iso(created), json.dumps(dict(details or {}))),
            )
            row = conn.execute(
                "SELECT * FROM edges WHERE source_id = ? AND target_id = ? AND type = ?",
                (source_id, target_id, type),
            ).fetchone()
        return edge_from_row(row)

    def forget(
        self, memory_id: str, *, reason: str = "", cascade_of: str | None = None
    ) -> Tombstone | None:
        """Delete the memory, its FTS entry, tags and edges; keep a content-free tombstone."""
        with self._state.sqlite_transaction() as conn:
            row = conn.execute("SELECT * FROM memories WHERE id = ?", (memory_id,)).fetchone()
            if row is None:
                return None
            memory = memory_from_row(row)
            tombstone = tombstone_of(memory, stored_now(self.clock), reason, cascade_of)
            conn.execute("DELETE FROM memory_tags WHERE memory_rowid = ?", (row["rowid"],))
            conn.execute("DELETE FROM memories WHERE rowid = ?", (row["rowid"],))
            count_removed(conn, document_terms((row["summary"], row["details"], row["tags"])))
            conn.execute(
                "DELETE FROM edges WHERE source_id = ? OR target_id = ?", (memory_id, memory_id)
            )
            conn.execute(
                "INSERT OR REPLACE INTO tombstones(memory_id, type, source_kind, source_id, trust,"
                " created, forgotten, reason, cascade_of) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                tombstone_row(memory, tombstone, reason, cascade_of),
            )
        return tombstone

    def set_trust(self, memory_id: str, trust: Trust) -> Memory | None:
        """Change a memory's tier (the ``memory trust`` command logs who and why)."""
        check_trust(trust)
        with self._state.sqlite_transaction() as conn:
            conn.execute("UPDATE memories SET trust = ? WHERE id = ?", (trust, memory_id))
        return self.get(memory_id)

    # -- reads -----------------------------------------------------------------

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
        """FTS5 bm25-ranked recall (newest first without a query), filtered in SQL."""
        where, params = recall_filters(
            include_untrusted=include_untrusted,
            type=type,
            task_kind=task_kind,
            source=source,
            tags=tags,
            tag_clause="m.rowid IN (SELECT memory_rowid FROM memory_tags WHERE tag = ?)",
        )
        query_terms = tokens(query)
        if not query_terms:
            sql = (
                "SELECT m.* FROM memories m"
                + (" WHERE " + " AND ".join(where) if where else "")
                + " ORDER BY m.created DESC, m.rowid DESC LIMIT ?"
            )
            return [memory_from_row(row) for row in self.conn.execute(sql, [*params, k])]
        weighted, common = split_by_weight(self.conn, query_terms)
        return ranked_then_newest(
            weighted,
            common,
            k,
            lambda terms, n: self._ranked(terms, where, params, n),
            lambda terms, n: self._newest_matching(terms, where, params, n),
        )

    def _ranked(
        self, query_terms: list[str], where: list[str], params: list[Any], k: int
    ) -> list[Memory]:
        # bm25 costs about a microsecond per matching row, so a word found in many
        # memories would make recall scale with the store. Rank only the newest
        # RANK_WINDOW matches that pass the filters: exact below that many matches,
        # recency-biased above it — and bounded either way.
        sql = (
            "SELECT m.* FROM (SELECT memories_fts.rowid AS rid, bm25(memories_fts) AS score"
            " FROM memories_fts JOIN memories m INDEXED BY memories_filter"
            " ON m.rowid = memories_fts.rowid WHERE memories_fts MATCH ?"
            + "".join(f" AND {w}" for w in where)
            + " ORDER BY memories_fts.rowid DESC LIMIT ?) ranked"
            " JOIN memories m ON m.rowid = ranked.rid"
            " ORDER BY ranked.score, m.rowid DESC LIMIT ?"
        )
        args = [match_expression(query_terms), *params, RANK_WINDOW, k]
        return [memory_from_row(row) for row in self.conn.execute(sql, args)]

    def _newest_matching(
        self, query_terms: list[str], where: list[str], params: list[Any], k: int
    ) -> list[Memory]:
        # No bm25 here: walking the index newest first stops after k rows that pass.
        sql = (
            "SELECT m.* FROM memories_fts JOIN memories m ON m.rowid = memories_fts.rowid"
            " WHERE memories_fts MATCH ?"
            + "".join(f" AND {w}" for w in where)
            + " ORDER BY memories_fts.rowid DESC LIMIT ?"
        )
        args = [match_expression(query_terms), *params, k]
        return [memory_from_row(row) for row in self.conn.execute(sql, args)]

    def get(self, memory_id: str) -> Memory | None:
        row = self.conn.execute("SELECT * FROM memories WHERE id = ?", (memory_id,)).fetchone()
        return memory_from_row(row) if row is not None else None

    def edges(
        self,
        memory_id: str,
        *,
        type: str | None = None,
        direction: Literal["out", "in", "both"] = "both",
    ) -> list[Edge]:
        sql, params = edges_query("edges", memory_id, type, direction)
        return [edge_from_row(row) for row in self.conn.execute(sql, params)]

    def tombstones(self) -> list[Tombstone]:
        rows = self.conn.execute("SELECT * FROM tombstones ORDER BY forgotten, memory_id")
        return [tombstone_from_row(row) for row in rows]

    def export(self) -> Iterator[Memory]:
        for row in self.conn.execute("SELECT * FROM memories ORDER BY rowid"):
            yield memory_from_row(row)

    def count(self) -> int:
        return int(self.conn.execute("SELECT count(*) FROM memories").fetchone()[0])

    def integrity_check(self) -> str:
        """``PRAGMA integrity_check`` result: "ok" when the file is sound."""
        return str(self.conn.execute("PRAGMA integrity_check").fetchone()[0])

    def probe_write(self) -> None:
        """Commit one small write, proving the file and its WAL are writable (startup gate)."""
        with self._state.sqlite_transaction() as conn:
            conn.execute(
                "INSERT INTO health(id, checked) VALUES (1, ?)"
                " ON CONFLICT(id) DO UPDATE SET checked = excluded.checked",
                (iso(self.clock.now()),),
            )

    def close(self) -> None:
        self._state.close()
