"""The team memory store: the state store's PostgreSQL database, full text by tsvector/GIN.

Same rules as the embedded store (memory/sqlite.py): trust defaults from the source
(``default_trust``), recall leaves untrusted memories out unless asked, a forgotten memory
leaves a content-free tombstone, edges link stored memories only. The index terms are the
embedded store's own (``terms.tokens``: Unicode letters and digits, lower-cased, accents
folded), stored as a ``tsvector`` built from that list (``array_to_tsvector``), so both
stores find the same memories for the same words. Ranking is ``ts_rank`` over the newest
``RANK_WINDOW`` matches that pass the filters; terms in more than half the memories are
left out of ranking and only fill up (terms.py keeps the counts), as on SQLite.

Tables are prefixed ``memory_`` (the database is shared with the rest of the state).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Literal

from kagura_agent.clock import Clock, SystemClock, iso
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
from kagura_agent.memory.terms import document_terms, tokens
from kagura_agent.state import Connection, Location, StateStore
from kagura_agent.state.sql import Dialects

COMPONENT = "memory-pg"
RANK_WINDOW = 1000

_V1 = """
CREATE TABLE memory_items (
  seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  id TEXT NOT NULL UNIQUE,
  type TEXT NOT NULL,
  summary TEXT NOT NULL,
  details TEXT NOT NULL DEFAULT '{}',
  tags TEXT NOT NULL DEFAULT '[]',
  source_kind TEXT NOT NULL CHECK (source_kind IN ('run', 'task', 'transport', 'import')),
  source_id TEXT NOT NULL,
  trust TEXT NOT NULL CHECK (trust IN ('trusted', 'untrusted')),
  task_kind TEXT,
  created TEXT NOT NULL,
  search TSVECTOR NOT NULL
);
CREATE INDEX memory_items_search ON memory_items USING GIN (search);
CREATE INDEX memory_items_type ON memory_items(type, trust, created);
CREATE INDEX memory_items_trust ON memory_items(trust, created);
CREATE INDEX memory_items_task_kind ON memory_items(task_kind, type, trust, created);
CREATE INDEX memory_items_source ON memory_items(source_kind, source_id, trust, created);
CREATE TABLE memory_tags (
  memory_seq BIGINT NOT NULL REFERENCES memory_items(seq) ON DELETE CASCADE,
  tag TEXT NOT NULL,
  PRIMARY KEY (tag, memory_seq)
);
CREATE INDEX memory_tags_seq ON memory_tags(memory_seq);
CREATE TABLE memory_edges (
  source_id TEXT NOT NULL,
  target_id TEXT NOT NULL,
  type TEXT NOT NULL,
  created TEXT NOT NULL,
  details TEXT NOT NULL DEFAULT '{}',
  PRIMARY KEY (source_id, target_id, type)
);
CREATE INDEX memory_edges_target ON memory_edges(target_id, type);
CREATE TABLE memory_tombstones (
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
CREATE TABLE memory_term_docs (term TEXT PRIMARY KEY, docs BIGINT NOT NULL);
CREATE TABLE memory_total (id INTEGER PRIMARY KEY CHECK (id = 1), memories BIGINT NOT NULL);
INSERT INTO memory_total(id, memories) VALUES (1, 0);
"""

# PostgreSQL only: the embedded store keeps its own file (memory/sqlite.py).
MIGRATIONS = (Dialects(sqlite="SELECT 1;", postgres=_V1),)

_COLUMNS = (
    "m.seq, m.id, m.type, m.summary, m.details, m.tags, m.source_kind, m.source_id,"
    " m.trust, m.task_kind, m.created"
)


class PgMemoryStore:
    """``MemoryStore`` on PostgreSQL. Shares the state store's pool; thread-safe as the
    state store is (each call borrows a pooled connection)."""

    backend = "postgres"

    def __init__(
        self, location: Location, *, clock: Clock | None = None, state: StateStore | None = None
    ) -> None:
        """Open (migrating) the memory tables in the database at ``location``; or, with
        ``state``, use that open store — ``StateStore.read_only(url)`` for a reader that
        never migrates (it raises ``SchemaBehind`` when the memory schema is not current)."""
        self.clock: Clock = clock or SystemClock()
        self._state = state if state is not None else StateStore(location)
        if self._state.dialect != "postgres":
            self._state.close()
            raise ValueError("the postgres memory store needs a postgresql:// state store")
        self._state.migrate(COMPONENT, MIGRATIONS)
        self.conn = self._state.conn

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
        """Store one memory in one transaction (the row, its terms and its tags)."""
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
        with self._state.transaction() as conn:
            _count(conn, Counter(_insert(conn, memory)), 1)
        return memory

    def remember_many(self, memories: Sequence[Memory]) -> None:
        """Store already-built memories (an import) in one transaction, counting their
        terms once for the batch."""
        found: Counter[str] = Counter()
        with self._state.transaction() as conn:
            for memory in memories:
                found.update(_insert(conn, memory))
            _count(conn, found, len(memories))

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
        with self._state.transaction() as conn:
            conn.execute(
                "INSERT INTO memory_edges(source_id, target_id, type, created, details)"
                " VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                (
                    source_id,
                    target_id,
                    type,
                    iso(stored_now(self.clock)),
                    json.dumps(dict(details or {})),
                ),
            )
            row = conn.execute(
                "SELECT * FROM memory_edges WHERE source_id = ? AND target_id = ? AND type = ?",
                (source_id, target_id, type),
            ).fetchone()
        assert row is not None  # inserted or already there, inside this transaction
        return edge_from_row(row)

    def forget(
        self, memory_id: str, *, reason: str = "", cascade_of: str | None = None
    ) -> Tombstone | None:
        """Delete the memory, its tags and edges; keep a content-free tombstone."""
        with self._state.transaction() as conn:
            row = conn.execute(
                f"SELECT {_COLUMNS} FROM memory_items m WHERE m.id = ?", (memory_id,)
            ).fetchone()
            if row is None:
                return None
            memory = memory_from_row(row)
            tombstone = tombstone_of(memory, stored_now(self.clock), reason, cascade_of)
            conn.execute("DELETE FROM memory_items WHERE seq = ?", (row["seq"],))
            gone = _terms(row["summary"], row["details"], row["tags"])
            _count(conn, Counter({term: -1 for term in gone}), -1)
            conn.execute(
                "DELETE FROM memory_edges WHERE source_id = ? OR target_id = ?",
                (memory_id, memory_id),
            )
            conn.execute(
                "INSERT INTO memory_tombstones(memory_id, type, source_kind, source_id, trust,"
                " created, forgotten, reason, cascade_of) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (memory_id) DO UPDATE SET forgotten = excluded.forgotten,"
                " reason = excluded.reason, cascade_of = excluded.cascade_of",
                tombstone_row(memory, tombstone, reason, cascade_of),
            )
        return tombstone

    def set_trust(self, memory_id: str, trust: Trust) -> Memory | None:
        """Change a memory's tier (the ``memory trust`` command logs who and why)."""
        check_trust(trust)
        with self._state.transaction() as conn:
            conn.execute("UPDATE memory_items SET trust = ? WHERE id = ?", (trust, memory_id))
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
        """ts_rank-ranked recall (newest first without a query), filtered in SQL."""
        where, params = recall_filters(
            include_untrusted=include_untrusted,
            type=type,
            task_kind=task_kind,
            source=source,
            tags=tags,
            tag_clause="m.seq IN (SELECT memory_seq FROM memory_tags WHERE tag = ?)",
        )
        query_terms = tokens(query)
        if not query_terms:
            sql = (
                f"SELECT {_COLUMNS} FROM memory_items m"
                + (" WHERE " + " AND ".join(where) if where else "")
                + " ORDER BY m.created DESC, m.seq DESC LIMIT ?"
            )
            return [memory_from_row(row) for row in self.conn.execute(sql, [*params, k])]
        weighted, common = self._split(query_terms)
        return ranked_then_newest(
            weighted,
            common,
            k,
            lambda terms, n: self._ranked(terms, where, params, n),
            lambda terms, n: self._newest_matching(terms, where, params, n),
        )

    def _split(self, query_terms: list[str]) -> tuple[list[str], list[str]]:
        # One round trip: the total rides along with each known term (none known: every
        # term is weighted whatever the total is).
        marks = ",".join("?" * len(query_terms))
        rows = self.conn.execute(
            "SELECT term, docs, (SELECT memories FROM memory_total WHERE id = 1)"
            f" FROM memory_term_docs WHERE term IN ({marks})",
            query_terms,
        ).fetchall()
        docs = {str(r[0]): int(r[1]) for r in rows}
        total = int(rows[0][2]) if rows else 0
        weighted = [t for t in query_terms if 2 * docs.get(t, 0) <= total]
        return weighted, [t for t in query_terms if 2 * docs.get(t, 0) > total]

    def _ranked(
        self, query_terms: list[str], where: list[str], params: list[Any], k: int
    ) -> list[Memory]:
        sql = (
            f"SELECT {_COLUMNS} FROM (SELECT m.seq AS rid, ts_rank(m.search, q.query) AS score"
            " FROM memory_items m, (SELECT CAST(? AS tsquery) AS query) q"
            " WHERE m.search @@ q.query"
            + "".join(f" AND {w}" for w in where)
            + " ORDER BY m.seq DESC LIMIT ?) ranked"
            " JOIN memory_items m ON m.seq = ranked.rid"
            " ORDER BY ranked.score DESC, m.seq DESC LIMIT ?"
        )
        args = [_tsquery(query_terms), *params, RANK_WINDOW, k]
        return [memory_from_row(row) for row in self.conn.execute(sql, args)]

    def _newest_matching(
        self, query_terms: list[str], where: list[str], params: list[Any], k: int
    ) -> list[Memory]:
        sql = (
            f"SELECT {_COLUMNS} FROM memory_items m WHERE m.search @@ CAST(? AS tsquery)"
            + "".join(f" AND {w}" for w in where)
            + " ORDER BY m.seq DESC LIMIT ?"
        )
        return [
            memory_from_row(r) for r in self.conn.execute(sql, [_tsquery(query_terms), *params, k])
        ]

    def get(self, memory_id: str) -> Memory | None:
        row = self.conn.execute(
            f"SELECT {_COLUMNS} FROM memory_items m WHERE m.id = ?", (memory_id,)
        ).fetchone()
        return memory_from_row(row) if row is not None else None

    def edges(
        self,
        memory_id: str,
        *,
        type: str | None = None,
        direction: Literal["out", "in", "both"] = "both",
    ) -> list[Edge]:
        sql, params = edges_query("memory_edges", memory_id, type, direction)
        return [edge_from_row(row) for row in self.conn.execute(sql, params)]

    def tombstones(self) -> list[Tombstone]:
        rows = self.conn.execute("SELECT * FROM memory_tombstones ORDER BY forgotten, memory_id")
        return [tombstone_from_row(row) for row in rows]

    def export(self) -> Iterator[Memory]:
        for row in self.conn.execute(f"SELECT {_COLUMNS} FROM memory_items m ORDER BY m.seq"):
            yield memory_from_row(row)

    def count(self) -> int:
        row = self.conn.execute("SELECT count(*) FROM memory_items").fetchone()
        return int(row[0]) if row else 0

    def close(self) -> None:
        self._state.close()


def _terms(summary: str, details: str, tags: str) -> list[str]:
    return sorted(document_terms((summary, details, tags)))


def _tsquery(query_terms: Sequence[str]) -> str:
    # Tokens are Unicode letters and digits only: quoted, each is one literal lexeme.
    return " | ".join(f"'{t}'" for t in query_terms)


def _insert(conn: Connection, memory: Memory) -> list[str]:
    """Insert one memory and its tags; returns its index terms (for ``_count``)."""
    text = document_text(memory)
    found = _terms(*text)
    row = conn.execute(
        "INSERT INTO memory_items(id, type, summary, details, tags, source_kind, source_id,"
        " trust, task_kind, created, search)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, array_to_tsvector(CAST(? AS text[])))"
        " RETURNING seq",
        (
            memory.id,
            memory.type,
            *text,
            memory.source.kind,
            memory.source.id,
            memory.trust,
            memory.task_kind,
            iso(memory.created),
            found,
        ),
    ).fetchone()
    assert row is not None  # RETURNING gives the inserted row
    if memory.tags:
        conn.execute(
            "INSERT INTO memory_tags(memory_seq, tag) SELECT ?, unnest(CAST(? AS text[]))",
            (row["seq"], list(memory.tags)),
        )
    return found


def _count(conn: Connection, changes: Counter[str], memories: int) -> None:
    """Keep the document frequencies (terms.py) in step, inside the caller's transaction:
    ``changes`` per term, ``memories`` added (or removed, negative)."""
    if changes:
        names = sorted(changes)  # one order for every writer: no lock-order deadlocks
        conn.execute(
            "INSERT INTO memory_term_docs(term, docs)"
            " SELECT * FROM unnest(CAST(? AS text[]), CAST(? AS bigint[]))"
            " ON CONFLICT (term) DO UPDATE SET docs = memory_term_docs.docs + excluded.docs",
            (names, [changes[name] for name in names]),
        )
        if memories < 0:
            conn.execute(
                "DELETE FROM memory_term_docs WHERE term = ANY(CAST(? AS text[])) AND docs <= 0",
                (names,),
            )
    conn.execute(
        "UPDATE memory_total SET memories = GREATEST(memories + ?, 0) WHERE id = 1", (memories,)
    )
