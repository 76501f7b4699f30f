"""Mid-run capability requests from inside the container (stdlib only).

The brain may ask for one more egress policy (or host) or credential scope, with a
reason. ``CapabilityBridge.request`` sends a ``capability-request`` line to the host and
waits for its ``capability-result``. The host decides everything: it compiles the
amended plan from the operator's manifests, refuses what they do not allow, asks an
operator about the rest (silence denies) and applies a grant live. Nothing the container
sends can approve anything: the answer is the host's.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from typing import Any, Protocol

KINDS = ("egress", "credential")
# The host answers every request (a timeout is its deny); this only bounds a host that died.
WAIT_SECONDS = 3600.0
MAX_FIELD = 512
TOOL_DESCRIPTION = (
    "Ask the operator for one more capability mid-run: kind 'egress' with name = an egress"
    " policy name or a host, or kind 'credential' with name = 'provider/scope'; give the"
    " reason. Only what the operator's manifests allow can be granted; an operator decides"
    " (no answer is a no). Answers granted or refused, with why."
)


class CapabilityClient(Protocol):
    """What an engine offering the request tool needs (CapabilityBridge in the container)."""

    async def request(self, kind: str, name: str, reason: str) -> dict[str, Any]: ...


class CapabilityBridge:
    """The container's side: each request is a line to the host and its answer back."""

    def __init__(self, send: Callable[[dict[str, Any]], None]) -> None:
        self._send = send
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}

    async def request(self, kind: str, name: str, reason: str) -> dict[str, Any]:
        """``{"granted": bool, "message": str}`` — the host's answer."""
        if kind not in KINDS:
            return {"granted": False, "message": f"kind must be one of {', '.join(KINDS)}"}
        if not name or len(name) > MAX_FIELD or len(reason) > MAX_FIELD:
            return {"granted": False, "message": f"name (1..{MAX_FIELD}) and reason are needed"}
        number = next(self._ids)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[number] = future
        try:
            self._send(
                {
                    "type": "capability-request",
                    "request": number,
                    "kind": kind,
                    "name": name,
                    "reason": reason,
                }
            )
            reply = await asyncio.wait_for(future, WAIT_SECONDS)
        except TimeoutError:
            return {"granted": False, "message": "the host did not answer"}
        finally:
            self._pending.pop(number, None)
        return {"granted": bool(reply.get("granted")), "message": str(reply.get("message") or "")}

    def resolve(self, msg: dict[str, Any]) -> None:
        """Deliver a ``capability-result`` to its waiting request (unknown ids dropped)."""
        number = msg.get("request")
        future = self._pending.get(number) if isinstance(number, int) else None
        if future is not None and not future.done():
            future.set_result(msg)

    def close(self) -> None:
        for future in self._pending.values():
            if not future.done():
                future.set_result({"granted": False, "message": "the channel closed"})
