"""Grants while a run goes on: the brain's capability requests and budget extensions.

    brain ── capability-request ──▶ MidRun.request ── Amender (manifests only) ── Refused?
                                        │ Questions.ask (Question bound to the amended plan:
                                        │ asked once, a denied category not again, rated)
                                        ▼ approved
                    egress: the proxy's allowlist reloads in place (connections kept)
                    credential: the broker mints the lease, it is pushed over the channel
    wall budget near its end ──▶ MidRun.watch_wall ── Amender.budget (≤ ceiling) ── ask
                                        ▼ approved: the new deadline, in the container and here
                                          silence / deny: the run stops when it runs out
    the CLI's turn or $ budget ran out ──▶ MidRun.extend_budget ── Amender.budget (≤ ceiling)
                                        ▼ approved: what is left by the host's count, to the
                                          engine (it goes on in the same session); else stop

One amendment at a time: each is compiled from the plan in force, so two approvals
never race. What reaches the operator is bounded (approvals/midrun.Questions): the same
question is put once, a category denied stays denied for the run without asking again,
the agent's questions are rate limited, and past MAX_REQUESTS requests a run's are
refused without a line or a record each. Every request and its outcome go into the run's record (``run_amendments``)
and every decision into the approval log, bound to the amended plan's fingerprint.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from kagura_agent.apply.guards.modelcalls import ModelCalls
from kagura_agent.apply.midrun.allotment import Allotments
from kagura_agent.apply.midrun.amend import Amender, Amendment, Refused
from kagura_agent.apply.records.live import LiveView
from kagura_agent.apply.records.progress import (
    BudgetNotExtended,
    BudgetRequest,
    Leasing,
    MidRunRequest,
    ProxyReloaded,
    RequestAnswered,
    RequestsCapped,
)
from kagura_agent.approvals.midrun import Answer, Asker, NotAsked, Question, Questions
from kagura_agent.brain.protocol import BRAIN_BUDGETS
from kagura_agent.clock import Clock, iso
from kagura_agent.errors import KaguraError
from kagura_agent.hygiene import neutralise
from kagura_agent.membrane.leases import Broker, Lease, LeaseRequest, deliver
from kagura_agent.membrane.leases.broker import Budget
from kagura_agent.state import StateStore
from kagura_agent.units import format_duration

RecordOutcome = Literal["refused", "granted", "denied", "timeout", "failed"]
# Ask about the wall budget this long before it ends (a third of it, 10 s..5 min).
WALL_LEAD_MIN, WALL_LEAD_MAX = 10.0, 300.0
# Ask about a lease's budget this long before it fails closed: a third of the budget,
# 10 s..2 min (a 1-minute lease is asked about 20 s ahead, an hour's 2 min ahead).
LEASE_LEAD_MIN, LEASE_LEAD_MAX = 10.0, 120.0
# The container must hear about an approved extension before its own deadline fires.
ANSWER_MARGIN = 2.0
# Capability requests one run may make (each is shown and recorded); past it they are
# refused unshown and unrecorded, said once: an agent calling request_access in a loop
# neither floods the live view nor grows the state store without end.
MAX_REQUESTS = 100

MIGRATIONS = (
    """
    CREATE TABLE run_amendments (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        run_id TEXT NOT NULL,
        at TEXT NOT NULL,
        request TEXT NOT NULL,
        kind TEXT NOT NULL,
        name TEXT NOT NULL,
        reason TEXT NOT NULL,
        category TEXT NOT NULL,
        fingerprint TEXT NOT NULL,
        outcome TEXT NOT NULL,
        who TEXT NOT NULL,
        detail TEXT NOT NULL
    );
    CREATE INDEX run_amendments_run ON run_amendments (run_id);
    """,
)


def announce(live: LiveView) -> Callable[[Question], None]:
    """How a ChatAsker puts a question to the cockpit: an ``ask`` live event."""

    def put(question: Question) -> None:
        live.ask(
            {
                "request": question.request,
                "category": question.category,
                "fingerprint": question.fingerprint,
                "text": question.text,
                "timeout": question.timeout,
            }
        )

    return put


def amendments(store: StateStore, run_id: str) -> list[dict[str, Any]]:
    """The run's record of mid-run requests and extensions, oldest first."""
    store.migrate("amendments", MIGRATIONS)
    rows = store.conn.execute(
        "SELECT * FROM run_amendments WHERE run_id = ? ORDER BY id", (run_id,)
    ).fetchall()
    return [dict(row) for row in rows]


class Egress(Protocol):
    def reload(self, egress: dict[str, Any]) -> None: ...

    def limit_model_calls(self, turns: int | None) -> None: ...


class Channel(Protocol):
    async def send_credentials(self, lease: str, bundle: Any) -> None: ...

    async def revoke_credentials(self, lease: str) -> None: ...

    async def extend_wall(self, number: int, wall_seconds: float) -> tuple[bool, str]: ...

    @property
    def turn_sent(self) -> asyncio.Event: ...


@dataclass(frozen=True)
class GrantTerms:
    """How a run's mid-run questions are put (from apply's options): who answers, what
    amendments compile from, how long a question waits, and the least time an operator
    gets to answer a budget question."""

    asker: Asker
    amender: Amender
    timeout: float
    answer_floor: float = 30.0


@dataclass(frozen=True)
class Holdings:
    """What the run holds when its turn begins, that a grant works on: the lease broker,
    the egress proxy and its count of model calls, the leases inside the container and
    the brain's own at the proxy. A run without one (no proxy, a host run) refuses the
    grants that need it."""

    broker: Broker | None = None
    egress: Egress | None = None
    calls: ModelCalls | None = None
    leases: tuple[Lease, ...] = ()
    at_proxy: tuple[Lease, ...] = ()


class MidRun:
    """One run's mid-run grants, built when the run's turn is about to begin (apply's
    ``steps.grants``) from what the run holds then; the turn's channel joins it when it
    opens (``attach``). Until then a grant needing one is refused."""

    def __init__(
        self,
        *,
        store: StateStore,
        run_id: str,
        live: LiveView,
        clock: Clock,
        terms: GrantTerms,
        held: Holdings = Holdings(),
    ) -> None:
        self.store = store
        self.run_id = run_id
        self.live = live
        self.clock = clock
        self.asker = terms.asker
        self.amender = terms.amender
        self.timeout = terms.timeout
        # The least time an operator gets to answer a budget question (--answer-floor):
        # the question is asked that long before the budget ends (never before it starts).
        self.answer_floor = min(terms.answer_floor, terms.timeout)
        self.egress: Egress | None = held.egress
        self.broker: Broker | None = held.broker
        # The run's leases inside the container: credentials granted mid-run join them
        # (renewed, wiped and released with the rest).
        self.leases: list[Lease] = list(held.leases)
        # The brain's own credential, held by the proxy (apply/midrun/injected.py): asked about
        # like the rest, never delivered into the container.
        self.at_proxy: list[Lease] = list(held.at_proxy)
        self.channel: Channel | None = None
        self._numbers = itertools.count(1)
        self._one_at_a_time = asyncio.Lock()
        # (lease, budget seconds, renewals) asked about: once per budget, again once grown.
        self._lease_asked: set[tuple[str, int, int]] = set()
        # Every question to the operator passes here: the same one pending or approved is
        # not asked again, a denied category not again this run, the agent's are rate
        # limited (approvals/midrun.Questions). The run's sub-agents' questions too.
        self.questions = Questions()
        self._requests = 0
        # The brain's turns and dollars as the host counted them from its events.
        self.spent_turns = 0
        self.spent_usd = 0.0
        # Model calls counted from the proxy's log (when the proxy injects the brain's
        # key): the turn budget holds on the larger count.
        self.calls: ModelCalls | None = held.calls
        # What the run's sub-agents hold and used (apply/midrun/dispatch.py): what finished ones
        # used counts against this run's own turn and dollar budgets.
        self.children = Allotments()

    def attach(self, channel: Channel) -> None:
        """The turn's channel: credentials granted mid-run go over it, extensions too."""
        self.channel = channel

    def counted(self, turns: int | None, usd: float | None) -> None:
        """What the run's cost events say was spent so far (the host's own count)."""
        if turns is not None:
            self.spent_turns = max(self.spent_turns, turns)
        if usd is not None:
            self.spent_usd = max(self.spent_usd, usd)

    @property
    def model_calls(self) -> int | None:
        """Model calls counted at the proxy so far (None: this run's are not counted)."""
        return None if self.calls is None else self.calls.count

    def past_budget(self) -> str | None:
        """Why the brain may not go on: a turn or dollar budget in force is spent (turns:
        the larger of the reported turns and the model calls counted at the proxy, plus
        what its finished sub-agents used; dollars: reported, plus theirs).

        Asked at each tool call. The proxy's count passes the budget only past it: the
        tools of the last allowed call are that turn's own (the CLI runs them before it
        stops at --max-turns and asks for more), and a call past the budget is refused at
        the port and stops the brain there (``past_counted``)."""
        budget = self.plan["budget"]
        calls = self.model_calls or 0
        turns, usd = self.children.used
        theirs = f" ({turns} by its sub-agents)" if turns else ""
        if budget["turns"] and calls > self.spent_turns and calls + turns > budget["turns"]:
            return _counted(calls, budget["turns"]) + theirs
        if budget["turns"] and self.spent_turns + turns >= budget["turns"]:
            spent = self.spent_turns + turns
            return f"{spent} turns spent of a {budget['turns']}-turn budget{theirs}"
        if budget["cost_usd"] and self.spent_usd + usd >= budget["cost_usd"]:
            theirs = f" (${usd:.4f} by its sub-agents)" if usd else ""
            spent_usd = self.spent_usd + usd
            return f"${spent_usd:.4f} spent of a ${budget['cost_usd']:g} budget{theirs}"
        return None

    def past_counted(self) -> str | None:
        """Why the brain must stop whatever its engine says: the proxy counted as many
        model calls as the turn budget in force allows and refused the next one (or, from
        a proxy that did not cap them, more went through than it allows)."""
        limit, calls = self.plan["budget"]["turns"], self.model_calls or 0
        refused_at = None if self.calls is None else self.calls.refused_at
        tried_past = refused_at is not None and refused_at >= limit
        return _counted(calls, limit) if limit and (calls > limit or tried_past) else None

    @property
    def plan(self) -> Any:
        return self.amender.plan

    def _request_id(self) -> str:
        return f"m-{self.run_id.removeprefix('run-')[:12]}-{next(self._numbers)}"

    # --- capability requests (the channel's CapabilityServer) ---------------------------

    async def request(self, kind: str, name: str, reason: str) -> tuple[bool, str]:
        self._requests += 1
        if self._requests > MAX_REQUESTS:
            if self._requests == MAX_REQUESTS + 1:
                self.live.emit(RequestsCapped(MAX_REQUESTS))
            return False, f"refused: this run made the {MAX_REQUESTS} requests it may"
        request = self._request_id()
        # The brain wrote both, and may have written a credential it holds: scrubbed before
        # anyone is shown them (a terminal's prompt prints the question as is) or they are
        # stored.
        scrub = self.live.redactor.scrub_any_case
        name, reason = (
            scrub(neutralise(name, newlines=False)),
            scrub(neutralise(reason, newlines=False)),
        )
        self.live.emit(MidRunRequest(request, kind, name, reason))
        async with self._one_at_a_time:
            try:
                amendment = self.amender.capability(kind, name)
                self._can_apply(kind)
            except Refused as exc:
                why = str(exc)
                self._record(request, kind, name, reason, "refused", "manifests", why)
                self.live.emit(RequestAnswered(request, "refused", why))
                return False, f"nobody was asked, the operator's manifests do not allow it: {why}"
            question = self._question(
                request,
                amendment,
                f"The brain asks for {amendment.category} mid-run: {reason}",
                self.timeout,
            )
            try:
                answer = await self.questions.ask(self.asker, self.store, question, self.clock)
            except NotAsked as exc:
                why = str(exc)
                self._record(request, kind, name, reason, "refused", "kagura-agent", why)
                self.live.emit(RequestAnswered(request, "refused", why))
                return False, f"nobody was asked: {why}"
            if not answer.approved:
                return False, self._answered(request, kind, name, reason, amendment, answer)
            try:
                await self._apply(kind, amendment)
            except KaguraError as exc:
                why = f"approved, but it could not be put in force: {exc.message}"
                self._record(request, kind, name, reason, "failed", answer.who, why, amendment)
                self.live.emit(RequestAnswered(request, "failed", why))
                return False, why
            self.amender.accept(amendment)
            said = f"{amendment.category} {answer.said()}; in force now"
            self._record(request, kind, name, reason, "granted", answer.who, said, amendment)
            self.live.emit(RequestAnswered(request, "granted", said))
            return True, said

    def _can_apply(self, kind: str) -> None:
        if kind == "egress" and self.egress is None:
            raise Refused("this run has no egress proxy (it started with no egress allowed)")
        if kind == "credential" and (self.broker is None or self.channel is None):
            raise Refused("this run cannot take a credential now (no broker or channel)")

    async def _apply(self, kind: str, amendment: Amendment) -> None:
        if kind == "egress":
            assert self.egress is not None
            await asyncio.to_thread(self.egress.reload, dict(amendment.plan["egress"]))
            self.live.emit(ProxyReloaded(len(amendment.plan["egress"]["allow"])))
            return
        assert self.broker is not None and self.channel is not None
        [entry] = [c for c in amendment.plan["credentials"] if c["category"] == amendment.category]
        self.live.emit(Leasing(entry["provider"], entry["scope"]))
        request = LeaseRequest.from_plan({**entry, "class": "approved"})
        lease = await asyncio.to_thread(self.broker.acquire, request)
        await deliver(self.channel, lease)
        self.leases.append(lease)

    # --- budgets -----------------------------------------------------------------------

    async def watch_wall(self) -> None:
        """Ask to extend the wall budget before it ends; until cancelled (the turn ended)
        or an extension is refused, denied or unanswered (then the run stops at its end).
        Its clock starts when the turn is sent: an extension granted before would reach a
        container with no turn to extend."""
        loop = asyncio.get_running_loop()
        if self.channel is not None:
            await self.channel.turn_sent.wait()
        started = loop.time()
        while True:
            wall = self.plan["budget"]["wall_seconds"]
            if not wall:
                return
            lead = wall_lead(wall, self.answer_floor)
            await asyncio.sleep(max(started + wall - lead - loop.time(), 0.0))
            left = started + wall - loop.time()
            if not await self._extend_wall(wall, left):
                return

    async def _extend_wall(self, wall: int, left: float) -> bool:
        request = self._request_id()
        name, reason = (
            "wall_seconds",
            f"{format_duration(int(wall))} wall budget ends in {left:.0f}s",
        )
        async with self._one_at_a_time:
            try:
                amendment = self.amender.budget("wall_seconds", wall * 2)
            except Refused as exc:
                why = f"{exc}; the run stops when its wall budget runs out"
                self._record(request, "budget", name, reason, "refused", "manifests", why)
                self.live.emit(BudgetNotExtended("wall", why, request))
                return False
            new = amendment.plan["budget"]["wall_seconds"]
            question = self._question(
                request,
                amendment,
                f"The {reason}. Extend it to {format_duration(int(new))}? Silence stops the run.",
                max(min(self.timeout, left - ANSWER_MARGIN), 1.0),
            )
            answer = await self._ask_for_host(question)
            if not answer.approved:
                said = self._answered(request, "budget", name, reason, amendment, answer)
                self.live.emit(BudgetNotExtended("wall", said))
                return False
            assert self.channel is not None
            taken, why_not = await self.channel.extend_wall(next(self._numbers), float(new))
            if not taken:
                why = f"approved, but the container did not take the new deadline: {why_not}"
                self._record(request, "budget", name, reason, "failed", answer.who, why, amendment)
                self.live.emit(RequestAnswered(request, "failed", why))
                return False
            self.amender.accept_budget(amendment)
            said = f"wall budget extended to {format_duration(int(new))} ({answer.said()})"
            self._record(request, "budget", name, reason, "granted", answer.who, said, amendment)
            self.live.emit(RequestAnswered(request, "granted", said))
            return True

    async def extend_budget(
        self, limit: str, turns: int, cost_usd: float, reason: str
    ) -> dict[str, Any]:
        """The brain's CLI ran out of its turn or dollar budget (``limit``): ask to double
        it, cut to the Policy ceiling. The counts are the host's (never less than what the
        engine says it spent); the answer says what is left of each budget when granted."""
        request = self._request_id()
        # What is left is reckoned from the larger count (the events may still be on
        # their way); past_budget keeps to the events as they are seen, in order.
        theirs = self.children.used
        used = (
            max(self.spent_turns, turns, self.model_calls or 0) + theirs[0],
            max(self.spent_usd, cost_usd) + theirs[1],
        )
        reason = self.live.redactor.scrub_any_case(neutralise(reason, newlines=False))
        name, what = limit, BRAIN_BUDGETS.get(limit, limit)
        self.live.emit(BudgetRequest(request, what, reason))
        async with self._one_at_a_time:
            current = self.plan["budget"].get(limit) if limit in BRAIN_BUDGETS else None
            try:
                if not current:
                    raise Refused(f"this run has no {what} budget to extend")
                amendment = self.amender.budget(limit, current * 2)
                limits: Mapping[str, Any] = amendment.plan["budget"]
                new, left = limits[limit], _left(limits, *used)
                spent = [k for k, v in left.items() if v is not None and v <= 0]
                if spent:
                    raise Refused(f"its {BRAIN_BUDGETS[spent[0]]} budget is spent too")
            except Refused as exc:
                why = f"{exc}; the run stops"
                self._record(request, "budget", name, reason, "refused", "manifests", why)
                self.live.emit(BudgetNotExtended(what, why, request))
                return {"granted": False, "message": why}
            question = self._question(
                request,
                amendment,
                f"The brain ran out of its {what} budget ({_budget_shown(limit, current)};"
                f" {reason}). Extend it to {_budget_shown(limit, new)}? Silence stops the run.",
                self.timeout,
            )
            answer = await self._ask_for_host(question)
            if not answer.approved:
                said = self._answered(request, "budget", name, reason, amendment, answer)
                self.live.emit(BudgetNotExtended(what, said))
                return {"granted": False, "message": said}
            if limit == "turns" and self.egress is not None:
                # The key-injecting port caps the calls at the turn budget: it moves first.
                try:
                    await asyncio.to_thread(self.egress.limit_model_calls, int(new))
                except KaguraError as exc:
                    why = f"approved, but the proxy did not take the new cap: {exc.message}"
                    self._record(
                        request, "budget", name, reason, "failed", answer.who, why, amendment
                    )
                    self.live.emit(RequestAnswered(request, "failed", why))
                    return {"granted": False, "message": why}
            self.amender.accept_budget(amendment)
            said = f"{what} budget extended to {_budget_shown(limit, new)} ({answer.said()})"
            self._record(request, "budget", name, reason, "granted", answer.who, said, amendment)
            self.live.emit(RequestAnswered(request, "granted", said))
            return {"granted": True, "message": said, **left}

    async def watch_leases(self, poll_seconds: float = 5.0) -> None:
        """Ask to extend a lease's budget before it runs out (until cancelled)."""
        while True:
            await self.check_leases()
            await asyncio.sleep(poll_seconds)

    async def check_leases(self) -> None:
        """One pass: each lease (the container's, and the brain's at the proxy) that fails
        closed (its budget or its renewals spent; ``Lease.held_until``) within a third of
        its budget (10 s..2 min) is asked about, once per budget. Approved: the lease's
        budget grows by what the plan gave it (its seconds, its renewals + 1), to the
        ceiling, and the next lease is asked about again before that ends; refused, denied
        or unanswered: the keeper exhausts it at its end and the run stops."""
        for lease in [*self.leases, *self.at_proxy]:
            if lease.closed or lease.minted is None:
                continue
            asked = (lease.id, lease.budget.seconds, lease.budget.renewals)
            if asked in self._lease_asked:
                continue
            now = lease.broker.clock.now()
            left = (lease.held_until - now).total_seconds()
            if left > lease_lead(lease.budget.seconds, self.answer_floor):
                continue
            self._lease_asked.add(asked)
            await self._extend_lease(lease, left)

    async def _extend_lease(self, lease: Lease, left: float) -> None:
        request_id = self._request_id()
        category = lease.request.category
        reason = (
            f"the lease budget of {category} ({format_duration(lease.budget.seconds)},"
            f" {lease.budget.renewals} renewals, {lease.renewals_used} used) runs out in"
            f" {max(left, 0):.0f}s"
        )
        async with self._one_at_a_time:
            seconds = lease.budget.seconds + lease.request.budget_seconds
            renewals = lease.budget.renewals + lease.request.renewals + 1
            try:
                amendment = self.amender.lease_budget(category, seconds, renewals)
            except Refused as exc:
                why = f"{exc}; the run stops when the lease runs out"
                self._record(request_id, "budget", category, reason, "refused", "manifests", why)
                self.live.emit(BudgetNotExtended("lease", why, request_id))
                return
            [entry] = [c for c in amendment.plan["credentials"] if c["category"] == category]
            question = self._question(
                request_id,
                amendment,
                f"{reason[0].upper()}{reason[1:]}. Extend it to {entry['budget_seconds']}s"
                f" with {entry['renewals']} renewals? Silence stops the run.",
                max(min(self.timeout, left - ANSWER_MARGIN), 1.0),
            )
            answer = await self._ask_for_host(question)
            if not answer.approved:
                said = self._answered(request_id, "budget", category, reason, amendment, answer)
                self.live.emit(BudgetNotExtended("lease", said))
                return
            if lease.closed:
                why = "approved, but the lease had run out before the answer came"
                self._record(
                    request_id, "budget", category, reason, "failed", answer.who, why, amendment
                )
                self.live.emit(RequestAnswered(request_id, "failed", why))
                return
            lease.budget = Budget(int(entry["budget_seconds"]), int(entry["renewals"]))
            self.amender.accept_lease_budget(amendment, category)
            said = (
                f"lease budget of {category} extended to {lease.budget.seconds}s,"
                f" {lease.budget.renewals} renewals ({answer.said()})"
            )
            self._record(
                request_id, "budget", category, reason, "granted", answer.who, said, amendment
            )
            self.live.emit(RequestAnswered(request_id, "granted", said))

    # --- shared ------------------------------------------------------------------------

    async def _ask_for_host(self, question: Question) -> Answer:
        """A question apply raises itself (a budget running out): not counted against the
        agent's rate; a category denied before is denied again unasked."""
        try:
            return await self.questions.ask(
                self.asker, self.store, question, self.clock, limited=False
            )
        except NotAsked as exc:
            return Answer(False, "denied", "kagura-agent", "midrun", str(exc))

    def _question(self, request: str, amendment: Amendment, ask: str, timeout: float) -> Question:
        fp = amendment.plan["fingerprint"]
        text = (
            f"{ask}\nplan {fp[:19]}… would change:\n{amendment.diff_text()}\n"
            f"(denied if nobody answers within {timeout:.0f}s)"
        )
        return Question(request, amendment.category, fp, text, timeout)

    def _answered(
        self,
        request: str,
        kind: str,
        name: str,
        reason: str,
        amendment: Amendment,
        answer: Answer,
    ) -> str:
        said = answer.said()
        outcome: RecordOutcome = "timeout" if answer.outcome == "timeout" else "denied"
        self._record(request, kind, name, reason, outcome, answer.who, said, amendment)
        self.live.emit(RequestAnswered(request, outcome, said, amendment.category))
        return said

    def _record(
        self,
        request: str,
        kind: str,
        name: str,
        reason: str,
        outcome: RecordOutcome,
        who: str,
        detail: str,
        amendment: Amendment | None = None,
    ) -> None:
        category, fp = "", ""  # refused before an amended plan existed
        if amendment is not None:
            category, fp = amendment.category, amendment.plan["fingerprint"]
            detail = f"{detail}\n{amendment.diff_text()}"
        # What the brain chose (a name, a reason) may carry a credential it holds.
        scrub = self.live.redactor.scrub_any_case
        name, reason, detail = scrub(name), scrub(reason), scrub(detail)
        self.store.migrate("amendments", MIGRATIONS)
        with self.store.transaction() as conn:
            conn.execute(
                "INSERT INTO run_amendments (run_id, at, request, kind, name, reason, category,"
                " fingerprint, outcome, who, detail) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    self.run_id,
                    iso(self.clock.now()),
                    request,
                    kind,
                    name,
                    reason,
                    category,
                    fp,
                    outcome,
                    who,
                    detail,
                ),
            )


def wall_lead(wall_seconds: float, answer_floor: float = 0.0) -> float:
    """Seconds before the wall budget ends that its extension is asked about: a third of
    it (10 s..5 min), never less than the operator's answer floor, never before it starts
    (a 30 s budget with a 30 s floor is asked about at once: 28 s to answer, not 8)."""
    lead = min(max(wall_seconds / 3, WALL_LEAD_MIN), WALL_LEAD_MAX)
    return min(max(lead, answer_floor + ANSWER_MARGIN), max(wall_seconds, 0.0))


def lease_lead(budget_seconds: float, answer_floor: float = 0.0) -> float:
    """Seconds before a lease fails closed that its extension is asked about: a third of
    its budget (10 s..2 min), and never less than the operator's answer floor."""
    lead = min(max(budget_seconds / 3, LEASE_LEAD_MIN), LEASE_LEAD_MAX)
    return min(max(lead, answer_floor + ANSWER_MARGIN), max(budget_seconds, 0.0))


def _left(budget: Mapping[str, Any], turns: int, usd: float) -> dict[str, Any]:
    """What is left of each brain budget in ``budget`` after ``turns`` and ``usd`` (None:
    no limit)."""
    limit_turns, limit_usd = budget["turns"], budget["cost_usd"]
    return {
        "turns": None if not limit_turns else limit_turns - turns,
        "cost_usd": None if not limit_usd else round(limit_usd - usd, 6),
    }


def _counted(calls: int, limit: int) -> str:
    return f"{calls} model calls counted at the proxy of a {limit}-turn budget"


def _budget_shown(limit: str, value: float) -> str:
    return f"${value:g}" if limit == "cost_usd" else f"{value:g} turns"


__all__ = ["MIGRATIONS", "MidRun", "amendments"]
