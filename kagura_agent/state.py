"""The state store: applied plans, approvals, the lease ledger, sessions, graduation, runs.

Two backends behind one seam. The embedded default is one SQLite database in the state
directory (``state.db``); a team names a PostgreSQL database (``postgresql://…``, psycopg 3
with a connection pool, imported only then) in a ``State`` manifest of the operator's
folder (manifest/statebackend.py), or in ``KAGURA_AGENT_STATE_URL``, which overrides it.
Every command resolves the store the same way (``state_location``), so ``leases``,
``graduation``, ``runner`` and ``queue`` see the ledger ``apply`` wrote.
Components see a ``Connection``: ``execute(sql, params)`` with ``?`` placeholders in the
SQL both dialects read (``state_sql``), and ``transaction()``, which holds the store's one
write lock (SQLite's ``BEGIN IMMEDIATE``; on PostgreSQL a transaction-scoped advisory
lock), so a read-check-write inside it behaves the same on both.

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

Driver errors are translated here: ``StateDbError`` (``MissingTable`` when a table is
not there yet); nothing above the seam sees sqlite3 or psycopg exceptions.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from kagura_agent import state_pg
from kagura_agent.errors import SetupError
from kagura_agent.manifest import statebackend
from kagura_agent.paths import state_dir
from kagura_agent.state_sql import Dialect, Migration, migration_sql
from kagura_agent.state_types import Connection, MissingTable, StateDbError

STATE_FILE = "state.db"
URL_ENV = "KAGURA_AGENT_STATE_URL"

# Where a store is: a SQLite file, or a PostgreSQL URL.
Location = Path | str

__all__ = [
    "STATE_FILE",
    "URL_ENV",
    "Connection",
    "Location",
    "MissingTable",
    "SchemaBehind",
    "StateDbError",
    "StateStore",
    "describe",
    "owner_key",
    "state_location",
    "state_origin",
    "state_path",
]


def state_path() -> Path:
    """Where state.db is: the state directory's (``KAGURA_AGENT_STATE_DIR``)."""
    return state_dir() / STATE_FILE


def state_location() -> Location:
    """The configured store: ``KAGURA_AGENT_STATE_URL`` when set, else the URL the
    operator folder's State manifest names, else state.db in the state directory."""
    url = os.environ.get(URL_ENV, "").strip()
    if url:
        return _checked_url(url)
    chosen = _manifest_choice()
    return chosen.url if chosen is not None else state_path()


def state_origin() -> str:
    """Who chose the configured store, for messages."""
    if os.environ.get(URL_ENV, "").strip():
        return URL_ENV
    chosen = _manifest_choice()
    return chosen.origin() if chosen is not None else "the state directory"


_choices: dict[str, statebackend.StateChoice | None] = {}


def _manifest_choice() -> statebackend.StateChoice | None:
    """The State manifest's choice (read once per folder and process)."""
    folder = str(statebackend.folder().resolve())
    if folder not in _choices:
        chosen = statebackend.choose(Path(folder))
        if chosen is not None:
            _refuse_written_choice(chosen)
        _choices[folder] = chosen
    return _choices[folder]


def _refuse_written_choice(chosen: statebackend.StateChoice) -> None:
    """A State manifest a run's agent could have written chooses no store.

    The store holds the authority (graduation, approvals, the lease ledger), and the run
    history that says which files an agent could have written is in a store: the one
    this choice would open knows nothing of it (the agent's own database, say). So the
    choice is checked against this host's own store in the state directory, where every
    run that did not choose another store is recorded."""
    from kagura_agent.apply.written import refuse_written

    if state_path().is_file():
        refuse_written(f"the state store choice of {chosen.origin()}", chosen.reads, state_path())


def _checked_url(url: str) -> str:
    if urlsplit(url).scheme not in ("postgresql", "postgres"):
        raise SetupError(
            f"{URL_ENV} must be a postgresql:// URL, not {describe(url)!r}",
            hint="unset it to use the embedded SQLite store in the state directory",
        )
    return url


def describe(location: Location) -> str:
    """``location`` for messages: a URL without its password."""
    if isinstance(location, Path):
        return str(location)
    parts = urlsplit(location)
    if parts.password is None:
        return location
    netloc = parts.netloc.rpartition("@")
    user = netloc[0].partition(":")[0]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc[2]}"))


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
    """The one way to open the state store (creating it): at the edge (a CLI handler,
    apply, the cockpit), then passed to whatever reads or writes it.

    ``where`` is a SQLite file (a Path), a ``postgresql://`` URL, or None for the
    configured one (``state_location``). A connection is not shared between threads: a
    thread opens its own store on ``store.location`` (or ``store.connect()``).
    """

    def __init__(self, where: Location | None = None) -> None:
        self.location: Location = _resolve(where)
        self.writable = True
        self.conn: Connection = _opened(self.location, where, read_only=False)

    @classmethod
    def read_only(cls, where: Location | None = None) -> StateStore | None:
        """The existing store at ``where`` opened read-only, or None when there is none.

        SQLite: creates nothing, not even the side files: when a writer has the database
        open (its ``-wal`` and ``-shm`` exist) the connection is ``mode=ro`` and reads
        through the WAL; otherwise every committed transaction is in the main file, which
        is opened ``immutable=1`` (no locks, no ``-shm``). A writer that starts during
        this read is not seen (its commits stay in its WAL until a checkpoint); planning
        is a look-up, and apply re-checks what it relies on. PostgreSQL: a read-only
        session on the database (which always "exists"; its components may not).
        """
        location = _resolve(where)
        if isinstance(location, Path) and not location.is_file():
            return None
        store = cls.__new__(cls)
        store.location = location
        store.writable = False
        store.conn = _opened(location, where, read_only=True)
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
        return _open(self.location, read_only=not self.writable, shared=True)

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
            conn.run_script(_VERSIONS_TABLE)
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
                hint=f"upgrade kagura-agent or point {URL_ENV} / KAGURA_AGENT_STATE_DIR elsewhere",
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


_VERSIONS_TABLE = (
    "CREATE TABLE IF NOT EXISTS schema_versions ("
    " component TEXT PRIMARY KEY, version INTEGER NOT NULL)"
)


def _resolve(where: Location | None) -> Location:
    if where is None:
        return state_location()
    if isinstance(where, str):
        return _checked_url(where)
    return where


def _opened(location: Location, where: Location | None, *, read_only: bool) -> Connection:
    """``_open``; when the store was the configured one, a failure says who chose it."""
    try:
        return _open(location, read_only=read_only)
    except StateDbError as exc:
        if where is not None or isinstance(location, Path):
            raise
        raise StateDbError(
            f"{exc} (chosen by {state_origin()})",
            hint=f"check the database is up and reachable, or unset {URL_ENV} / remove the"
            " State manifest to use the embedded store",
        ) from exc


def _open(location: Location, *, read_only: bool, shared: bool = False) -> Connection:
    if isinstance(location, str):
        return state_pg.PgConnection(location, read_only=read_only)
    if read_only:
        try:
            return SqliteConnection(_connect_read_only(location), location)
        except sqlite3.Error as exc:
            raise StateDbError(
                f"cannot read the state store at {location}: {exc}", hint=_damaged(exc)
            ) from exc
    try:
        location.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(
            location, timeout=30.0, isolation_level=None, check_same_thread=not shared
        )
        conn.row_factory = sqlite3.Row
        _set_wal(conn)
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("PRAGMA foreign_keys=ON")
        conn.execute(_VERSIONS_TABLE)
    except (OSError, sqlite3.Error) as exc:
        raise SetupError(
            f"cannot open the state store at {location}: {exc}",
            hint=_damaged(exc) or "set KAGURA_AGENT_STATE_DIR to a writable directory",
        ) from exc
    return SqliteConnection(conn, location)


def _damaged(exc: Exception) -> str:
    """The hint for a file SQLite cannot read as a database (random bytes, truncated):
    nothing is rewritten for the operator; the file is theirs to keep or restore."""
    if isinstance(exc, sqlite3.DatabaseError) and (
        "not a database" in str(exc) or "malformed" in str(exc)
    ):
        return (
            "the file is damaged or is no kagura-agent store: restore it from a backup, or"
            " move it aside (keeping it) to start an empty one"
        )
    return ""


class SqliteConnection:
    """The embedded backend: SQL passes through unchanged; the write lock is SQLite's."""

    dialect: Dialect = "sqlite"

    def __init__(self, conn: sqlite3.Connection, path: Path) -> None:
        self.raw = conn
        self.path = path

    def execute(self, sql: str, params: Sequence[Any] = (), /) -> sqlite3.Cursor:
        try:
            return self.raw.execute(sql, params)
        except sqlite3.Error as exc:
            raise _translated(exc, self.path) from exc

    def run_script(self, script: str) -> None:
        # Statement by statement: executescript would commit on its own.
        for statement in _split_sql(script):
            self.execute(statement)

    @contextmanager
    def transaction(self) -> Iterator[SqliteConnection]:
        """BEGIN IMMEDIATE … COMMIT, rolled back on any exception."""
        self.execute("BEGIN IMMEDIATE")
        try:
            yield self
        except BaseException:
            self.raw.execute("ROLLBACK")
            raise
        self.execute("COMMIT")

    def close(self) -> None:
        self.raw.close()


def _translated(exc: sqlite3.Error, path: Path) -> StateDbError:
    text = str(exc)
    if isinstance(exc, sqlite3.OperationalError) and text.startswith("no such table"):
        return MissingTable(f"state store {path}: {text}")
    return StateDbError(f"state store {path}: {text}")


def _connect_read_only(path: Path) -> sqlite3.Connection:
    uri = path.resolve().as_uri()
    if all(path.with_name(path.name + side).exists() for side in ("-wal", "-shm")):
        conn = sqlite3.connect(f"{uri}?mode=ro", uri=True, timeout=30.0, isolation_level=None)
        try:
            conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
            return _reader(conn)
        except sqlite3.Error:
            # Side files this user may not open for reading (or left by a crash):
            # fall back to the main file, which holds everything checkpointed.
            conn.close()
    conn = sqlite3.connect(f"{uri}?immutable=1", uri=True, isolation_level=None)
    conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
    return _reader(conn)


def _reader(conn: sqlite3.Connection) -> sqlite3.Connection:
    conn.row_factory = sqlite3.Row
    conn.execute("PRAGMA query_only=ON")
    return conn


def _set_wal(conn: sqlite3.Connection, timeout: float = 30.0) -> None:
    """Switch to WAL, waiting for other processes doing the same on a fresh database.

    SQLite does not call the busy handler for every lock the switch takes: processes
    opening a new database together get "database is locked" at once, so retry here
    (bounded by ``timeout``, like every other wait on the database).
    """
    deadline = time.monotonic() + timeout
    delay = 0.005
    while True:
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 0.1)


def _split_sql(script: str) -> list[str]:
    """Split a migration into statements."""
    statements: list[str] = []
    buffer = ""
    for line in script.splitlines(keepends=True):
        buffer += line
        if sqlite3.complete_statement(buffer):
            if buffer.strip():
                statements.append(buffer.strip())
            buffer = ""
    if buffer.strip():
        statements.append(buffer.strip())
    return statements
