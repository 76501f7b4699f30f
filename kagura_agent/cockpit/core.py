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
"""

from __future__ import annotations

import json
import os
import secrets
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from kagura_agent.apply.executor import ApplyOptions, refuse_unapplyable
from kagura_agent.approvals import record_decision
from kagura_agent.approvals.log import Decision, Outcome, latest_decision
from kagura_agent.clock import Clock, SystemClock, iso, parse_iso
from kagura_agent.cockpit.intents import HELP, Intent, classify
from kagura_agent.cockpit.midrun import MIDRUN_PREFIX, MidRunDesk
from kagura_agent.cockpit.registry import Registry, Session, new_session_id
from kagura_agent.cockpit.runner import (
    AdoptedRun,
    ApplyProcess,
    Feed,
    Pacer,
    Progress,
    Relay,
    RunOutcome,
    TeamRun,
    apply_argv,
)
from kagura_agent.cockpit.transport import Event, Transport
from kagura_agent.errors import KaguraError, UsageError
from kagura_agent.graduation import Knobs, approve_graduation, format_duration, proposals
from kagura_agent.graduation.settings import graduation_settings
from kagura_agent.hygiene import neutralise
from kagura_agent.manifest.adhoc import write_adhoc_task
from kagura_agent.manifest.workspace import load_workspace
from kagura_agent.membrane.hardening import LABEL_RUN
from kagura_agent.membrane.runtime import connect
from kagura_agent.paths import state_dir, under
from kagura_agent.plan import planfile
from kagura_agent.plan.build import plan_tasks
from kagura_agent.plan.model import Plan
from kagura_agent.plan.render import render_text
from kagura_agent.processes import process_start
from kagura_agent.state import Location, MissingTable, StateStore, state_location
from kagura_agent.team.queue import DEFAULT_APPROVAL_TTL, enqueue_plan
from kagura_agent.ui import Style

STOP_WAIT_SECONDS = 120.0
GRADUATION_PREFIX = "g-"  # request ids of graduation proposals (sessions are s-…)
GRADUATION_RETRY_SECONDS = 2.0
# How often serve looks for its sessions answered outside their chat (the web console).
ANSWER_POLL_SECONDS = 1.0


@dataclass(frozen=True)
class CockpitConfig:
    operators: frozenset[str]
    manifests: str | None = None
    approval_timeout: float = 600.0
    # `run TEXT` tasks: their project root (default: the current directory) and image.
    project_root: Path | None = None
    image: str | None = None
    state: Location | None = None  # the state store (default: the configured one)
    plans_dir: Path | None = None  # saved plans of sessions (default: beside the state store)
    env: dict[str, str] | None = field(default=None, repr=False)  # for apply (default: ours)
    # The operators' channel (a thread id of the transport: "C0123OPS", "tty"): graduation
    # proposals go there; without one, to the thread of the run that made them eligible.
    channel: str | None = None
    # Team mode: the queue's PostgreSQL. An approved session is queued for the team's
    # runners (team/queue.enqueue_plan) instead of applied here, and followed from there.
    queue_url: str | None = None


class Cockpit:
    def __init__(
        self, transport: Transport, config: CockpitConfig, clock: Clock | None = None
    ) -> None:
        if not config.operators:
            raise KaguraError("the cockpit needs at least one operator")
        self.transport = transport
        self.config = config
        self.clock = clock or SystemClock()
        self.state = config.state or state_location()
        beside = self.state.parent if isinstance(self.state, Path) else state_dir()
        self.plans_dir = config.plans_dir or beside / "cockpit-plans"
        self.registry = Registry(self.state, self.clock)
        self._lock = threading.Lock()
        self._runs: dict[str, ApplyProcess | AdoptedRun | TeamRun] = {}
        self._threads: dict[str, threading.Thread] = {}
        self._timers: dict[str, threading.Timer] = {}
        # Sessions whose apply runs (started or adopted), and those queued behind them.
        self._active: dict[str, Session] = {}
        self._queue: list[Session] = []
        self._behind: dict[str, str] = {}  # queued session -> the one it waits for
        self._progress: dict[str, Progress] = {}
        self._pacer = Pacer(float(getattr(transport, "post_interval", 0.0)))
        # Graduation proposals asked in chat: request id -> category, and per category the
        # evidence count it was last asked with (asked again only with more evidence).
        self._graduations: dict[str, tuple[str, str]] = {}  # request -> (category, where)
        self._asked_graduation: dict[str, int] = {}
        self._midrun = MidRunDesk(self.state, self.clock)  # mid-run questions (m-…)

    # --- lifecycle -----------------------------------------------------------------------

    def settle_previous(self) -> list[Session]:
        """Settle what a previous cockpit left open. Its requests expire; a run whose apply
        still goes is adopted (followed to its end, killable); one whose apply is gone gets
        the outcome it recorded in the ``runs`` table, or is lost. Returns every session
        that was open."""
        expired = self.registry.expire_requests()
        left = [_with_keys(s) for s in self.registry.open_sessions()]
        running = [s for s in left if s.state == "running"]
        queued = [s for s in left if s.state == "queued"]
        for session in running:
            if session.pid is None and session.run_id:  # queued for the team's runners
                if self.config.queue_url is None:
                    self._say(
                        session.thread,
                        f"session {session.id}: its run {session.run_id} is on the team queue;"
                        " this cockpit does not follow it (serve --queue does)",
                    )
                    continue
                with self._lock:
                    self._active[session.id] = session
                self._follow_team(session, session.run_id)
                self._say(
                    session.thread,
                    f"session {session.id}: the cockpit restarted; still following run"
                    f" {session.run_id} on the team queue",
                )
                continue
            run = AdoptedRun(session.pid or 0, session.pid_start, self.state)
            if session.pid is not None and run.alive():
                with self._lock:
                    self._active[session.id] = session
                self._follow_in_thread(session, run)
                self._say(
                    session.thread,
                    f"session {session.id}: the cockpit restarted; still following its run"
                    " (its outcome follows when it ends)",
                )
            else:
                self._finish(session, run.outcome())
        for session in queued:  # approved, never started: they start (or queue) again
            self._say(session.thread, f"session {session.id}: the cockpit restarted")
            self._start(session)
        return [*expired, *running, *queued]

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
        with self._lock:
            timers = list(self._timers.items())
            self._timers.clear()
            runs = list(self._runs.values())
            queued, self._queue = self._queue, []
        for session_id, timer in timers:
            timer.cancel()
            if session_id.startswith(GRADUATION_PREFIX):
                self._expire_graduation(session_id, "the cockpit stopped before anyone answered")
            else:
                self._expire(session_id, "the cockpit stopped before anyone answered")
        for session in queued:
            if self.registry.update(session.id, expect="queued", state="cancelled"):
                self._say(
                    session.thread,
                    f"session {session.id}: the cockpit stopped before it could start; nothing ran",
                )
        for run in runs:
            if isinstance(run, TeamRun):  # the runner's: the next cockpit follows it again
                run.detach()
            else:
                run.interrupt()
        for thread in list(self._threads.values()):
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
            running = self._running_in(event.thread) if intent.kind == "unknown" else None
            if running is None:
                self._say(event.thread, f"{intent.problem}; say `help` for the commands")
                return
            # A reply in a running session's thread: a message for its brain.
            intent = Intent("say", f"{running} {event.text.strip()}")
        if event.user not in self.config.operators:
            self._say(event.thread, f"only this cockpit's operators may {intent.kind}; ignored")
            return
        if intent.kind == "status":
            self._status(event)
        elif intent.kind == "plan":
            self._plan(event, intent.argument)
        elif intent.kind == "launch":
            self._launch(event, intent.argument)
        elif intent.kind == "run":
            key = f"chat-{secrets.token_hex(4)}"  # the brain session `continue` resumes
            self._launch(event, str(self._adhoc_task(intent.argument, key)))
        elif intent.kind == "continue":
            session_id, _, text = intent.argument.partition(" ")
            self._launch(event, str(self._adhoc_task(text, self._brain_session(session_id))))
        elif intent.kind in ("approve", "deny"):
            self._answer(event, intent.argument, approved=intent.kind == "approve")
        elif intent.kind == "kill":
            self._kill(event, intent.argument)
        elif intent.kind == "say":
            session_id, _, text = intent.argument.partition(" ")
            self._steer(event, session_id, text)

    def _running_in(self, thread: str) -> str | None:
        """The session running (or queued) in ``thread``, if any."""
        with self._lock:
            found = [s.id for s in [*self._active.values(), *self._queue] if s.thread == thread]
        return found[-1] if found else None

    def _say(self, thread: str, text: str) -> None:
        try:
            self._pacer.note(_channel(thread))
            self.transport.say(thread, neutralise(text))
        except Exception as exc:  # the chat being down must not take the cockpit down
            print(f"cockpit: could not post to {thread}: {exc}", file=sys.stderr)

    def _attach(self, thread: str, filename: str, content: str, comment: str) -> None:
        """A long output, whole (a Relay calls this; errors reach its own handler)."""
        self.transport.attach(thread, filename, neutralise(content), neutralise(comment))

    # --- intents -------------------------------------------------------------------------

    def _compile(self, task_path: str) -> Plan:
        plans = plan_tasks(self.config.manifests, [task_path])
        if len(plans) != 1:
            raise UsageError(f"{task_path} holds {len(plans)} tasks; launch one task at a time")
        return plans[0]

    def _brain_session(self, session_id: str) -> str:
        """The brain session of a `run` session, which `continue` resumes."""
        import yaml

        session = self.registry.get(session_id)
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

    def _adhoc_task(self, text: str, brain_session: str) -> Path:
        """A one-off task from chat text, exactly as `kagura-agent run "TEXT"` writes it:
        the default LLM brain, the text a value (never template source)."""
        return write_adhoc_task(
            text,
            manifests=self.config.manifests,
            image=self.config.image,
            session=brain_session,
            project_root=self.config.project_root,
            clock=self.clock,
        )

    def _plan(self, event: Event, task_path: str) -> None:
        self._say(event.thread, render_text(self._compile(task_path), Style(False)).rstrip())

    def _launch(self, event: Event, task_path: str) -> None:
        plan = self._compile(task_path)
        refuse_unapplyable(plan, ApplyOptions())  # incl. host-runtime brains: never from chat
        root = os.path.realpath(plan["task"]["project_root"])
        needs = [a["category"] for a in plan["approvals"] if a["class"] == "needs-approval"]
        now = iso(self.clock.now())
        session_id = new_session_id()
        session = Session(
            id=session_id,
            transport=event.transport,
            thread=event.thread,
            requested_by=event.user,
            task_path=str(Path(task_path).resolve()),
            task_name=plan["task"]["name"],
            fingerprint=plan["intent"],  # approvals bind to the plan's intent
            plan_path=str(self.plans_dir / f"{session_id}.json"),
            needs=",".join(needs),
            state="awaiting-approval" if needs else "running",
            created_at=now,
            updated_at=now,
            asked_at=now if needs else None,
            root=root,
            brain_session=plan["task"].get("session") or None,
        )
        planfile.save(plan, Path(session.plan_path))
        self.registry.add(session)
        self._say(
            event.thread,
            f"session {session.id}: {session.task_name}\n"
            + render_text(plan, Style(False)).rstrip(),
        )
        if not needs:
            self._start(session)
            return
        reasons = {a["category"]: a["reason"] for a in plan["approvals"]}
        asked = "\n".join(f"  {c}: {reasons.get(c, '')}" for c in needs)
        timeout = self.config.approval_timeout
        # The timer first: a request whose buttons never reached the chat still lapses.
        timer = threading.Timer(
            timeout, self._expire, args=(session.id, f"no answer within {timeout:g}s")
        )
        timer.daemon = True
        with self._lock:
            self._timers[session.id] = timer
        timer.start()
        self.transport.ask(
            event.thread,
            neutralise(
                f"session {session.id} needs approval for plan {plan['intent'][:19]}…:\n{asked}\n"
                f"(denied if nobody answers within {timeout:g}s)"
            ),
            session.id,
        )

    def _answer(self, event: Event, session_id: str, *, approved: bool) -> None:
        if session_id.startswith(GRADUATION_PREFIX):
            self._answer_graduation(event, session_id, approved=approved)
            return
        if session_id.startswith(MIDRUN_PREFIX):
            self._answer_midrun(event, session_id, approved=approved)
            return
        session = self.registry.get(session_id)
        if session is None:
            self._say(event.thread, f"no session {session_id}")
            return
        if session.state != "awaiting-approval":
            self._say(event.thread, f"session {session_id} is {session.state}; nothing to answer")
            return
        state = "running" if approved else "denied"
        if not self.registry.update(session_id, expect="awaiting-approval", state=state):
            self._say(event.thread, f"session {session_id} was answered already")
            return
        self._cancel_timer(session_id)
        who = f"{event.transport}:{event.user}"
        self._record(session, "approved" if approved else "denied", who, "answered in chat")
        if approved:
            self._say(session.thread, f"session {session_id} approved by {who}; applying")
            self._start(session)
        else:
            self._say(session.thread, f"session {session_id} denied by {who}; nothing ran")

    def settle_answered_elsewhere(self) -> None:
        """Sessions this cockpit asks about that were answered outside their chat (the web
        console: Registry.answer_elsewhere): the thread is told, an approved one starts."""
        with self._lock:
            waiting = [s for s in self._timers if not s.startswith(GRADUATION_PREFIX)]
        for session_id in waiting:
            session = self.registry.get(session_id)
            if session is None or session.state not in ("queued", "denied"):
                continue  # still waiting, or answered in chat (that path says so itself)
            decision = self._elsewhere(session)
            if decision is None:
                continue  # denied in chat or by its timer: not ours to announce
            with self._lock:
                timer = self._timers.pop(session_id, None)
            if timer is None:
                continue  # settled here meanwhile
            timer.cancel()
            where = f"{decision.who} in the {decision.via} console"
            if session.state == "denied":
                self._say(session.thread, f"session {session_id} denied by {where}; nothing ran")
                continue
            self._say(session.thread, f"session {session_id} approved by {where}; applying")
            self._start(session)

    def _elsewhere(self, session: Session) -> Decision | None:
        """The decision that answered ``session`` outside its chat, if one did."""
        if not session.categories or session.asked_at is None:
            return None
        with StateStore(self.state) as store:
            decision = latest_decision(
                store,
                session.fingerprint,
                session.categories[0],
                since=parse_iso(session.asked_at),
                request=session.id,
            )
        return decision if decision is not None and decision.via != session.transport else None

    def _asker(self, session: Session) -> Callable[[dict[str, Any]], None]:
        """A run's mid-run question (cockpit/midrun.py) → the thread, with Approve / Deny."""

        def ask(item: dict[str, Any]) -> None:
            pending = self._midrun.asked(session.id, session.thread, item)
            if pending is None:
                return
            try:
                text = f"session {session.id} asks ({pending.request}):\n{item.get('text', '')}"
                self.transport.ask(session.thread, neutralise(text), pending.request)
            except Exception as exc:  # unanswered, it lapses: apply denies on its timeout
                print(f"cockpit: could not post to {session.thread}: {exc}", file=sys.stderr)

        return ask

    def _answer_midrun(self, event: Event, request: str, *, approved: bool) -> None:
        pending = {p.request: p for s in list(self._active) for p in self._midrun.open_for(s)}
        session = pending[request].session if request in pending else ""
        with self._lock:
            run = self._runs.get(session)
        said = self._midrun.answer(
            request,
            approved=approved,
            who=f"{event.transport}:{event.user}",
            via=event.transport,
            nudge=run.nudge if run is not None else (lambda _r: "its run has ended"),
        )
        self._say(pending[request].thread if request in pending else event.thread, said)

    def _expire(self, session_id: str, why: str) -> None:
        with self._lock:
            self._timers.pop(session_id, None)
        session = self.registry.get(session_id)
        if session is None or not self.registry.update(
            session_id, expect="awaiting-approval", state="expired"
        ):
            return
        self._record(session, "timeout", "nobody", why)
        self._say(session.thread, f"session {session_id}: {why}; denied, nothing ran")

    def _record(self, session: Session, outcome: Outcome, who: str, reason: str) -> None:
        self.registry.record(session, outcome, who, session.transport, reason)

    def _cancel_timer(self, session_id: str) -> None:
        with self._lock:
            timer = self._timers.pop(session_id, None)
        if timer is not None:
            timer.cancel()

    def _kill(self, event: Event, session_id: str) -> None:
        """Stop a session, whatever it is doing: a pending request is denied, a queued
        session dropped, a running apply interrupted (SIGINT: it revokes its leases and
        removes its containers, then exits 130; the thread is told what it left)."""
        who = f"{event.transport}:{event.user}"
        session = self.registry.get(session_id)
        if session is None:
            self._say(event.thread, f"no session {session_id}")
            return
        if session.state == "awaiting-approval":
            self._answer(event, session_id, approved=False)
            return
        with self._lock:
            run = self._runs.get(session_id)
            queued = next((s for s in self._queue if s.id == session_id), None)
            if queued is not None:
                self._queue.remove(queued)
                self._behind.pop(session_id, None)
        if queued is not None:
            self.registry.update(session_id, expect="queued", state="cancelled", stopped_by=who)
            self._say(
                session.thread,
                f"session {session_id}: dropped from the queue by {who}; nothing ran",
            )
            return
        if run is None:
            self._say(event.thread, f"session {session_id} is not running here ({session.state})")
            return
        self.registry.update(session_id, stopped_by=who)
        if isinstance(run, TeamRun):
            said = run.cancel(who)
            self._say(session.thread, f"session {session_id}: {said}")
            if event.thread != session.thread:
                self._say(event.thread, f"stopping session {session_id}; its thread follows it")
            return
        run.interrupt()
        self._say(
            session.thread,
            f"session {session_id}: stopping (asked by {who}); apply interrupts the run,"
            " revokes its leases and removes its containers",
        )
        if event.thread != session.thread:
            self._say(event.thread, f"stopping session {session_id}; its thread follows it")

    def _steer(self, event: Event, session_id: str, text: str) -> None:
        """Steering: ``text`` to the running session's apply, which hands it to the brain
        as its next user message where the engine takes one (the thread is told which)."""
        with self._lock:
            run = self._runs.get(session_id)
            session = self._active.get(session_id)
        if run is None or session is None:
            known = self.registry.get(session_id)
            state = known.state if known is not None else "unknown"
            self._say(event.thread, f"session {session_id} is not running here ({state})")
            return
        problem = run.steer(text)
        if problem is not None:
            self._say(event.thread, f"session {session_id}: the message was not sent: {problem}")
            return
        who = f"{event.transport}:{event.user}"
        self._say(session.thread, f"session {session_id}: message from {who} sent to its brain")

    def _status(self, event: Event) -> None:
        """Every open session (then the latest ended ones): state, age, cost so far, what
        it is doing (phase), waiting for (queued behind) or waiting on (approvals)."""
        sessions = self.registry.listing()
        if not sessions:
            self._say(event.thread, "no sessions yet")
            return
        now = self.clock.now()
        lines = []
        for s in sessions:
            progress = self._progress.get(s.id)
            cost = progress.cost_usd if progress is not None else s.cost_usd
            age = _age((now - parse_iso(s.created_at)).total_seconds())
            lines.append(
                f"{s.id}  {s.state:<17} {age:>5}  {_usd(cost):>8}  {s.task_name:<20}"
                f" {s.run_id or '-':<16} by {s.requested_by}"
            )
            if s.state == "running":
                if progress is not None:
                    since = _age(time.monotonic() - progress.since)
                    lines.append(f"    phase: {progress.phase} (for {since})")
                else:
                    lines.append("    phase: followed after a restart")
            elif s.state == "queued":
                lines.append(f"    queued behind {self._behind.get(s.id, 'a restart')}")
            elif s.state == "awaiting-approval":
                asked = parse_iso(s.asked_at or s.created_at)
                left = self.config.approval_timeout - (now - asked).total_seconds()
                lines.append(
                    f"    pending approval: {', '.join(s.categories)}"
                    f" (approve {s.id} | deny {s.id}; denied in {max(left, 0):.0f}s)"
                )
            for question in self._midrun.open_for(s.id):
                lines.append(
                    f"    asks mid-run: {question.category}"
                    f" (approve {question.request} | deny {question.request})"
                )
        self._say(event.thread, "\n".join(lines))

    # --- runs ----------------------------------------------------------------------------

    def _start(self, session: Session) -> None:
        """Run the session's apply now, or queue it behind the running (or earlier queued)
        session that writes the same project root or resumes the same brain session.
        In team mode it is queued for the team's runners instead (their queue holds the
        project root's lock across runners)."""
        if self.config.queue_url:
            with self._lock:
                self._active[session.id] = session
            self._enqueue(session, self.config.queue_url)
            return
        with self._lock:
            blocker = self._blocker(session)
            if blocker is None:
                self._active[session.id] = session
            else:
                self._queue.append(session)
                self._behind[session.id] = blocker.id
        if blocker is None:
            self._run(session)
            return
        self.registry.update(session.id, state="queued")
        if blocker.root == session.root:
            same = "the same project root"
        elif blocker.brain_session and blocker.brain_session == session.brain_session:
            same = "the same brain session"
        else:
            same = "a project root inside the other's"
        self._say(
            session.thread,
            f"session {session.id}: queued behind {blocker.id} ({same}); it starts"
            f" when that one ends (`kill {session.id}` drops it)",
        )

    def _blocker(self, session: Session) -> Session | None:
        """(Under the lock.) The running or earlier queued session this one must wait for."""
        for other in [*self._active.values(), *self._queue]:
            if other.id != session.id and _conflict(other, session):
                return other
        return None

    def _release(self, session_id: str) -> None:
        """A session's apply ended: start the queued sessions nothing blocks any more."""
        ready = []
        with self._lock:
            self._active.pop(session_id, None)
            waiting, self._queue = self._queue, []
            for session in waiting:
                blocker = self._blocker(session)
                if blocker is None:
                    self._active[session.id] = session
                    self._behind.pop(session.id, None)
                    ready.append(session)
                else:
                    self._queue.append(session)
                    self._behind[session.id] = blocker.id
        for session in ready:
            self._run(session)

    def _run(self, session: Session) -> None:
        since = parse_iso(session.asked_at) if session.asked_at else None
        thread = session.thread
        relay = Relay(
            lambda text: self._say(thread, text),
            attach=lambda name, content, comment: self._attach(thread, name, content, comment),
            max_chars=int(getattr(self.transport, "max_chars", 4000)),
            pacer=self._pacer,
            channel=_channel(thread),
        )
        progress = Progress()
        try:
            run = ApplyProcess(
                apply_argv(Path(session.plan_path), since, self.config.approval_timeout),
                relay,
                env=self.config.env,
                feed=Feed(relay, progress, session.id, on_ask=self._asker(session)),
            )
        except OSError as exc:
            relay.close()
            self.registry.update(session.id, state="failed")
            self._say(session.thread, f"session {session.id}: apply could not start: {exc}")
            self._release(session.id)
            return
        self._progress[session.id] = progress
        self.registry.update(
            session.id, state="running", pid=run.pid, pid_start=process_start(run.pid)
        )
        self._follow_in_thread(session, run)
        self._offer_stop(
            session,
            f"session {session.id} is running: ❌ Stop (or `kill {session.id}`) interrupts it;"
            " apply cleans up and exits 130",
        )

    def _offer_stop(self, session: Session, text: str) -> None:
        """Post ``text`` with the ❌ Stop button for ``session`` (kill still works by name
        when the post fails)."""
        try:
            self.transport.offer_stop(session.thread, neutralise(text), session.id)
        except Exception as exc:
            print(f"cockpit: could not post to {session.thread}: {exc}", file=sys.stderr)

    def _enqueue(self, session: Session, url: str) -> None:
        """Queue the session's saved plan, with the approvals given in chat, for the
        team's runners; then follow the run from the shared store."""
        try:
            queued = enqueue_plan(
                url,
                planfile.load(Path(session.plan_path)),
                approve=session.categories,
                approval_ttl=DEFAULT_APPROVAL_TTL,  # as `apply --queue`: an hour to be taken
                who=f"{session.transport}:{session.requested_by}",
                clock=self.clock,
            )
        except KaguraError as exc:
            self.registry.update(session.id, state="failed")
            self._say(session.thread, f"session {session.id}: not queued: {exc.render()}")
            self._release(session.id)
            return
        self.registry.update(session.id, state="running", run_id=queued.run_id)
        self._follow_team(session, queued.run_id)
        self._say(
            session.thread,
            f"session {session.id}: queued as run {queued.run_id} on {queued.queue} for the"
            " team's runners; its events follow here",
        )
        self._offer_stop(
            session,
            f"session {session.id} is queued: ❌ Stop (or `kill {session.id}`) cancels it in the"
            " queue, or asks its runner to interrupt it",
        )

    def _follow_team(self, session: Session, run_id: str) -> None:
        thread = session.thread
        assert self.config.queue_url is not None
        relay = Relay(
            lambda text: self._say(thread, text),
            attach=lambda name, content, comment: self._attach(thread, name, content, comment),
            max_chars=int(getattr(self.transport, "max_chars", 4000)),
            pacer=self._pacer,
            channel=_channel(thread),
        )
        progress = Progress(phase="queued for a runner")
        self._progress[session.id] = progress
        run = TeamRun(self.config.queue_url, run_id, relay, Feed(relay, progress, session.id))
        self._follow_in_thread(session, run)

    def _follow_in_thread(self, session: Session, run: ApplyProcess | AdoptedRun | TeamRun) -> None:
        thread = threading.Thread(
            target=self._follow, args=(session, run), name=f"cockpit-{session.id}", daemon=True
        )
        with self._lock:
            self._runs[session.id] = run
            self._threads[session.id] = thread
        thread.start()

    def _follow(self, session: Session, run: ApplyProcess | AdoptedRun | TeamRun) -> None:
        try:
            outcome = run.wait()
        except Exception as exc:  # reading its output failed; the process is still its own
            outcome = RunOutcome(-1, None, f"error: {exc}", None)
        finally:
            with self._lock:
                self._runs.pop(session.id, None)
        if outcome.outcome == "detached":  # the cockpit stops; the run goes on elsewhere
            self._progress.pop(session.id, None)
            with self._lock:
                self._active.pop(session.id, None)
            return
        try:
            self._finish(session, outcome)
        finally:
            self._progress.pop(session.id, None)
            self._release(session.id)
        if outcome.exit_code == 0:  # a verified success is new evidence
            self.propose_graduations(session.thread)

    def _finish(self, session: Session, outcome: RunOutcome) -> None:
        state = (
            outcome.outcome
            if outcome.outcome in ("lost", "cancelled")
            else _state_for(outcome.exit_code)
        )
        progress = self._progress.get(session.id)
        cost = (
            outcome.cost_usd
            if outcome.cost_usd is not None
            else (progress.cost_usd if progress is not None else None)
        )
        self.registry.update(
            session.id,
            state=state,
            run_id=outcome.run_id,
            exit_code=outcome.exit_code,
            cost_usd=cost,
        )
        took = f" in {outcome.wall_seconds:.1f}s" if outcome.wall_seconds is not None else ""
        run_text = f"run {outcome.run_id}" if outcome.run_id else "apply"
        spent = f", {_usd(cost)}" if cost is not None else ""
        text = f"session {session.id}: {run_text} {state}{took}{spent} (exit {outcome.exit_code})"
        if state == "killed":
            stopped = self.registry.get(session.id)
            who = stopped.stopped_by if stopped is not None and stopped.stopped_by else None
            text += f"; stopped by {who}" if who else "; interrupted"
            if outcome.run_id and outcome.note is None:
                text += "\n" + self._left_behind(outcome.run_id)
        if outcome.note:
            text += f"; {outcome.note}"
        self._say(session.thread, text)

    def _left_behind(self, run_id: str) -> str:
        """What a stopped run's apply left: its leases (revoked or still open) and any
        container or network labelled with the run (checked, not assumed)."""

        leases = "leases: none"
        try:
            with StateStore(self.state) as store:
                rows = store.conn.execute(
                    "SELECT state, closed_at FROM lease_grants WHERE run_id = ?", (run_id,)
                ).fetchall()
        except MissingTable:  # no lease table: the run never leased
            rows = []
        if rows:
            still = sum(1 for r in rows if r["closed_at"] is None)
            # Closed as lapsing: not revocable (STS), it works until its expiry.
            lapsing = sum(1 for r in rows if r["closed_at"] is not None and r["state"] == "lapsing")
            closed = len(rows) - still - lapsing
            lapses = f", {lapsing} not revocable (lapse at expiry)" if lapsing else ""
            leases = f"leases: {closed} revoked{lapses}" + (
                f", ⚠ {still} still open (the next apply's sweep revokes them)"
                if still
                else ", none open"
            )
        try:
            client = connect(timeout=15)
            label = f"{LABEL_RUN}={run_id}"
            found = [
                f"container {c.get('Names', ['?'])[0].lstrip('/')}"
                for c in client.api.containers(all=True, filters={"label": label})
            ]
            found += [f"network {n.name}" for n in client.networks.list(filters={"label": label})]
            volumes = client.api.volumes(filters={"label": label}).get("Volumes") or []
            found += [f"volume {v['Name']}" for v in volumes]
            client.close()
        except Exception as exc:  # Docker unreachable: say so rather than guess
            return f"{leases}; containers: could not check ({exc})"
        if found:
            return f"{leases}; ⚠ left: {', '.join(found)} (the next apply's sweep removes them)"
        return f"{leases}; containers, networks and volumes: none left"

    # --- graduation ----------------------------------------------------------------------

    def propose_graduations(self, thread: str | None) -> bool:
        """Post each standing graduation proposal not asked yet (or asked with less
        evidence) to the operators' channel, with its evidence and Approve / Deny.
        Never raises; returns False when one could not be posted (it is not taken as
        asked, so the next call tries again)."""
        where = self.config.channel or thread
        if where is None:
            return True
        try:
            knobs = self._knobs()
            with StateStore(self.state) as store:
                found = proposals(store, knobs)
        except Exception as exc:  # the run's outcome is posted already; say why, carry on
            self._say(where, f"could not read graduation proposals: {exc}")
            return True
        timeout = self.config.approval_timeout
        posted = True
        for status in found:
            with self._lock:
                if self._asked_graduation.get(status.category, -1) >= status.successes:
                    continue
                if any(c == status.category for c, _ in self._graduations.values()):
                    continue
                request = f"{GRADUATION_PREFIX}{secrets.token_hex(3)}"
                self._graduations[request] = (status.category, where)
                self._asked_graduation[status.category] = status.successes
                timer = threading.Timer(
                    timeout,
                    self._expire_graduation,
                    args=(request, f"no answer within {timeout:g}s"),
                )
                timer.daemon = True
                self._timers[request] = timer
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
                self.transport.ask(where, neutralise(text), request)
            except Exception as exc:  # not asked: forget it, so the next call asks again
                print(f"cockpit: could not post to {where}: {exc}", file=sys.stderr)
                timer.cancel()
                with self._lock:
                    self._graduations.pop(request, None)
                    self._timers.pop(request, None)
                    self._asked_graduation.pop(status.category, None)
                posted = False
        return posted

    def _knobs(self) -> Knobs:
        """The knobs the planner uses (a manifest raising the bar holds here too)."""
        return graduation_settings(load_workspace(self.config.manifests, []).catalog).knobs

    def _answer_graduation(self, event: Event, request: str, *, approved: bool) -> None:
        with self._lock:
            asked = self._graduations.pop(request, None)
            timer = self._timers.pop(request, None)
        if timer is not None:
            timer.cancel()
        if asked is None:
            self._say(event.thread, f"no pending graduation proposal {request}")
            return
        category = asked[0]
        who = f"{event.transport}:{event.user}"
        with StateStore(self.state) as store:
            if approved:
                try:
                    approve_graduation(
                        store,
                        category,
                        who=who,
                        clock=self.clock,
                        knobs=self._knobs(),
                        via=event.transport,
                    )
                except KaguraError:
                    with self._lock:  # it may be asked again once it stands again
                        self._asked_graduation.pop(category, None)
                    raise
            else:
                record_decision(
                    store,
                    category=category,
                    fingerprint=None,
                    outcome="denied",
                    who=who,
                    via=event.transport,
                    clock=self.clock,
                    kind="graduation",
                    reason="graduation proposal denied in chat",
                )
        if approved:
            self._say(
                event.thread,
                f"{category} graduated by {who} ({request}); one failed run demotes it again",
            )
        else:
            self._say(event.thread, f"{category} stays locked: denied by {who} ({request})")

    def _expire_graduation(self, request: str, why: str) -> None:
        with self._lock:
            asked = self._graduations.pop(request, None)
            self._timers.pop(request, None)
        if asked is None:
            return
        category, where = asked
        with StateStore(self.state) as store:
            record_decision(
                store,
                category=category,
                fingerprint=None,
                outcome="timeout",
                who="nobody",
                via=self.transport.name,
                clock=self.clock,
                kind="graduation",
                reason=why,
            )
        self._say(where, f"graduation proposal {request} ({category}): {why}; it stays locked")

    def sessions(self) -> Sequence[Session]:
        return self.registry.recent()


def _state_for(exit_code: int) -> str:
    if exit_code == 0:
        return "succeeded"
    if exit_code in (130, 143):
        return "killed"
    return "failed"


def _channel(thread: str) -> str:
    return thread.partition(":")[0]


def _conflict(a: Session, b: Session) -> bool:
    """Whether two sessions' applies would fight over apply's locks: the same brain
    session, or project roots one inside the other (apply/runs.py ``root_locks``)."""
    nested = bool(a.root and b.root and (under(a.root, b.root) or under(b.root, a.root)))
    return nested or bool(a.brain_session and a.brain_session == b.brain_session)


def _with_keys(session: Session) -> Session:
    """A session of an older cockpit, given its lock keys from its saved plan."""
    if session.root is not None:
        return session

    try:
        task = json.loads(Path(session.plan_path).read_text(encoding="utf-8"))["task"]
        root = os.path.realpath(task["project_root"])
    except (OSError, ValueError, KeyError, TypeError):
        return session
    return replace(session, root=root, brain_session=task.get("session") or None)


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{max(seconds, 0):.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.0f}h"


def _usd(cost: float | None) -> str:
    return "$-" if cost is None else f"${cost:.4f}"
