"""Incidents: runs a tripwire stopped, with what the agent tried (state store table)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kagura_agent.state import StateStore

MIGRATIONS = (
    """
    CREATE TABLE incidents (
        id TEXT PRIMARY KEY,
        at TEXT NOT NULL,
        run_id TEXT NOT NULL,
        task TEXT NOT NULL,
        fingerprint TEXT NOT NULL,
        reason TEXT NOT NULL,
        actions TEXT NOT NULL,
        egress TEXT NOT NULL,
        events TEXT NOT NULL
    );
    CREATE INDEX incidents_at ON incidents(at);
    """,
)


@dataclass(frozen=True)
class Incident:
    """A run a tripwire stopped: when (``at``, ISO), which run of which task and plan, the
    tripwire's ``reason``, what the host did about it (``actions``), and what the agent
    tried: its egress decisions and the run's recent events."""

    at: str
    run_id: str
    task: str
    fingerprint: str
    reason: str
    actions: Sequence[str]
    egress: Sequence[Mapping[str, Any]]
    events: Sequence[Mapping[str, Any]]


def record_incident(store: StateStore, incident: Incident) -> str:
    """Store one incident; returns its id."""
    i = incident
    store.migrate("incidents", MIGRATIONS)
    incident_id = f"inc-{uuid.uuid4().hex[:12]}"
    with store.transaction() as conn:
        conn.execute(
            "INSERT INTO incidents(id, at, run_id, task, fingerprint, reason, actions, egress,"
            " events) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                incident_id,
                i.at,
                i.run_id,
                i.task,
                i.fingerprint,
                i.reason,
                json.dumps(list(i.actions)),
                json.dumps([dict(e) for e in i.egress], default=str),
                json.dumps([dict(e) for e in i.events], default=str),
            ),
        )
    return incident_id


def list_incidents(store: StateStore, limit: int = 100) -> list[dict[str, Any]]:
    """The most recent incidents first, each with its egress log and events."""
    store.migrate("incidents", MIGRATIONS)
    rows = store.conn.execute(
        "SELECT * FROM incidents ORDER BY at DESC, id LIMIT ?", (int(limit),)
    ).fetchall()
    return [
        {
            "id": row["id"],
            "at": row["at"],
            "run_id": row["run_id"],
            "task": row["task"],
            "fingerprint": row["fingerprint"],
            "reason": row["reason"],
            "actions": json.loads(row["actions"]),
            "egress": json.loads(row["egress"]),
            "events": json.loads(row["events"]),
        }
        for row in rows
    ]
