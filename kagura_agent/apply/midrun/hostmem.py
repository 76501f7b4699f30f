"""The host's memory, as served to the brain in the container over the channel.

The container never holds a memory credential: it asks, the host answers. Recall returns
trusted memories only unless the task asked for untrusted ones, and what the brain writes
is recorded as coming from this run (untrusted: the agent's own words).

Five tools: recall, get, remember, explore (a memory's neighbours over edges) and link (a
new edge between two memories). The same filter holds for each: a memory the run may not
read is answered as if it did not exist — ``get`` gives None, ``explore`` and ``link``
refuse it, and ``explore`` leaves out every neighbour the run may not read (an edge from
a trusted memory is no way into an untrusted one). A link the brain makes keeps its
provenance on the edge (``by``: this run, ``trust``: untrusted) and may only be of the
types in ``BRAIN_EDGE_TYPES``: ``prevents`` (failure learning's evidence) and ``produced``
(a child's output) are written by the host alone.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

from kagura_agent.brain.channel import MemoryRefused
from kagura_agent.membrane.secrets import Redactor
from kagura_agent.memory.factory import open_memory
from kagura_agent.memory.model import Memory, Source
from kagura_agent.plan.model import Plan

T = TypeVar("T")
BRAIN_EDGE_TYPES = ("related_to", "derived_from")


class HostMemory:
    def __init__(
        self,
        store: Any,
        run_id: str,
        task_kind: str,
        *,
        include_untrusted: bool,
        redactor: Redactor | None = None,
    ) -> None:
        self.store = store
        self.run_id = run_id
        self.task_kind = task_kind
        self.include_untrusted = include_untrusted
        # The run's secrets: what the brain writes outlives its leases and is read by
        # later runs that never held them, so none of it is stored.
        self.redactor = redactor or Redactor()

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
        text = self.redactor.scrub(text)
        tags = [self.redactor.scrub(tag) for tag in tags]
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
        found = await self._readable(memory_id)
        return _public(found) if found is not None else None

    async def explore(self, memory_id: str, limit: int) -> dict[str, Any]:
        """The memory and its neighbours over edges (either direction), readable ones only."""
        start = await self._readable(memory_id)
        if start is None:
            raise MemoryRefused(f"no memory {memory_id} this run may read")
        neighbours = []
        for edge in await self._call(self.store.edges, memory_id):
            outgoing = edge.source_id == memory_id
            other = await self._readable(edge.target_id if outgoing else edge.source_id)
            if other is None:
                continue  # unreadable: not even its id is shown
            neighbours.append(
                {
                    "edge": edge.type,
                    "direction": "out" if outgoing else "in",
                    "by": str(edge.details.get("by", "host")),
                    "memory": _public(other),
                }
            )
            if len(neighbours) >= max(1, min(limit, 50)):
                break
        return {"memory": _public(start), "neighbours": neighbours}

    async def link(self, source_id: str, target_id: str, edge_type: str) -> dict[str, Any]:
        """A new edge between two memories this run may read, recorded as made by it."""
        if edge_type not in BRAIN_EDGE_TYPES:
            raise MemoryRefused(f"the brain may link only as {', '.join(BRAIN_EDGE_TYPES)}")
        if source_id == target_id:
            raise MemoryRefused("a memory cannot be linked to itself")
        for memory_id in (source_id, target_id):
            if await self._readable(memory_id) is None:
                raise MemoryRefused(f"no memory {memory_id} this run may read")
        details = {"by": f"run:{self.run_id}", "trust": "untrusted"}
        edge = await self._call(self.store.create_edge, source_id, target_id, edge_type, details)
        return {
            "source": edge.source_id,
            "target": edge.target_id,
            "edge": edge.type,
            "by": str(edge.details.get("by", "")),
        }

    async def _readable(self, memory_id: str) -> Memory | None:
        """The memory when this run may read it (the trust filter), else None."""
        found: Memory | None = await self._call(self.store.get, memory_id)
        if found is None or (found.untrusted and not self.include_untrusted):
            return None
        return found


def open_host_memory(plan: Plan, run_id: str, redactor: Redactor) -> HostMemory:
    """The memory server for ``plan``'s run, with the task's trust filter; what the brain
    writes passes the run's ``redactor``."""
    store = open_memory(plan["memory"])
    include = plan["task"]["context"]["include_untrusted"]
    kind = plan["task"]["kind"]
    return HostMemory(store, run_id, kind, include_untrusted=include, redactor=redactor)


def _public(memory: Memory) -> dict[str, Any]:
    return {
        "id": memory.id,
        "type": memory.type,
        "summary": memory.summary,
        "details": memory.details,
        "trust": "untrusted" if memory.untrusted else "trusted",
    }
