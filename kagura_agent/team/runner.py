"""``kagura-agent runner``: one Docker host's worker for the team queue.

A procrastinate worker (heartbeat, LISTEN/NOTIFY, locks) on the queues this host can
honour, with ``concurrency`` runs at once. Each job is applied exactly as an operator's
shell would apply a saved plan — ``kagura-agent apply PLAN.json --json --run-id ID`` in a
child process with this runner's state directory — so the fingerprint and freshness
checks, approvals, project-root flock, leases and clean-up are apply's own. The child dies
with the runner (PR_SET_PDEATHSIG): a runner killed with ``kill -9`` behaves like a host
that vanished, and its reaping is the reaper's (reaper.py).

Before taking work the runner sweeps what its own earlier life left (containers and
networks of runs whose applying process is gone, orphaned leases): that is "swept when it
returns".
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kagura_agent.apply.records.runs import sweep_dead_runs
from kagura_agent.apply.run.docker import DockerApplyRuntime
from kagura_agent.clock import SystemClock, parse_iso
from kagura_agent.membrane.leases import Sweeper
from kagura_agent.membrane.runtime import connect as connect_docker
from kagura_agent.membrane.runtime import docker_errors
from kagura_agent.state import open_store, owner_key
from kagura_agent.team.children import WarmChildren
from kagura_agent.team.db import connect, ensure_schema, pg_errors
from kagura_agent.team.placement import Capacity
from kagura_agent.team.queue import TASK_NAME, make_app
from kagura_agent.team.reaper import STORE_EVENT, reap_forever


@dataclass(frozen=True)
class RunnerConfig:
    """One runner: its identity, its own state directory, capacity and timings."""

    name: str
    state_dir: Path
    capacity: Capacity
    heartbeat: float = 10.0  # seconds between worker heartbeats
    stalled_after: float = 30.0  # a runner silent this long is gone; its runs are lost
    poll: float = 5.0  # fetch fallback when a NOTIFY is missed


def log(config: RunnerConfig, message: str) -> None:
    sys.stderr.write(f"runner {config.name}: {message}\n")
    sys.stderr.flush()


def serve(url: str, config: RunnerConfig) -> int:
    """Run the runner until SIGTERM/SIGINT; returns its exit code."""
    # Everything this process and its applies open is this runner's own state.
    os.environ["KAGURA_AGENT_STATE_DIR"] = str(config.state_dir)
    config.state_dir.mkdir(parents=True, exist_ok=True)
    ensure_schema(url)
    sweep_own_leftovers(config)
    register(url, config)
    app = make_app(url)
    children = WarmChildren(config.capacity.concurrency)
    app.task(name=TASK_NAME, pass_context=True)(_task(config, children))
    queues = config.capacity.queues()
    log(config, f"taking {', '.join(queues)} ({config.capacity.concurrency} at once)")

    async def main() -> None:
        async with app.open_async():
            children.refill()
            reaper = asyncio.create_task(
                reap_forever(app, config.name, config.heartbeat, config.stalled_after)
            )
            try:
                await app.run_worker_async(
                    queues=queues,
                    name=config.name,
                    concurrency=config.capacity.concurrency,
                    update_heartbeat_interval=config.heartbeat,
                    stalled_worker_timeout=config.stalled_after,
                    fetch_job_polling_interval=config.poll,
                    install_signal_handlers=True,
                )
            finally:
                reaper.cancel()
                await children.close()

    with pg_errors("the runner's job engine"):
        asyncio.run(main())
    log(config, "stopped")
    return 0


def daemon_runtimes() -> list[str]:
    """The OCI runtimes this host's Docker daemon offers (``docker info`` Runtimes)."""
    client = connect_docker()
    try:
        with docker_errors("reading docker info"):
            return sorted(client.info().get("Runtimes") or {"runc": {}})
    finally:
        client.close()


def sweep_own_leftovers(config: RunnerConfig) -> None:
    """Containers, networks and leases an earlier life of this runner left behind."""
    clock = SystemClock()
    with open_store() as store:
        leases = Sweeper(store, clock=clock).sweep()
        runtime = DockerApplyRuntime(owner_key=owner_key(store.location))
        try:
            removed: list[str] = []
            swept = sweep_dead_runs(
                store,
                runtime,
                clock,
                # A dead run's root quarantined says so here (the runner's log), in full.
                lambda finding: log(config, finding.message),
                # A dead run's proxy: its log is salvaged before the run's containers go.
                before_removal=lambda: removed.extend(runtime.sweep_egress(store)),
            )
            removed += runtime.sweep_egress(store)
        finally:
            runtime.client.close()
    if swept or removed or leases.revoked:
        log(
            config,
            f"swept what an earlier life left: {len(swept)} run(s), {len(removed)} egress"
            f" object(s); leases: {leases.summary()}",
        )


def register(url: str, config: RunnerConfig) -> None:
    with connect(url) as conn:
        conn.execute(
            "INSERT INTO kagura_team_runners(name, host, pid, state_dir, concurrency, queues)"
            " VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (name) DO UPDATE SET"
            " host = excluded.host, pid = excluded.pid, state_dir = excluded.state_dir,"
            " concurrency = excluded.concurrency, queues = excluded.queues, started_at = now()",
            (
                config.name,
                socket.gethostname(),
                os.getpid(),
                str(config.state_dir),
                config.capacity.concurrency,
                config.capacity.queues(),
            ),
        )


def _task(config: RunnerConfig, children: WarmChildren) -> Callable[..., Any]:
    async def apply_queued(
        context: Any, run_id: str, plan: dict[str, Any], approve: list[str], approved_until: str
    ) -> int:
        return await apply_job(
            context.app, config, children, context.job.id, run_id, plan, approve, approved_until
        )

    return apply_queued


async def store_event(app: Any, run_id: str, item: dict[str, Any]) -> None:
    await app.connector.execute_query_one_async(STORE_EVENT, run_id=run_id, item=item)


async def apply_job(
    app: Any,
    config: RunnerConfig,
    children: WarmChildren,
    job_id: int,
    run_id: str,
    plan: dict[str, Any],
    approve: list[str],
    approved_until: str,
) -> int:
    """Claim the run, refuse it when its approval lapsed in the queue, else apply it."""
    db = app.connector
    claimed = await db.execute_query_one_async(
        "UPDATE kagura_team_runs SET status = 'running', runner = %(runner)s,"
        " started_at = now(), job_id = %(job_id)s WHERE run_id = %(run_id)s"
        " AND status = 'queued' RETURNING run_id",
        runner=config.name,
        job_id=job_id,
        run_id=run_id,
    )
    if claimed is None:
        # Lost, refused or already applied: a run is applied once, never twice.
        log(config, f"{run_id} is no longer queued; not applying it")
        return -1
    await store_event(
        app,
        run_id,
        {"kind": "runner", "runner": config.name, "message": f"taken by runner {config.name}"},
    )
    deadline = parse_iso(approved_until)
    if datetime.now(UTC) > deadline:
        message = f"refused: its approval expired while it was queued (at {approved_until})"
        await _finish(app, run_id, "refused", 6, message)
        log(config, f"{run_id} {message}")
        return 6
    folder = config.state_dir / "queued-plans"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{run_id}.json"
    path.write_text(json.dumps(plan))
    argv = ["apply", str(path), "--json", "--run-id", run_id]
    for category in approve:
        argv += ["--approve", category]
    log(config, f"applying {run_id} ({plan['task']['name']})")
    proc = await children.run(argv)
    assert proc.stdout is not None and proc.stderr is not None
    output = asyncio.gather(proc.stdout.read(), _relay(app, run_id, proc.stderr))
    try:
        out, _ = await asyncio.shield(output)
    except asyncio.CancelledError:
        # The job's abort was asked (``queue cancel``, kill from chat) or the runner is
        # shutting down: interrupt the apply as an operator's Ctrl-C would — it revokes
        # its leases and removes its containers — and record how it ended.
        log(config, f"{run_id}: stop asked; interrupting its apply")
        if proc.returncode is None:
            proc.send_signal(signal.SIGINT)
        out, _ = await output
        code = await proc.wait()
        await _finish(app, run_id, "killed", code, _message(out.decode(errors="replace")))
        path.unlink(missing_ok=True)
        raise
    code = await proc.wait()
    status = {0: "success", 6: "refused", 130: "killed"}.get(code, "failed")
    await _finish(app, run_id, status, code, _message(out.decode(errors="replace")))
    path.unlink(missing_ok=True)
    log(config, f"{run_id} {status} (exit {code})")
    return code


async def _relay(app: Any, run_id: str, stream: asyncio.StreamReader) -> None:
    """Each line apply prints on stderr becomes one stored event (JSON lines as they are)."""
    async for raw in stream:
        line = raw.decode(errors="replace").strip()
        if not line:
            continue
        try:
            item = json.loads(line)
        except ValueError:
            item = None
        if not isinstance(item, dict):
            item = {"kind": "log", "message": line}
        await store_event(app, run_id, item)


async def _finish(app: Any, run_id: str, status: str, code: int, message: str | None) -> None:
    # Only a running row ends here: a run the reaper already called lost stays lost.
    await app.connector.execute_query_one_async(
        "UPDATE kagura_team_runs SET status = %(status)s, exit_code = %(code)s,"
        " message = %(message)s, ended_at = now() WHERE run_id = %(run_id)s"
        " AND status = 'running' RETURNING run_id",
        status=status,
        code=code,
        message=message,
        run_id=run_id,
    )
    await store_event(
        app, run_id, {"kind": "end", "status": status, "exit_code": code, "message": message}
    )


def _message(stdout: str) -> str | None:
    """The first error of apply's ``--json`` result, if it printed one."""
    start = stdout.find("{")
    if start < 0:
        return None
    try:
        result = json.loads(stdout[start:])
    except ValueError:
        return None
    errors = result.get("errors") or []
    return str(errors[0].get("message")) if errors else None
