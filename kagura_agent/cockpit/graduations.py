"""Graduation proposals in chat: each standing proposal asked once (again only with more
evidence) in the operators' channel, with Approve / Deny; the answer, or silence past
the approval timeout, recorded in the approval log as ``kagura-agent graduation`` does."""

from __future__ import annotations

import secrets
import sys
import threading

from kagura_agent.approvals import Verdict, record_decision
from kagura_agent.cockpit.desk import GRADUATION_PREFIX, Desk
from kagura_agent.cockpit.transport import Event
from kagura_agent.errors import KaguraError
from kagura_agent.graduation import Knobs, approve_graduation, format_duration, proposals
from kagura_agent.graduation.settings import graduation_settings
from kagura_agent.hygiene import neutralise
from kagura_agent.manifest.workspace import load_workspace
from kagura_agent.state import StateStore


class Graduations:
    def __init__(self, desk: Desk) -> None:
        self.desk = desk
        # Proposals asked in chat: request id -> (category, where), and per category the
        # evidence count it was last asked with (asked again only with more evidence).
        self.asked: dict[str, tuple[str, str]] = {}
        self.asked_with: dict[str, int] = {}

    def propose(self, thread: str | None) -> bool:
        """Post each standing graduation proposal not asked yet (or asked with less
        evidence) to the operators' channel, with its evidence and Approve / Deny.
        Never raises; returns False when one could not be posted (it is not taken as
        asked, so the next call tries again)."""
        desk = self.desk
        where = desk.config.channel or thread
        if where is None:
            return True
        try:
            knobs = self.knobs()
            with StateStore(desk.state) as store:
                found = proposals(store, knobs)
        except Exception as exc:  # the run's outcome is posted already; say why, carry on
            desk.say(where, f"could not read graduation proposals: {exc}")
            return True
        timeout = desk.config.approval_timeout
        posted = True
        for status in found:
            with desk.lock:
                if self.asked_with.get(status.category, -1) >= status.successes:
                    continue
                if any(c == status.category for c, _ in self.asked.values()):
                    continue
                request = f"{GRADUATION_PREFIX}{secrets.token_hex(3)}"
                self.asked[request] = (status.category, where)
                self.asked_with[status.category] = status.successes
                timer = threading.Timer(
                    timeout,
                    self.expire,
                    args=(request, f"no answer within {timeout:g}s"),
                )
                timer.daemon = True
                desk.timers[request] = timer
            timer.start()
            span = format_duration(status.span)
            text = (
                f"graduation proposal {request}: {status.category} has earned it:"
                f" {status.successes} verified successes over {status.distinct_tasks}"
                f" distinct tasks in {span}, no failure since it was last reset.\n"
                "Approve graduates it: plans stop asking for it, as `kagura-agent graduation"
                " approve` does (recorded in the approval log); one failed run demotes it"
                f" again. Deny keeps it asking (nothing changes if nobody answers within"
                f" {timeout:g}s)."
            )
            try:
                desk.transport.ask(where, neutralise(text), request)
            except Exception as exc:  # not asked: forget it, so the next call asks again
                print(f"cockpit: could not post to {where}: {exc}", file=sys.stderr)
                timer.cancel()
                with desk.lock:
                    self.asked.pop(request, None)
                    desk.timers.pop(request, None)
                    self.asked_with.pop(status.category, None)
                posted = False
        return posted

    def knobs(self) -> Knobs:
        """The knobs the planner uses (a manifest raising the bar holds here too)."""
        return graduation_settings(load_workspace(self.desk.config.manifests, []).catalog).knobs

    def answer(self, event: Event, request: str, *, approved: bool) -> None:
        desk = self.desk
        with desk.lock:
            asked = self.asked.pop(request, None)
            timer = desk.timers.pop(request, None)
        if timer is not None:
            timer.cancel()
        if asked is None:
            desk.say(event.thread, f"no pending graduation proposal {request}")
            return
        category = asked[0]
        who = f"{event.transport}:{event.user}"
        with StateStore(desk.state) as store:
            if approved:
                try:
                    approve_graduation(
                        store,
                        category,
                        who=who,
                        clock=desk.clock,
                        knobs=self.knobs(),
                        via=event.transport,
                    )
                except KaguraError:
                    with desk.lock:  # it may be asked again once it stands again
                        self.asked_with.pop(category, None)
                    raise
            else:
                record_decision(
                    store,
                    Verdict(
                        category=category,
                        fingerprint=None,
                        outcome="denied",
                        who=who,
                        via=event.transport,
                        kind="graduation",
                        reason="graduation proposal denied in chat",
                    ),
                    clock=desk.clock,
                )
        if approved:
            desk.say(
                event.thread,
                f"{category} graduated by {who} ({request}); one failed run demotes it again",
            )
        else:
            desk.say(event.thread, f"{category} stays locked: denied by {who} ({request})")

    def expire(self, request: str, why: str) -> None:
        desk = self.desk
        with desk.lock:
            asked = self.asked.pop(request, None)
            desk.timers.pop(request, None)
        if asked is None:
            return
        category, where = asked
        with StateStore(desk.state) as store:
            record_decision(
                store,
                Verdict(
                    category=category,
                    fingerprint=None,
                    outcome="timeout",
                    who="nobody",
                    via=desk.transport.name,
                    kind="graduation",
                    reason=why,
                ),
                clock=desk.clock,
            )
        desk.say(where, f"graduation proposal {request} ({category}): {why}; it stays locked")
