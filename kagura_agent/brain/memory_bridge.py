"""Memory inside the container, served by the host (stdlib only).

``BridgeMemory`` is the MemoryClient engines get: each call becomes a
``memory-request`` line to the host and waits for the matching ``memory-result``. The
container never holds a memory credential; the host applies trust-tier filters.

Shell tools (script steps, CLIs) reach the same bridge through a Unix socket whose path
is in ``KAGURA_MEMORY_SOCKET``; ``python3 -m kagura_agent.brain.memtool`` is the client.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

from kagura_agent.brain.replies import PendingReplies

MEMORY_SOCKET_ENV = "KAGURA_MEMORY_SOCKET"
MEMORY_OPS = ("recall", "remember", "get", "explore", "link")
# Requests the host serves beside memory: ``dispatch`` runs a sub-agent (apply/midrun/dispatch.py)
# and answers when the child has finished, so it waits as long as the turn may run.
HOST_OPS = ("dispatch",)
REQUEST_TIMEOUT_SECONDS = 30.0
MAX_SOCKET_LINE = 1024 * 1024


class MemoryUnavailable(RuntimeError):
    """The host refused or did not answer a memory request."""


class BridgeMemory:
    """MemoryClient whose calls travel to the host over the channel."""

    def __init__(self, send: Callable[[dict[str, Any]], None]) -> None:
        self._replies = PendingReplies(send)

    async def request(self, op: str, fields: dict[str, Any]) -> Any:
        """Send one request and return the host's ``result`` (raises MemoryUnavailable)."""
        if op not in MEMORY_OPS + HOST_OPS:
            raise MemoryUnavailable(f"unknown memory op {op!r}")
        timeout = None if op in HOST_OPS else REQUEST_TIMEOUT_SECONDS
        message = {"type": "memory-request", "op": op, **fields}
        try:
            reply = await self._replies.ask(message, timeout)
        except TimeoutError:
            raise MemoryUnavailable(f"the host did not answer memory {op}") from None
        if not reply.get("ok"):
            raise MemoryUnavailable(str(reply.get("error") or "memory request refused"))
        return reply.get("result")

    def resolve(self, msg: dict[str, Any]) -> None:
        """Deliver a ``memory-result`` to its waiting request (unknown ids are dropped)."""
        self._replies.resolve(msg)

    def close(self) -> None:
        """Fail every waiting request (the channel is going away)."""
        self._replies.close(MemoryUnavailable("the channel closed"))

    async def recall(self, query: str, limit: int = 5) -> list[dict[str, Any]]:
        result = await self.request("recall", {"query": query, "limit": limit})
        return [r for r in result if isinstance(r, dict)] if isinstance(result, list) else []

    async def remember(self, text: str, tags: list[str] | None = None) -> str:
        return str(await self.request("remember", {"text": text, "tags": list(tags or [])}))

    async def get(self, memory_id: str) -> dict[str, Any] | None:
        result = await self.request("get", {"id": memory_id})
        return result if isinstance(result, dict) else None

    async def explore(self, memory_id: str, limit: int = 10) -> dict[str, Any]:
        result = await self.request("explore", {"id": memory_id, "limit": limit})
        return result if isinstance(result, dict) else {}

    async def link(self, source_id: str, target_id: str, edge_type: str) -> dict[str, Any]:
        fields = {"source": source_id, "target": target_id, "edge_type": edge_type}
        result = await self.request("link", fields)
        return result if isinstance(result, dict) else {}

    async def dispatch(self, request: dict[str, Any]) -> dict[str, Any]:
        """Run a sub-agent (the host compiles, asks, runs it); its result or refusal."""
        result = await self.request("dispatch", {"child": request})
        return result if isinstance(result, dict) else {}


async def serve_socket(path: str, memory: BridgeMemory) -> asyncio.Server:
    """Serve one JSON request per connection on a Unix socket for shell tools."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await reader.readline()
            req = json.loads(line)
            op = req.pop("op")
            reply = {"ok": True, "result": await memory.request(str(op), dict(req))}
        except (ValueError, KeyError, AttributeError, TypeError, MemoryUnavailable) as exc:
            reply = {"ok": False, "error": str(exc)}
        writer.write((json.dumps(reply) + "\n").encode())
        await writer.drain()
        writer.close()

    return await asyncio.start_unix_server(handle, path=path, limit=MAX_SOCKET_LINE)
