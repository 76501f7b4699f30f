"""Asking an operator while a run goes on: one question, bound to one plan fingerprint,
denied when nobody answers in time.

Mid-run capability requests, sub-agents' approvals and budget extensions go through one
:class:`Questions` per run (the same question asked once, a denied category not again,
the agent's questions rate limited), then its :class:`Asker`.
The question names the category and the fingerprint of the *amended* plan; whatever the
answer, it is recorded in the approval log against exactly that fingerprint. Who can
answer depends on how apply runs:

- under ``serve`` (:class:`ChatAsker`): apply prints the question as a live ``ask``
  event (kept in the run's journal too); the cockpit posts it with Approve / Deny, records
  the operator's decision in the approval log (:func:`record_answer`) and then only
  *nudges* apply with the request id on stdin. apply believes the log, never the nudge:
  it takes the latest decision for exactly its question (request id, fingerprint,
  category) made since it asked. A nudge with no such decision (a forged or replayed
  answer, one for another plan) changes nothing. It also reads the log every
  ``POLL_SECONDS`` without a nudge: an operator of the web console (``kagura-agent web
  --allow-approvals``) answers through the same log, from another process. When the
  cockpit goes away (apply's stdin ends) nobody can answer: denied at once.
- on a terminal (:class:`TtyAsker`): the question is asked there, ``tty_prompt``'s way.
- otherwise (:class:`NobodyAsker`): nobody can be asked; denied, with that reason.

A silence past the timeout is recorded as ``timeout`` and denies.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from kagura_agent.approvals.asking import tty_prompt
from kagura_agent.approvals.log import Decision, Outcome, Verdict, latest_decision, record_decision
from kagura_agent.clock import Clock
from kagura_agent.state import StateStore

# How often a waiting ChatAsker reads the approval log without a nudge.
POLL_SECONDS = 1.0


@dataclass(frozen=True)
class Question:
    request: str  # "m-…": what the operator's Approve / Deny names
    category: str  # "egress:POLICY", "credential:PROVIDER/SCOPE", "budget:wall_time", …
    fingerprint: str  # the amended plan's: the answer binds to it
    text: str  # what the operator reads: the question and the plan diff
    timeout: float


@dataclass(frozen=True)
class Answer:
    approved: bool
    outcome: Outcome
    who: str
    via: str
    reason: str = ""

    @classmethod
    def of(cls, decision: Decision) -> Answer:
        return cls(decision.approved, decision.outcome, decision.who, decision.via, decision.reason)

    def said(self) -> str:
        """One line for the run's record and the brain: what came of it, and who said so."""
        if self.approved:
            return f"approved by {self.who} via {self.via}"
        if self.outcome == "timeout":
            return f"not approved: {self.reason or 'nobody answered'}"
        return f"denied by {self.who} via {self.via}" + (f" ({self.reason})" if self.reason else "")


class Asker(Protocol):
    """Poses one question and returns the decision it recorded (or found) in the log."""

    async def ask(self, store: StateStore, question: Question, clock: Clock) -> Answer: ...


# A run's agent may put at most this many questions to its operator in any WINDOW (the
# requests it makes: capabilities, sub-agents); past it, nobody is asked until the oldest
# question leaves the window. Budget extensions apply raises itself are not counted.
QUESTIONS_PER_WINDOW = 3
QUESTION_WINDOW = 300.0  # seconds


class NotAsked(Exception):
    """The operator is not asked (the message says why): a category denied earlier in
    the run, or the run's questions past their rate."""


class Questions:
    """Every mid-run question of one run passes here on its way to the operator.

    - The same question (category and plan fingerprint) pending or approved is not asked
      again: a caller while it is pending waits for its answer; after an approval the
      answer is the approval (recorded in the log against that very fingerprint).
    - A category denied (or left unanswered) is not asked again for the rest of the run:
      ``NotAsked`` says by whom and when it was denied.
    - The agent's questions are rate limited: ``QUESTIONS_PER_WINDOW`` in
      ``QUESTION_WINDOW`` seconds; past it ``NotAsked``, and its request is refused.

    So 25 identical requests put one question, and a denied one stays denied unasked."""

    def __init__(
        self,
        *,
        per_window: int = QUESTIONS_PER_WINDOW,
        window: float = QUESTION_WINDOW,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.per_window = per_window
        self.window = window
        self._monotonic = monotonic
        self._asked: deque[float] = deque()  # when the agent's questions were put
        self._approved: dict[tuple[str, str], Answer] = {}
        self._denied: dict[str, str] = {}  # category -> what the answer said
        self._pending: dict[tuple[str, str], asyncio.Future[Answer]] = {}
        self.not_asked = 0  # requests refused here, unasked

    def check(self, category: str, *, limited: bool = True) -> None:
        """Raise NotAsked when a question of ``category`` would not be put now."""
        said = self._denied.get(category)
        if said is not None:
            raise NotAsked(f"{category} was {said} earlier in this run: not asked again")
        if not limited:
            return
        now = self._monotonic()
        while self._asked and self._asked[0] <= now - self.window:
            self._asked.popleft()
        if len(self._asked) >= self.per_window:
            wait = self._asked[0] + self.window - now
            raise NotAsked(
                f"this run asked its operator {len(self._asked)} questions in the last"
                f" {self.window:.0f}s, the most it may; ask again in {wait:.0f}s"
            )

    async def ask(
        self,
        asker: Asker,
        store: StateStore,
        question: Question,
        clock: Clock,
        *,
        limited: bool = True,
    ) -> Answer:
        """``asker``'s answer to ``question``, or one given before (see the class);
        ``limited``: an agent's request, counted against the rate. Raises NotAsked."""
        key = (question.category, question.fingerprint)
        if key in self._approved:
            return self._approved[key]
        pending = self._pending.get(key)
        if pending is not None:
            return await asyncio.shield(pending)
        try:
            self.check(question.category, limited=limited)
        except NotAsked:
            self.not_asked += 1
            raise
        if limited:
            self._asked.append(self._monotonic())
        future: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        self._pending[key] = future
        try:
            answer = await asker.ask(store, question, clock)
        except BaseException:
            future.cancel()
            raise
        finally:
            del self._pending[key]
        if answer.approved:
            self._approved[key] = answer
        else:
            self._denied[question.category] = answer.said()
        future.set_result(answer)
        return answer


@dataclass(frozen=True)
class Asked:
    """Which mid-run question an operator answers: its id (m-…), and the category and the
    amended plan's fingerprint the answer binds to (what the chat desk and the web
    console hold of a pending question)."""

    request: str
    category: str
    fingerprint: str


def record_answer(
    store: StateStore,
    asked: Asked,
    *,
    approved: bool,
    who: str,
    via: str,
    clock: Clock,
    reason: str,
) -> Decision:
    """An operator's answer to the mid-run question ``asked``: a decision in the approval
    log bound to the question's category and the amended plan's fingerprint (what the
    chat desk and the web console record; the asking apply reads it back)."""
    return record_decision(
        store,
        Verdict(
            category=asked.category,
            fingerprint=asked.fingerprint,
            outcome="approved" if approved else "denied",
            who=who,
            via=via,
            reason=reason,
            request=asked.request,
        ),
        clock=clock,
    )


def _timeout(store: StateStore, question: Question, clock: Clock, via: str, why: str) -> Answer:
    decision = record_decision(
        store,
        Verdict(
            category=question.category,
            fingerprint=question.fingerprint,
            outcome="timeout",
            who="nobody",
            via=via,
            reason=why,
            request=question.request,
        ),
        clock=clock,
    )
    return Answer.of(decision)


class ChatAsker:
    """Under ``serve``: ``announce`` prints the question for the cockpit; nudges arrive
    through :meth:`nudged` (request ids read from stdin), :meth:`gone` when stdin ends."""

    def __init__(self, announce: Callable[[Question], None], via: str = "serve") -> None:
        self._announce = announce
        self._via = via
        self._waiting: dict[str, asyncio.Queue[bool]] = {}
        self._gone = False
        self.ignored: list[str] = []  # nudges that had no decision behind them

    def nudged(self, request: str) -> None:
        queue = self._waiting.get(request)
        if queue is not None:
            queue.put_nowait(True)
        else:
            self.ignored.append(request)

    def gone(self) -> None:
        """Nobody can answer any more (the cockpit went away): every question is denied."""
        self._gone = True
        for queue in self._waiting.values():
            queue.put_nowait(False)

    async def ask(self, store: StateStore, question: Question, clock: Clock) -> Answer:
        # The log keeps whole seconds: a decision in the same second as the ask counts.
        since = clock.now().replace(microsecond=0)
        if self._gone:
            return _timeout(store, question, clock, self._via, "nobody can answer (no cockpit)")
        queue: asyncio.Queue[bool] = asyncio.Queue()
        self._waiting[question.request] = queue
        loop = asyncio.get_running_loop()
        deadline = loop.time() + question.timeout
        try:
            self._announce(question)
            while True:
                left = deadline - loop.time()
                try:
                    # (asyncio.timeout keeps a cancellation that wait_for may drop on 3.11)
                    async with asyncio.timeout(max(min(left, POLL_SECONDS), 0.0)):
                        alive = await queue.get()
                except TimeoutError:
                    found = _decided(store, question, since)
                    if found is not None:  # answered elsewhere (the web console)
                        return Answer.of(found)
                    if loop.time() < deadline:
                        continue
                    why = f"no answer within {question.timeout:.0f}s"
                    return _timeout(store, question, clock, self._via, why)
                if not alive:
                    why = "the cockpit went away before anyone answered"
                    return _timeout(store, question, clock, self._via, why)
                found = _decided(store, question, since)
                if found is not None:
                    return Answer.of(found)
                self.ignored.append(question.request)  # a nudge with nothing in the log
        finally:
            self._waiting.pop(question.request, None)


def _decided(store: StateStore, question: Question, since: datetime) -> Decision | None:
    return latest_decision(
        store, question.fingerprint, question.category, since=since, request=question.request
    )


class TtyAsker:
    """On a terminal: the question and its diff, then ``[y/N] (deny in Ns)``."""

    def __init__(self, who: str) -> None:
        self._who = who

    async def ask(self, store: StateStore, question: Question, clock: Clock) -> Answer:
        answer = await asyncio.to_thread(tty_prompt, question.text, question.timeout)
        if answer is None:
            return _timeout(
                store, question, clock, "cli", f"no answer within {question.timeout:g}s"
            )
        decision = record_decision(
            store,
            Verdict(
                category=question.category,
                fingerprint=question.fingerprint,
                outcome="approved" if answer else "denied",
                who=self._who,
                via="cli",
                reason="answered at the terminal mid-run",
                request=question.request,
            ),
            clock=clock,
        )
        return Answer.of(decision)


class NobodyAsker:
    """No terminal and no cockpit: nobody can be asked, so the answer is no (recorded)."""

    async def ask(self, store: StateStore, question: Question, clock: Clock) -> Answer:
        decision = record_decision(
            store,
            Verdict(
                category=question.category,
                fingerprint=question.fingerprint,
                outcome="denied",
                who="nobody",
                via="cli",
                reason="nobody can be asked: apply has no terminal and runs outside serve",
                request=question.request,
            ),
            clock=clock,
        )
        return Answer.of(decision)
