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

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, cast

from kagura_agent.apply.context import ApplyOptions
from kagura_agent.apply.executor import refuse_unapplyable
from kagura_agent.apply.runs import new_run_id
from kagura_agent.clock import Clock, SystemClock
from kagura_agent.errors import RefusedError, UsageError
from kagura_agent.plan.model import Plan
from kagura_agent.team.db import EVENTS_CHANNEL, connect, ensure_schema, pg_errors
from kagura_agent.team.placement import queue_for

if TYPE_CHECKING:
    import procrastinate

TASK_NAME = "kagura.apply"
TERMINAL = ("success", "failed", "refused", "lost")
DEFAULT_APPROVAL_TTL = 3600.0


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


def follow(url: str, run_id: str, *, timeout: float | None = None) -> Iterator[dict[str, Any]]:
    """Yield the run's events (stored ones first, then as runners store them) until the
    run ends; the last item is ``{"kind": "status", ...}`` with its row. Woken by
    LISTEN/NOTIFY; ``timeout`` bounds the whole wait (None: until the run ends)."""
    run(url, run_id)
    deadline = None if timeout is None else SystemClock().now() + timedelta(seconds=timeout)
    seen = 0
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
                yield {**row["item"], "at": row["at"].isoformat()}
            status = conn.execute(
                "SELECT * FROM kagura_team_runs WHERE run_id = %s", (run_id,)
            ).fetchone()
            if status is not None and status["status"] in TERMINAL and not rows:
                yield {"kind": "status", **{k: _plain(v) for k, v in status.items()}}
                return
            if deadline is not None and SystemClock().now() > deadline:
                raise UsageError(f"run {run_id} still {status and status['status']} at timeout")
            _wait_notify(conn, 1.0)


def _wait_notify(conn: Any, seconds: float) -> None:
    """Wait until a NOTIFY arrives on ``conn`` or ``seconds`` pass."""
    with pg_errors("waiting for events"):
        for _ in conn.notifies(timeout=seconds, stop_after=1):
            pass


def _plain(value: Any) -> Any:
    return value.isoformat() if isinstance(value, datetime) else value
