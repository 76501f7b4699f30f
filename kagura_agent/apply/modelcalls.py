"""Model calls counted by the host from the proxy's own log, never from the agent's word.

When the brain's API key is injected at the proxy (membrane/egress/squid.Injection), every
model call the agent makes with it passes squid's injecting port, and squid logs each
request it handled there. The host follows that log live (membrane/egress/session.py)
and counts here; the brain's engine, inside the agent's container, reports its own turns,
which a tampered engine can under-report. The turn budget holds on the larger of the two
(apply/midrun.py ``past_budget`` and ``past_counted``).

One model call is one log line that is all of:

- a request that came in on the injecting port (``INJECT_PORT``): the only way to use the
  key the proxy adds;
- ``POST``: the Messages API's calls are POSTs (a GET lists models or reads a result);
- squid connected to the upstream for it (the upstream's address is logged): a request
  squid refused or could not deliver reached no model and cost nothing;
- not ``/v1/messages/count_tokens`` (free of charge), the path compared exactly after
  the query is dropped: any other path counts, whatever it names (squid passes no other
  path on that port: squid.MODEL_CALL_PATH; this holds should one pass).

A line is written when the request ends, so a long streamed answer is counted when it is
complete.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from kagura_agent.membrane.egress.squid import INJECT_PORT

FREE_PATHS = frozenset({"/v1/messages/count_tokens"})
# A counted figure above twice the reported turns plus this is shown as a sign the engine
# was tampered with (the CLI's own small calls, a title or a summary, make some gap).
MISMATCH_SLACK = 2


def is_model_call(event: Mapping[str, Any]) -> bool:
    """Whether one ``egress.decision`` event of the run's proxy is one model call."""
    return (
        event.get("type") == "egress.decision"
        and event.get("inport") == INJECT_PORT
        and event.get("method") == "POST"
        and event.get("decision") == "allow"
        and bool(event.get("server"))
        and event.get("path") not in FREE_PATHS
    )


def mismatch(counted: int, reported: int) -> bool:
    """Many more model calls at the proxy than turns the brain reported."""
    return counted > 2 * reported + MISMATCH_SLACK


class ModelCalls:
    """The run's count of model calls; fed from the proxy log's collector thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count = 0

    def feed(self, event: Mapping[str, Any]) -> None:
        if is_model_call(event):
            with self._lock:
                self._count += 1

    @property
    def count(self) -> int:
        with self._lock:
            return self._count


__all__ = ["FREE_PATHS", "ModelCalls", "is_model_call", "mismatch"]
