"""The team queue's tables are a versioned component (``team``) of the state store's
migrations: runners, ``apply --queue`` and the state store's own components starting
together on a fresh PostgreSQL all succeed and see one schema; a queue made before the
schema was versioned is adopted, not re-created."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from procrastinate import schema

from kagura_agent.state import URL_ENV, StateStore
from kagura_agent.team import db

ROOT = Path(__file__).resolve().parent.parent
PROCESSES = 12

# Each process waits for the same instant, then does what a starting runner does (the team
# component) and what a starting apply does (the state store's components), in either order.
CHILD = """
import sys, time
start, team_first = float(sys.argv[1]), sys.argv[2] == "1"
from kagura_agent.state import StateStore
from kagura_agent.apply.records import runs
from kagura_agent.clock import SystemClock
from kagura_agent.membrane.leases.ledger import Ledger
from kagura_agent.team.db import ensure_schema
while time.time() < start:
    time.sleep(0.001)
url = sys.argv[3]
if team_first:
    ensure_schema(url)
store = StateStore(url)
Ledger(store, SystemClock())
store.migrate("runs", runs.MIGRATIONS)
if not team_first:
    ensure_schema(url)
rows = store.conn.execute("SELECT component, version FROM schema_versions ORDER BY 1")
print(sorted((r[0], r[1]) for r in rows if r[0] in ("team", "leases", "runs")))
"""


def test_runners_and_applies_starting_together_migrate_the_team_schema_once(
    tmp_path: Path, postgres_server: Any
) -> None:
    with postgres_server.fresh_database() as url:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "KAGURA_AGENT_STATE_DIR": str(tmp_path)}
        env.pop(URL_ENV, None)
        start = time.time() + 3.0
        children = [
            subprocess.Popen(
                [sys.executable, "-c", CHILD, str(start), str(index % 2), url],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for index in range(PROCESSES)
        ]
        results = [(c.wait(timeout=120), *c.communicate()) for c in children]
        failed = [err for code, _, err in results if code != 0]
        assert failed == [], failed[0]
        assert len({out for _, out, _ in results}) == 1, results
        with StateStore(url) as store:
            versions = dict(store.conn.execute("SELECT component, version FROM schema_versions"))
            tables = {
                row[0]
                for row in store.conn.execute(
                    "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'"
                )
            }
        assert versions["team"] == len(db.migrations()) == 2
        assert {"procrastinate_jobs", "kagura_team_runs", "kagura_team_events"} <= tables
        assert "kagura_team_runners" in tables


def test_a_queue_made_before_versioning_is_adopted(postgres_server: Any) -> None:
    """procrastinate's schema is not idempotent: a database whose queue an earlier
    kagura-agent made (no ``team`` version) is recorded as v1 and brought to v2 in place,
    keeping its runs."""
    import psycopg

    with postgres_server.fresh_database() as url:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(schema.SchemaManager.get_schema().encode())
            conn.execute(db.TABLES.encode())
            conn.execute(
                "INSERT INTO kagura_team_runs(run_id, task, fingerprint, project_root, queue,"
                " status, enqueued_by, approved_until)"
                " VALUES ('run-old', 't', 'f', '/p', 'q', 'success', 'me', now())"
            )
        db.ensure_schema(url)
        db.ensure_schema(url)  # then nothing to do
        with StateStore(url) as store:
            row = store.conn.execute(
                "SELECT version FROM schema_versions WHERE component = 'team'"
            ).fetchone()
            assert row is not None and row[0] == 2
            kept = store.conn.execute("SELECT run_id FROM kagura_team_runs").fetchall()
        assert [r[0] for r in kept] == ["run-old"]


def test_the_team_component_is_postgres_only() -> None:
    with pytest.raises(Exception, match="PostgreSQL"):
        db.queue_url("sqlite:///x.db")
