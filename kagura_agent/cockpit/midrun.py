"""Mid-run questions in chat: a running apply asks (a capability its brain requested, a
budget about to run out); the cockpit posts the question with Approve / Deny and hands
the answer back.

The answer is a decision in the approval log — who (``TRANSPORT:USER``), via the
transport, for the category and the *amended* plan's fingerprint that apply named — and
then only a nudge on apply's stdin (``{"answered": REQUEST}``). apply believes the log,
not the nudge (approvals/midrun.py), so a nudge can never approve anything by itself.
Silence: apply records the timeout itself and the request lapses here at the same time.
After a restart the old cockpit's pipes are gone: apply sees its stdin end and denies
whatever it was asking; nothing is carried over.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kagura_agent.approvals.midrun import Asked, record_answer
from kagura_agent.clock import Clock
from kagura_agent.state import Location, StateStore

MIDRUN_PREFIX = "m-"  # request ids of mid-run questions (sessions are s-…, graduations g-…)


@dataclass(frozen=True)
class Pending:
    request: str
    session: str
    thread: str
    category: str
    fingerprint: str


class MidRunDesk:
    """The mid-run questions open in this cockpit."""

    def __init__(self, state: Location, clock: Clock) -> None:
        self._state = state
        self._clock = clock
        self._pending: dict[str, Pending] = {}
        self._timers: dict[str, threading.Timer] = {}
        self._lock = threading.Lock()

    def asked(self, session: str, thread: str, item: dict[str, Any]) -> Pending | None:
        """An ``ask`` event of ``session``'s apply; the question to post (None: malformed)."""
        request, category, fp = (item.get(k) for k in ("request", "category", "fingerprint"))
        timeout = item.get("timeout")
        if not all(isinstance(v, str) and v for v in (request, category, fp)):
            return None
        if not str(request).startswith(MIDRUN_PREFIX) or not isinstance(timeout, int | float):
            return None
        pending = Pending(str(request), session, thread, str(category), str(fp))
        timer = threading.Timer(float(timeout) + 1.0, self.lapse, args=(pending.request,))
        timer.daemon = True
        with self._lock:
            self._pending[pending.request] = pending
            self._timers[pending.request] = timer
        timer.start()
        return pending

    def lapse(self, request: str) -> None:
        """apply's own timeout passed (it recorded the timeout): nothing to answer now."""
        with self._lock:
            self._pending.pop(request, None)
            timer = self._timers.pop(request, None)
        if timer is not None:
            timer.cancel()

    def open_for(self, session: str) -> list[Pending]:
        with self._lock:
            return [p for p in self._pending.values() if p.session == session]

    def answer(
        self,
        request: str,
        *,
        approved: bool,
        who: str,
        via: str,
        nudge: Callable[[str], str | None],
    ) -> str:
        """Record the operator's decision for the question's plan and nudge its apply; what
        to say in the thread."""
        with self._lock:
            pending = self._pending.pop(request, None)
            timer = self._timers.pop(request, None)
        if timer is not None:
            timer.cancel()
        if pending is None:
            return f"no open question {request} (answered already, lapsed, or its run ended)"
        with StateStore(self._state) as store:
            record_answer(
                store,
                Asked(pending.request, pending.category, pending.fingerprint),
                approved=approved,
                who=who,
                via=via,
                clock=self._clock,
                reason="answered in chat mid-run",
            )
        word = "approved" if approved else "denied"
        problem = nudge(request)
        if problem:
            return f"{request} {pending.category} {word} by {who}, but {problem}"
        return f"{request} {pending.category} {word} by {who}"
