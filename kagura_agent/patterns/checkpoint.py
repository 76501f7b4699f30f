"""Checkpoint and resume a named session (``--session NAME``).

A checkpoint is the step last completed, the work still pending, the brain's session
id, what the session spent so far (``spent``: turns, dollars, wall time and lease time by
the host's count, patterns/spent.py) and what was left of the budget in force when it was
saved (``budget_left``: that budget less ``spent``). The next run of the session is
planned from what is left (plan/resume.py) and its leases are minted for the lease time
left. It never holds a live credential: leases are re-acquired on resume, and a
checkpoint whose data carries a credential-looking key is refused. Checkpoints live in the state store (one row per session, replaced
atomically) so a crash between steps loses at most the step in flight.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from kagura_agent.clock import Clock, SystemClock, iso, parse_iso
from kagura_agent.patterns.spent import Spent
from kagura_agent.state import StateStore

COMPONENT = "checkpoints"
MIGRATIONS = (
    """
    CREATE TABLE checkpoints (
      session TEXT PRIMARY KEY,
      step INTEGER NOT NULL,
      data TEXT NOT NULL,
      saved TEXT NOT NULL
    );
    """,
)

# Keys that name a secret; their presence means someone tried to checkpoint one.
_SECRET_KEY = re.compile(
    r"(token|secret|password|passwd|credential|api[_-]?key|private[_-]?key|authorization)",
    re.IGNORECASE,
)


class CredentialInCheckpoint(ValueError):
    """A checkpoint's data contained a key that names a credential."""


@dataclass(frozen=True)
class Checkpoint:
    """Where a named session stands after ``step`` (1-based steps completed)."""

    session: str
    step: int
    pending: Sequence[Any] = ()
    brain_session_id: str | None = None
    budget_left: Mapping[str, float | int | None] = field(default_factory=dict)
    plan_fingerprint: str | None = None
    saved: datetime | None = None
    # Whose session this is: the project root (real path) and task kind that saved it.
    owner: Mapping[str, str] = field(default_factory=dict)
    # What the session spent since it last finished (summed over its runs).
    spent: Spent = field(default_factory=Spent)

    @property
    def next_step(self) -> int:
        return self.step + 1

    def message(self) -> str:
        """The line shown when a session resumes."""
        brain = f", brain session {self.brain_session_id}" if self.brain_session_id else ""
        spent = self.spent
        figures = [
            f"{spent.turns} turns" if spent.turns else "",
            f"{spent.wall_seconds}s wall" if spent.wall_seconds else "",
            f"${spent.cost_usd:g}" if spent.cost_usd else "",
        ]
        shown = ", ".join(f for f in figures if f)
        return (
            f"resuming session {self.session!r} from step {self.next_step}"
            f" ({len(self.pending)} pending{brain})"
            + (f"; it spent {shown} so far, this run has what is left" if shown else "")
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "session": self.session,
            "step": self.step,
            "pending": list(self.pending),
            "brain_session_id": self.brain_session_id,
            "budget_left": dict(self.budget_left),
            "plan_fingerprint": self.plan_fingerprint,
            "saved": iso(self.saved) if self.saved else None,
            "owner": dict(self.owner),
            "spent": self.spent.to_json(),
        }


def _check_no_credentials(value: Any, path: str = "$") -> None:
    if isinstance(value, Mapping):
        for key, item in value.items():
            if _SECRET_KEY.search(str(key)):
                raise CredentialInCheckpoint(
                    f"checkpoint data at {path}.{key} names a credential; checkpoints never"
                    " hold live credentials (leases are re-acquired on resume)"
                )
            _check_no_credentials(item, f"{path}.{key}")
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            _check_no_credentials(item, f"{path}[{index}]")


def _migrated(state: StateStore) -> StateStore:
    state.migrate(COMPONENT, MIGRATIONS)
    return state


def save_checkpoint(
    state: StateStore, checkpoint: Checkpoint, *, clock: Clock | None = None
) -> Checkpoint:
    """Replace the session's checkpoint in one transaction; returns it with ``saved`` set."""
    data = checkpoint.to_json()
    _check_no_credentials({k: data[k] for k in ("pending", "budget_left")})
    saved = parse_iso(iso((clock or SystemClock()).now()))
    data["saved"] = iso(saved)
    with _migrated(state).transaction() as conn:
        conn.execute(
            "INSERT INTO checkpoints(session, step, data, saved) VALUES (?, ?, ?, ?)"
            " ON CONFLICT(session) DO UPDATE SET step = excluded.step, data = excluded.data,"
            " saved = excluded.saved",
            (checkpoint.session, checkpoint.step, json.dumps(data, sort_keys=True), iso(saved)),
        )
    return load_checkpoint(state, checkpoint.session) or checkpoint


def load_checkpoint(state: StateStore, session: str) -> Checkpoint | None:
    """The session's last checkpoint, or None when it has none."""
    row = (
        _migrated(state)
        .conn.execute("SELECT data FROM checkpoints WHERE session = ?", (session,))
        .fetchone()
    )
    if row is None:
        return None
    data = json.loads(row["data"])
    return Checkpoint(
        session=data["session"],
        step=int(data["step"]),
        pending=tuple(data["pending"]),
        brain_session_id=data["brain_session_id"],
        budget_left=data["budget_left"],
        plan_fingerprint=data["plan_fingerprint"],
        saved=parse_iso(data["saved"]) if data["saved"] else None,
        owner=data.get("owner") or {},
        # A checkpoint saved before sessions counted what they spent: nothing counted.
        spent=Spent.from_json(data.get("spent")),
    )


def resume(state: StateStore, session: str | None) -> Checkpoint | None:
    """What a run of ``session`` continues from (``next_step``, ``message()``), or None."""
    return load_checkpoint(state, session) if session else None


def clear_checkpoint(state: StateStore, session: str) -> bool:
    """Drop the session's checkpoint (its work finished); True when one existed."""
    with _migrated(state).transaction() as conn:
        cursor = conn.execute("DELETE FROM checkpoints WHERE session = ?", (session,))
    return cursor.rowcount > 0


def finish_spending(state: StateStore, session: str, *, clock: Clock | None = None) -> None:
    """The session's work finished: keep its checkpoint (the brain conversation a later
    run continues) with nothing spent, so that run gets its whole budget."""
    found = load_checkpoint(state, session)
    if found is not None and not found.spent.nothing:
        save_checkpoint(
            state, dataclasses.replace(found, spent=Spent(), budget_left={}), clock=clock
        )


def session_owner(project_root: str, kind: str) -> dict[str, str]:
    """The identity a session is bound to: the project root's real path and the task kind."""
    return {"project_root": os.path.realpath(project_root), "kind": kind}


def session_fact(checkpoint: Checkpoint) -> dict[str, Any]:
    """What the planner reads of a checkpoint (``Facts.checkpoint``): where the session
    stands and what it spent, never its pending work or brain conversation."""
    return {
        "session": checkpoint.session,
        "step": checkpoint.step,
        "saved": iso(checkpoint.saved) if checkpoint.saved else None,
        "spent": checkpoint.spent.to_json(),
    }


def foreign_checkpoint(
    state: StateStore, session: str | None, owner: Mapping[str, str]
) -> str | None:
    """Why ``session``'s checkpoint may not be resumed by ``owner``, or None when it may.

    A session carries a brain conversation (what the agent read, what tools printed) and
    the steps already done; another task naming the same session must not inherit them.
    A checkpoint saved without an owner (before sessions were bound) is not resumed either.
    """
    checkpoint = load_checkpoint(state, session) if session else None
    if checkpoint is None or dict(checkpoint.owner) == dict(owner):
        return None
    if not checkpoint.owner:
        return f"session {session!r} has a checkpoint that names no owner"
    return (
        f"session {session!r} belongs to task kind {checkpoint.owner.get('kind')!r} on"
        f" {checkpoint.owner.get('project_root')}, not to kind {owner.get('kind')!r} on"
        f" {owner.get('project_root')}"
    )
