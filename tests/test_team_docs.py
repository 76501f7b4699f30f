"""The team set-up in docs/operations.md, run as written: the State manifest in the
host's ./manifests, then a runner, plan, apply --queue, queue list / follow / runners —
on a fresh database of the session's PostgreSQL and this machine's Docker (the URL,
state directory and RUN filled in). Nothing names the database but the manifest: every
command found it there, and nothing was written to the embedded store."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from apply_helpers import REPO, make_project, write_task
from team_helpers import queue_url, wait_registered  # noqa: F401 - the fixture

from kagura_agent.state import StateStore

pytestmark = pytest.mark.usefixtures("docker_client")


def state_manifest() -> str:
    text = (REPO / "docs" / "operations.md").read_text(encoding="utf-8")
    for body in re.findall(r"^```yaml\n(.*?)^```", text, re.M | re.S):
        if "kind: State" in body:
            return str(body)
    raise AssertionError("docs/operations.md has no State manifest")


def team_block() -> list[str]:
    text = (REPO / "docs" / "operations.md").read_text(encoding="utf-8")
    for body in re.findall(r"^```bash\n(.*?)^```", text, re.M | re.S):
        if "kagura-agent runner" in body:
            return [line for line in body.splitlines() if line.strip()]
    raise AssertionError("docs/operations.md has no team set-up block")


def test_the_team_setup_runs_as_written(
    docker_client: Any,
    tmp_path: Path,
    state_dir: Path,
    queue_url: str,  # noqa: F811 - the fixture
) -> None:
    project = make_project(tmp_path)
    write_task(
        project, "docs-team", {"steps": ["echo hello > out.txt"], "verify": ["test -s out.txt"]}
    )
    (project / "manifests").mkdir()
    (project / "manifests" / "state.yml").write_text(state_manifest())
    env = {**os.environ, "KAGURA_AGENT_STATE_DIR": str(state_dir), "NO_COLOR": "1"}
    for name in ("KAGURA_AGENT_STATE_URL", "KAGURA_AGENT_QUEUE_URL", "KAGURA_AGENT_MANIFESTS"):
        env.pop(name, None)
    runner: subprocess.Popen[bytes] | None = None
    outputs: dict[str, str] = {}
    run_id = ""
    try:
        for line in team_block():
            words = shlex.split(line.split("  #")[0])
            if words[0] == "export":
                name, _, _ = words[1].partition("=")
                env[name] = queue_url
                continue
            assert words[0] == "kagura-agent", line
            argv = [sys.executable, "-m", "kagura_agent", *words[1:]]
            argv = [str(tmp_path / "runner") if w == "/var/lib/kagura-runner" else w for w in argv]
            if words[1] == "runner":
                log = open(tmp_path / "runner.log", "wb")  # noqa: SIM115 - the runner's
                runner = subprocess.Popen(argv, env=env, cwd=project, stdout=log, stderr=log)
                wait_registered(queue_url, 1)
                continue
            argv = [run_id if w == "RUN" else w for w in argv]
            done = subprocess.run(
                argv, env=env, cwd=project, capture_output=True, text=True, timeout=300
            )
            assert done.returncode == 0, f"{line}\n{done.stdout}{done.stderr}"
            outputs[words[1] + " " + words[2]] = done.stdout
            if found := re.search(r"queued (run-[0-9a-f]+)", done.stdout):
                run_id = found.group(1)
    finally:
        if runner is not None:
            runner.send_signal(signal.SIGTERM)
            runner.wait(timeout=60)
    assert run_id, outputs
    assert f"run {run_id}: success" in outputs["queue follow"]
    assert "host-1" in outputs["queue runners"]
    # --json success is the envelope (test_json_success names this test for both).
    for action, key in (("list", "runs"), ("runners", "runners")):
        argv = [sys.executable, "-m", "kagura_agent", "queue", action, "--json"]
        done = subprocess.run(argv, env=env, cwd=project, capture_output=True, text=True)
        data = json.loads(done.stdout)
        assert (done.returncode, data["ok"], data["errors"]) == (0, True, []), done.stderr
        assert data[key], data
    # Cancelling a run that has ended changes nothing and says so.
    argv = [sys.executable, "-m", "kagura_agent", "queue", "cancel", run_id, "--json"]
    done = subprocess.run(argv, env=env, cwd=project, capture_output=True, text=True)
    data = json.loads(done.stdout)
    assert (done.returncode, data["ok"], data["errors"]) == (0, True, []), done.stderr
    assert (data["run"], data["status"]) == (run_id, "success"), data
    assert "has ended already" in data["message"], data
    assert (project / "out.txt").read_text() == "hello\n"
    # The run's record, the runner's sweeps and the plan's look-ups all went to PostgreSQL.
    assert not (state_dir / "state.db").exists()
    assert not (tmp_path / "runner" / "state.db").exists()
    with StateStore(queue_url) as store:
        ran = store.conn.execute("SELECT run_id FROM runs WHERE run_id = ?", (run_id,)).fetchall()
    assert len(ran) == 1
