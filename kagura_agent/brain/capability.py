"""Mid-run capability requests from inside the container (stdlib only).

The brain may ask for one more egress policy (or host) or credential scope, with a
reason. ``CapabilityBridge.request`` sends a ``capability-request`` line to the host and
waits for its ``capability-result``. The host decides everything: it compiles the
amended plan from the operator's manifests, refuses what they do not allow, asks an
operator about the rest (silence denies) and applies a grant live. Nothing the container
sends can approve anything: the answer is the host's.

The same bridge asks for a turn or dollar budget the CLI ran out of (``budget-request``
with the limit and what the engine says it spent): the host decides by its own count and
the Policy ceilings, and answers with what is left of each budget after an extension.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from kagura_agent.brain.replies import PendingReplies

KINDS = ("egress", "credential")
BUDGETS = ("turns", "cost_usd")  # the budgets the CLI holds a query to
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

    async def extend_budget(
        self, limit: str, turns: int, cost_usd: float, reason: str
    ) -> dict[str, Any]: ...


class CapabilityBridge:
    """The container's side: each request is a line to the host and its answer back."""

    def __init__(self, send: Callable[[dict[str, Any]], None]) -> None:
        self._replies = PendingReplies(send)

    async def request(self, kind: str, name: str, reason: str) -> dict[str, Any]:
        """``{"granted": bool, "message": str}`` — the host's answer."""
        if kind not in KINDS:
            return {"granted": False, "message": f"kind must be one of {', '.join(KINDS)}"}
        if not name or len(name) > MAX_FIELD or len(reason) > MAX_FIELD:
            return {"granted": False, "message": f"name (1..{MAX_FIELD}) and reason are needed"}
        message = {"type": "capability-request", "kind": kind, "name": name, "reason": reason}
        try:
            reply = await self._replies.ask(message, WAIT_SECONDS)
        except TimeoutError:
            return {"granted": False, "message": "the host did not answer"}
        return {"granted": bool(reply.get("granted")), "message": str(reply.get("message") or "")}

    async def extend_budget(
        self, limit: str, turns: int, cost_usd: float, reason: str
    ) -> dict[str, Any]:
        """``{"granted", "message", "turns", "cost_usd"}``: the host's answer, with what is
        left of each budget (None: no limit) when granted."""
        if limit not in BUDGETS:
            return {"granted": False, "message": f"limit must be one of {', '.join(BUDGETS)}"}
        message = {"type": "budget-request", "limit": limit, "turns": turns,
                   "cost_usd": cost_usd, "reason": reason[:MAX_FIELD]}  # fmt: skip
        try:
            reply = await self._replies.ask(message, WAIT_SECONDS)
        except TimeoutError:
            return {"granted": False, "message": "the host did not answer"}
        return {
            "granted": bool(reply.get("granted")),
            "message": str(reply.get("message") or ""),
            "turns": reply.get("turns"),
            "cost_usd": reply.get("cost_usd"),
        }

    def resolve(self, msg: dict[str, Any]) -> None:
        """Deliver a ``capability-result`` or ``budget-result`` to its waiting request (unknown ids dropped)."""
        self._replies.resolve(msg)

    def close(self) -> None:
        self._replies.close({"granted": False, "message": "the channel closed"})
