"""Queue a saved, approved plan for the team's runners, and read queued runs back.

``enqueue_plan`` is the one way in (``apply --queue``, the serve cockpit, a CI job):

    refuse what no runner may apply (membrane floor, not applyable, host runtime,
    a needs-approval capability nobody approved)
    → kagura_team_runs row (status queued, the run id chosen here, approval deadline)
    → procrastinate job on the plan's placement queue, locked on its project root

The lock is procrastinate's: no two jobs with the same lock run at once, on any runner,
and jobs of one root run in the order queued. The approval deadline travels with the
job: a runner that takes it after the deadline refuses it (status ``refused``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, cast

from kagura_agent.apply.records.runs import new_run_id
from kagura_agent.apply.run.context import ApplyOptions
from kagura_agent.apply.run.executor import refuse_unapplyable
from kagura_agent.clock import Clock, SystemClock
from kagura_agent.errors import RefusedError, UsageError
from kagura_agent.plan.model import Plan
from kagura_agent.team.db import EVENTS_CHANNEL, connect, ensure_schema, pg_errors
from kagura_agent.team.placement import queue_for

if TYPE_CHECKING:
    import procrastinate

TASK_NAME = "kagura.apply"
# A run ends success | failed | refused (exit 6, or its approval lapsed in the queue) |
# killed (stopped while applying: apply's SIGINT path) | cancelled (stopped before a runner
# took it: nothing ran) | lost (its runner stopped heartbeating; reaper.py).
TERMINAL = ("success", "failed", "refused", "killed", "cancelled", "lost")
DEFAULT_APPROVAL_TTL = 3600.0
# The events that close a run, each stored just after its final status (runner, reaper,
# cancel); ``follow`` waits up to CLOSING_WAIT seconds for it once the status is final.
CLOSING = ("end", "lost", "cancelled")
CLOSING_WAIT = 30.0


@dataclass(frozen=True)
class QueuedRun:
    """What ``enqueue_plan`` placed: the run id to follow, the job, queue and lock."""

    run_id: str
    job_id: int
    queue: str
    lock: str
    approved_until: datetime

    def to_json(self) -> dict[str, object]:
        return {
            "run_id": self.run_id,
            "job_id": self.job_id,
            "queue": self.queue,
            "lock": self.lock,
            "approved_until": self.approved_until.isoformat(),
        }


def make_app(url: str) -> procrastinate.App:
    """A procrastinate app on ``url`` (not opened)."""
    with pg_errors("the job engine"):
        import procrastinate

        return procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=url))


def root_lock(plan: Plan) -> str:
    return "kagura-root:" + plan["task"]["project_root"]


def check_queueable(plan: Plan, approve: Sequence[str]) -> None:
    """Refuse (exit 6) a plan no runner may apply; a usage error for a stray approval."""
    refuse_unapplyable(plan, ApplyOptions(approve=tuple(approve)))
    if plan["brain"]["runtime"] != "container":
        raise RefusedError("a queued plan must run its brain in a container (runtime: host)")
    needed = {a["category"] for a in plan["approvals"] if a["class"] == "needs-approval"}
    unknown = sorted(set(approve) - needed)
    if unknown:
        raise UsageError(f"--approve {', '.join(unknown)}: this plan does not ask for it")
    missing = sorted(needed - set(approve))
    if missing:
        raise RefusedError(
            f"this plan needs approval for {', '.join(missing)} before it is queued",
            hint="approve it now: " + " ".join(f"--approve {m}" for m in missing),
        )


def enqueue_plan(
    url: str,
    plan: Plan,
    *,
    approve: Sequence[str] = (),
    approval_ttl: float = DEFAULT_APPROVAL_TTL,
    who: str,
    clock: Clock | None = None,
) -> QueuedRun:
    """Queue ``plan`` (saved and approved) for the runners; see the module docstring."""
    check_queueable(plan, approve)
    now = (clock or SystemClock()).now()
    deadline = now + timedelta(seconds=approval_ttl)
    ensure_schema(url)
    run_id, queue, lock = new_run_id(), queue_for(plan), root_lock(plan)
    with connect(url) as conn:
        conn.execute(
            "INSERT INTO kagura_team_runs(run_id, task, fingerprint, project_root, queue,"
            " status, enqueued_by, enqueued_at, approved_until)"
            " VALUES (%s, %s, %s, %s, %s, 'queued', %s, %s, %s)",
            (
                run_id,
                plan["task"]["name"],
                plan["fingerprint"],
                plan["task"]["project_root"],
                queue,
                who,
                now,
                deadline,
            ),
        )
        app = make_app(url)
        with pg_errors("queueing the run"), app.open():
            job_id = app.configure_task(TASK_NAME, queue=queue, lock=lock).defer(
                run_id=run_id,
                plan=cast(dict[str, Any], plan),
                approve=list(approve),
                approved_until=deadline.isoformat(),
            )
        conn.execute("UPDATE kagura_team_runs SET job_id = %s WHERE run_id = %s", (job_id, run_id))
    return QueuedRun(run_id, job_id, queue, lock, deadline)


def runs(url: str, *, limit: int = 100) -> list[dict[str, Any]]:
    """The latest queued runs, newest first (as JSON-ready dicts)."""
    ensure_schema(url)
    with connect(url) as conn:
        rows = conn.execute(
            "SELECT run_id, job_id, task, queue, status, runner, exit_code, message,"
            " enqueued_by, enqueued_at, approved_until, started_at, ended_at"
            " FROM kagura_team_runs ORDER BY enqueued_at DESC LIMIT %s",
            (limit,),
        ).fetchall()
    return [{k: _plain(v) for k, v in row.items()} for row in rows]


def run(url: str, run_id: str) -> dict[str, Any]:
    """One queued run's row; a UsageError when there is none."""
    ensure_schema(url)
    with connect(url) as conn:
        row = conn.execute("SELECT * FROM kagura_team_runs WHERE run_id = %s", (run_id,)).fetchone()
    if row is None:
        raise UsageError(f"no queued run {run_id}")
    return {k: _plain(v) for k, v in row.items()}


def follow(
    url: str,
    run_id: str,
    *,
    timeout: float | None = None,
    stop: Callable[[], bool] | None = None,
) -> Iterator[dict[str, Any]]:
    """Yield the run's events (stored ones first, then as runners store them) until the
    run ends; the last item is ``{"kind": "status", ...}`` with its row. Woken by
    LISTEN/NOTIFY; ``timeout`` bounds the whole wait (None: until the run ends); ``stop``
    (checked at least every second) ends it early, without a status item."""
    run(url, run_id)
    deadline = None if timeout is None else SystemClock().now() + timedelta(seconds=timeout)
    seen = 0
    closed = False  # the event that ends the run was read (stored after its status)
    ended_at: float | None = None
    with connect(url) as conn:
        conn.execute(f"LISTEN {EVENTS_CHANNEL}")
        while True:
            rows = conn.execute(
                "SELECT seq, at, item FROM kagura_team_events WHERE run_id = %s AND seq > %s"
                " ORDER BY seq",
                (run_id, seen),
            ).fetchall()
            for row in rows:
                seen = row["seq"]
                closed = closed or row["item"].get("kind") in CLOSING
                yield {**row["item"], "at": row["at"].isoformat()}
            status = conn.execute(
                "SELECT * FROM kagura_team_runs WHERE run_id = %s", (run_id,)
            ).fetchone()
            if status is not None and status["status"] in TERMINAL and not rows:
                # Whoever ends a run sets its status, then stores its closing event (the
                # reaper after revoking the leases it reports): wait for that event,
                # within reason (a writer that died in between).
                ended_at = ended_at if ended_at is not None else time.monotonic()
                if closed or time.monotonic() - ended_at > CLOSING_WAIT:
                    yield {"kind": "status", **{k: _plain(v) for k, v in status.items()}}
                    return
            if deadline is not None and SystemClock().now() > deadline:
                raise UsageError(f"run {run_id} still {status and status['status']} at timeout")
            if stop is not None and stop():
                return
            _wait_notify(conn, 1.0)


def cancel(url: str, run_id: str, who: str) -> str:
    """Stop a queued run, whatever it is doing; returns what was done, in a sentence.

    Not yet taken by a runner: its job is cancelled in the queue (procrastinate: only a
    ``todo`` job is) and the run ends ``cancelled`` — nothing ran. Taken: the job's abort
    is requested; its runner cancels the job, which interrupts the apply (SIGINT: leases
    revoked, containers removed) and ends the run ``killed``. Ended: nothing to do.
    """
    row = run(url, run_id)
    if row["status"] in TERMINAL:
        return f"run {run_id} has ended already ({row['status']})"
    app = make_app(url)
    with pg_errors("cancelling the run"), app.open():
        if app.job_manager.cancel_job_by_id(row["job_id"], abort=False):
            ended = False
            with connect(url) as conn:
                ended = (
                    conn.execute(
                        "UPDATE kagura_team_runs SET status = 'cancelled', ended_at = now(),"
                        " message = %s WHERE run_id = %s AND status = 'queued' RETURNING run_id",
                        (f"cancelled by {who} before a runner took it", run_id),
                    ).fetchone()
                    is not None
                )
                said = f"run {run_id}: cancelled in the queue by {who}; nothing ran"
                if ended:
                    _store_event(conn, run_id, {"kind": "cancelled", "message": said})
            return said
        if app.job_manager.cancel_job_by_id(row["job_id"], abort=True):
            said = (
                f"run {run_id}: stop asked by {who}; runner {row['runner'] or '(taking it)'}"
                " interrupts its apply, which revokes its leases and removes its containers"
            )
            with connect(url) as conn:
                _store_event(conn, run_id, {"kind": "abort", "message": said})
            return said
    return f"run {run_id} is {run(url, run_id)['status']}; it cannot be stopped from here"


def _store_event(conn: Any, run_id: str, item: dict[str, Any]) -> None:
    from psycopg.types.json import Jsonb

    conn.execute(
        "INSERT INTO kagura_team_events(run_id, item) VALUES (%s, %s)", (run_id, Jsonb(item))
    )
    conn.execute("SELECT pg_notify(%s, %s)", (EVENTS_CHANNEL, run_id))


def _wait_notify(conn: Any, seconds: float) -> None:
    """Wait until a NOTIFY arrives on ``conn`` or ``seconds`` pass."""
    with pg_errors("waiting for events"):
        for _ in conn.notifies(timeout=seconds, stop_after=1):
            pass


def _plain(value: Any) -> Any:
    return value.isoformat() if isinstance(value, datetime) else value
