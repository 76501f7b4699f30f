"""Fixtures and helpers for the team-queue tests: a fresh database per test on the
session's PostgreSQL (conftest ``postgres_server``, started by the project's script) and
runner processes, each with its own identity and state directory."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import pytest
from apply_helpers import REPO, write_task

from kagura_agent.plan import planfile
from kagura_agent.plan.build import plan_tasks
from kagura_agent.plan.model import Plan
from kagura_agent.team import queue

HEARTBEAT = 0.5
STALLED_AFTER = 2.5


@pytest.fixture()
def queue_url(postgres_server: Any) -> Iterator[str]:
    """An empty database of its own for this test's queue (conftest's session server)."""
    with postgres_server.fresh_database() as url:
        yield url


class Runner:
    """One ``kagura-agent runner`` process; its log in ``log``."""

    def __init__(self, name: str, state_dir: Path, env: dict[str, str], *args: str) -> None:
        self.name, self.state_dir = name, state_dir
        self.log = state_dir.parent / f"{name}.log"
        self._args, self._env = list(args), env
        self.proc: subprocess.Popen[bytes] | None = None
        self._out: IO[bytes] | None = None

    def start(self) -> Runner:
        self._out = open(self.log, "ab")  # noqa: SIM115 - closed in stop()
        argv = [sys.executable, "-m", "kagura_agent", "runner", "--name", self.name]
        argv += ["--state-dir", str(self.state_dir), "--heartbeat", str(HEARTBEAT)]
        argv += ["--stalled-after", str(STALLED_AFTER), *self._args]
        self.proc = subprocess.Popen(
            argv,
            env=self._env,
            cwd=REPO,
            stdin=subprocess.DEVNULL,
            stdout=self._out,
            stderr=subprocess.STDOUT,
        )
        return self

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self._out is not None:
            self._out.close()

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


@pytest.fixture()
def runners(queue_url: str, tmp_path: Path) -> Iterator[Callable[..., Runner]]:
    """``runners(name, *args, env=...)`` starts a runner; all are stopped at the end."""
    started: list[Runner] = []

    def start(name: str, *args: str, env: dict[str, str] | None = None) -> Runner:
        base = {**os.environ, "NO_COLOR": "1", "KAGURA_AGENT_QUEUE_URL": queue_url}
        runner = Runner(name, tmp_path / "runners" / name, {**base, **(env or {})}, *args)
        runner.state_dir.mkdir(parents=True, exist_ok=True)
        started.append(runner.start())
        return runner

    yield start
    for runner in started:
        runner.stop()


def plan_file(project: Path, name: str, spec: dict[str, Any], manifests: Path) -> Path:
    """Write task-NAME.yml in ``project`` and save its plan next to it; the plan's path."""
    write_task(project, name, spec)
    task = project / f"task-{name}.yml"
    (project / "task.yml").rename(task)
    [plan] = plan_tasks(str(manifests), [str(task)])
    path = project.parent / f"plan-{project.name}-{name}.json"
    planfile.save(plan, path)
    return path


def load(path: Path) -> Plan:
    return planfile.load(path)


def wait_until(check: Callable[[], Any], timeout: float, what: str, step: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(step)


def wait_registered(url: str, count: int, timeout: float = 60) -> None:
    from kagura_agent.team.db import connect, ensure_schema

    ensure_schema(url)

    def registered() -> bool:
        with connect(url) as conn:
            row = conn.execute("SELECT count(*) AS n FROM kagura_team_runners").fetchone()
        return row is not None and row["n"] >= count

    wait_until(registered, timeout, f"{count} runners to register")


def all_ended(url: str, count: int) -> list[dict[str, Any]] | None:
    rows = queue.runs(url, limit=1000)
    done = [r for r in rows if r["status"] in queue.TERMINAL]
    return rows if len(rows) == count and len(done) == count else None
