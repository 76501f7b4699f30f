"""The host's memory, as served to the brain in the container over the channel.

The container never holds a memory credential: it asks, the host answers. Recall returns
trusted memories only unless the task asked for untrusted ones, and what the brain writes
is recorded as coming from this run (untrusted: the agent's own words).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

from kagura_agent.memory.factory import open_memory
from kagura_agent.memory.model import Memory, Source
from kagura_agent.plan.model import Plan

T = TypeVar("T")


class HostMemory:
    def __init__(self, store: Any, run_id: str, task_kind: str, *, include_untrusted: bool) -> None:
        self.store = store
        self.run_id = run_id
        self.task_kind = task_kind
        self.include_untrusted = include_untrusted

    async def _call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        # A SQLite connection may only be used by the thread that opened it (this loop's
        # thread), and its calls take well under a millisecond; a network backend would
        # stall the channel, so it gets a worker thread.
        if getattr(self.store, "backend", "") == "sqlite":
            return fn(*args, **kwargs)
        return await asyncio.to_thread(fn, *args, **kwargs)

    async def recall(self, query: str, limit: int) -> list[dict[str, Any]]:
        found = await self._call(
            self.store.recall,
            query,
            k=max(1, min(limit, 20)),
            include_untrusted=self.include_untrusted,
        )
        # The store filtered already; the host checks again, whatever backend answered.
        return [_public(m) for m in found if self.include_untrusted or not m.untrusted]

    async def remember(self, text: str, tags: list[str]) -> str:
        memory = await self._call(
            self.store.remember,
            type="note",
            summary=text[:200],
            details={"text": text},
            tags=tags,
            source=Source("run", self.run_id),
            task_kind=self.task_kind,
            trust="untrusted",
        )
        return str(memory.id)

    async def get(self, memory_id: str) -> dict[str, Any] | None:
        found = await self._call(self.store.get, memory_id)
        if found is None or (found.untrusted and not self.include_untrusted):
            return None
        return _public(found)


def open_host_memory(plan: Plan, run_id: str) -> HostMemory:
    """The memory server for ``plan``'s run, with the task's trust filter."""
    store = open_memory(plan["memory"])
    include = bool(plan["task"].get("context", {}).get("include_untrusted"))
    kind = plan["task"].get("kind") or plan["task"]["name"]
    return HostMemory(store, run_id, kind, include_untrusted=include)


def _public(memory: Memory) -> dict[str, Any]:
    return {
        "id": memory.id,
        "type": memory.type,
        "summary": memory.summary,
        "details": memory.details,
        "trust": "untrusted" if memory.untrusted else "trusted",
    }
