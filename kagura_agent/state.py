"""The embedded state store: one SQLite database in the state directory.

Each component owns its tables and declares them as an ordered list of migrations;
``StateStore.migrate(component, migrations)`` applies the ones not yet applied, inside
one transaction each, and records the component's version. WAL mode and synchronous=FULL
make every committed transaction survive a crash of the process.
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


class StateStore:
    """The one way to open state.db (creating it): at the edge (a CLI handler, apply, the
    cockpit), then passed to whatever reads or writes it. A connection is not shared
    between threads: a thread opens its own on ``store.path``."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path if path is not None else state_path()
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

    def migrate(self, component: str, migrations: Sequence[str]) -> None:
        """Apply the migrations of ``component`` that have not been applied yet.

        Safe when many processes start at once on a fresh state directory: the version is
        read inside the same ``BEGIN IMMEDIATE`` transaction that applies a migration, so
        exactly one process applies each version and the others, once they get the write
        lock, see it applied. The read-only check first keeps the common case (nothing
        to do) free of the write lock.
        """
        if self._version(component) == len(migrations):
            return
        while True:
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
                for statement in _split_sql(migrations[current]):
                    self.conn.execute(statement)
                self.conn.execute(
                    "INSERT INTO schema_versions(component, version) VALUES (?, ?)"
                    " ON CONFLICT(component) DO UPDATE SET version = excluded.version",
                    (component, current + 1),
                )

    def _version(self, component: str) -> int:
        row = self.conn.execute(
            "SELECT version FROM schema_versions WHERE component = ?", (component,)
        ).fetchone()
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
