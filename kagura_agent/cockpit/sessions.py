"""An approved session's life: started now or queued behind the session it would fight
over apply's locks with, its apply run as its own process (or queued for the team's
runners), followed to its end with its output relayed to the thread, then finished —
its outcome recorded and said, with what a stopped run left behind — and the sessions
queued behind it started. A restarted cockpit settles what the previous one left open."""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from kagura_agent.clock import parse_iso
from kagura_agent.cockpit.desk import Desk, Run, usd
from kagura_agent.cockpit.graduations import Graduations
from kagura_agent.cockpit.registry import Session
from kagura_agent.cockpit.runner import (
    AdoptedRun,
    ApplyProcess,
    Feed,
    Progress,
    RunOutcome,
    TeamRun,
    apply_argv,
)
from kagura_agent.errors import KaguraError
from kagura_agent.hygiene import neutralise
from kagura_agent.membrane.hardening import LABEL_RUN
from kagura_agent.membrane.runtime import connect
from kagura_agent.paths import under
from kagura_agent.plan import planfile
from kagura_agent.processes import process_start
from kagura_agent.state import MissingTable, StateStore
from kagura_agent.team.queue import DEFAULT_APPROVAL_TTL, enqueue_plan


class Sessions:
    def __init__(self, desk: Desk, graduations: Graduations) -> None:
        self.desk = desk
        self.graduations = graduations  # a verified success is new evidence

    def settle_previous(self) -> list[Session]:
        """Settle what a previous cockpit left open. Its requests expire; a run whose apply
        still goes is adopted (followed to its end, killable); one whose apply is gone gets
        the outcome it recorded in the ``runs`` table, or is lost. Returns every session
        that was open."""
        desk = self.desk
        expired = desk.registry.expire_requests()
        left = [_with_keys(s) for s in desk.registry.open_sessions()]
        running = [s for s in left if s.state == "running"]
        queued = [s for s in left if s.state == "queued"]
        for session in running:
            if session.pid is None and session.run_id:  # queued for the team's runners
                if desk.config.queue_url is None:
                    desk.say(
                        session.thread,
                        f"session {session.id}: its run {session.run_id} is on the team queue;"
                        " this cockpit does not follow it (serve --queue does)",
                    )
                    continue
                with desk.lock:
                    desk.active[session.id] = session
                self._follow_team(session, session.run_id)
                desk.say(
                    session.thread,
                    f"session {session.id}: the cockpit restarted; still following run"
                    f" {session.run_id} on the team queue",
                )
                continue
            run = AdoptedRun(session.pid or 0, session.pid_start, desk.state)
            if session.pid is not None and run.alive():
                with desk.lock:
                    desk.active[session.id] = session
                self._follow_in_thread(session, run)
                desk.say(
                    session.thread,
                    f"session {session.id}: the cockpit restarted; still following its run"
                    " (its outcome follows when it ends)",
                )
            else:
                self._finish(session, run.outcome())
        for session in queued:  # approved, never started: they start (or queue) again
            desk.say(session.thread, f"session {session.id}: the cockpit restarted")
            self.start(session)
        return [*expired, *running, *queued]

    # --- start or queue ------------------------------------------------------------------

    def start(self, session: Session) -> None:
        """Run the session's apply now, or queue it behind the running (or earlier queued)
        session that writes the same project root or resumes the same brain session.
        In team mode it is queued for the team's runners instead (their queue holds the
        project root's lock across runners)."""
        desk = self.desk
        if desk.config.queue_url:
            with desk.lock:
                desk.active[session.id] = session
            self._enqueue(session, desk.config.queue_url)
            return
        with desk.lock:
            blocker = self._blocker(session)
            if blocker is None:
                desk.active[session.id] = session
            else:
                desk.queue.append(session)
                desk.behind[session.id] = blocker.id
        if blocker is None:
            self._run(session)
            return
        desk.registry.update(session.id, state="queued")
        if blocker.root == session.root:
            same = "the same project root"
        elif blocker.brain_session and blocker.brain_session == session.brain_session:
            same = "the same brain session"
        else:
            same = "a project root inside the other's"
        desk.say(
            session.thread,
            f"session {session.id}: queued behind {blocker.id} ({same}); it starts"
            f" when that one ends (`kill {session.id}` drops it)",
        )

    def _blocker(self, session: Session) -> Session | None:
        """(Under the lock.) The running or earlier queued session this one must wait for."""
        for other in [*self.desk.active.values(), *self.desk.queue]:
            if other.id != session.id and _conflict(other, session):
                return other
        return None

    def _release(self, session_id: str) -> None:
        """A session's apply ended: start the queued sessions nothing blocks any more."""
        desk = self.desk
        ready = []
        with desk.lock:
            desk.active.pop(session_id, None)
            waiting, desk.queue = desk.queue, []
            for session in waiting:
                blocker = self._blocker(session)
                if blocker is None:
                    desk.active[session.id] = session
                    desk.behind.pop(session.id, None)
                    ready.append(session)
                else:
                    desk.queue.append(session)
                    desk.behind[session.id] = blocker.id
        for session in ready:
            self._run(session)

    # --- run -----------------------------------------------------------------------------

    def _run(self, session: Session) -> None:
        desk = self.desk
        since = parse_iso(session.asked_at) if session.asked_at else None
        relay = desk.relay(session.thread)
        progress = Progress()
        try:
            run = ApplyProcess(
                apply_argv(Path(session.plan_path), since, desk.config.approval_timeout),
                relay,
                env=desk.config.env,
                feed=Feed(relay, progress, session.id, on_ask=self._asker(session)),
            )
        except OSError as exc:
            relay.close()
            desk.registry.update(session.id, state="failed")
            desk.say(session.thread, f"session {session.id}: apply could not start: {exc}")
            self._release(session.id)
            return
        desk.progress[session.id] = progress
        desk.registry.update(
            session.id, state="running", pid=run.pid, pid_start=process_start(run.pid)
        )
        self._follow_in_thread(session, run)
        desk.offer_stop(
            session,
            f"session {session.id} is running: ❌ Stop (or `kill {session.id}`) interrupts it;"
            " apply cleans up and exits 130",
        )

    def _asker(self, session: Session) -> Callable[[dict[str, Any]], None]:
        """A run's mid-run question (cockpit/midrun.py) → the thread, with Approve / Deny."""
        desk = self.desk

        def ask(item: dict[str, Any]) -> None:
            pending = desk.midrun.asked(session.id, session.thread, item)
            if pending is None:
                return
            try:
                text = f"session {session.id} asks ({pending.request}):\n{item.get('text', '')}"
                desk.transport.ask(session.thread, neutralise(text), pending.request)
            except Exception as exc:  # unanswered, it lapses: apply denies on its timeout
                print(f"cockpit: could not post to {session.thread}: {exc}", file=sys.stderr)

        return ask

    def _enqueue(self, session: Session, url: str) -> None:
        """Queue the session's saved plan, with the approvals given in chat, for the
        team's runners; then follow the run from the shared store."""
        desk = self.desk
        try:
            queued = enqueue_plan(
                url,
                planfile.load(Path(session.plan_path)),
                approve=session.categories,
                approval_ttl=DEFAULT_APPROVAL_TTL,  # as `apply --queue`: an hour to be taken
                who=f"{session.transport}:{session.requested_by}",
                clock=desk.clock,
            )
        except KaguraError as exc:
            desk.registry.update(session.id, state="failed")
            desk.say(session.thread, f"session {session.id}: not queued: {exc.render()}")
            self._release(session.id)
            return
        desk.registry.update(session.id, state="running", run_id=queued.run_id)
        self._follow_team(session, queued.run_id)
        desk.say(
            session.thread,
            f"session {session.id}: queued as run {queued.run_id} on {queued.queue} for the"
            " team's runners; its events follow here",
        )
        desk.offer_stop(
            session,
            f"session {session.id} is queued: ❌ Stop (or `kill {session.id}`) cancels it in the"
            " queue, or asks its runner to interrupt it",
        )

    # --- follow and finish ---------------------------------------------------------------

    def _follow_team(self, session: Session, run_id: str) -> None:
        desk = self.desk
        assert desk.config.queue_url is not None
        relay = desk.relay(session.thread)
        progress = Progress(phase="queued for a runner")
        desk.progress[session.id] = progress
        run = TeamRun(desk.config.queue_url, run_id, relay, Feed(relay, progress, session.id))
        self._follow_in_thread(session, run)

    def _follow_in_thread(self, session: Session, run: Run) -> None:
        thread = threading.Thread(
            target=self._follow, args=(session, run), name=f"cockpit-{session.id}", daemon=True
        )
        with self.desk.lock:
            self.desk.runs[session.id] = run
            self.desk.threads[session.id] = thread
        thread.start()

    def _follow(self, session: Session, run: Run) -> None:
        desk = self.desk
        try:
            outcome = run.wait()
        except Exception as exc:  # reading its output failed; the process is still its own
            outcome = RunOutcome(-1, None, f"error: {exc}", None)
        finally:
            with desk.lock:
                desk.runs.pop(session.id, None)
        if outcome.outcome == "detached":  # the cockpit stops; the run goes on elsewhere
            desk.progress.pop(session.id, None)
            with desk.lock:
                desk.active.pop(session.id, None)
            return
        try:
            self._finish(session, outcome)
        finally:
            desk.progress.pop(session.id, None)
            self._release(session.id)
        if outcome.exit_code == 0:  # a verified success is new evidence
            self.graduations.propose(session.thread)

    def _finish(self, session: Session, outcome: RunOutcome) -> None:
        desk = self.desk
        state = (
            outcome.outcome
            if outcome.outcome in ("lost", "cancelled")
            else _state_for(outcome.exit_code)
        )
        progress = desk.progress.get(session.id)
        cost = (
            outcome.cost_usd
            if outcome.cost_usd is not None
            else (progress.cost_usd if progress is not None else None)
        )
        desk.registry.update(
            session.id,
            state=state,
            run_id=outcome.run_id,
            exit_code=outcome.exit_code,
            cost_usd=cost,
        )
        took = f" in {outcome.wall_seconds:.1f}s" if outcome.wall_seconds is not None else ""
        run_text = f"run {outcome.run_id}" if outcome.run_id else "apply"
        spent = f", {usd(cost)}" if cost is not None else ""
        text = f"session {session.id}: {run_text} {state}{took}{spent} (exit {outcome.exit_code})"
        if state == "killed":
            stopped = desk.registry.get(session.id)
            who = stopped.stopped_by if stopped is not None and stopped.stopped_by else None
            text += f"; stopped by {who}" if who else "; interrupted"
            if outcome.run_id and outcome.note is None:
                text += "\n" + self._left_behind(outcome.run_id)
        if outcome.note:
            text += f"; {outcome.note}"
        desk.say(session.thread, text)

    def _left_behind(self, run_id: str) -> str:
        """What a stopped run's apply left: its leases (revoked or still open) and any
        container or network labelled with the run (checked, not assumed)."""

        leases = "leases: none"
        try:
            with StateStore(self.desk.state) as store:
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


def _state_for(exit_code: int) -> str:
    if exit_code == 0:
        return "succeeded"
    if exit_code in (130, 143):
        return "killed"
    return "failed"


def _conflict(a: Session, b: Session) -> bool:
    """Whether two sessions' applies would fight over apply's locks: the same brain
    session, or project roots one inside the other (apply/records/runs.py ``root_locks``)."""
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
