"""A session in flight, from chat: ``kill`` stops it whatever it is doing, ``say`` (or a
reply in its thread) steers its brain, and Approve / Deny answers a question its run
asked mid-run (cockpit/midrun.py)."""

from __future__ import annotations

from kagura_agent.cockpit.desk import Desk
from kagura_agent.cockpit.launch import Launcher
from kagura_agent.cockpit.runner import TeamRun
from kagura_agent.cockpit.transport import Event


class Control:
    def __init__(self, desk: Desk, launcher: Launcher) -> None:
        self.desk = desk
        self.launcher = launcher  # a pending request is killed by denying it

    def kill(self, event: Event, session_id: str) -> None:
        """Stop a session, whatever it is doing: a pending request is denied, a queued
        session dropped, a running apply interrupted (SIGINT: it revokes its leases and
        removes its containers, then exits 130; the thread is told what it left)."""
        desk = self.desk
        who = f"{event.transport}:{event.user}"
        session = desk.registry.get(session_id)
        if session is None:
            desk.say(event.thread, f"no session {session_id}")
            return
        if session.state == "awaiting-approval":
            self.launcher.answer(event, session_id, approved=False)
            return
        with desk.lock:
            run = desk.runs.get(session_id)
            queued = next((s for s in desk.queue if s.id == session_id), None)
            if queued is not None:
                desk.queue.remove(queued)
                desk.behind.pop(session_id, None)
        if queued is not None:
            desk.registry.update(session_id, expect="queued", state="cancelled", stopped_by=who)
            desk.say(
                session.thread,
                f"session {session_id}: dropped from the queue by {who}; nothing ran",
            )
            return
        if run is None:
            desk.say(event.thread, f"session {session_id} is not running here ({session.state})")
            return
        desk.registry.update(session_id, stopped_by=who)
        if isinstance(run, TeamRun):
            said = run.cancel(who)
            desk.say(session.thread, f"session {session_id}: {said}")
            if event.thread != session.thread:
                desk.say(event.thread, f"stopping session {session_id}; its thread follows it")
            return
        run.interrupt()
        desk.say(
            session.thread,
            f"session {session_id}: stopping (asked by {who}); apply interrupts the run,"
            " revokes its leases and removes its containers",
        )
        if event.thread != session.thread:
            desk.say(event.thread, f"stopping session {session_id}; its thread follows it")

    def steer(self, event: Event, session_id: str, text: str) -> None:
        """Steering: ``text`` to the running session's apply, which hands it to the brain
        as its next user message where the engine takes one (the thread is told which)."""
        desk = self.desk
        with desk.lock:
            run = desk.runs.get(session_id)
            session = desk.active.get(session_id)
        if run is None or session is None:
            known = desk.registry.get(session_id)
            state = known.state if known is not None else "unknown"
            desk.say(event.thread, f"session {session_id} is not running here ({state})")
            return
        problem = run.steer(text)
        if problem is not None:
            desk.say(event.thread, f"session {session_id}: the message was not sent: {problem}")
            return
        who = f"{event.transport}:{event.user}"
        desk.say(session.thread, f"session {session_id}: message from {who} sent to its brain")

    def answer_midrun(self, event: Event, request: str, *, approved: bool) -> None:
        desk = self.desk
        pending = {p.request: p for s in list(desk.active) for p in desk.midrun.open_for(s)}
        session = pending[request].session if request in pending else ""
        with desk.lock:
            run = desk.runs.get(session)
        said = desk.midrun.answer(
            request,
            approved=approved,
            who=f"{event.transport}:{event.user}",
            via=event.transport,
            nudge=run.nudge if run is not None else (lambda _r: "its run has ended"),
        )
        desk.say(pending[request].thread if request in pending else event.thread, said)
