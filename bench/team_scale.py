"""Team scale: queued runs through procrastinate and ``kagura-agent runner`` processes.

    python bench/team_scale.py [--latency-runs 12] [--sleep 60] [--slots 3] [--concurrency 2]

Starts its own PostgreSQL (scripts/postgres-up.sh) and real runners, each with its own
name and state directory, all on this machine's Docker. Two measurements in one run:

- latency: 3 runners idle and listening; ``--latency-runs`` runs are queued one at a time
  (each after the last one's container started). Latency is enqueue → the runner's
  "starting container" phase (the container is created and started right after), both
  stamped by PostgreSQL's clock; also shown: enqueue → taken by a runner, and enqueue →
  the brain's first event from inside the container.
- throughput on I/O-bound tasks (a step that sleeps ``--sleep`` s): ``--slots`` runs per
  run slot, all queued at once, with 1 runner and then 3 (each ``--concurrency`` runs at
  once); runs/minute = runs / (last end - first enqueue). speedup_3 = 3-runner rate / 1.

Prints ``RESULT team_scale p50_ms=… p95_ms=… speedup_3=… rpm_1=… rpm_3=… cores=…``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kagura_agent.plan.build import plan_tasks
from kagura_agent.plan.model import Plan
from kagura_agent.team import queue
from kagura_agent.team.db import connect, ensure_schema
from testing.pg_server import postgres

REPO = Path(__file__).resolve().parent.parent
AGENT_UID = 1000


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def make_plans(base: Path, prefix: str, count: int, steps: list[str]) -> list[Plan]:
    """``count`` plans, each its own project root and task name (no lock between them)."""
    manifests = base / "manifests"
    if not manifests.exists():
        shutil.copytree(REPO / "manifests", manifests)
    plans = []
    for index in range(count):
        root = base / f"{prefix}{index:03d}"
        root.mkdir(parents=True)
        if os.geteuid() == 0:
            os.chown(root, AGENT_UID, AGENT_UID)
        else:
            root.chmod(0o777)
        task = root / "task.yml"
        spec = {"steps": steps}
        document = {"apiVersion": "kagura.dev/v1", "kind": "Task"}
        task.write_text(
            yaml.safe_dump({**document, "metadata": {"name": f"{prefix}{index:03d}"}, "spec": spec})
        )
        # One task per plan: a plan binds every task file it was planned with.
        plans += plan_tasks(str(manifests), [str(task)])
    return plans


@contextmanager
def runner_processes(base: Path, url: str, names: list[str], concurrency: int) -> Iterator[None]:
    procs = []
    env = {**os.environ, "KAGURA_AGENT_QUEUE_URL": url, "NO_COLOR": "1"}
    try:
        for name in names:
            log = open(base / f"{name}.log", "ab")  # noqa: SIM115 - closed below
            argv = [sys.executable, "-m", "kagura_agent", "runner", "--name", name]
            argv += ["--state-dir", str(base / "runners" / name)]
            argv += ["--concurrency", str(concurrency), "--heartbeat", "2", "--stalled-after", "10"]
            procs.append((subprocess.Popen(argv, env=env, cwd=REPO, stdout=log, stderr=log), log))
        deadline = time.monotonic() + 60
        while _registered(url) < len(names):
            assert time.monotonic() < deadline, "runners did not register"
            time.sleep(0.2)
        yield
    finally:
        for proc, _ in procs:
            proc.send_signal(signal.SIGTERM)
        for proc, log in procs:
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
            log.close()
        with connect(url) as conn:
            conn.execute("DELETE FROM kagura_team_runners")


def _logs(base: Path) -> str:
    """The last lines of each runner's log."""
    return "".join(
        f"== {log.name}\n" + "".join(log.read_text(errors="replace").splitlines(True)[-15:])
        for log in sorted(base.glob("*.log"))
    )


def _registered(url: str) -> int:
    with connect(url) as conn:
        row = conn.execute("SELECT count(*) AS n FROM kagura_team_runners").fetchone()
    return int(row["n"]) if row else 0


def _event_at(url: str, run_id: str, where: str) -> datetime | None:
    with connect(url) as conn:
        row = conn.execute(
            "SELECT min(at) AS at FROM kagura_team_events WHERE run_id = %s AND " + where,
            (run_id,),
        ).fetchone()
    return row["at"] if row else None


STARTING = "item->>'message' LIKE 'starting container from%%'"
TAKEN = "item->>'kind' = 'runner'"
BRAIN = "item->>'kind' = 'brain'"


def _wait_ended(url: str, run_ids: list[str], timeout: float) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while True:
        rows = [queue.run(url, run_id) for run_id in run_ids]
        if all(r["status"] in queue.TERMINAL for r in rows):
            return rows
        assert time.monotonic() < deadline, "runs did not end"
        time.sleep(0.5)


def latency(base: Path, url: str, count: int, concurrency: int) -> list[float]:
    plans = make_plans(base, "lat", count, ["true"])
    starts, taken, brain = [], [], []
    with runner_processes(base, url, ["lat-a", "lat-b", "lat-c"], concurrency):
        time.sleep(1.0)
        for plan in plans:
            queued = queue.enqueue_plan(url, plan, who="bench")
            enqueued = queue.run(url, queued.run_id)["enqueued_at"]
            deadline = time.monotonic() + 120
            while (at := _event_at(url, queued.run_id, STARTING)) is None:
                if time.monotonic() > deadline:
                    raise SystemExit(
                        f"{queued.run_id} never started a container"
                        f" ({queue.run(url, queued.run_id)['message']}); the runners said:\n"
                        + _logs(base)
                    )
                time.sleep(0.02)
            start = datetime.fromisoformat(enqueued)
            starts.append((at - start).total_seconds() * 1000)
            took = _event_at(url, queued.run_id, TAKEN)
            taken.append((took - start).total_seconds() * 1000 if took else float("nan"))
            _wait_ended(url, [queued.run_id], 120)
            first = _event_at(url, queued.run_id, BRAIN)
            brain.append((first - start).total_seconds() * 1000 if first else float("nan"))
    print(
        f"latency ({count} runs, 3 idle runners): enqueue → taken p50 {_pct(taken, 0.5):.0f} ms"
        f" p95 {_pct(taken, 0.95):.0f}; → starting container p50 {_pct(starts, 0.5):.0f}"
        f" p95 {_pct(starts, 0.95):.0f}; → first brain event p50 {_pct(brain, 0.5):.0f}"
        f" p95 {_pct(brain, 0.95):.0f}"
    )
    return starts


def throughput(base: Path, url: str, runners: int, runs: int, seconds: float, conc: int) -> float:
    prefix = f"io{runners}-"
    plans = make_plans(base, prefix, runs, [f"sleep {seconds:g}"])
    names = [f"{prefix}{n}" for n in range(runners)]
    with runner_processes(base, url, names, conc):
        began = time.monotonic()
        queued = [queue.enqueue_plan(url, plan, who="bench") for plan in plans]
        rows = _wait_ended(url, [q.run_id for q in queued], 1800)
        wall = time.monotonic() - began
    ok = [r for r in rows if r["status"] == "success"]
    spread = {name: sum(1 for r in rows if r["runner"] == name) for name in names}
    rate = len(ok) / wall * 60
    print(
        f"throughput, {runners} runner(s) x {conc}: {len(ok)}/{runs} ok in {wall:.1f} s"
        f" = {rate:.1f} runs/min; per runner {spread}"
    )
    for row in rows:
        if row["status"] != "success":
            print(f"  {row['run_id']} {row['status']}: {row['message']}")
    return rate


# KAGURA_BENCH_QUICK=1 (CI, tests/test_benches.py): one iteration at small sizes, to show
# the bench still runs and ends with its RESULT line; its numbers mean nothing then.
QUICK = os.environ.get("KAGURA_BENCH_QUICK") == "1"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency-runs", type=int, default=1 if QUICK else 12)
    parser.add_argument("--sleep", type=float, default=1.0 if QUICK else 60.0)
    parser.add_argument("--slots", type=int, default=1 if QUICK else 3, help="runs per run slot")
    parser.add_argument("--concurrency", type=int, default=2)
    args = parser.parse_args()
    # SIGTERM unwinds (runners stopped, PostgreSQL stopped, temp folder removed).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with tempfile.TemporaryDirectory(prefix="kagura-bench-team-") as tmp, postgres() as url:
        base = Path(tmp)
        os.environ["KAGURA_AGENT_STATE_DIR"] = str(base / "planner-state")
        ensure_schema(url)
        starts = latency(base, url, args.latency_runs, args.concurrency)
        one = throughput(base, url, 1, args.slots * args.concurrency, args.sleep, args.concurrency)
        three = throughput(
            base, url, 3, 3 * args.slots * args.concurrency, args.sleep, args.concurrency
        )
    print(
        f"RESULT team_scale p50_ms={_pct(starts, 0.5):.0f} p95_ms={_pct(starts, 0.95):.0f}"
        f" speedup_3={three / one:.2f} rpm_1={one:.1f} rpm_3={three:.1f} cores={os.cpu_count()}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
