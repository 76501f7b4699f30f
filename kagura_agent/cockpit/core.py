"""The cockpit: chat in, the same plan → approve → apply path out.

It is a trusted host process. Only its operators (by transport user id) may plan,
launch, approve, deny or kill; anyone else gets a refusal and nothing happens. A launch
compiles the task's plan, saves it, and — when the plan needs approval — asks in the
thread with Approve / Deny buttons. The answer is recorded in the approval log against
that plan's fingerprint (who = "TRANSPORT:USER", via = the transport); silence past the
timeout is recorded as a timeout and denies. Then ``apply`` runs the saved plan as its own
process (cockpit/runner.py), accepting the approvals recorded since the request, and the
thread follows its progress. A plan that changed since it was shown is refused by apply
itself (the saved plan is checked against a fresh one).

Many sessions run at once. Two that write the same project root (or resume the same brain
session) never do: apply holds a lock on both, so the later one is queued, visibly
("queued behind s-…"), and starts when the earlier one ends. A running session can be
stopped from chat (``kill`` or its ❌ Stop button): apply's SIGINT path cleans up, and the
thread is told what was revoked and removed.

This module is the face: ``Cockpit`` takes each event, gates it on the operators and hands
the intent to the job that owns it — launch.py (plan, launch, approvals), sessions.py
(queue, run, follow, finish), control.py (kill, steer, mid-run answers), status.py and
graduations.py — all sharing one ``Desk`` (desk.py).
"""

from __future__ import annotations

import secrets
import sys
import threading
import traceback
from collections.abc import Sequence

from kagura_agent.clock import Clock, SystemClock
from kagura_agent.cockpit.control import Control
from kagura_agent.cockpit.desk import GRADUATION_PREFIX, CockpitConfig, Desk
from kagura_agent.cockpit.graduations import Graduations
from kagura_agent.cockpit.intents import HELP, Intent, classify
from kagura_agent.cockpit.launch import Launcher
from kagura_agent.cockpit.midrun import MIDRUN_PREFIX
from kagura_agent.cockpit.registry import Session
from kagura_agent.cockpit.runner import TeamRun
from kagura_agent.cockpit.sessions import Sessions
from kagura_agent.cockpit.status import status_text
from kagura_agent.cockpit.transport import Event, Transport
from kagura_agent.errors import KaguraError
from kagura_agent.graduation import Knobs

__all__ = ["Cockpit", "CockpitConfig"]

STOP_WAIT_SECONDS = 120.0
GRADUATION_RETRY_SECONDS = 2.0
# How often serve looks for its sessions answered outside their chat (the web console).
ANSWER_POLL_SECONDS = 1.0


class Cockpit:
    def __init__(
        self, transport: Transport, config: CockpitConfig, clock: Clock | None = None
    ) -> None:
        if not config.operators:
            raise KaguraError("the cockpit needs at least one operator")
        self.desk = desk = Desk(transport, config, clock or SystemClock())
        self.transport = transport
        self.config = config
        self.clock = desk.clock
        self.state = desk.state
        self.plans_dir = desk.plans_dir
        self.registry = desk.registry
        self.graduations = Graduations(desk)
        self.lifecycle = Sessions(desk, self.graduations)
        self.launcher = Launcher(desk, self.lifecycle)
        self.control = Control(desk, self.launcher)

    # --- lifecycle -----------------------------------------------------------------------

    def settle_previous(self) -> list[Session]:
        """Settle what a previous cockpit left open (sessions.py ``settle_previous``)."""
        return self.lifecycle.settle_previous()

    def serve(self) -> None:
        """Handle events until the transport stops; then interrupt and await every run.

        The standing graduation proposals are asked once the transport can post (a
        Gateway connects inside ``run``): tried every few seconds until they are out."""
        stopped = threading.Event()

        def ask_graduations() -> None:
            while not stopped.wait(GRADUATION_RETRY_SECONDS):
                if self.propose_graduations(None):
                    return

        def watch_answers() -> None:
            while not stopped.wait(ANSWER_POLL_SECONDS):
                try:
                    self.settle_answered_elsewhere()
                except Exception as exc:  # the next round tries again
                    print(f"cockpit: reading answers from the store: {exc}", file=sys.stderr)

        asker = threading.Thread(target=ask_graduations, name="cockpit-graduation", daemon=True)
        asker.start()
        watcher = threading.Thread(target=watch_answers, name="cockpit-answers", daemon=True)
        watcher.start()
        try:
            self.transport.run(self.handle)
        finally:
            stopped.set()
            self.shutdown()

    def shutdown(self) -> None:
        desk = self.desk
        with desk.lock:
            timers = list(desk.timers.items())
            desk.timers.clear()
            runs = list(desk.runs.values())
            queued, desk.queue = desk.queue, []
        for session_id, timer in timers:
            timer.cancel()
            if session_id.startswith(GRADUATION_PREFIX):
                self.graduations.expire(session_id, "the cockpit stopped before anyone answered")
            else:
                self.launcher.expire(session_id, "the cockpit stopped before anyone answered")
        for session in queued:
            if self.registry.update(session.id, expect="queued", state="cancelled"):
                desk.say(
                    session.thread,
                    f"session {session.id}: the cockpit stopped before it could start; nothing ran",
                )
        for run in runs:
            if isinstance(run, TeamRun):  # the runner's: the next cockpit follows it again
                run.detach()
            else:
                run.interrupt()
        for thread in list(desk.threads.values()):
            thread.join(STOP_WAIT_SECONDS)

    # --- events --------------------------------------------------------------------------

    def handle(self, event: Event) -> None:
        """One inbound event. Never raises: every outcome is an answer in the thread."""
        try:
            self._dispatch(event)
        except KaguraError as exc:
            self._say(event.thread, exc.render())
        except Exception:
            traceback.print_exc(file=sys.stderr)
            self._say(event.thread, "internal error (logged on the cockpit's host)")

    def _dispatch(self, event: Event) -> None:
        intent = classify(event)
        if intent.kind == "help":
            self._say(event.thread, HELP)
            return
        if intent.problem:
            running = self.desk.running_in(event.thread) if intent.kind == "unknown" else None
            if running is None:
                self._say(event.thread, f"{intent.problem}; say `help` for the commands")
                return
            # A reply in a running session's thread: a message for its brain.
            intent = Intent("say", f"{running} {event.text.strip()}")
        if event.user not in self.config.operators:
            self._say(event.thread, f"only this cockpit's operators may {intent.kind}; ignored")
            return
        launcher = self.launcher
        if intent.kind == "status":
            self._say(event.thread, status_text(self.desk))
        elif intent.kind == "plan":
            launcher.plan(event, intent.argument)
        elif intent.kind == "launch":
            launcher.launch(event, intent.argument)
        elif intent.kind == "run":
            key = f"chat-{secrets.token_hex(4)}"  # the brain session `continue` resumes
            launcher.launch(event, str(launcher.adhoc_task(intent.argument, key)))
        elif intent.kind == "continue":
            session_id, _, text = intent.argument.partition(" ")
            brain = launcher.brain_session(session_id)
            launcher.launch(event, str(launcher.adhoc_task(text, brain)))
        elif intent.kind in ("approve", "deny"):
            self._answer(event, intent.argument, approved=intent.kind == "approve")
        elif intent.kind == "kill":
            self.control.kill(event, intent.argument)
        elif intent.kind == "say":
            session_id, _, text = intent.argument.partition(" ")
            self.control.steer(event, session_id, text)

    def _answer(self, event: Event, request: str, *, approved: bool) -> None:
        """Approve / Deny, to whichever asked: a graduation proposal (g-…), a run's mid-run
        question (m-…) or a session's approval request (s-…)."""
        if request.startswith(GRADUATION_PREFIX):
            self.graduations.answer(event, request, approved=approved)
        elif request.startswith(MIDRUN_PREFIX):
            self.control.answer_midrun(event, request, approved=approved)
        else:
            self.launcher.answer(event, request, approved=approved)

    def _say(self, thread: str, text: str) -> None:
        self.desk.say(thread, text)

    # --- the jobs' public faces ----------------------------------------------------------

    def propose_graduations(self, thread: str | None) -> bool:
        """Post the standing graduation proposals not asked yet (graduations.py)."""
        return self.graduations.propose(thread)

    def settle_answered_elsewhere(self) -> None:
        """Tell the threads of sessions answered outside their chat (launch.py)."""
        self.launcher.settle_answered_elsewhere()

    def sessions(self) -> Sequence[Session]:
        return self.registry.recent()

    # What the graduation tests read: the knobs in force, the proposals asked, the timers.
    def _knobs(self) -> Knobs:
        return self.graduations.knobs()

    @property
    def _graduations(self) -> dict[str, tuple[str, str]]:
        return self.graduations.asked

    @property
    def _timers(self) -> dict[str, threading.Timer]:
        return self.desk.timers
