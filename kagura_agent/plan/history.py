"""The last applied plan per task, kept in the state store so ``plan`` can diff against it."""

from __future__ import annotations

import json
from typing import Any

from kagura_agent.plan.model import Plan
from kagura_agent.state import SchemaBehind, StateStore, open_store_read_only

MIGRATIONS = [
    """
    CREATE TABLE applied_plans (
        task TEXT PRIMARY KEY,
        fingerprint TEXT NOT NULL,
        applied_at TEXT NOT NULL,
        plan_json TEXT NOT NULL
    );
    """
]


def record_applied(store: StateStore, plan: Plan, applied_at: str) -> None:
    store.migrate("plans", MIGRATIONS)
    with store.transaction() as conn:
        conn.execute(
            "INSERT INTO applied_plans(task, fingerprint, applied_at, plan_json) VALUES (?, ?, ?, ?)"
            " ON CONFLICT(task) DO UPDATE SET fingerprint = excluded.fingerprint,"
            " applied_at = excluded.applied_at, plan_json = excluded.plan_json",
            (plan["task"]["name"], plan["fingerprint"], applied_at, json.dumps(plan)),
        )


def last_applied(task: str) -> dict[str, Any] | None:
    """The last plan applied for ``task``, or None.

    Read-only (``plan`` never creates or migrates the state store): None when there is
    no store, or its ``plans`` tables are not at this version yet.
    """
    store = open_store_read_only()
    if store is None:
        return None
    with store:
        try:
            store.migrate("plans", MIGRATIONS)  # read-only: only checks the version
        except SchemaBehind:
            return None
        row = store.conn.execute(
            "SELECT plan_json FROM applied_plans WHERE task = ?", (task,)
        ).fetchone()
    return json.loads(row["plan_json"]) if row else None
