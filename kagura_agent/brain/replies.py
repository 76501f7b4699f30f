"""Numbered requests from the container to the host, each answered by one reply line.

The bridges inside the container (memory, mid-run capability requests) send a line
carrying ``request: N`` and wait for the host's line with the same number. Stdlib only.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from typing import Any


class PendingReplies:
    """Send numbered requests and hand each reply to the request waiting for it."""

    def __init__(self, send: Callable[[dict[str, Any]], None]) -> None:
        self._send = send
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}

    async def ask(self, message: dict[str, Any], timeout: float | None) -> dict[str, Any]:
        """Send ``message`` with the next number; the reply (TimeoutError after ``timeout``)."""
        number = next(self._ids)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[number] = future
        try:
            self._send({**message, "request": number})
            async with asyncio.timeout(timeout):  # keeps a cancellation wait_for may drop
                return await future
        finally:
            self._pending.pop(number, None)

    def resolve(self, msg: dict[str, Any]) -> None:
        """Deliver a reply to its waiting request (unknown numbers are dropped)."""
        number = msg.get("request")
        future = self._pending.get(number) if isinstance(number, int) else None
        if future is not None and not future.done():
            future.set_result(msg)

    def close(self, reply: dict[str, Any] | BaseException) -> None:
        """End every waiting request with ``reply`` (an answer, or an error to raise)."""
        for future in self._pending.values():
            if future.done():
                continue
            if isinstance(reply, BaseException):
                future.set_exception(reply)
            else:
                future.set_result(reply)
