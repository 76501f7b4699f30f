"""The team queue's PostgreSQL: where it is, its schema, and psycopg errors translated.

The queue lives in the team's one PostgreSQL: ``KAGURA_AGENT_QUEUE_URL``, else the state
store's (``KAGURA_AGENT_STATE_URL``, else the State manifest's). Its schema is the
``team`` component of the state store's versioned migrations (``StateStore.migrate``: one locked transaction, the version
recorded in ``schema_versions``, so runners starting at the same moment do not race and a
later kagura-agent can add steps):

    v1  procrastinate's own tables and functions
    v2  kagura_team_runs     one row per queued run: plan, placement, status, runner, times
        kagura_team_events   the run's live events (apply's JSON lines), in order
        kagura_team_runners  each runner's identity and advertised capacity

A database set up before the schema was versioned (procrastinate's tables there, no
``team`` version) is adopted as v1; v2's statements are idempotent for it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from kagura_agent.errors import SetupError
from kagura_agent.state import MissingTable, StateStore, state_location
from kagura_agent.state.sql import Dialects, Migration

if TYPE_CHECKING:
    import psycopg

COMPONENT = "team"

TABLES = """
CREATE TABLE IF NOT EXISTS kagura_team_runs (
    run_id TEXT PRIMARY KEY,
    job_id BIGINT,
    task TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    project_root TEXT NOT NULL,
    queue TEXT NOT NULL,
    status TEXT NOT NULL,
    runner TEXT,
    exit_code INTEGER,
    message TEXT,
    enqueued_by TEXT NOT NULL,
    enqueued_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    approved_until TIMESTAMPTZ NOT NULL,
    started_at TIMESTAMPTZ,
    ended_at TIMESTAMPTZ
);
CREATE INDEX IF NOT EXISTS kagura_team_runs_status ON kagura_team_runs(status);
CREATE TABLE IF NOT EXISTS kagura_team_events (
    seq BIGSERIAL PRIMARY KEY,
    run_id TEXT NOT NULL REFERENCES kagura_team_runs(run_id) ON DELETE CASCADE,
    at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
    item JSONB NOT NULL
);
CREATE INDEX IF NOT EXISTS kagura_team_events_run ON kagura_team_events(run_id, seq);
CREATE TABLE IF NOT EXISTS kagura_team_runners (
    name TEXT PRIMARY KEY,
    host TEXT NOT NULL,
    pid INTEGER NOT NULL,
    state_dir TEXT NOT NULL,
    concurrency INTEGER NOT NULL,
    queues TEXT[] NOT NULL,
    started_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
"""

# The channel a runner notifies after each event it stores (payload: the run id).
EVENTS_CHANNEL = "kagura_team_events"


def queue_url(explicit: str | None = None) -> str:
    """The queue's connection URL (option, then the environment), or a SetupError."""
    url = explicit or os.environ.get("KAGURA_AGENT_QUEUE_URL")
    if not url:
        store = state_location()  # KAGURA_AGENT_STATE_URL, else the State manifest's
        url = store if isinstance(store, str) else None
    if not url or not url.startswith(("postgresql://", "postgres://")):
        raise SetupError(
            "team mode needs a PostgreSQL URL for its queue",
            hint="name the team's PostgreSQL in a State manifest (or KAGURA_AGENT_STATE_URL),"
            " set KAGURA_AGENT_QUEUE_URL, or pass --queue-url",
        )
    return url


@contextlib.contextmanager
def pg_errors(what: str) -> Iterator[None]:
    """psycopg and procrastinate errors become a SetupError naming ``what`` failed."""
    try:
        import psycopg
        from procrastinate import exceptions as procrastinate_exceptions
    except ImportError as exc:
        raise SetupError(
            f"team mode needs procrastinate and psycopg ({exc.name} is missing)",
            hint="pip install 'kagura-agent[team]'",
        ) from exc
    try:
        yield
    except (psycopg.Error, procrastinate_exceptions.ProcrastinateException) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise SetupError(f"{what}: {first}") from exc


@contextlib.contextmanager
def connect(url: str) -> Iterator[psycopg.Connection[dict[str, Any]]]:
    """A short psycopg connection (autocommit; rows as dicts); errors translated."""
    with pg_errors("the team queue's PostgreSQL"):
        import psycopg
        from psycopg.rows import dict_row

        with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
            yield conn


def migrations() -> list[Migration]:
    """The ``team`` component's steps (PostgreSQL only: team mode has no SQLite queue)."""
    from procrastinate import schema

    return [
        Dialects(sqlite=_NOT_SQLITE, postgres=schema.SchemaManager.get_schema()),
        Dialects(sqlite=_NOT_SQLITE, postgres=TABLES),
    ]


_NOT_SQLITE = "SELECT 'the team queue lives on PostgreSQL only'"


def ensure_schema(url: str) -> None:
    """The ``team`` component at this kagura-agent's version (idempotent; safe to race)."""
    with pg_errors("the team queue's PostgreSQL"):
        steps = migrations()
    with StateStore(url) as store:
        if store.dialect != "postgres":  # pragma: no cover - queue_url checks the scheme
            raise SetupError("the team queue lives on PostgreSQL only")
        _adopt_unversioned(store)
        store.migrate(COMPONENT, steps)


def _adopt_unversioned(store: StateStore) -> None:
    """A database whose queue was made before the schema was versioned: procrastinate's
    tables are there but no ``team`` version; record v1 (its v2 is idempotent)."""
    try:
        if store.conn.execute(
            "SELECT 1 FROM schema_versions WHERE component = ?", (COMPONENT,)
        ).fetchone():
            return
    except MissingTable:
        pass
    found = store.conn.execute("SELECT to_regclass('procrastinate_jobs') AS found").fetchone()
    if found is None or found[0] is None:
        return
    with store.transaction() as conn:
        conn.run_script(
            "CREATE TABLE IF NOT EXISTS schema_versions ("
            " component TEXT PRIMARY KEY, version INTEGER NOT NULL)"
        )
        conn.execute(
            "INSERT INTO schema_versions(component, version) VALUES (?, 1)"
            " ON CONFLICT(component) DO NOTHING",
            (COMPONENT,),
        )
