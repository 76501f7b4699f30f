"""The startup gate: no run starts unless its memory backend is reachable and writable.

Embedded: the file opens, ``PRAGMA integrity_check`` says ok and a write commits.
Cloud: one authenticated call answers. Failures raise ``SetupError`` (exit 3) with the
reason. Only transient network failures are retried, once, quickly; a missing URL,
token, client library or a refused credential fails at once.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Mapping
from typing import Any

from kagura_agent.errors import SetupError
from kagura_agent.memory.factory import DEFAULT_SECTION, open_memory
from kagura_agent.memory.sqlite import SqliteMemoryStore
from kagura_agent.state import StateDbError

RETRY_DELAY_SECONDS = 0.5


def check_ready(memory_plan_section: Mapping[str, Any] | None, *, token: str | None = None) -> None:
    """Raise SetupError unless the plan's memory backend can be used for a run."""
    section = memory_plan_section or DEFAULT_SECTION
    backend = section.get("backend", "sqlite")
    if backend == "sqlite":
        _check_sqlite(section)
    elif backend == "postgres":
        open_memory(section).close()  # reachable and migrated; errors are SetupErrors
    else:
        _check_cloud(section, token)


def _check_sqlite(section: Mapping[str, Any]) -> None:
    store = open_memory(section)
    assert isinstance(store, SqliteMemoryStore)
    try:
        verdict = store.integrity_check()
        if verdict != "ok":
            raise SetupError(f"memory store {store.path} failed its integrity check: {verdict}")
        store.probe_write()
    except (sqlite3.Error, StateDbError) as exc:
        raise SetupError(f"memory store {store.path} is not usable: {exc}") from exc
    finally:
        store.close()


def _check_cloud(section: Mapping[str, Any], token: str | None) -> None:
    from kagura_agent.memory.cloud import CloudMemoryStore  # lazy: see memory/factory.py

    store = open_memory(section, token=token)  # missing URL/token/client: raises, no retry
    assert isinstance(store, CloudMemoryStore)
    try:
        for attempt in (1, 2):
            try:
                store.ping()
                return
            except SetupError as exc:
                if attempt == 2 or not _transient(exc):
                    raise
                time.sleep(RETRY_DELAY_SECONDS)
    finally:
        store.close()


def _transient(exc: SetupError) -> bool:
    """A dropped connection, a timeout or a 5xx/429 may pass; refusals will not."""
    from kagura_memory import KaguraAuthError, KaguraConnectionError, KaguraRateLimitError

    cause = exc.__cause__
    if isinstance(cause, KaguraAuthError):
        return False
    return isinstance(cause, KaguraConnectionError | KaguraRateLimitError | TimeoutError)
