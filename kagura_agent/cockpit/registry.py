"""The cockpit's sessions, kept in the state store so a restart loses none of them.

A session is one ``launch``: its plan (saved beside the state store), the chat thread it
answers in, who asked, and where it stands. A session id doubles as its approval
request id ("approve s-1a2b3c"). Each call opens its own connection: the cockpit calls
in from transport, timer and runner threads.

States: awaiting-approval → [queued →] running → succeeded | failed | killed; or denied,
expired (nobody answered in time, or the cockpit stopped first), cancelled (killed while
queued: nothing ran), lost (after a restart, the apply process was gone without having
recorded an outcome). A session is queued while another one that writes the same project
root (or resumes the same brain session) runs: apply holds a lock on both.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, fields
from typing import Any

from kagura_agent.approvals import Verdict, record_decision
from kagura_agent.approvals.log import Outcome
from kagura_agent.clock import Clock, iso
from kagura_agent.state import Location, StateStore
from kagura_agent.state.sql import Migration, with_rowid

MIGRATIONS: list[Migration] = [
    with_rowid(
        """
    CREATE TABLE cockpit_sessions (
        id TEXT PRIMARY KEY,
        transport TEXT NOT NULL,
        thread TEXT NOT NULL,
        requested_by TEXT NOT NULL,
        task_path TEXT NOT NULL,
        task_name TEXT NOT NULL,
        fingerprint TEXT NOT NULL,
        plan_path TEXT NOT NULL,
        needs TEXT NOT NULL,
        state TEXT NOT NULL,
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL,
        asked_at TEXT,
        run_id TEXT,
        pid INTEGER,
        pid_start TEXT,
        exit_code INTEGER
    );
    CREATE INDEX cockpit_sessions_state ON cockpit_sessions(state);
    """,
        "cockpit_sessions",
    ),
    """
    ALTER TABLE cockpit_sessions ADD COLUMN root TEXT;
    ALTER TABLE cockpit_sessions ADD COLUMN brain_session TEXT;
    ALTER TABLE cockpit_sessions ADD COLUMN cost_usd REAL;
    ALTER TABLE cockpit_sessions ADD COLUMN stopped_by TEXT;
    """,
]
OPEN_STATES = ("awaiting-approval", "queued", "running")


@dataclass(frozen=True)
class Session:
    id: str
    transport: str
    thread: str
    requested_by: str
    task_path: str
    task_name: str
    fingerprint: str
    plan_path: str
    needs: str  # the categories needing approval, comma-separated ("" for none)
    state: str
    created_at: str
    updated_at: str
    asked_at: str | None = None
    run_id: str | None = None
    pid: int | None = None
    pid_start: str | None = None
    exit_code: int | None = None
    root: str | None = None  # the project root's real path (what apply locks)
    brain_session: str | None = None  # the task's brain session (apply locks it too)
    cost_usd: float | None = None  # what the run cost, once it ended
    stopped_by: str | None = None  # who killed it ("TRANSPORT:USER")

    @property
    def categories(self) -> list[str]:
        return [c for c in self.needs.split(",") if c]


_COLUMNS = [f.name for f in fields(Session)]
_SELECT = f"SELECT {', '.join(_COLUMNS)} FROM cockpit_sessions"


def new_session_id() -> str:
    return "s-" + secrets.token_hex(3)


class Registry:
    """Sessions in the state store at ``location``."""

    def __init__(self, location: Location, clock: Clock) -> None:
        self.location = location
        self.clock = clock
        with self._store() as store:
            store.migrate("cockpit", MIGRATIONS)

    def _store(self) -> StateStore:
        return StateStore(self.location)  # one connection per call: callers are in many threads

    def add(self, session: Session) -> None:
        values = [getattr(session, c) for c in _COLUMNS]
        with self._store() as store, store.transaction() as conn:
            conn.execute(
                f"INSERT INTO cockpit_sessions ({', '.join(_COLUMNS)})"
                f" VALUES ({', '.join('?' for _ in _COLUMNS)})",
                values,
            )

    def update(self, session_id: str, *, expect: str | None = None, **changes: Any) -> bool:
        """Change a session; with ``expect``, only if it is still in that state.

        Returns whether a row changed: two operators pressing Approve at once start one run.
        """
        unknown = set(changes) - set(_COLUMNS)
        if unknown:
            raise ValueError(f"unknown session fields: {sorted(unknown)}")
        changes["updated_at"] = iso(self.clock.now())
        assignments = ", ".join(f"{name} = ?" for name in changes)
        sql = f"UPDATE cockpit_sessions SET {assignments} WHERE id = ?"
        params = [*changes.values(), session_id]
        if expect is not None:
            sql += " AND state = ?"
            params.append(expect)
        with self._store() as store, store.transaction() as conn:
            return conn.execute(sql, params).rowcount == 1

    def answer_elsewhere(
        self, session_id: str, *, fingerprint: str, approved: bool, who: str, via: str
    ) -> str:
        """Answer a session waiting for approval from outside its chat (the web console):
        bound to the session id and the plan fingerprint the answerer was shown, like a
        chat button. Approved, the session is ``queued`` for its cockpit to start (a
        restarted cockpit starts queued sessions too); denied, it ends. The claim is one
        conditional update, so a chat answer and this one never both count; the decisions
        are logged after it (a crash in between leaves a queued session without an
        approval, which apply refuses). Returns what happened, for the answerer."""
        session = self.get(session_id)
        if session is None:
            return f"no session {session_id}"
        if session.state != "awaiting-approval":
            return f"session {session_id} is {session.state}; nothing to answer"
        if session.fingerprint != fingerprint:
            return (
                f"session {session_id} asks for plan {session.fingerprint[:19]}…, not the"
                f" {fingerprint[:19]}… you were shown; nothing recorded"
            )
        state = "queued" if approved else "denied"
        if not self.update(session_id, expect="awaiting-approval", state=state):
            return f"session {session_id} was answered already"
        outcome: Outcome = "approved" if approved else "denied"
        reason = f"answered in the {via} console"
        self.record(session, outcome, who, via, reason, request=session_id)
        return f"session {session_id} {outcome} by {who}"

    def record(
        self,
        session: Session,
        outcome: Outcome,
        who: str,
        via: str,
        reason: str,
        request: str | None = None,
    ) -> None:
        """One decision per category the session needs, on its plan's fingerprint."""
        with self._store() as store:
            for category in session.categories:
                record_decision(
                    store,
                    Verdict(
                        category=category,
                        fingerprint=session.fingerprint,
                        outcome=outcome,
                        who=who,
                        via=via,
                        reason=reason,
                        request=request,
                    ),
                    clock=self.clock,
                )

    def get(self, session_id: str) -> Session | None:
        with self._store() as store:
            row = store.conn.execute(_SELECT + " WHERE id = ?", (session_id,)).fetchone()
        return Session(**dict(row)) if row else None

    def listing(self, closed: int = 10) -> list[Session]:
        """Every open session (oldest first), then the ``closed`` latest ended ones."""
        ended = [s for s in self.recent(closed + 200) if s.state not in OPEN_STATES]
        return [*self.open_sessions(), *ended[:closed]]

    def recent(self, limit: int = 20) -> list[Session]:
        with self._store() as store:
            rows = store.conn.execute(
                _SELECT + " ORDER BY created_at DESC, rowid DESC LIMIT ?",
                (limit,),
            ).fetchall()
        return [Session(**dict(row)) for row in rows]

    def open_sessions(self) -> list[Session]:
        with self._store() as store:
            rows = store.conn.execute(
                _SELECT + " WHERE state IN (?, ?, ?) ORDER BY created_at, rowid",
                OPEN_STATES,
            ).fetchall()
        return [Session(**dict(row)) for row in rows]

    def expire_requests(self) -> list[Session]:
        """At start: the requests a previous cockpit left pending lapse (nobody can press
        a button of a stopped cockpit). Returns them."""
        expired = []
        for session in self.open_sessions():
            if session.state == "awaiting-approval" and self.update(
                session.id, expect="awaiting-approval", state="expired"
            ):
                expired.append(session)
        return expired
