"""The embedded state store: one SQLite database in the state directory.

Each component owns its tables and declares them as an ordered list of migrations;
``StateStore.migrate(component, migrations)`` applies the ones not yet applied, inside
one transaction each, and records the component's version. WAL mode and synchronous=FULL
make every committed transaction survive a crash of the process.

Read paths (``plan``, ``validate``, ``show`` and the facts they gather) open the store
with ``StateStore.read_only``: they never create the database or its directory, never
migrate it and never leave SQLite's ``-wal``/``-shm`` files behind. A component whose
schema is older than this kagura-agent's (or absent) is not read: ``migrate`` on a
read-only store raises ``SchemaBehind`` instead of upgrading it, and each reader falls
back to "no data" — the fail-closed answer (nothing graduated, no last applied plan,
context memories untrusted) — until the next write path (apply) migrates it.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from kagura_agent.errors import SetupError
from kagura_agent.paths import state_dir

STATE_FILE = "state.db"


def state_path() -> Path:
    """Where state.db is: the state directory's (``KAGURA_AGENT_STATE_DIR``)."""
    return state_dir() / STATE_FILE


class SchemaBehind(SetupError):
    """A read-only store holds an older schema of ``component`` (``current`` is 0 when
    the component was never created) than this kagura-agent reads (``wanted``)."""

    def __init__(self, path: Path, component: str, current: int, wanted: int) -> None:
        super().__init__(
            f"state store {path} has {component} schema v{current}, older than this"
            f" kagura-agent's v{wanted}; it is not read until a write (apply) migrates it"
        )
        self.component = component
        self.current = current
        self.wanted = wanted


class StateStore:
    """The one way to open state.db (creating it): at the edge (a CLI handler, apply, the
    cockpit), then passed to whatever reads or writes it. A connection is not shared
    between threads: a thread opens its own on ``store.path``."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path if path is not None else state_path()
        self.writable = True
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.conn = sqlite3.connect(self.path, timeout=30.0, isolation_level=None)
            self.conn.row_factory = sqlite3.Row
            _set_wal(self.conn)
            self.conn.execute("PRAGMA synchronous=FULL")
            self.conn.execute("PRAGMA foreign_keys=ON")
            self.conn.execute(
                "CREATE TABLE IF NOT EXISTS schema_versions ("
                " component TEXT PRIMARY KEY, version INTEGER NOT NULL)"
            )
        except (OSError, sqlite3.Error) as exc:
            raise SetupError(
                f"cannot open the state store at {self.path}: {exc}",
                hint="set KAGURA_AGENT_STATE_DIR to a writable directory",
            ) from exc

    @classmethod
    def read_only(cls, path: Path | None = None) -> StateStore | None:
        """The existing store at ``path`` opened read-only, or None when there is none.

        Creates nothing, not even SQLite's side files: when a writer has the database
        open (its ``-wal`` and ``-shm`` exist) the connection is ``mode=ro`` and reads
        through the WAL; otherwise every committed transaction is in the main file, which
        is opened ``immutable=1`` (no locks, no ``-shm``). A writer that starts during
        this read is not seen (its commits stay in its WAL until a checkpoint); planning
        is a look-up, and apply re-checks what it relies on.
        """
        path = path if path is not None else state_path()
        if not path.is_file():
            return None
        store = cls.__new__(cls)
        store.path = path
        store.writable = False
        try:
            store.conn = _connect_read_only(path)
        except sqlite3.Error as exc:
            raise SetupError(f"cannot read the state store at {path}: {exc}") from exc
        return store

    def migrate(self, component: str, migrations: Sequence[str]) -> None:
        """Apply the migrations of ``component`` that have not been applied yet.

        On a read-only store nothing is applied: it raises ``SchemaBehind`` when the
        component is not at this version (and SetupError when it is newer).

        Safe when many processes start at once on a fresh state directory: the version is
        read inside the same ``BEGIN IMMEDIATE`` transaction that applies a migration, so
        exactly one process applies each version and the others, once they get the write
        lock, see it applied. The read-only check first keeps the common case (nothing
        to do) free of the write lock.
        """
        if self._version(component) == len(migrations):
            return
        if not self.writable:
            current = self._version(component)
            if current > len(migrations):
                raise SetupError(
                    f"state store {self.path} has {component} schema v{current}, newer"
                    f" than this kagura-agent understands (v{len(migrations)})",
                    hint="upgrade kagura-agent or point KAGURA_AGENT_STATE_DIR elsewhere",
                )
            raise SchemaBehind(self.path, component, current, len(migrations))
        # Every pending step in one transaction: a reader (``plan``, read-only) sees the
        # component before or after, never half-way (an intermediate version would read
        # as an old schema, and a plan made then would be stale by apply).
        with self.transaction():
            current = self._version(component)
            if current > len(migrations):
                raise SetupError(
                    f"state store {self.path} has {component} schema v{current}, newer"
                    f" than this kagura-agent understands (v{len(migrations)})",
                    hint="upgrade kagura-agent or point KAGURA_AGENT_STATE_DIR elsewhere",
                )
            if current == len(migrations):
                return
            for migration in migrations[current:]:
                for statement in _split_sql(migration):
                    self.conn.execute(statement)
            self.conn.execute(
                "INSERT INTO schema_versions(component, version) VALUES (?, ?)"
                " ON CONFLICT(component) DO UPDATE SET version = excluded.version",
                (component, len(migrations)),
            )

    def _version(self, component: str) -> int:
        try:
            row = self.conn.execute(
                "SELECT version FROM schema_versions WHERE component = ?", (component,)
            ).fetchone()
        except sqlite3.OperationalError:
            if self.writable:
                raise
            return 0  # a read-only view of a database made by something else: nothing known
        return int(row["version"]) if row else 0

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """BEGIN IMMEDIATE … COMMIT, rolled back on any exception."""
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            yield self.conn
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        self.conn.execute("COMMIT")

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> StateStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


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
    """Split a migration into statements (executescript would commit on its own)."""
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
