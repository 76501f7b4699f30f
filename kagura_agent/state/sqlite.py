"""The embedded backend: one SQLite file, in WAL mode, every commit synced.

``open_sqlite`` opens the file at a path it is given (creating it and its folder for a
writer; never, for a reader: see ``StateStore.read_only``); SQL passes through unchanged
and the store's write lock is SQLite's own (``BEGIN IMMEDIATE``). Driver errors are
translated here (``StateDbError``; ``MissingTable`` for a table not there yet).
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kagura_agent.errors import SetupError
from kagura_agent.state.sql import VERSIONS_TABLE, Dialect
from kagura_agent.state.types import MissingTable, StateDbError


def open_sqlite(location: Path, *, read_only: bool, shared: bool = False) -> SqliteConnection:
    """A connection to the SQLite store at ``location`` (``shared``: usable from another
    thread than the one opening it; the caller serialises its use)."""
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
        conn.execute(VERSIONS_TABLE)
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
