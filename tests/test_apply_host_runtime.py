"""`runtime: host`: shown in red as unsandboxed, refused without --allow-host-runtime."""

from __future__ import annotations

from pathlib import Path

import pytest
from apply_helpers import cli_env, kagura, write_task


@pytest.mark.usefixtures("without_docker")
def test_host_runtime_needs_the_flag_and_then_runs_on_the_host(
    tmp_path: Path, state_dir: Path
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    task = write_task(
        project,
        "on-host",
        {
            "runtime": "host",
            "steps": ["echo ran > host.txt"],
            "verify": ["grep -qx ran host.txt"],
        },
    )
    env = cli_env(state_dir)
    plan = kagura(["plan", str(task)], env)
    assert plan.returncode == 0, plan.stderr
    assert "ON THE HOST, UNSANDBOXED" in plan.stdout
    assert "--allow-host-runtime" in plan.stdout

    refused = kagura(["apply", "--yes", str(task)], env)
    assert refused.returncode == 6
    assert "unsandboxed" in refused.stderr
    assert not (project / "host.txt").exists()

    done = kagura(["apply", "--yes", "--allow-host-runtime", str(task)], env)
    assert done.returncode == 0, done.stderr
    assert (project / "host.txt").read_text() == "ran\n"
    assert "verify 'grep -qx ran host.txt' exited 0" in done.stderr
