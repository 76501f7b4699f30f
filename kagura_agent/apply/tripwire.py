"""Hijack tripwires: signs that the agent is no longer doing its task stop the run.

A burst of denied egress (the plan's ``tripwires``: ``denied_egress`` denials within
``window_seconds``) trips. Tripping kills the run's container from the host at once; the
run then leaves through the ordinary clean-up path (leases wiped and revoked), verify
does not run, the run is a recorded failure (graduated capabilities are demoted) and an
incident is written with the egress decisions and the run's last events
(``kagura-agent incidents``).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

MAX_LOG = 200


class Tripwire:
    """Counts denied egress in a sliding window; calls ``on_trip(reason)`` once."""

    def __init__(
        self,
        knobs: dict[str, Any],
        on_trip: Callable[[str], None],
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limit = int(knobs.get("denied_egress", 5))
        self.window = float(knobs.get("window_seconds", 60))
        self.on_trip = on_trip
        self.clock = clock
        self.reason: str | None = None
        self.egress_log: deque[dict[str, Any]] = deque(maxlen=MAX_LOG)
        self._denials: deque[float] = deque()
        self._lock = threading.Lock()

    def egress(self, event: dict[str, Any]) -> None:
        """Feed one egress event (the proxy's decisions arrive on a collector thread)."""
        if event.get("type") != "egress.decision":
            return
        with self._lock:
            self.egress_log.append(event)
            if event.get("decision") != "deny" or self.reason is not None:
                return
            now = self.clock()
            self._denials.append(now)
            while self._denials and self._denials[0] < now - self.window:
                self._denials.popleft()
            if len(self._denials) < self.limit:
                return
            self.reason = (
                f"{len(self._denials)} denied egress requests within"
                f" {self.window:g}s (tripwire: {self.limit})"
            )
        self.on_trip(self.reason)
