"""The approval log in the state store: every decision, bound to one plan fingerprint.

A decision records who decided, when, through which channel (cli, cli-flag, slack, …),
for which capability category and which plan fingerprint, and the outcome: ``approved``,
``denied`` or ``timeout`` (a timeout is a deny). Looking an approval up needs the exact
fingerprint, so an approval given for one plan is never reused for another.
Graduation decisions (a human unlocking a category) are logged here too, with
``kind="graduation"`` and no fingerprint, and so are raises of a memory's trust tier
(``kind="memory-trust"``, category ``memory:ID``, with the operator's reason).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from kagura_agent.clock import Clock, iso, parse_iso
from kagura_agent.errors import RefusedError, UsageError
from kagura_agent.state import Connection, StateStore
from kagura_agent.state.sql import Dialects, Migration
from kagura_agent.state.types import Row

Outcome = Literal["approved", "denied", "timeout"]
Kind = Literal["capability", "graduation", "memory-trust"]

MIGRATIONS: list[Migration] = [
    """
    CREATE TABLE approval_decisions (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        decided_at TEXT NOT NULL,
        who TEXT NOT NULL,
        via TEXT NOT NULL,
        kind TEXT NOT NULL CHECK (kind IN ('capability', 'graduation')),
        category TEXT NOT NULL,
        fingerprint TEXT,
        outcome TEXT NOT NULL CHECK (outcome IN ('approved', 'denied', 'timeout')),
        reason TEXT NOT NULL DEFAULT ''
    );
    CREATE INDEX approval_decisions_plan ON approval_decisions (fingerprint, category);
    """,
    # memory-trust decisions: SQLite cannot alter a CHECK, so the table is rebuilt there.
    Dialects(
        sqlite="""
    CREATE TABLE approval_decisions_v2 (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        decided_at TEXT NOT NULL,
        who TEXT NOT NULL,
        via TEXT NOT NULL,
        kind TEXT NOT NULL CHECK (kind IN ('capability', 'graduation', 'memory-trust')),
        category TEXT NOT NULL,
        fingerprint TEXT,
        outcome TEXT NOT NULL CHECK (outcome IN ('approved', 'denied', 'timeout')),
        reason TEXT NOT NULL DEFAULT ''
    );
    INSERT INTO approval_decisions_v2 SELECT * FROM approval_decisions;
    DROP TABLE approval_decisions;
    ALTER TABLE approval_decisions_v2 RENAME TO approval_decisions;
    CREATE INDEX approval_decisions_plan ON approval_decisions (fingerprint, category);
    """,
        postgres="""
        ALTER TABLE approval_decisions DROP CONSTRAINT approval_decisions_kind_check;
        ALTER TABLE approval_decisions ADD CONSTRAINT approval_decisions_kind_check
            CHECK (kind IN ('capability', 'graduation', 'memory-trust'));
        """,
    ),
    # The mid-run question (m-…) a decision answers: two runs asking for the same amended
    # plan share its fingerprint and category, and one's answer must not be the other's.
    "ALTER TABLE approval_decisions ADD COLUMN request TEXT",
]


@dataclass(frozen=True)
class Verdict:
    """What someone decided, before the log records it (and gives it an id and a time):
    the ``outcome`` on ``category`` of the plan ``fingerprint`` (None for a graduation or
    a memory's trust), ``who`` decided and through which channel (``via``), and why.
    ``request`` is the mid-run question it answers (m-…), if one."""

    category: str
    fingerprint: str | None
    outcome: Outcome
    who: str
    via: str
    kind: Kind = "capability"
    reason: str = ""
    request: str | None = None


@dataclass(frozen=True)
class Decision:
    """One recorded approval decision."""

    id: int
    decided_at: datetime
    who: str
    via: str
    kind: Kind
    category: str
    fingerprint: str | None
    outcome: Outcome
    reason: str = ""
    request: str | None = None  # the mid-run question answered (m-…), if one

    @property
    def approved(self) -> bool:
        return self.outcome == "approved"

    def to_json(self) -> dict[str, object]:
        return {
            "id": self.id,
            "decided_at": iso(self.decided_at),
            "who": self.who,
            "via": self.via,
            "kind": self.kind,
            "category": self.category,
            "fingerprint": self.fingerprint,
            "outcome": self.outcome,
            "reason": self.reason,
            "request": self.request,
        }


def migrate(store: StateStore) -> None:
    """Create or upgrade the approval log's tables."""
    store.migrate("approvals", MIGRATIONS)


def _decision(row: Row) -> Decision:
    return Decision(
        id=int(row["id"]),
        decided_at=parse_iso(str(row["decided_at"])),
        who=str(row["who"]),
        via=str(row["via"]),
        kind=row["kind"],
        category=str(row["category"]),
        fingerprint=row["fingerprint"],
        outcome=row["outcome"],
        reason=str(row["reason"]),
        request=row["request"],
    )


def record_decision(store: StateStore, verdict: Verdict, *, clock: Clock) -> Decision:
    """Append one decision to the approval log and return it."""
    if verdict.kind == "capability" and not verdict.fingerprint:
        raise UsageError(f"an approval of {verdict.category} must name the plan fingerprint")
    migrate(store)
    with store.transaction() as conn:
        return insert_decision(conn, verdict, at=clock.now())


def insert_decision(conn: Connection, verdict: Verdict, *, at: datetime) -> Decision:
    """Insert a decision inside the caller's transaction (after ``migrate(store)``).

    Graduation uses this so that unlocking a category and logging who unlocked it commit
    together or not at all.
    """
    v = verdict
    row = conn.execute(
        "INSERT INTO approval_decisions"
        " (decided_at, who, via, kind, category, fingerprint, outcome, reason, request)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING *",
        (iso(at), v.who, v.via, v.kind, v.category, v.fingerprint, v.outcome, v.reason, v.request),
    ).fetchone()
    assert row is not None  # RETURNING gives the inserted row
    return _decision(row)


def approval_for(
    store: StateStore, fingerprint: str, category: str, *, since: datetime | None = None
) -> Decision | None:
    """The approval of ``category`` for exactly this plan, or None.

    Only the latest decision for (fingerprint, category) counts, so a later deny revokes
    an earlier approval. Decisions for any other fingerprint are never returned, nor,
    with ``since``, decisions made before that moment (one approval per apply).
    """
    decision = _latest_capability_decision(store, fingerprint, category)
    if decision is None or (since is not None and decision.decided_at < since):
        return None
    return decision if decision.approved else None


def latest_decision(
    store: StateStore, fingerprint: str, category: str, *, since: datetime, request: str
) -> Decision | None:
    """The latest decision of any outcome answering mid-run question ``request``, on
    ``category`` for exactly this plan, made at or after ``since``, or None. A decision
    for another question (another run's, asking for the same plan) never counts."""
    migrate(store)
    row = store.conn.execute(
        "SELECT * FROM approval_decisions WHERE kind = 'capability' AND fingerprint = ?"
        " AND category = ? AND request = ? ORDER BY id DESC LIMIT 1",
        (fingerprint, category, request),
    ).fetchone()
    decision = _decision(row) if row is not None else None
    return decision if decision is not None and decision.decided_at >= since else None


def _latest_capability_decision(
    store: StateStore, fingerprint: str, category: str
) -> Decision | None:
    migrate(store)
    row = store.conn.execute(
        "SELECT * FROM approval_decisions WHERE kind = 'capability' AND fingerprint = ?"
        " AND category = ? ORDER BY id DESC LIMIT 1",
        (fingerprint, category),
    ).fetchone()
    return _decision(row) if row is not None else None


def require_approvals(
    store: StateStore,
    fingerprint: str,
    categories: Sequence[str],
    *,
    since: datetime | None = None,
) -> list[Decision]:
    """Every category's approval for this plan, or RefusedError naming what is missing."""
    found: list[Decision] = []
    missing: list[str] = []
    notes: list[str] = []
    for category in categories:
        decision = approval_for(store, fingerprint, category, since=since)
        if decision is None:
            missing.append(category)
            notes.append(category + _elsewhere(store, fingerprint, category))
        else:
            found.append(decision)
    if missing:
        flags = " ".join(f"--approve {category}" for category in missing)
        bound = " (approvals are bound to one plan)" if notes != missing else ""
        raise RefusedError(
            f"no approval for this plan ({fingerprint[:19]}…): " + "; ".join(notes),
            hint=f"also pass {flags}, or apply without --yes to be asked{bound}",
        )
    return found


def _elsewhere(store: StateStore, fingerprint: str, category: str) -> str:
    row = store.conn.execute(
        "SELECT fingerprint, who FROM approval_decisions WHERE kind = 'capability'"
        " AND category = ? AND outcome = 'approved' AND fingerprint != ?"
        " ORDER BY id DESC LIMIT 1",
        (category, fingerprint),
    ).fetchone()
    if row is None:
        return ""
    return f" (approved by {row['who']} for another plan, {str(row['fingerprint'])[:19]}…)"


def history(
    store: StateStore, *, category: str | None = None, limit: int | None = None
) -> list[Decision]:
    """The approval log, newest first."""
    migrate(store)
    sql = "SELECT * FROM approval_decisions"
    params: list[object] = []
    if category is not None:
        sql += " WHERE category = ?"
        params.append(category)
    sql += " ORDER BY id DESC"
    if limit is not None:
        sql += " LIMIT ?"
        params.append(limit)
    return [_decision(row) for row in store.conn.execute(sql, params)]
