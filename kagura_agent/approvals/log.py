"""The approval log: every human decision on a capability, bound to one plan fingerprint.

A decision records who decided, when, through which channel (cli, cli-flag, slack, …),
for which capability category and which plan fingerprint, and the outcome: ``approved``,
``denied`` or ``timeout`` (a timeout is a deny). Looking an approval up needs the exact
fingerprint, so an approval given for one plan is never reused for another.
Graduation decisions (a human unlocking a category) are logged here too, with
``kind="graduation"`` and no fingerprint.
"""

from __future__ import annotations

import getpass
import os
import select
import sqlite3
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal, TextIO

from kagura_agent.clock import Clock, iso, parse_iso
from kagura_agent.errors import RefusedError, UsageError
from kagura_agent.state import StateStore

Outcome = Literal["approved", "denied", "timeout"]
Kind = Literal["capability", "graduation"]
# prompt_fn(question, timeout_seconds) -> True (yes), False (no) or None (timed out).
PromptFn = Callable[[str, float], "bool | None"]

MIGRATIONS = [
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
]


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
        }


def migrate(store: StateStore) -> None:
    """Create or upgrade the approval log's tables."""
    store.migrate("approvals", MIGRATIONS)


def _decision(row: sqlite3.Row) -> Decision:
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
    )


def record_decision(
    store: StateStore,
    *,
    category: str,
    fingerprint: str | None,
    outcome: Outcome,
    who: str,
    via: str,
    clock: Clock,
    kind: Kind = "capability",
    reason: str = "",
) -> Decision:
    """Append one decision to the approval log and return it."""
    if kind == "capability" and not fingerprint:
        raise UsageError(f"an approval of {category} must name the plan fingerprint")
    migrate(store)
    with store.transaction() as conn:
        return insert_decision(
            conn,
            category=category,
            fingerprint=fingerprint,
            outcome=outcome,
            who=who,
            via=via,
            at=clock.now(),
            kind=kind,
            reason=reason,
        )


def insert_decision(
    conn: sqlite3.Connection,
    *,
    category: str,
    fingerprint: str | None,
    outcome: Outcome,
    who: str,
    via: str,
    at: datetime,
    kind: Kind = "capability",
    reason: str = "",
) -> Decision:
    """Insert a decision inside the caller's transaction (after ``migrate(store)``).

    Graduation uses this so that unlocking a category and logging who unlocked it commit
    together or not at all.
    """
    cursor = conn.execute(
        "INSERT INTO approval_decisions"
        " (decided_at, who, via, kind, category, fingerprint, outcome, reason)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (iso(at), who, via, kind, category, fingerprint, outcome, reason),
    )
    row = conn.execute(
        "SELECT * FROM approval_decisions WHERE id = ?", (cursor.lastrowid,)
    ).fetchone()
    return _decision(row)


def approval_for(store: StateStore, fingerprint: str, category: str) -> Decision | None:
    """The approval of ``category`` for exactly this plan, or None.

    Only the latest decision for (fingerprint, category) counts, so a later deny revokes
    an earlier approval. Decisions for any other fingerprint are never returned.
    """
    migrate(store)
    row = store.conn.execute(
        "SELECT * FROM approval_decisions WHERE kind = 'capability' AND fingerprint = ?"
        " AND category = ? ORDER BY id DESC LIMIT 1",
        (fingerprint, category),
    ).fetchone()
    if row is None:
        return None
    decision = _decision(row)
    return decision if decision.approved else None


def require_approvals(
    store: StateStore, fingerprint: str, categories: Sequence[str]
) -> list[Decision]:
    """Every category's approval for this plan, or RefusedError naming what is missing."""
    found: list[Decision] = []
    missing: list[str] = []
    for category in categories:
        decision = approval_for(store, fingerprint, category)
        if decision is None:
            missing.append(category + _elsewhere(store, fingerprint, category))
        else:
            found.append(decision)
    if missing:
        raise RefusedError(
            f"no approval for this plan ({fingerprint[:19]}…): " + "; ".join(missing),
            hint="approvals are bound to one plan; approve again (--approve CATEGORY)",
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


def preapprove(
    store: StateStore,
    approve: Sequence[str],
    needed: Sequence[str],
    fingerprint: str,
    *,
    who: str,
    clock: Clock,
    via: str = "cli-flag",
) -> list[Decision]:
    """Record ``--approve CATEGORY`` flags as the operator's decisions for this plan.

    A flag naming a category the plan does not ask about is a usage error: a mistyped
    category must never pass silently while the real one is left unapproved.
    """
    stray = [category for category in approve if category not in needed]
    if stray:
        raise UsageError(
            "--approve names categories this plan does not ask for: " + ", ".join(stray),
            hint="needs approval: " + (", ".join(needed) or "nothing"),
        )
    return [
        record_decision(
            store,
            category=category,
            fingerprint=fingerprint,
            outcome="approved",
            who=who,
            via=via,
            clock=clock,
            reason="approved on the command line",
        )
        for category in dict.fromkeys(approve)
    ]


def ask(
    store: StateStore,
    categories: Sequence[str],
    fingerprint: str,
    *,
    prompt_fn: PromptFn,
    timeout: float,
    who: str,
    clock: Clock,
    via: str = "cli",
    reasons: dict[str, str] | None = None,
) -> list[Decision]:
    """Ask a human about each category in turn and record every answer.

    Stops at the first deny or timeout (the run is refused anyway); check the result with
    ``all(d.approved for d in decisions) and len(decisions) == len(categories)``.
    """
    decisions: list[Decision] = []
    for category in categories:
        why = (reasons or {}).get(category, "")
        question = f"Grant {category} to plan {fingerprint[:19]}…?" + (f" ({why})" if why else "")
        answer = prompt_fn(question, timeout)
        outcome: Outcome = "timeout" if answer is None else "approved" if answer else "denied"
        decisions.append(
            record_decision(
                store,
                category=category,
                fingerprint=fingerprint,
                outcome=outcome,
                who=who,
                via=via,
                clock=clock,
                reason=f"no answer within {timeout:g}s" if answer is None else "",
            )
        )
        if outcome != "approved":
            break
    return decisions


def tty_prompt(
    question: str, timeout: float, *, stdin: TextIO | None = None, out: TextIO | None = None
) -> bool | None:
    """Ask on a terminal: "y"/"yes" approves, anything else or EOF denies, silence times out."""
    source = stdin if stdin is not None else sys.stdin
    sink = out if out is not None else sys.stderr
    sink.write(f"{question} [y/N] (deny in {timeout:g}s) ")
    sink.flush()
    ready, _, _ = select.select([source], [], [], timeout)
    if not ready:
        sink.write("\ntimed out: denied\n")
        return None
    line = source.readline()
    return line.strip().lower() in ("y", "yes")


def operator_name() -> str:
    """Who is deciding at this terminal (recorded in the approval log)."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return os.environ.get("USER", "unknown")
