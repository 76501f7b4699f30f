"""Shared helpers for the memory and pattern tests: open either backend on a fresh store."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

from kagura_agent.clock import FixedClock
from kagura_agent.memory import MemoryStore, open_memory
from kagura_agent.memory.postgres import PgMemoryStore
from testing.fake_memory_cloud import FakeMemoryCloud

TOKEN = "fake-memory-token"
CONTEXT = "ctx-test"
START = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


@contextmanager
def open_backend(
    backend: str, tmp_path: Path, clock: FixedClock, postgres_url: str = ""
) -> Iterator[MemoryStore]:
    """A fresh store of ``backend`` ("sqlite", "cloud" against the local fake, or
    "postgres" in the (fresh) database at ``postgres_url``)."""
    if backend == "postgres":
        store = PgMemoryStore(postgres_url, clock=clock)
        try:
            yield store
        finally:
            store.close()
        return
    if backend == "sqlite":
        store = open_memory({"backend": "sqlite", "location": str(tmp_path / "m.db")}, clock=clock)
        try:
            yield store
        finally:
            store.close()
        return
    with FakeMemoryCloud(token=TOKEN, contexts={CONTEXT}) as cloud:
        section = {"backend": "cloud", "location": cloud.mcp_url, "context_id": CONTEXT}
        store = open_memory(section, clock=clock, token=TOKEN)
        try:
            yield store
        finally:
            store.close()
