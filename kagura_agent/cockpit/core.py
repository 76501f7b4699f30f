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
"""

from __future__ import annotations

import secrets
import sys
import threading
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kagura_agent.clock import Clock, SystemClock, iso, parse_iso
from kagura_agent.cockpit.intents import HELP, classify
from kagura_agent.cockpit.registry import Registry, Session, new_session_id
from kagura_agent.cockpit.runner import AdoptedRun, ApplyProcess, Relay, RunOutcome, apply_argv
from kagura_agent.cockpit.transport import Event, Transport
from kagura_agent.errors import KaguraError
from kagura_agent.hygiene import neutralise
from kagura_agent.manifest.adhoc import write_adhoc_task
from kagura_agent.plan.model import Plan
from kagura_agent.state import StateStore
from kagura_agent.state import state_path as default_state_path

STOP_WAIT_SECONDS = 120.0


@dataclass(frozen=True)
class CockpitConfig:
    operators: frozenset[str]
    manifests: str | None = None
    approval_timeout: float = 600.0
    # `run TEXT` tasks: their project root (default: the current directory) and image.
    project_root: Path | None = None
    image: str | None = None
    state_path: Path | None = None  # the state store (default: the state dir's)
    plans_dir: Path | None = None  # saved plans of sessions (default: beside the state store)
    env: dict[str, str] | None = field(default=None, repr=False)  # for apply (default: ours)


class Cockpit:
    def __init__(
        self, transport: Transport, config: CockpitConfig, clock: Clock | None = None
    ) -> None:
        if not config.operators:
            raise KaguraError("the cockpit needs at least one operator")
        self.transport = transport
        self.config = config
        self.clock = clock or SystemClock()
        state_path = config.state_path or default_state_path()
        self.state_path = state_path
        self.plans_dir = config.plans_dir or state_path.parent / "cockpit-plans"
        self.registry = Registry(state_path, self.clock)
        self._lock = threading.Lock()
        self._runs: dict[str, ApplyProcess | AdoptedRun] = {}
        self._threads: dict[str, threading.Thread] = {}
        self._timers: dict[str, threading.Timer] = {}

    # --- lifecycle -----------------------------------------------------------------------

    def settle_previous(self) -> list[Session]:
        """Settle what a previous cockpit left open. Its requests expire; a run whose apply
        still goes is adopted (followed to its end, killable); one whose apply is gone gets
        the outcome it recorded in the ``runs`` table, or is lost. Returns every session
        that was open."""
        expired = self.registry.expire_requests()
        running = [s for s in self.registry.open_sessions() if s.state == "running"]
        for session in running:
            run = AdoptedRun(session.pid or 0, session.pid_start, self.state_path)
            if session.pid is not None and run.alive():
                self._follow_in_thread(session, run)
                self._say(
                    session.thread,
                    f"session {session.id}: the cockpit restarted; still following its run"
                    " (its outcome follows when it ends)",
                )
            else:
                self._finish(session, run.outcome())
        return [*expired, *running]

    def serve(self) -> None:
        """Handle events until the transport stops; then interrupt and await every run."""
        try:
            self.transport.run(self.handle)
        finally:
            self.shutdown()

    def shutdown(self) -> None:
        with self._lock:
            timers = list(self._timers.items())
            self._timers.clear()
            runs = list(self._runs.values())
        for session_id, timer in timers:
            timer.cancel()
            self._expire(session_id, "the cockpit stopped before anyone answered")
        for run in runs:
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
            self._say(event.thread, f"{intent.problem}; say `help` for the commands")
            return
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

    def _say(self, thread: str, text: str) -> None:
        try:
            self.transport.say(thread, neutralise(text))
        except Exception as exc:  # the chat being down must not take the cockpit down
            print(f"cockpit: could not post to {thread}: {exc}", file=sys.stderr)

    # --- intents -------------------------------------------------------------------------

    def _compile(self, task_path: str) -> Plan:
        from kagura_agent.errors import UsageError
        from kagura_agent.plan.build import plan_tasks

        plans = plan_tasks(self.config.manifests, [task_path])
        if len(plans) != 1:
            raise UsageError(f"{task_path} holds {len(plans)} tasks; launch one task at a time")
        return plans[0]

    def _brain_session(self, session_id: str) -> str:
        """The brain session of a `run` session, which `continue` resumes."""
        import yaml

        from kagura_agent.errors import UsageError

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
        )

    def _plan(self, event: Event, task_path: str) -> None:
        from kagura_agent.plan.render import render_text
        from kagura_agent.ui import Style

        self._say(event.thread, render_text(self._compile(task_path), Style(False)).rstrip())

    def _launch(self, event: Event, task_path: str) -> None:
        from kagura_agent.apply.executor import ApplyOptions, refuse_unapplyable
        from kagura_agent.plan import planfile
        from kagura_agent.plan.render import render_text
        from kagura_agent.ui import Style

        plan = self._compile(task_path)
        refuse_unapplyable(plan, ApplyOptions())  # incl. host-runtime brains: never from chat
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
            fingerprint=plan["fingerprint"],
            plan_path=str(self.plans_dir / f"{session_id}.json"),
            needs=",".join(needs),
            state="awaiting-approval" if needs else "running",
            created_at=now,
            updated_at=now,
            asked_at=now if needs else None,
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
                f"session {session.id} needs approval for plan {plan['fingerprint'][:19]}…:\n{asked}\n"
                f"(denied if nobody answers within {timeout:g}s)"
            ),
            session.id,
        )

    def _answer(self, event: Event, session_id: str, *, approved: bool) -> None:
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

    def _record(self, session: Session, outcome: Any, who: str, reason: str) -> None:
        from kagura_agent.approvals import record_decision

        with StateStore(self.state_path) as store:
            for category in session.categories:
                record_decision(
                    store,
                    category=category,
                    fingerprint=session.fingerprint,
                    outcome=outcome,
                    who=who,
                    via=session.transport,
                    clock=self.clock,
                    reason=reason,
                )

    def _cancel_timer(self, session_id: str) -> None:
        with self._lock:
            timer = self._timers.pop(session_id, None)
        if timer is not None:
            timer.cancel()

    def _kill(self, event: Event, session_id: str) -> None:
        with self._lock:
            run = self._runs.get(session_id)
        if run is None:
            session = self.registry.get(session_id)
            state = session.state if session else "unknown"
            self._say(event.thread, f"session {session_id} is not running here ({state})")
            return
        run.interrupt()
        self._say(event.thread, f"interrupting session {session_id}; it cleans up, then stops")

    def _status(self, event: Event) -> None:
        sessions = self.registry.recent()
        if not sessions:
            self._say(event.thread, "no sessions yet")
            return
        lines = [
            f"{s.id}  {s.state:<17} {s.task_name:<20} {s.run_id or '-':<16} by {s.requested_by}"
            for s in sessions
        ]
        self._say(event.thread, "\n".join(lines))

    # --- runs ----------------------------------------------------------------------------

    def _start(self, session: Session) -> None:
        since = parse_iso(session.asked_at) if session.asked_at else None
        relay = Relay(lambda text: self._say(session.thread, text))
        try:
            run = ApplyProcess(
                apply_argv(Path(session.plan_path), since), relay, env=self.config.env
            )
        except OSError as exc:
            relay.close()
            self.registry.update(session.id, state="failed")
            self._say(session.thread, f"session {session.id}: apply could not start: {exc}")
            return
        from kagura_agent.membrane.leases.ledger import process_start

        self.registry.update(session.id, pid=run.pid, pid_start=process_start(run.pid))
        self._follow_in_thread(session, run)

    def _follow_in_thread(self, session: Session, run: ApplyProcess | AdoptedRun) -> None:
        thread = threading.Thread(
            target=self._follow, args=(session, run), name=f"cockpit-{session.id}", daemon=True
        )
        with self._lock:
            self._runs[session.id] = run
            self._threads[session.id] = thread
        thread.start()

    def _follow(self, session: Session, run: ApplyProcess | AdoptedRun) -> None:
        try:
            outcome = run.wait()
        except Exception as exc:  # reading its output failed; the process is still its own
            outcome = RunOutcome(-1, None, f"error: {exc}", None)
        finally:
            with self._lock:
                self._runs.pop(session.id, None)
        self._finish(session, outcome)

    def _finish(self, session: Session, outcome: RunOutcome) -> None:
        state = "lost" if outcome.outcome == "lost" else _state_for(outcome.exit_code)
        self.registry.update(
            session.id, state=state, run_id=outcome.run_id, exit_code=outcome.exit_code
        )
        took = f" in {outcome.wall_seconds:.1f}s" if outcome.wall_seconds is not None else ""
        run_text = f"run {outcome.run_id}" if outcome.run_id else "apply"
        self._say(
            session.thread,
            f"session {session.id}: {run_text} {state}{took} (exit {outcome.exit_code})",
        )

    def sessions(self) -> Sequence[Session]:
        return self.registry.recent()


def _state_for(exit_code: int) -> str:
    if exit_code == 0:
        return "succeeded"
    if exit_code in (130, 143):
        return "killed"
    return "failed"
