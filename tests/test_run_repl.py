"""`run "text"`, `run -` and `repl`: one-off tasks from the defaults, through plan → apply.

They use the sdk brain (Claude Agent SDK) against the fake `claude` in the agent test
image, with the current directory as the project root.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from apply_helpers import REPO, cli_env, leftovers, make_project, manifest_set, run_ids

from testing.agent_test_image import ensure_agent_test_image

pytestmark = pytest.mark.usefixtures("docker_client")

API_KEY = "sk-ant-kagura-canary-" + "r" * 30


def _setup(tmp_path: Path, client: Any) -> tuple[Path, Path]:
    image = ensure_agent_test_image(client)
    manifests = manifest_set(
        tmp_path,
        {
            "kind": "Image",
            "metadata": {"name": "agent-test"},
            "spec": {"recipe": "images/agent", "tag": image, "baseline": True},
        },
    )
    return manifests, make_project(tmp_path)


def _kagura(args: list[str], env: dict[str, str], cwd: Path, stdin: str = "") -> Any:
    return subprocess.run(
        [sys.executable, "-m", "kagura_agent", *args],
        cwd=cwd,
        env={**env, "PYTHONPATH": str(REPO)},
        input=stdin,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_run_text_and_stdin(tmp_path: Path, state_dir: Path, docker_client: Any) -> None:
    manifests, project = _setup(tmp_path, docker_client)
    env = cli_env(state_dir, ANTHROPIC_API_KEY=API_KEY)
    common = ["--yes", "--image", "agent-test", "--manifests", str(manifests)]
    done = _kagura(["run", *common, "list the files here"], env, project)
    assert done.returncode == 0, done.stderr
    assert str(project) in done.stderr  # the project root is the current directory
    assert "$0.0123" in done.stderr
    assert API_KEY not in done.stdout + done.stderr
    piped = _kagura(["run", *common, "-"], env, project, stdin="summarise README\n")
    assert piped.returncode == 0, piped.stderr
    runs = run_ids(state_dir)
    assert len(runs) == 2
    for run_id in runs:
        assert leftovers(docker_client, run_id) == []


def test_repl_continues_one_session(tmp_path: Path, state_dir: Path, docker_client: Any) -> None:
    manifests, project = _setup(tmp_path, docker_client)
    env = cli_env(state_dir, ANTHROPIC_API_KEY=API_KEY)
    args = ["repl", "--session", "talk", "--image", "agent-test", "--manifests", str(manifests)]
    done = _kagura(args, env, project, stdin="first question\n\nsecond question\n")
    assert done.returncode == 0, done.stderr
    assert len(run_ids(state_dir)) == 2  # the empty line is skipped
    # The second line resumes the brain session the first one started.
    assert "resuming session 'talk'" in done.stderr
