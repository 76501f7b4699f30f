"""The embedded state store: one SQLite database in the state directory.

Each component owns its tables and declares them as an ordered list of migrations;
``StateStore.migrate(component, migrations)`` applies the ones not yet applied, inside
one transaction each, and records the component's version. WAL mode and synchronous=FULL
make every committed transaction survive a crash of the process.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from kagura_agent.errors import SetupError
from kagura_agent.paths import state_dir

STATE_FILE = "state.db"


class StateStore:
    def __init__(self, path: Path | None = None) -> None:
        self.path = path if path is not None else state_dir() / STATE_FILE
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.conn = sqlite3.connect(self.path, timeout=30.0, isolation_level=None)
            self.conn.row_factory = sqlite3.Row
            self.conn.execute("PRAGMA journal_mode=WAL")
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
        """Apply the migrations of ``component`` that have not been applied yet."""
        row = self.conn.execute(
            "SELECT version FROM schema_versions WHERE component = ?", (component,)
        ).fetchone()
        current = int(row["version"]) if row else 0
        if current > len(migrations):
            raise SetupError(
                f"state store {self.path} has {component} schema v{current}, newer than this"
                f" kagura-agent understands (v{len(migrations)})",
                hint="upgrade kagura-agent or point KAGURA_AGENT_STATE_DIR elsewhere",
            )
        for version in range(current + 1, len(migrations) + 1):
            with self.transaction() as conn:
                for statement in _split_sql(migrations[version - 1]):
                    conn.execute(statement)
                conn.execute(
                    "INSERT INTO schema_versions(component, version) VALUES (?, ?)"
                    " ON CONFLICT(component) DO UPDATE SET version = excluded.version",
                    (component, version),
                )

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
