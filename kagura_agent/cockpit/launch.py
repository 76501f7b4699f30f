"""From a chat intent to an approved session: ``plan`` shows a task's plan; ``launch``,
``run`` and ``continue`` compile one, save it and open a session; a plan that needs
approval is asked in the thread with Approve / Deny and a timer (silence denies). The
answer — in chat, or in the web console (settle_answered_elsewhere) — is recorded in the
approval log against the plan's fingerprint, and an approved session starts
(sessions.py)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from kagura_agent.apply.run.executor import ApplyOptions, refuse_unapplyable
from kagura_agent.approvals.log import Decision, Outcome, latest_decision
from kagura_agent.clock import iso, parse_iso
from kagura_agent.cockpit.desk import GRADUATION_PREFIX, Desk
from kagura_agent.cockpit.registry import Session, new_session_id
from kagura_agent.cockpit.sessions import Sessions
from kagura_agent.cockpit.transport import Event
from kagura_agent.errors import UsageError
from kagura_agent.hygiene import neutralise
from kagura_agent.manifest.adhoc import AdhocTask, write_adhoc_task
from kagura_agent.plan import planfile
from kagura_agent.plan.build import plan_tasks
from kagura_agent.plan.model import Plan
from kagura_agent.plan.render import render_text
from kagura_agent.state import StateStore
from kagura_agent.ui import Style


class Launcher:
    def __init__(self, desk: Desk, sessions: Sessions) -> None:
        self.desk = desk
        self.sessions = sessions

    # --- tasks ---------------------------------------------------------------------------

    def compile(self, task_path: str) -> Plan:
        plans = plan_tasks(self.desk.config.manifests, [task_path])
        if len(plans) != 1:
            raise UsageError(f"{task_path} holds {len(plans)} tasks; launch one task at a time")
        return plans[0]

    def brain_session(self, session_id: str) -> str:
        """The brain session of a `run` session, which `continue` resumes."""
        import yaml

        session = self.desk.registry.get(session_id)
        if session is None:
            raise UsageError(f"no session {session_id}")
        try:
            spec = yaml.safe_load(Path(session.task_path).read_text(encoding="utf-8"))["spec"]
        except (OSError, yaml.YAMLError, KeyError, TypeError) as exc:
            raise UsageError(f"cannot read the task of session {session_id}: {exc}") from None
        key = spec.get("session") if isinstance(spec, dict) else None
        if not key:
            raise UsageError(
                f"session {session_id} was a launch of a task file; only `run` sessions continue",
                hint="give the task a spec.session and launch it again to resume its brain",
            )
        return str(key)

    def adhoc_task(self, text: str, brain_session: str) -> Path:
        """A one-off task from chat text, exactly as `kagura-agent run "TEXT"` writes it:
        the default LLM brain, the text a value (never template source)."""
        config = self.desk.config
        task = AdhocTask(
            text, image=config.image, session=brain_session, project_root=config.project_root
        )
        return write_adhoc_task(task, manifests=config.manifests, clock=self.desk.clock)

    def plan(self, event: Event, task_path: str) -> None:
        self.desk.say(event.thread, render_text(self.compile(task_path), Style(False)).rstrip())

    def launch(self, event: Event, task_path: str) -> None:
        desk = self.desk
        plan = self.compile(task_path)
        refuse_unapplyable(plan, ApplyOptions())  # incl. host-runtime brains: never from chat
        root = os.path.realpath(plan["task"]["project_root"])
        needs = [a["category"] for a in plan["approvals"] if a["class"] == "needs-approval"]
        now = iso(desk.clock.now())
        session_id = new_session_id()
        session = Session(
            id=session_id,
            transport=event.transport,
            thread=event.thread,
            requested_by=event.user,
            task_path=str(Path(task_path).resolve()),
            task_name=plan["task"]["name"],
            fingerprint=plan["intent"],  # approvals bind to the plan's intent
            plan_path=str(desk.plans_dir / f"{session_id}.json"),
            needs=",".join(needs),
            state="awaiting-approval" if needs else "running",
            created_at=now,
            updated_at=now,
            asked_at=now if needs else None,
            root=root,
            brain_session=plan["task"].get("session") or None,
        )
        planfile.save(plan, Path(session.plan_path))
        desk.registry.add(session)
        desk.say(
            event.thread,
            f"session {session.id}: {session.task_name}\n"
            + render_text(plan, Style(False)).rstrip(),
        )
        if not needs:
            self.sessions.start(session)
            return
        reasons = {a["category"]: a["reason"] for a in plan["approvals"]}
        asked = "\n".join(f"  {c}: {reasons.get(c, '')}" for c in needs)
        timeout = desk.config.approval_timeout
        # The timer first: a request whose buttons never reached the chat still lapses.
        timer = threading.Timer(
            timeout, self.expire, args=(session.id, f"no answer within {timeout:g}s")
        )
        timer.daemon = True
        with desk.lock:
            desk.timers[session.id] = timer
        timer.start()
        desk.transport.ask(
            event.thread,
            neutralise(
                f"session {session.id} needs approval for plan {plan['intent'][:19]}…:\n{asked}\n"
                f"(denied if nobody answers within {timeout:g}s)"
            ),
            session.id,
        )

    # --- answers -------------------------------------------------------------------------

    def answer(self, event: Event, session_id: str, *, approved: bool) -> None:
        """An operator's Approve / Deny of a session's request, in chat."""
        desk = self.desk
        session = desk.registry.get(session_id)
        if session is None:
            desk.say(event.thread, f"no session {session_id}")
            return
        if session.state != "awaiting-approval":
            desk.say(event.thread, f"session {session_id} is {session.state}; nothing to answer")
            return
        state = "running" if approved else "denied"
        if not desk.registry.update(session_id, expect="awaiting-approval", state=state):
            desk.say(event.thread, f"session {session_id} was answered already")
            return
        desk.cancel_timer(session_id)
        who = f"{event.transport}:{event.user}"
        self._record(session, "approved" if approved else "denied", who, "answered in chat")
        if approved:
            desk.say(session.thread, f"session {session_id} approved by {who}; applying")
            self.sessions.start(session)
        else:
            desk.say(session.thread, f"session {session_id} denied by {who}; nothing ran")

    def settle_answered_elsewhere(self) -> None:
        """Sessions this cockpit asks about that were answered outside their chat (the web
        console: Registry.answer_elsewhere): the thread is told, an approved one starts."""
        desk = self.desk
        with desk.lock:
            waiting = [s for s in desk.timers if not s.startswith(GRADUATION_PREFIX)]
        for session_id in waiting:
            session = desk.registry.get(session_id)
            if session is None or session.state not in ("queued", "denied"):
                continue  # still waiting, or answered in chat (that path says so itself)
            decision = self._elsewhere(session)
            if decision is None:
                continue  # denied in chat or by its timer: not ours to announce
            with desk.lock:
                timer = desk.timers.pop(session_id, None)
            if timer is None:
                continue  # settled here meanwhile
            timer.cancel()
            where = f"{decision.who} in the {decision.via} console"
            if session.state == "denied":
                desk.say(session.thread, f"session {session_id} denied by {where}; nothing ran")
                continue
            desk.say(session.thread, f"session {session_id} approved by {where}; applying")
            self.sessions.start(session)

    def _elsewhere(self, session: Session) -> Decision | None:
        """The decision that answered ``session`` outside its chat, if one did."""
        if not session.categories or session.asked_at is None:
            return None
        with StateStore(self.desk.state) as store:
            decision = latest_decision(
                store,
                session.fingerprint,
                session.categories[0],
                since=parse_iso(session.asked_at),
                request=session.id,
            )
        return decision if decision is not None and decision.via != session.transport else None

    def expire(self, session_id: str, why: str) -> None:
        desk = self.desk
        with desk.lock:
            desk.timers.pop(session_id, None)
        session = desk.registry.get(session_id)
        if session is None or not desk.registry.update(
            session_id, expect="awaiting-approval", state="expired"
        ):
            return
        self._record(session, "timeout", "nobody", why)
        desk.say(session.thread, f"session {session_id}: {why}; denied, nothing ran")

    def _record(self, session: Session, outcome: Outcome, who: str, reason: str) -> None:
        self.desk.registry.record(session, outcome, who, session.transport, reason)
