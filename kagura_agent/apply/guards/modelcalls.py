"""Model calls counted by the host from the proxy's own log, never from the agent's word.

When the brain's API key is injected at the proxy (membrane/egress/modelport.py), every
model call the agent makes with it passes the key-injecting port, which counts and caps
each call when it starts (the proxy refuses a call past the run's caps: nothing past the
budget reaches the model) and logs each request it handled. The host follows that log
live (membrane/egress/session.py) and counts here, for the record and to stop the run
at its budget; the brain's engine, inside the agent's container, reports its own turns,
which a tampered engine can under-report. The turn budget holds on the larger of the two
(apply/midrun/grants.py ``past_budget`` and ``past_counted``).

A turn call is one log line that is all of:

- a request that came in on the injecting port (``INJECT_PORT``): the only way to use the
  key the proxy adds;
- allowed, and the proxy reached the upstream for it (the upstream's address is logged):
  a request refused or never delivered reached no model and cost nothing;
- counted by the port as a turn (``MODEL_TURN``: a Messages call with tools, what an
  agent's turn is). Its side calls (``MODEL_SIDE``: no tools, the CLI's titles and
  summaries) and token counts (``MODEL_FREE``) are counted apart: they have caps of their
  own at the port, and a 30-turn budget holds 30 turns.

A line from a proxy of an older kagura-agent (squid's reverse proxy, no class) counts as
it did: any POST but ``/v1/messages/count_tokens``.

A line is written when the request ends, so a long streamed answer is recorded when it is
complete; the port counted it when it started.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from kagura_agent.membrane.egress.modelport import CALL_KINDS, INJECT_PORT

FREE_PATHS = frozenset({"/v1/messages/count_tokens"})
# A counted figure above twice the reported turns plus this is shown as a sign the engine
# was tampered with.
MISMATCH_SLACK = 2


def call_kind(event: Mapping[str, Any]) -> str | None:
    """How one ``egress.decision`` event of the run's proxy counts: ``turn``, ``side``,
    ``free``, ``files``, or None when it is no model call that reached the model."""
    if not (
        event.get("type") == "egress.decision"
        and event.get("inport") == INJECT_PORT
        and event.get("decision") == "allow"
        and bool(event.get("server"))
    ):
        return None
    status = str(event.get("squid_status", ""))
    if status in CALL_KINDS:
        return status.removeprefix("MODEL_").lower()
    if event.get("method") != "POST":
        return None
    return "free" if event.get("path") in FREE_PATHS else "turn"


def is_model_call(event: Mapping[str, Any]) -> bool:
    """Whether one ``egress.decision`` event is one turn call (what the budget counts)."""
    return call_kind(event) == "turn"


def mismatch(counted: int, reported: int) -> bool:
    """Many more model calls at the proxy than turns the brain reported."""
    return counted > 2 * reported + MISMATCH_SLACK


def is_budget_refusal(event: Mapping[str, Any]) -> bool:
    """The port refused a call because a cap of the run's budget was reached."""
    return (
        event.get("type") == "egress.decision"
        and event.get("inport") == INJECT_PORT
        and event.get("decision") == "deny"
        and event.get("reason") == "budget"
    )


class ModelCalls:
    """The run's count of model calls, by kind; fed from the proxy log's collector thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}
        self._refused_at: int | None = None

    def feed(self, event: Mapping[str, Any]) -> None:
        kind = call_kind(event)
        with self._lock:
            if kind is not None:
                self._counts[kind] = self._counts.get(kind, 0) + 1
            elif is_budget_refusal(event):
                self._refused_at = self._counts.get("turn", 0)

    @property
    def refused_at(self) -> int | None:
        """The turn count when the port last refused a call for the budget (None: never):
        the agent tried to go on past its cap."""
        with self._lock:
            return self._refused_at

    @property
    def count(self) -> int:
        """Turn calls: what the turn budget counts."""
        with self._lock:
            return self._counts.get("turn", 0)

    def of(self, kind: str) -> int:
        with self._lock:
            return self._counts.get(kind, 0)


__all__ = [
    "FREE_PATHS",
    "ModelCalls",
    "call_kind",
    "is_budget_refusal",
    "is_model_call",
    "mismatch",
]
