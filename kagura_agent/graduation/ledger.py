"""Graduation state in the state store: evidence in, proposals out, grants by a human.

Evidence comes only from what the agent cannot forge — the exit codes of the task's
``verify`` commands run by the host-side executor — never from the brain's report. A run
is a success only when it had at least one verify command and every one exited 0;
anything else is a failure, and one failure demotes every category the run used back to
``locked`` and resets its counter. Counting is "since the last reset": a reset remembers
the highest evidence row id at that moment, so later rows count and earlier ones never do
(robust even when two events share a clock second).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta

from kagura_agent import approvals
from kagura_agent.approvals import Decision
from kagura_agent.clock import Clock, iso, parse_iso
from kagura_agent.errors import RefusedError, UsageError
from kagura_agent.graduation.knobs import Knobs
from kagura_agent.graduation.model import CategoryStatus, GraduationSnapshot, unmet_knobs
from kagura_agent.state import Connection, StateStore

MIGRATIONS = [
    """
    CREATE TABLE graduation_meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
    INSERT INTO graduation_meta (key, value) VALUES ('version', 0);
    CREATE TABLE graduation_categories (
        category TEXT PRIMARY KEY,
        state TEXT NOT NULL CHECK (state IN ('locked', 'graduated')),
        reset_seq INTEGER NOT NULL DEFAULT 0,
        reset_at TEXT,
        last_reset_reason TEXT,
        graduated_at TEXT,
        graduated_by TEXT
    );
    CREATE TABLE graduation_evidence (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        category TEXT NOT NULL,
        run_id TEXT NOT NULL,
        task TEXT NOT NULL,
        fingerprint TEXT NOT NULL,
        recorded_at TEXT NOT NULL,
        outcome TEXT NOT NULL CHECK (outcome IN ('success', 'failure')),
        verify TEXT NOT NULL,
        UNIQUE (run_id, category)
    );
    CREATE TABLE graduation_events (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        at TEXT NOT NULL,
        category TEXT NOT NULL,
        event TEXT NOT NULL CHECK (event IN ('graduated', 'demoted', 'reset')),
        who TEXT NOT NULL,
        run_id TEXT,
        reason TEXT NOT NULL DEFAULT ''
    );
    """,
    # v2: every category with evidence has a state row, and evidence is indexed by
    # (category, id) so a snapshot reads only the rows since each category's reset.
    """
    INSERT INTO graduation_categories (category, state)
        SELECT DISTINCT category, 'locked' FROM graduation_evidence WHERE true
        ON CONFLICT DO NOTHING;
    CREATE INDEX graduation_evidence_since_reset
        ON graduation_evidence (category, id, outcome, task, recorded_at);
    """,
]


@dataclass(frozen=True)
class RecordedOutcome:
    """What ``record_outcome`` concluded from the verify results."""

    success: bool
    reason: str
    recorded: tuple[str, ...]  # categories that got a new evidence row
    demoted: tuple[str, ...]  # categories reset to locked by this failure


def migrate(store: StateStore) -> None:
    """Create or upgrade graduation's tables (and the approval log it writes to)."""
    store.migrate("graduation", MIGRATIONS)
    approvals.migrate(store)


def judge(verify_results: Sequence[tuple[str, int]]) -> tuple[bool, str]:
    """Success only with at least one verify command and every exit code 0."""
    if not verify_results:
        return False, "no verify commands ran; an unverified run earns no trust"
    failed = [(cmd, code) for cmd, code in verify_results if code != 0]
    if failed:
        cmd, code = failed[0]
        return False, f"verify {cmd!r} exited {code}"
    return True, f"{len(verify_results)} verify command(s) exited 0"


def record_outcome(
    store: StateStore,
    categories: Sequence[str],
    run_id: str,
    task: str,
    fingerprint: str,
    verify_results: Sequence[tuple[str, int]],
    clock: Clock,
) -> RecordedOutcome:
    """Record one run's verified outcome against every category it used.

    ``verify_results`` are (command, exit code) pairs from the host-side verify step.
    A run recorded twice for the same category counts once.
    """
    migrate(store)
    success, reason = judge(verify_results)
    now = iso(clock.now())
    detail = json.dumps([[cmd, code] for cmd, code in verify_results])
    recorded: list[str] = []
    demoted: list[str] = []
    with store.transaction() as conn:
        for category in dict.fromkeys(categories):
            added = conn.execute(
                "INSERT INTO graduation_evidence (category, run_id, task,"
                " fingerprint, recorded_at, outcome, verify) VALUES (?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT DO NOTHING RETURNING id",
                (category, run_id, task, fingerprint, now, _outcome(success), detail),
            ).fetchone()
            if added is None:
                continue
            recorded.append(category)
            conn.execute(
                "INSERT INTO graduation_categories (category, state)"
                " VALUES (?, 'locked') ON CONFLICT DO NOTHING",
                (category,),
            )
            if not success:
                _lock(conn, category, int(added["id"]), now, f"run {run_id}: {reason}")
                _event(conn, now, category, "demoted", "verify", run_id, reason)
                demoted.append(category)
        if demoted:
            _bump(conn)
    return RecordedOutcome(success, reason, tuple(recorded), tuple(demoted))


def reset(
    store: StateStore,
    category: str,
    *,
    who: str,
    clock: Clock,
    reason: str = "",
    defined: bool = False,
) -> None:
    """Lock ``category`` and start its count afresh (the operator's explicit reset).

    A category with no record here, and not ``defined`` by the manifests, is a typo:
    refused, and nothing is written (no phantom row).
    """
    migrate(store)
    now = iso(clock.now())
    why = reason or f"reset by {who}"
    with store.transaction() as conn:
        if not defined and not _recorded(conn, category):
            raise UsageError(
                f"no capability category {category!r}: the manifests define no such"
                " image, credential scope or egress policy, and it has no graduation record",
                hint="`kagura-agent graduation status` lists the categories with evidence",
            )
        row = conn.execute("SELECT MAX(id) AS top FROM graduation_evidence").fetchone()
        _lock(conn, category, int(row["top"] or 0) if row else 0, now, why)
        _event(conn, now, category, "reset", who, None, why)
        _bump(conn)


def approve_graduation(
    store: StateStore, category: str, *, who: str, clock: Clock, knobs: Knobs, via: str = "cli"
) -> Decision:
    """A human unlocks ``category``; refused unless a proposal stands (every knob holds)."""
    migrate(store)
    with store.transaction() as conn:
        status = _snapshot(conn, knobs).status(category)
        if status.state == "graduated":
            raise UsageError(f"{category} is already graduated (since {status.graduated_at})")
        if status.state != "proposed":
            raise RefusedError(
                f"no graduation proposal for {category}: unmet {', '.join(status.unmet)}",
                hint="graduation needs verified evidence first; see `graduation status`",
            )
        now = clock.now()
        conn.execute(
            "INSERT INTO graduation_categories (category, state, graduated_at, graduated_by)"
            " VALUES (?, 'graduated', ?, ?) ON CONFLICT(category) DO UPDATE SET"
            " state = 'graduated', graduated_at = excluded.graduated_at,"
            " graduated_by = excluded.graduated_by",
            (category, iso(now), who),
        )
        _event(conn, iso(now), category, "graduated", who, None, f"approved via {via}")
        _bump(conn)
        return approvals.insert_decision(
            conn,
            approvals.Verdict(
                category=category,
                fingerprint=None,
                outcome="approved",
                who=who,
                via=via,
                kind="graduation",
                reason=f"{status.successes} verified successes over {status.distinct_tasks} tasks",
            ),
            at=now,
        )


def snapshot(store: StateStore, knobs: Knobs) -> GraduationSnapshot:
    """Every known category's status (a Fact for the planner)."""
    migrate(store)
    return _snapshot(store.conn, knobs)


def proposals(store: StateStore, knobs: Knobs) -> list[CategoryStatus]:
    """Locked categories where every knob holds: waiting for a human to approve."""
    found = snapshot(store, knobs).categories.values()
    return [status for status in found if status.state == "proposed"]


def events(store: StateStore, category: str | None = None) -> list[dict[str, object]]:
    """State transitions (graduated / demoted / reset), newest first."""
    migrate(store)
    sql = "SELECT * FROM graduation_events"
    params: tuple[str, ...] = ()
    if category is not None:
        sql, params = sql + " WHERE category = ?", (category,)
    rows = store.conn.execute(sql + " ORDER BY id DESC", params).fetchall()
    columns = ("at", "category", "event", "who", "run_id", "reason")
    return [{key: row[key] for key in columns} for row in rows]


def _snapshot(conn: Connection, knobs: Knobs) -> GraduationSnapshot:
    row = conn.execute("SELECT value FROM graduation_meta WHERE key = 'version'").fetchone()
    version = int(row["value"]) if row else 0
    states = {row["category"]: row for row in conn.execute("SELECT * FROM graduation_categories")}
    tallies = {
        row["category"]: row
        for row in conn.execute(
            "SELECT e.category,"
            " SUM(CASE WHEN e.outcome = 'success' THEN 1 ELSE 0 END) AS successes,"
            " COUNT(DISTINCT CASE WHEN e.outcome = 'success' THEN e.task END) AS tasks,"
            " MIN(CASE WHEN e.outcome = 'success' THEN e.recorded_at END) AS first,"
            " MAX(CASE WHEN e.outcome = 'success' THEN e.recorded_at END) AS last,"
            " SUM(CASE WHEN e.outcome = 'failure' THEN 1 ELSE 0 END) AS failures"
            " FROM graduation_categories g JOIN graduation_evidence e"
            " ON e.category = g.category AND e.id > g.reset_seq"
            " GROUP BY e.category"
        )
    }
    categories: dict[str, CategoryStatus] = {}
    for name in sorted(set(states) | set(tallies)):
        state, tally = states.get(name), tallies.get(name)
        successes = int(tally["successes"] or 0) if tally else 0
        tasks = int(tally["tasks"] or 0) if tally else 0
        failures = int(tally["failures"] or 0) if tally else 0
        span = _span(tally["first"], tally["last"]) if tally else _span(None, None)
        unmet = unmet_knobs(
            knobs, successes=successes, distinct_tasks=tasks, span=span, failures=failures
        )
        graduated = state is not None and state["state"] == "graduated"
        categories[name] = CategoryStatus(
            category=name,
            state="graduated" if graduated else "locked" if unmet else "proposed",
            successes=successes,
            distinct_tasks=tasks,
            span=span,
            failures=failures,
            reset_at=state["reset_at"] if state else None,
            graduated_at=state["graduated_at"] if graduated and state else None,
            graduated_by=state["graduated_by"] if graduated and state else None,
            last_reset_reason=state["last_reset_reason"] if state else None,
            unmet=() if graduated else unmet,
        )
    return GraduationSnapshot(version=version, knobs=knobs, categories=categories)


def _span(first: str | None, last: str | None) -> timedelta:
    if first is None or last is None:
        return timedelta(0)
    return max(timedelta(0), parse_iso(last) - parse_iso(first))


def _outcome(success: bool) -> str:
    return "success" if success else "failure"


def _lock(conn: Connection, category: str, seq: int, now: str, reason: str) -> None:
    conn.execute(
        "INSERT INTO graduation_categories (category, state, reset_seq, reset_at,"
        " last_reset_reason) VALUES (?, 'locked', ?, ?, ?) ON CONFLICT(category) DO UPDATE SET"
        " state = 'locked', reset_seq = excluded.reset_seq, reset_at = excluded.reset_at,"
        " last_reset_reason = excluded.last_reset_reason, graduated_at = NULL,"
        " graduated_by = NULL",
        (category, seq, now, reason),
    )


def _event(
    conn: Connection,
    at: str,
    category: str,
    event: str,
    who: str,
    run_id: str | None,
    reason: str,
) -> None:
    conn.execute(
        "INSERT INTO graduation_events (at, category, event, who, run_id, reason)"
        " VALUES (?, ?, ?, ?, ?, ?)",
        (at, category, event, who, run_id, reason),
    )


def _recorded(conn: Connection, category: str) -> bool:
    return any(
        conn.execute(f"SELECT 1 FROM {table} WHERE category = ? LIMIT 1", (category,)).fetchone()
        for table in ("graduation_categories", "graduation_evidence", "graduation_events")
    )


def _bump(conn: Connection) -> None:
    conn.execute("UPDATE graduation_meta SET value = value + 1 WHERE key = 'version'")


__all__ = [
    "RecordedOutcome",
    "approve_graduation",
    "events",
    "judge",
    "migrate",
    "proposals",
    "record_outcome",
    "reset",
    "snapshot",
]
