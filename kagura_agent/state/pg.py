"""The state store on PostgreSQL (team mode): psycopg 3 and one connection pool per URL.

Imported by the state package always, but psycopg and psycopg-pool are imported only when
a store is opened on a ``postgresql://`` URL, so ``validate`` and ``plan`` on the embedded
default pay nothing for them.

What differs from SQLite, and how this keeps the same behaviour:

- the write lock: SQLite lets one write transaction in at a time (``BEGIN IMMEDIATE``);
  here every write transaction takes one transaction-scoped advisory lock first
  (``pg_advisory_xact_lock``), so a component's read-check-write (a lease budget, the
  graduation sequence, "only if still awaiting approval") is serialised the same way
  across every process and host sharing the database. Reads take no lock;
- placeholders and migration column types: state/sql.py;
- read-only stores: the session is ``default_transaction_read_only``; writes fail.

Connections come from a process-wide pool per URL (``KAGURA_AGENT_STATE_POOL`` connections
at most, default 8) in autocommit mode; ``close`` gives the connection back.
"""

from __future__ import annotations

import atexit
import os
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from kagura_agent.errors import SetupError
from kagura_agent.hygiene import url_without_password
from kagura_agent.state.sql import Dialect, placeholders
from kagura_agent.state.types import Cursor, MissingTable, StateDbError

if TYPE_CHECKING:
    import psycopg
    from psycopg_pool import ConnectionPool

# pg_advisory_xact_lock key of the store's one write lock ("kagura" in ASCII).
WRITE_LOCK = 0x6B6167757261
POOL_ENV = "KAGURA_AGENT_STATE_POOL"

_pools: dict[tuple[str, bool], ConnectionPool[Any]] = {}
_pools_lock = threading.Lock()


_safe = url_without_password


class PgRow:
    """A result row read by column name or position (like sqlite3.Row)."""

    __slots__ = ("_index", "_values")

    def __init__(self, values: Sequence[Any], index: dict[str, int]) -> None:
        self._values = tuple(values)
        self._index = index

    def __getitem__(self, key: int | str, /) -> Any:
        return self._values[key if isinstance(key, int) else self._index[key]]

    def keys(self) -> list[str]:
        return list(self._index)

    def __iter__(self) -> Iterator[Any]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"PgRow({dict(zip(self._index, self._values, strict=True))!r})"


def _row_factory(cursor: Any) -> Any:
    names = [column.name for column in cursor.description or ()]
    index = {name: position for position, name in enumerate(names)}

    def make(values: Sequence[Any]) -> PgRow:
        return PgRow(values, index)

    return make


def pool(url: str, *, read_only: bool = False) -> ConnectionPool[Any]:
    """The process's pool for ``url`` (opened on first use, closed at exit); a read-only
    pool's sessions are ``default_transaction_read_only``."""
    key = (url, read_only)
    with _pools_lock:
        found = _pools.get(key)
        if found is not None:
            return found
        try:
            import psycopg
            from psycopg_pool import ConnectionPool
        except ImportError as exc:
            raise SetupError(
                "a PostgreSQL state store needs psycopg and psycopg-pool",
                hint="pip install 'kagura-agent[team]'",
            ) from exc
        size = int(os.environ.get(POOL_ENV, "8") or "8")
        # A plan per execution: psycopg prepares a statement run 5 times, and PostgreSQL's
        # generic plan for it can be far slower for some values (memory recall of a term in
        # most memories as for one in a few: 200 ms instead of 0.1 ms). No parallel workers:
        # every state query is small, and starting workers cost more than they saved.
        options = "-c plan_cache_mode=force_custom_plan -c max_parallel_workers_per_gather=0"
        if read_only:
            options += " -c default_transaction_read_only=on"
        kwargs: dict[str, Any] = {
            "autocommit": True,
            "row_factory": _row_factory,
            "options": options,
        }
        created: ConnectionPool[Any] = ConnectionPool(
            url,
            min_size=1,
            max_size=max(1, size),
            kwargs=kwargs,
            name=f"kagura-state-{len(_pools)}",
            open=False,
        )
        try:
            # One plain connection first: an unreachable server is one quick, clear error
            # instead of the pool retrying in the background until its timeout.
            psycopg.connect(url, connect_timeout=10).close()
            created.open(wait=True, timeout=30.0)
        except psycopg.Error as exc:  # psycopg_pool.PoolTimeout too: nobody answered
            created.close()
            # libpq's message may quote the connection string it could not parse.
            said = _safe(str(exc).replace(url, _safe(url)))
            raise StateDbError(f"cannot reach the state store {_safe(url)}: {said}") from exc
        if not _pools:
            atexit.register(close_pools)
        _pools[key] = created
        return created


def close_pools() -> None:
    """Close every pool this process opened (at exit; tests between databases)."""
    with _pools_lock:
        opened = list(_pools.values())
        _pools.clear()
    for each in opened:
        each.close()


class PgConnection:
    """A handle on the pool: each statement borrows a connection (autocommit) and gives it
    back at once, and ``transaction`` holds one for its duration, with the write lock.
    Nothing is held between statements, so a handle left unclosed leaks no server
    connection (the lease ledger's, a thread's)."""

    dialect: Dialect = "postgres"

    def __init__(self, url: str, *, read_only: bool) -> None:
        import psycopg

        self._errors: type[Exception] = psycopg.Error
        self._missing: type[Exception] = psycopg.errors.UndefinedTable
        self._where = _safe(url)
        self._pool = pool(url, read_only=read_only)
        # The connection a transaction holds, per thread: a handle may serve several
        # threads (a memory store behind asyncio.to_thread), each with its own transaction.
        self._local = threading.local()

    @property
    def _held(self) -> psycopg.Connection[Any] | None:
        held: psycopg.Connection[Any] | None = getattr(self._local, "held", None)
        return held

    @_held.setter
    def _held(self, conn: psycopg.Connection[Any] | None) -> None:
        self._local.held = conn

    @contextmanager
    def _translated(self) -> Iterator[None]:
        """psycopg's errors (PoolTimeout included) as the seam's."""
        try:
            yield
        except self._errors as exc:
            kind = MissingTable if isinstance(exc, self._missing) else StateDbError
            raise kind(f"state store {self._where}: {exc}") from exc

    def execute(self, sql: str, params: Sequence[Any] = (), /) -> Cursor:
        text = placeholders(sql) if params else sql
        with self._translated():
            if self._held is not None:
                return self._held.execute(text, list(params) or None)
            # Results are read into memory: the cursor stays readable once the connection
            # is back in the pool.
            with self._pool.connection(timeout=30.0) as conn:
                cursor: Cursor = conn.execute(text, list(params) or None)
                return cursor

    def run_script(self, script: str) -> None:
        # Without parameters psycopg sends the text as it is: several statements at once.
        self.execute(script)

    @contextmanager
    def transaction(self) -> Iterator[PgConnection]:
        """BEGIN, the store's write lock, … COMMIT; rolled back on any exception."""
        if self._held is not None:
            raise StateDbError(f"state store {self._where}: a transaction is already open")
        with (
            self._translated(),
            self._pool.connection(timeout=30.0) as conn,
            conn.transaction(),
        ):
            self._held = conn
            try:
                self.execute("SELECT pg_advisory_xact_lock(?)", (WRITE_LOCK,))
                yield self
            finally:
                self._held = None

    def close(self) -> None:
        """Nothing is held between statements: nothing to give back."""
