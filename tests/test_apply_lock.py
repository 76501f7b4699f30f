"""One apply per project root (and per session) at a time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from apply_helpers import (
    cli_env,
    kagura,
    leftovers,
    make_project,
    run_ids,
    spawn,
    wait_for_container,
    wait_for_run,
    write_task,
)


def test_a_project_root_is_not_applied_twice_at_once(
    tmp_path: Path, state_dir: Path, docker_client: Any
) -> None:
    project = make_project(tmp_path)
    task = write_task(project, "slow", {"steps": ["sleep 5"], "verify": ["true"]})
    env = cli_env(state_dir)
    first = spawn(["apply", "--yes", str(task)], env)
    run_id = wait_for_run(state_dir)
    wait_for_container(docker_client, run_id)
    second = kagura(["apply", "--yes", str(task)], env)
    assert second.returncode == 6
    assert f"project root {project} is already being applied" in second.stderr
    out, _ = first.communicate(timeout=120)
    assert first.returncode == 0, out
    assert run_ids(state_dir) == [run_id]  # the refused apply started nothing
    assert leftovers(docker_client, run_id) == []
    # Once the first run ended, the lock is free again.
    again = kagura(["apply", "--yes", str(task)], env)
    assert again.returncode == 0, again.stderr


def test_the_root_lock_holds_across_state_directories_and_paths(
    tmp_path: Path, state_dir: Path, docker_client: Any
) -> None:
    project = make_project(tmp_path)
    task = write_task(project, "slow", {"steps": ["sleep 5"], "verify": ["true"]})
    first = spawn(["apply", "--yes", str(task)], cli_env(state_dir))
    run_id = wait_for_run(state_dir)
    wait_for_container(docker_client, run_id)
    # Another state directory, and the same root reached through a symlink.
    other_state = tmp_path / "other-state"
    link = tmp_path / "link"
    link.symlink_to(project)
    second = kagura(["apply", "--yes", str(link / "task.yml")], cli_env(other_state))
    assert second.returncode == 6, second.stderr
    assert f"project root {project} is already being applied" in second.stderr
    assert "any state directory" in second.stderr
    assert run_ids(other_state) == []  # the refused apply started nothing
    out, _ = first.communicate(timeout=120)
    assert first.returncode == 0, out
    assert leftovers(docker_client, run_id) == []
