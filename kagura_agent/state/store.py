"""Opening the state store at a location it is given: applied plans, approvals, the lease
ledger, sessions, graduation, runs.

This is the lowest layer of the state package: it takes a ``Location`` (a SQLite file, or
a ``postgresql://`` URL) and never reads the environment, a manifest or run history to
find one. Which store a command opens is chosen above it (state/choose.py: the
``KAGURA_AGENT_STATE_URL`` variable, the operator's ``State`` manifest, else state.db in
the state directory), the way Terraform's backend configuration is apart from its state
manager.

Two backends behind one seam. The embedded default is one SQLite database
(state/sqlite.py); a team names a PostgreSQL database (state/pg.py, psycopg 3 with a
connection pool, imported only then). Components see a ``Connection``: ``execute(sql,
params)`` with ``?`` placeholders in the SQL both dialects read (state/sql.py), and
``transaction()``, which holds the store's one write lock (SQLite's ``BEGIN IMMEDIATE``; on
PostgreSQL a transaction-scoped advisory lock), so a read-check-write inside it behaves
the same on both.

Each component owns its tables and declares them as an ordered list of migrations;
``StateStore.migrate(component, migrations)`` applies the ones not yet applied, all in one
transaction, and records the component's version. On SQLite WAL mode and
synchronous=FULL make every committed transaction survive a crash of the process.

Read paths (``plan``, ``validate``, ``show`` and the facts they gather) open the store
with ``StateStore.read_only``: they never create the database or its directory, never
migrate it and never leave SQLite's ``-wal``/``-shm`` files behind (on PostgreSQL the
session is read-only). A component whose schema is older than this kagura-agent's (or
absent) is not read: ``migrate`` on a read-only store raises ``SchemaBehind`` instead of
upgrading it, and each reader falls back to "no data" — the fail-closed answer (nothing
graduated, no last applied plan, context memories untrusted) — until the next write path
(apply) migrates it.

Driver errors are translated at the seam: ``StateDbError`` (``MissingTable`` when a table
is not there yet); nothing above it sees sqlite3 or psycopg exceptions.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

from kagura_agent.errors import SetupError
from kagura_agent.hygiene import url_without_password
from kagura_agent.state.pg import PgConnection
from kagura_agent.state.sql import VERSIONS_TABLE, Dialect, Migration, migration_sql
from kagura_agent.state.sqlite import SqliteConnection, open_sqlite
from kagura_agent.state.types import Connection, MissingTable

# Where a store is: a SQLite file, or a PostgreSQL URL.
Location = Path | str


def checked_url(url: str, *, said_by: str = "a state store URL") -> str:
    """``url`` when it names a PostgreSQL database, else a SetupError saying who gave it."""
    if urlsplit(url).scheme not in ("postgresql", "postgres"):
        raise SetupError(
            f"{said_by} must be a postgresql:// URL, not {describe(url)!r}",
            hint="unset it to use the embedded SQLite store in the state directory",
        )
    return url


def describe(location: Location) -> str:
    """``location`` for messages: a URL without its password."""
    if isinstance(location, Path):
        return str(location)
    return url_without_password(location)


def owner_key(location: Location) -> str:
    """A short, stable name of the store at ``location``, for labelling what its runs
    leave on a shared Docker daemon, so that a crash sweep takes only its own: a digest of
    the SQLite file's real path, or of the PostgreSQL server and database (not the user
    or password: the same database reached as another user is the same store)."""
    if isinstance(location, Path):
        text = "sqlite:" + os.path.realpath(location)
    else:
        parts = urlsplit(location)
        host = (parts.hostname or "").lower()
        text = f"postgresql://{host}:{parts.port or 5432}{parts.path or '/'}?{parts.query}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class SchemaBehind(SetupError):
    """A read-only store holds an older schema of ``component`` (``current`` is 0 when
    the component was never created) than this kagura-agent reads (``wanted``)."""

    def __init__(self, where: str, component: str, current: int, wanted: int) -> None:
        super().__init__(
            f"state store {where} has {component} schema v{current}, older than this"
            f" kagura-agent's v{wanted}; it is not read until a write (apply) migrates it"
        )
        self.component = component
        self.current = current
        self.wanted = wanted


class StateStore:
    """The one way to open the state store (creating it), at the ``location`` given: at the
    edge (a CLI handler, apply, the cockpit), then passed to whatever reads or writes it.

    ``location`` is a SQLite file (a Path) or a ``postgresql://`` URL; state/choose.py
    says which one a command means (``open_store()``). A connection is not shared between
    threads: a thread opens its own store on ``store.location`` (or ``store.connect()``).
    """

    def __init__(self, location: Location) -> None:
        self.location: Location = _checked(location)
        self.writable = True
        self.conn: Connection = open_connection(self.location, read_only=False)

    @classmethod
    def read_only(cls, location: Location) -> StateStore | None:
        """The existing store at ``location`` opened read-only, or None when there is none.

        SQLite: creates nothing, not even the side files: when a writer has the database
        open (its ``-wal`` and ``-shm`` exist) the connection is ``mode=ro`` and reads
        through the WAL; otherwise every committed transaction is in the main file, which
        is opened ``immutable=1`` (no locks, no ``-shm``). A writer that starts during
        this read is not seen (its commits stay in its WAL until a checkpoint); planning
        is a look-up, and apply re-checks what it relies on. PostgreSQL: a read-only
        session on the database (which always "exists"; its components may not).
        """
        location = _checked(location)
        if isinstance(location, Path) and not location.is_file():
            return None
        store = cls.__new__(cls)
        store.location = location
        store.writable = False
        store.conn = open_connection(location, read_only=True)
        return store

    @property
    def dialect(self) -> Dialect:
        return self.conn.dialect

    @property
    def path(self) -> Path:
        """The SQLite file (only for the embedded backend)."""
        if not isinstance(self.location, Path):
            raise SetupError(f"state store {describe(self.location)} is not a file")
        return self.location

    def connect(self) -> Connection:
        """A new connection to this store, usable from another thread (callers serialise
        their own use of it); closed by the caller."""
        return open_connection(self.location, read_only=not self.writable, shared=True)

    def sqlite(self) -> sqlite3.Connection:
        """The driver's connection, for a component that only exists on SQLite (the
        embedded memory store: FTS5)."""
        if not isinstance(self.conn, SqliteConnection):
            raise SetupError(f"state store {describe(self.location)} is not SQLite")
        return self.conn.raw

    @contextmanager
    def sqlite_transaction(self) -> Iterator[sqlite3.Connection]:
        """``transaction`` for a SQLite-only component: the driver's connection."""
        with self.conn.transaction():
            yield self.sqlite()

    def migrate(self, component: str, migrations: Sequence[Migration]) -> None:
        """Apply the migrations of ``component`` that have not been applied yet.

        On a read-only store nothing is applied: it raises ``SchemaBehind`` when the
        component is not at this version (and SetupError when it is newer).

        Safe when many processes start at once on a fresh store: the version is read
        inside the same write-locked transaction that applies the pending steps, so
        exactly one process applies each version and the others, once they get the lock,
        see it applied. The unlocked check first keeps the common case (nothing to do)
        free of the write lock. Every pending step is in that one transaction: a reader
        (``plan``, read-only) sees the component before or after, never half-way (an
        intermediate version would read as an old schema, and a plan made then would be
        stale by apply).
        """
        wanted = len(migrations)
        current = self._version(component)
        if current == wanted:
            return
        if not self.writable:
            self._not_newer(component, current, wanted)
            raise SchemaBehind(describe(self.location), component, current, wanted)
        with self.transaction() as conn:
            conn.run_script(VERSIONS_TABLE)
            current = self._version(component)
            self._not_newer(component, current, wanted)
            if current == wanted:
                return
            for step in migrations[current:]:
                conn.run_script(migration_sql(step, conn.dialect))
            conn.execute(
                "INSERT INTO schema_versions(component, version) VALUES (?, ?)"
                " ON CONFLICT(component) DO UPDATE SET version = excluded.version",
                (component, wanted),
            )

    def _not_newer(self, component: str, current: int, wanted: int) -> None:
        if current > wanted:
            raise SetupError(
                f"state store {describe(self.location)} has {component} schema v{current},"
                f" newer than this kagura-agent understands (v{wanted})",
                hint="upgrade kagura-agent or point KAGURA_AGENT_STATE_URL / KAGURA_AGENT_STATE_DIR"
                " elsewhere",
            )

    def _version(self, component: str) -> int:
        try:
            row = self.conn.execute(
                "SELECT version FROM schema_versions WHERE component = ?", (component,)
            ).fetchone()
        except MissingTable:
            return 0  # nothing migrated yet (or a database made by something else)
        return int(row["version"]) if row else 0

    @contextmanager
    def transaction(self) -> Iterator[Connection]:
        """One write transaction holding the store's write lock; rolled back on any
        exception."""
        with self.conn.transaction() as conn:
            yield conn

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> StateStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _checked(location: Location) -> Location:
    return checked_url(location) if isinstance(location, str) else location


def open_connection(location: Location, *, read_only: bool, shared: bool = False) -> Connection:
    """A connection to the store at ``location`` (``StateStore`` holds one)."""
    if isinstance(location, str):
        return PgConnection(location, read_only=read_only)
    return open_sqlite(location, read_only=read_only, shared=shared)
