"""``serve --queue``: the cockpit queues approved sessions for the team's runners and
streams each run's events back from the shared store into the thread. Real PostgreSQL
(scripts/postgres-up.sh), ``kagura-agent runner`` processes, real containers and the
terminal transport, as an operator runs it.

One cockpit, in order: a run applied by a runner (events in the thread, success); a run
whose runner is killed with ``kill -9`` (the thread says lost on that runner, its lease
revoked by the survivor); a running run killed from chat (its runner interrupts the
apply: killed, nothing left); a run no runner took yet killed from chat (cancelled in
the queue, nothing ran)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from apply_helpers import REPO, cli_env, leftovers, make_project, manifest_set, write_task
from team_helpers import queue_url, runners, wait_registered, wait_until  # noqa: F401
from test_team_runners import cloudflare_provider

from kagura_agent.team import queue
from testing.fake_cloudflare import ROOT_TOKEN

pytestmark = pytest.mark.usefixtures("docker_client")


class Serve:
    """``kagura-agent serve --queue`` on the terminal: commands in, lines out."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            cwd=REPO,
        )
        self.lines: list[str] = []

    def type_in(self, text: str) -> int:
        """Send one command; the index its answers start from."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()
        return len(self.lines)

    def until(self, needle: str, since: int = 0, timeout: float = 180) -> str:
        deadline = time.monotonic() + timeout
        assert self.proc.stdout is not None
        while True:
            for line in self.lines[since:]:
                if needle in line:
                    return line
            assert time.monotonic() < deadline, f"no {needle!r} in:\n" + "".join(self.lines)
            line = self.proc.stdout.readline()
            assert line, "serve ended:\n" + "".join(self.lines)
            self.lines.append(line)

    def session(self, since: int) -> str:
        return self.until("  stop it: kill s-", since).split()[-1]

    def run_id(self, since: int) -> str:
        return self.until(": queued as run run-", since).split("queued as run ")[1].split()[0]


@pytest.mark.timeout(600)
def test_serve_queues_for_runners_and_the_thread_follows_lost_and_killed_runs(
    docker_client: Any,
    tmp_path: Path,
    state_dir: Path,
    queue_url: str,  # noqa: F811 - the fixture
    runners: Any,  # noqa: F811 - the fixture
    cloudflare: Any,
) -> None:
    shared = {"KAGURA_AGENT_STATE_URL": queue_url, "KAGURA_TEST_CF_ROOT": ROOT_TOKEN}
    manifests = manifest_set(tmp_path, cloudflare_provider(cloudflare))
    tasks = {}
    for name, steps, extra in (
        ("quick", ["echo applied > applied.txt"], {"verify": ["test -s applied.txt"]}),
        ("doomed", ["sleep 600"], {"credentials": [{"provider": "cf", "scope": "dns-read"}]}),
        ("stopped", ["sleep 600"], {}),
        ("never", ["echo ran > ran.txt"], {}),
    ):
        project = make_project(tmp_path, name)
        tasks[name] = (project, write_task(project, name, {"steps": steps, **extra}))
    doomed = runners("doomed", env=shared)
    wait_registered(queue_url, 1)
    env = cli_env(state_dir, KAGURA_AGENT_QUEUE_URL=queue_url, **shared)
    argv = [sys.executable, "-m", "kagura_agent", "serve", "--queue"]
    serve = Serve([*argv, "--manifests", str(manifests)], env)
    try:
        # 1. Queued, applied by the runner, its events in the thread.
        since = serve.type_in(f"launch {tasks['quick'][1]}")
        quick = serve.session(since)
        run_id = serve.run_id(since)
        serve.until("● taken by runner doomed", since)
        serve.until(f"session {quick}: run {run_id} succeeded", since)
        assert (tasks["quick"][0] / "applied.txt").read_text() == "applied\n"
        assert queue.run(queue_url, run_id)["runner"] == "doomed"
        assert run_id not in "".join(serve.lines[:since])

        # 2. Its runner killed with kill -9 mid-run: the thread says lost, lease revoked.
        since = serve.type_in(f"launch {tasks['doomed'][1]}")
        lost = serve.session(since)
        lost_run = serve.run_id(since)
        serve.until("● taken by runner doomed", since)
        wait_until(lambda: cloudflare.live_tokens(), 120, "the run's lease", step=0.2)
        survivor = runners("survivor", env=shared)
        wait_registered(queue_url, 2)
        doomed.kill9()
        said = serve.until(f"session {lost}: run {lost_run} lost", since)
        assert "lost on runner doomed: it stopped heartbeating" in said, said
        assert "leases revoked: 1 of 1 (by runner survivor)" in said, said
        serve.until("⚠ run lost: runner doomed stopped heartbeating", since)
        assert cloudflare.live_tokens() == []

        # 3. Killed from chat while its runner applies it: the runner interrupts the apply.
        since = serve.type_in(f"launch {tasks['stopped'][1]}")
        stopped = serve.session(since)
        stopped_run = serve.run_id(since)
        serve.until("● taken by runner survivor", since)
        wait_until(lambda: _agent_running(docker_client, stopped_run), 120, "its container")
        asked = serve.type_in(f"kill {stopped}")
        serve.until(f"run {stopped_run}: stop asked by terminal:", asked)
        said = serve.until(f"session {stopped}: run {stopped_run} killed", asked)
        assert "(exit 130); stopped by terminal:" in said, said
        serve.until("containers, networks and volumes: none left", asked)
        assert leftovers(docker_client, stopped_run) == []
        assert queue.run(queue_url, stopped_run)["status"] == "killed"

        # 4. Killed from chat before any runner took it: cancelled in the queue.
        survivor.stop()
        since = serve.type_in(f"launch {tasks['never'][1]}")
        never = serve.session(since)
        never_run = serve.run_id(since)
        asked = serve.type_in(f"kill {never}")
        serve.until(f"run {never_run}: cancelled in the queue by terminal:", asked)
        serve.until(f"session {never}: run {never_run} cancelled", asked)
        assert queue.run(queue_url, never_run)["status"] == "cancelled"
        runners("late", env=shared)  # a runner arriving later does not apply it
        wait_registered(queue_url, 3)
        time.sleep(3)
        assert not (tasks["never"][0] / "ran.txt").exists()
        assert serve.proc.stdin is not None
        serve.proc.stdin.close()
        assert serve.proc.wait(60) == 0
    finally:
        if serve.proc.poll() is None:
            serve.proc.kill()
    out = "".join(serve.lines)
    assert "Traceback" not in out and ROOT_TOKEN not in out


def _agent_running(client: Any, run_id: str) -> bool:
    from apply_helpers import run_containers

    return any(
        "dev.kagura.task" in c.labels and c.status == "running"
        for c in run_containers(client, run_id)
    )


@pytest.mark.timeout(400)
def test_a_chat_approval_travels_with_the_queued_run_and_a_restarted_cockpit_follows_it(
    docker_client: Any,
    tmp_path: Path,
    state_dir: Path,
    queue_url: str,  # noqa: F811 - the fixture
    runners: Any,  # noqa: F811 - the fixture
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A chat fake (the scripted transport): a plan needing approval is approved in the
    thread and queued with that approval; the cockpit stops before any runner took it
    (the run stays queued: the cockpit only stops following), and the next cockpit follows
    it again from the store to its end, applied by a runner that starts later."""
    import threading
    from dataclasses import replace

    from test_cockpit import ALICE, ScriptedTransport

    from kagura_agent.cockpit.core import Cockpit, CockpitConfig

    monkeypatch.setenv("KAGURA_AGENT_STATE_URL", queue_url)  # sessions + approvals shared
    docs = {
        "kind": "EgressPolicy",
        "metadata": {"name": "docs"},
        "spec": {"allow": [{"host": "docs.invalid"}]},
    }
    manifests = manifest_set(tmp_path, docs)
    project = make_project(tmp_path, "net")
    spec = {"steps": ["echo ok > ok.txt"], "egress": ["docs"], "verify": ["test -s ok.txt"]}
    task = write_task(project, "net", spec)
    config = CockpitConfig(
        operators=frozenset({ALICE}), manifests=str(manifests), queue_url=queue_url
    )

    def serve(transport: ScriptedTransport) -> tuple[Cockpit, threading.Thread]:
        cockpit = Cockpit(transport, config)
        cockpit.settle_previous()
        thread = threading.Thread(target=cockpit.serve, daemon=True)
        thread.start()
        return cockpit, thread

    first = ScriptedTransport()
    _, thread = serve(first)
    first.send(f"launch {task}")
    first.wait_for("needs approval for plan")
    session_id = first.requests[-1]  # a session's id is its approval request's
    first.send(f"approve {session_id}")
    out = first.wait_for(": queued as run run-")
    run_id = out.split("queued as run ")[1].split()[0]
    first.stop()
    thread.join(60)
    assert not thread.is_alive()
    assert queue.run(queue_url, run_id)["status"] == "queued"  # left to the runners

    # A cockpit without --queue neither follows it nor calls it lost.
    local = ScriptedTransport()
    Cockpit(local, replace(config, queue_url=None)).settle_previous()
    assert f"its run {run_id} is on the team queue; this cockpit does not follow it" in (
        local.text()
    )

    second = ScriptedTransport()
    cockpit, thread = serve(second)
    second.wait_for(f"still following run {run_id} on the team queue")
    runners("late", env={"KAGURA_AGENT_STATE_URL": queue_url})
    out = second.wait_for(f"session {session_id}: run {run_id} succeeded", timeout=180)
    assert "● taken by runner late" in out
    assert (project / "ok.txt").read_text() == "ok\n"
    (session,) = cockpit.sessions()
    assert (session.state, session.run_id) == ("succeeded", run_id)
    assert "approved by test:" in first.text()
    second.stop()
    thread.join(60)
