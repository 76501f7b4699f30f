"""The reaper: runs of a runner whose heartbeat stopped are lost; their leases are revoked.

Every runner reaps for the whole team, so nothing waits for the dead host to return:

    procrastinate's stalled jobs (``doing``, their worker's heartbeat older than
    ``stalled_after`` or the worker pruned)
    → kagura_team_runs: queued/running → lost (one UPDATE: only one reaper wins a run)
    → the run's open rows in the state store's lease ledger revoked at their provider
      (Sweeper, forced: the owner pid is on another host and means nothing here)
    → a ``lost`` event for whoever follows the run (the cockpit, ``queue follow``)
    → the job finished as failed, never retried: a lost run is not applied a second
      time behind its own back; an operator queues it again.

The lease ledger is the state store's (``open_store()``): with a shared PostgreSQL state
store every runner sees every run's leases; with the embedded SQLite one a runner sees
only its own, and the event says how many it could revoke.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from kagura_agent.clock import SystemClock
from kagura_agent.membrane.leases import Sweeper
from kagura_agent.membrane.leases.ledger import Ledger
from kagura_agent.state import open_store
from kagura_agent.team.db import EVENTS_CHANNEL
from kagura_agent.team.queue import TASK_NAME

MARK_LOST = (
    "UPDATE kagura_team_runs SET status = 'lost', ended_at = now(), message = %(message)s"
    " WHERE job_id = %(job_id)s AND status IN ('queued', 'running')"
    " RETURNING run_id, runner"
)
STORE_EVENT = (
    "WITH stored AS (INSERT INTO kagura_team_events(run_id, item)"
    " VALUES (%(run_id)s, %(item)s) RETURNING run_id)"
    f" SELECT pg_notify('{EVENTS_CHANNEL}', run_id) AS sent FROM stored"
)


async def reap_forever(app: Any, me: str, every: float, stalled_after: float) -> None:
    """Reap every ``every`` seconds until cancelled; a failed pass is logged, not fatal."""
    while True:
        await asyncio.sleep(every)
        try:
            await reap_once(app, me, stalled_after)
        except Exception as exc:  # the next pass retries; the runner keeps working
            sys.stderr.write(f"runner {me}: reaper pass failed: {exc}\n")


async def reap_once(app: Any, me: str, stalled_after: float) -> list[str]:
    """One pass; returns the run ids this reaper marked lost."""
    from procrastinate import jobs

    stalled = await app.job_manager.get_stalled_jobs(
        task_name=TASK_NAME, seconds_since_heartbeat=stalled_after
    )
    lost = []
    for job in stalled:
        row = await app.connector.execute_query_one_async(
            MARK_LOST,
            job_id=job.id,
            message=f"lost: its runner stopped heartbeating for over {stalled_after:g}s",
        )
        if row is not None:
            revoked, found = await asyncio.to_thread(revoke_run_leases, row["run_id"])
            item = {
                "kind": "lost",
                "runner": row["runner"],
                "reaped_by": me,
                "leases_revoked": revoked,
                "leases_found": found,
                "message": (
                    f"run lost: runner {row['runner'] or '(none)'} stopped heartbeating;"
                    f" {revoked} of {found} open lease(s) revoked by runner {me}"
                ),
            }
            await app.connector.execute_query_one_async(
                STORE_EVENT, run_id=row["run_id"], item=item
            )
            sys.stderr.write(f"runner {me}: {row['run_id']} {item['message']}\n")
            lost.append(row["run_id"])
        try:
            await app.job_manager.finish_job(job, status=jobs.Status.FAILED, delete_job=False)
        except Exception:  # another reaper finished it first
            continue
    return lost


def revoke_run_leases(run_id: str) -> tuple[int, int]:
    """Revoke the open ledger rows of ``run_id``; (revoked, found)."""
    clock = SystemClock()
    with open_store() as store:
        rows = [row for row in Ledger(store, clock).open_rows() if row.run_id == run_id]
        sweeper = Sweeper(store, clock=clock)
        revoked = 0
        for row in rows:
            report = sweeper.sweep(only=row.id, force=True)
            revoked += len(report.revoked) + len(report.expired)
    return revoked, len(rows)
