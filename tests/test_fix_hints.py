"""Every refusal's fix, followed as written, makes the next command pass: from real runs,
the hint printed by the refusal is extracted and run by the shell, then the command that
was refused runs again.

- the agent left its own root ``chmod 000`` (it owns it): ``chmod u+rwx ROOT`` (the
  ``chown -R`` the plan said before changes nothing there);
- a root-owned checkout, readable or ``000``: ``chown -R 1000:1000 ROOT`` (and
  ``chmod u+rwx`` when the owner's bits lack it);
- a task file a run's agent wrote into its root: ``touch`` it once reviewed.

(The quarantine's ``kagura-agent aftercare ROOT`` is followed in test_apply_setid.)
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
from apply_helpers import cli_env, kagura, make_project, manifest_set, write_task


def _follow(refused: subprocess.CompletedProcess[str], pattern: str) -> str:
    """The refusal's fix command, run as written by a shell; returns it."""
    found = re.search(pattern, refused.stderr, re.MULTILINE)
    assert found, refused.stderr
    command = found.group(1)
    subprocess.run(["sh", "-c", command], check=True)
    return command


def test_a_root_the_agent_left_chmod_000_is_fixed_by_the_refusals_hint(
    docker_client: Any, tmp_path: Path, state_dir: Path
) -> None:
    manifests = manifest_set(tmp_path)
    project = make_project(tmp_path)
    task = write_task(project, "locker", {"steps": ["touch ran && chmod 000 /workspace"]})
    env = cli_env(state_dir)
    first = kagura(["apply", "--yes", "--manifests", str(manifests), str(task)], env)
    assert first.returncode == 0, first.stderr
    assert (os.stat(project).st_mode & 0o777) == 0  # what the agent left
    refused = kagura(["apply", "--yes", "--manifests", str(manifests), str(task)], env)
    assert refused.returncode == 6, refused.stderr
    command = _follow(refused, r"fix: (.+)$")
    assert command == f"chmod u+rwx {project}"
    again = kagura(["apply", "--yes", "--manifests", str(manifests), str(task)], env)
    assert again.returncode == 0, again.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="a root-owned checkout needs root to make")
@pytest.mark.parametrize("mode", [0o755, 0o000])
def test_a_root_owned_checkout_is_fixed_by_the_refusals_hint(
    docker_client: Any, tmp_path: Path, state_dir: Path, mode: int
) -> None:
    manifests = manifest_set(tmp_path)
    project = tmp_path / "checkout"
    project.mkdir()
    task = write_task(project, "rooted", {"steps": ["touch ran"]})
    os.chown(task, 0, 0)
    project.chmod(mode)
    env = cli_env(state_dir)
    refused = kagura(["apply", "--yes", "--manifests", str(manifests), str(task)], env)
    assert refused.returncode == 6, refused.stderr
    command = _follow(refused, r"fix: (.+)$")
    assert command.startswith(f"chown -R 1000:1000 {project}")
    again = kagura(["apply", "--yes", "--manifests", str(manifests), str(task)], env)
    assert again.returncode == 0, again.stderr
    assert (project / "ran").stat().st_uid == 1000


def test_a_task_file_a_run_wrote_is_the_operators_once_touched_as_the_hint_says(
    docker_client: Any, tmp_path: Path, state_dir: Path
) -> None:
    manifests = manifest_set(tmp_path)
    project = make_project(tmp_path)
    writes_next = (
        "printf 'apiVersion: kagura.dev/v1\\nkind: Task\\nmetadata: {name: next}\\n"
        'spec:\\n  steps: ["touch next-ran"]\\n\' > next.yml'
    )
    task = write_task(project, "writer", {"steps": [writes_next]})
    env = cli_env(state_dir)
    first = kagura(["apply", "--yes", "--manifests", str(manifests), str(task)], env)
    assert first.returncode == 0, first.stderr
    following = project / "next.yml"
    refused = kagura(["apply", "--yes", "--manifests", str(manifests), str(following)], env)
    assert refused.returncode == 6, refused.stderr
    assert "may be an agent's" in refused.stderr
    command = _follow(refused, r"`([^`]+)`")
    assert command == f"touch {following}"
    again = kagura(["apply", "--yes", "--manifests", str(manifests), str(following)], env)
    assert again.returncode == 0, again.stderr
    assert (project / "next-ran").exists()
