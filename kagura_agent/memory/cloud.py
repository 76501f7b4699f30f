"""Kagura Memory Cloud backend, through the ``kagura-memory`` client (extra ``cloud-memory``).

The client speaks MCP over HTTP and is async; this adapter runs it on a private event
loop in a daemon thread so the ``MemoryStore`` protocol stays synchronous and works
from inside another event loop too. Library errors become ``SetupError`` here.

Provenance travels with each memory: in tags (``trust:…``, ``source:…``, ``task_kind:…``,
which the server filters on) and in a ``details["kagura_agent"]`` envelope (read back on
``get``). A memory without our envelope — written by some other tool — is untrusted.
Our edge types map onto edge types the server accepts.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Coroutine, Iterator, Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any, Literal, TypeVar, cast

from kagura_agent.clock import Clock, SystemClock, iso, parse_iso
from kagura_agent.errors import SetupError
from kagura_agent.memory.common import new_memory, stored_now, tombstone_of
from kagura_agent.memory.model import (
    Edge,
    Memory,
    Source,
    SourceKind,
    Tombstone,
    Trust,
    check_edge_type,
)

ENVELOPE = "kagura_agent"
TOMBSTONE_TYPE = "tombstone"
# Ours -> the server's VALID_EDGE_TYPES ("fix learned_from failure" reads the right way).
EDGE_TO_SERVER = {
    "prevents": "learned_from",
    "derived_from": "depends_on",
    "produced": "declared_link",
    "related_to": "related_to",
}
EDGE_FROM_SERVER = {v: k for k, v in EDGE_TO_SERVER.items()}
_PAGE = 200

T = TypeVar("T")


class CloudMemoryStore:
    """``MemoryStore`` on Kagura Memory Cloud (one context)."""

    backend = "cloud"

    def __init__(
        self,
        url: str,
        token: str,
        context_id: str,
        *,
        clock: Clock | None = None,
        timeout: float = 10.0,
    ) -> None:
        try:
            from kagura_memory import KaguraClient
        except ImportError as exc:
            raise SetupError(
                "the cloud memory backend needs the kagura-memory client",
                hint="pip install 'kagura-agent[cloud-memory]'",
            ) from exc
        self.url = url
        self.context_id = context_id
        self.clock: Clock = clock or SystemClock()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._timeout = timeout

        async def make() -> Any:
            return KaguraClient(api_key=token, mcp_url=url, timeout=timeout)

        try:
            self._client = self._run(make())
        except ValueError as exc:  # the client refuses plain http to a non-loopback host
            self.close()
            raise SetupError(f"memory cloud URL refused: {exc}") from exc

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        return future.result(timeout=self._timeout * 3)

    def _call(self, coro: Coroutine[Any, Any, T], what: str) -> T:
        """Run a client call, translating the library's errors at this boundary."""
        from kagura_memory import KaguraAuthError, KaguraError

        try:
            return self._run(coro)
        except KaguraAuthError as exc:
            raise SetupError(
                f"memory cloud refused the credential ({what}): {exc}",
                hint="check the memory manifest's token reference",
            ) from exc
        except KaguraError as exc:
            raise SetupError(f"memory cloud {what} failed: {exc}") from exc
        except TimeoutError as exc:
            raise SetupError(f"memory cloud {what} timed out at {self.url}") from exc

    # -- writes ----------------------------------------------------------------

    def remember(
        self,
        *,
        type: str,
        summary: str,
        source: Source,
        trust: Trust | None = None,
        details: Mapping[str, Any] | None = None,
        tags: Sequence[str] = (),
        task_kind: str | None = None,
    ) -> Memory:
        """Store one memory in the context, provenance in tags and the details envelope."""
        memory = new_memory(
            self.clock,
            type=type,
            summary=summary,
            source=source,
            trust=trust,
            details=details,
            tags=tags,
            task_kind=task_kind,
        )
        envelope = {
            "summary": summary,
            "source": source.to_json(),
            "trust": memory.trust,
            "task_kind": task_kind,
            "created": iso(memory.created),
            "tags": list(memory.tags),
            "details": dict(memory.details),
        }
        answer = self._call(
            self._client.remember(
                self.context_id,
                summary=_cloud_summary(type, summary),
                content=json.dumps(dict(memory.details), sort_keys=True) or summary,
                type=type,
                tags=[*memory.tags, *_provenance_tags(memory.trust, source, task_kind)],
                source_type="api",
                details={ENVELOPE: envelope},
            ),
            "remember",
        )
        return replace(memory, id=str(answer["memory_id"]))  # the server names it

    def create_edge(
        self,
        source_id: str,
        target_id: str,
        type: str,
        details: Mapping[str, Any] | None = None,
    ) -> Edge:
        """The server's edges carry no details: they are returned here but not kept
        (failure learning keeps them in the fix memory's details too)."""
        check_edge_type(type)
        edge = self._call(
            self._client.create_edge(
                self.context_id, source_id, target_id, edge_type=EDGE_TO_SERVER[type], weight=1.0
            ),
            "create_edge",
        )
        created = _edge_time(edge.created_at, self.clock)
        return Edge(source_id, target_id, type, created, dict(details or {}))

    def forget(
        self, memory_id: str, *, reason: str = "", cascade_of: str | None = None
    ) -> Tombstone | None:
        """Delete the memory and its edges; the tombstone is itself a (content-free) memory."""
        memory = self.get(memory_id)
        if memory is None:
            return None
        for edge in self.edges(memory_id):
            self._call(
                self._client.delete_edge(self.context_id, edge.source_id, edge.target_id),
                "delete_edge",
            )
        self._call(self._client.forget(self.context_id, memory_id=memory_id), "forget")
        tombstone = tombstone_of(memory, stored_now(self.clock), reason, cascade_of)
        self._call(
            self._client.remember(
                self.context_id,
                summary=f"tombstone of forgotten memory {memory_id}",
                content=f"forgotten {memory_id}",
                type=TOMBSTONE_TYPE,
                tags=["kagura-tombstone"],
                source_type="api",
                details={ENVELOPE: {"tombstone": tombstone.to_json()}},
            ),
            "remember tombstone",
        )
        return tombstone

    # -- reads -----------------------------------------------------------------

    def recall(
        self,
        query: str = "",
        *,
        k: int = 10,
        type: str | None = None,
        task_kind: str | None = None,
        source: Source | None = None,
        tags: Sequence[str] = (),
        include_untrusted: bool = False,
    ) -> list[Memory]:
        """Server-side search with tag filters; provenance re-checked from each envelope.

        The server needs a query; without one the filter values stand in for it and
        the hits are ordered newest first here.
        """
        required = list(tags)
        if not include_untrusted:
            required.append("trust:trusted")
        if task_kind is not None:
            required.append(f"task_kind:{task_kind}")
        if source is not None:
            required.append(f"source:{source.kind}:{source.id}")
        filters: dict[str, Any] = {}
        if type is not None:
            filters["type"] = type
        if required:
            filters["tags"] = required
            filters["tags_match"] = "all"
        text = query.strip() or " ".join([type or "", task_kind or "", *tags]).strip() or "memory"
        answer = self._call(
            self._client.recall(self.context_id, query=text, k=k, filters=filters or None),
            "recall",
        )
        found: list[Memory] = []
        for hit in answer.get("results", []):
            memory = self.get(str(hit.get("memory_id") or hit.get("id")))
            if memory is None or (memory.untrusted and not include_untrusted):
                continue
            found.append(memory)
        if not query.strip():
            found.sort(key=lambda m: m.created, reverse=True)
        return found[:k]

    def get(self, memory_id: str) -> Memory | None:
        from kagura_memory import KaguraNotFoundError

        async def reference() -> dict[str, Any] | None:
            try:
                return await self._client.reference(self.context_id, memory_id)  # type: ignore[no-any-return]
            except KaguraNotFoundError:
                return None

        answer = self._call(reference(), "reference")
        return None if answer is None else _from_cloud(answer.get("memory", {}), self.clock)

    def edges(
        self,
        memory_id: str,
        *,
        type: str | None = None,
        direction: Literal["out", "in", "both"] = "both",
    ) -> list[Edge]:
        kinds = [EDGE_TO_SERVER[type]] if type is not None else list(EDGE_FROM_SERVER)
        listed = self._call(
            self._client.list_edges(self.context_id, memory_id, edge_types=kinds), "list_edges"
        )
        found = []
        for edge in listed:
            if direction == "out" and edge.source_id != memory_id:
                continue
            if direction == "in" and edge.target_id != memory_id:
                continue
            ours = EDGE_FROM_SERVER.get(edge.edge_type)
            if ours is not None:
                created = _edge_time(edge.created_at, self.clock)
                found.append(Edge(edge.source_id, edge.target_id, ours, created))
        return found

    def _listed(self, type: str | None) -> Iterator[str]:
        offset = 0
        while True:
            page = self._call(
                self._client.list_memories(
                    context_id=self.context_id, type=type, limit=_PAGE, offset=offset
                ),
                "list_memories",
            )
            yield from (item.id for item in page.memories)
            if not page.has_more:
                return
            offset += _PAGE

    def tombstones(self) -> list[Tombstone]:
        found = []
        for memory_id in self._listed(TOMBSTONE_TYPE):
            answer = self._call(self._client.reference(self.context_id, memory_id), "reference")
            data = answer.get("memory", {}).get("details", {}).get(ENVELOPE, {}).get("tombstone")
            if isinstance(data, dict):
                found.append(_tombstone(data))
        return sorted(found, key=lambda t: (t.forgotten, t.memory_id))

    def export(self) -> Iterator[Memory]:
        memories = [m for m in map(self.get, self._listed(None)) if m is not None]
        yield from sorted(
            (m for m in memories if m.type != TOMBSTONE_TYPE), key=lambda m: m.created
        )

    def ping(self) -> None:
        """One authenticated call: the context must exist and the credential be accepted."""
        self._call(self._client.get_context_info(self.context_id), "get_context_info")

    def close(self) -> None:
        client = getattr(self, "_client", None)
        if client is not None:
            self._run(client.close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        self._loop.close()


def _cloud_summary(type: str, summary: str) -> str:
    # The server accepts summaries of 10-500 characters; ours may be shorter.
    text = summary if len(summary) >= 10 else f"[{type}] {summary}".ljust(10, ".")
    return text[:500]


def _provenance_tags(trust: Trust, source: Source, task_kind: str | None) -> list[str]:
    tags = [f"trust:{trust}", f"source:{source.kind}:{source.id}"]
    if task_kind is not None:
        tags.append(f"task_kind:{task_kind}")
    return tags


def _edge_time(value: datetime | None, clock: Clock) -> datetime:
    return value if value is not None else parse_iso(iso(clock.now()))


def _from_cloud(data: Mapping[str, Any], clock: Clock) -> Memory:
    envelope = (data.get("details") or {}).get(ENVELOPE)
    if not isinstance(envelope, dict) or "source" not in envelope:
        # Written by something other than kagura-agent: keep it, but never trust it.
        created = data.get("created_at")
        return Memory(
            id=str(data.get("id") or data.get("memory_id")),
            type=str(data.get("type", "note")),
            summary=str(data.get("summary", "")),
            source=Source("import", "memory-cloud"),
            trust="untrusted",
            created=parse_iso(created) if isinstance(created, str) else clock.now(),
            details={"content": data.get("content")},
            tags=tuple(data.get("tags") or ()),
        )
    return Memory(
        id=str(data.get("id") or data.get("memory_id")),
        type=str(data.get("type", "note")),
        summary=str(envelope["summary"]),
        source=Source(cast(SourceKind, envelope["source"]["kind"]), envelope["source"]["id"]),
        trust=cast(Trust, envelope["trust"]),
        created=parse_iso(envelope["created"]),
        details=dict(envelope.get("details") or {}),
        tags=tuple(envelope.get("tags") or ()),
        task_kind=envelope.get("task_kind"),
    )


def _tombstone(data: Mapping[str, Any]) -> Tombstone:
    return Tombstone(
        memory_id=data["memory_id"],
        type=data["type"],
        source=Source(cast(SourceKind, data["source"]["kind"]), data["source"]["id"]),
        trust=cast(Trust, data["trust"]),
        created=parse_iso(data["created"]),
        forgotten=parse_iso(data["forgotten"]),
        reason=data["reason"],
        cascade_of=data.get("cascade_of"),
    )
