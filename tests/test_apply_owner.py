"""The agent runs as the project root's owner — never as root — and so does verify."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from apply_helpers import cli_env, kagura, leftovers, run_ids, write_task


def _project(tmp_path: Path, uid: int) -> Path:
    root = tmp_path / f"owned-by-{uid}"
    root.mkdir()
    os.chown(root, uid, uid)
    return root


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")
def test_agent_and_verify_run_as_the_owner(
    tmp_path: Path, state_dir: Path, docker_client: Any
) -> None:
    project = _project(tmp_path, 1234)
    task = write_task(
        project,
        "owner",
        {
            "steps": ["id -u > uid.txt"],
            "verify": ['test "$(id -u)" = 1234', "grep -qx 1234 uid.txt"],
        },
    )
    os.chown(task, 1234, 1234)
    env = cli_env(state_dir)
    done = kagura(["apply", "--yes", str(task)], env)
    assert done.returncode == 0, done.stderr
    assert (project / "uid.txt").stat().st_uid == 1234
    [run_id] = run_ids(state_dir)
    assert leftovers(docker_client, run_id) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="a root-owned project needs root to create")
def test_a_root_owned_project_never_runs_the_agent_as_root(tmp_path: Path, state_dir: Path) -> None:
    project = _project(tmp_path, 0)
    task = write_task(project, "rooted", {"steps": ["true"]})
    done = kagura(["plan", "--json", str(task)], cli_env(state_dir))
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert plan["hardening"]["user"] == "1000:1000"
    assert any("owned by root" in w for w in plan["warnings"])
