"""What components see of the state store's connection, whichever backend holds it."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

from kagura_agent.errors import SetupError
from kagura_agent.state.sql import Dialect


class StateDbError(SetupError):
    """The state database refused a statement or could not be reached (the driver's
    error, translated at the seam)."""


class MissingTable(StateDbError):
    """A statement named a table that does not exist (yet): nothing was migrated there."""


class Row(Protocol):
    """One result row: by column name or position."""

    def __getitem__(self, key: int | str, /) -> Any: ...

    def keys(self) -> list[str]: ...


class Cursor(Protocol):
    @property
    def rowcount(self) -> int: ...

    def fetchone(self) -> Row | None: ...

    def fetchall(self) -> list[Row]: ...

    def __iter__(self) -> Iterator[Row]: ...


class Connection(Protocol):
    """One connection to the state store. SQL uses ``?`` placeholders and the subset both
    dialects read (kagura_agent.state.sql); ``dialect`` says which one answers."""

    @property
    def dialect(self) -> Dialect: ...

    def execute(self, sql: str, params: Sequence[Any] = (), /) -> Cursor: ...

    def run_script(self, script: str) -> None:
        """Run several statements without parameters (a migration step)."""

    def transaction(self) -> AbstractContextManager[Connection]:
        """A write transaction holding the store's write lock, rolled back on error."""

    def close(self) -> None: ...
