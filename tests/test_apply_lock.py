"""One apply per project root (and per session) at a time."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
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

from kagura_agent.apply.guards.parentdeath import PARENT_ENV, PARENT_ROOT_ENV, child_environment
from kagura_agent.apply.records.runs import root_locks
from kagura_agent.errors import RefusedError

# The first run holds its root until the test has seen the second apply end (a file the
# test writes), never for a time: on a loaded machine the second apply can take longer to
# start than any sleep (seen: `sleep 5` over before the second apply asked for the lock).
HOLD = "for i in $(seq 1200); do [ -f release ] && break; sleep 0.1; done"


def _release(project: Path) -> None:
    (project / "release").write_text("")


def test_a_project_root_is_not_applied_twice_at_once(
    tmp_path: Path, state_dir: Path, docker_client: Any
) -> None:
    project = make_project(tmp_path)
    task = write_task(project, "slow", {"steps": [HOLD], "verify": ["true"]})
    env = cli_env(state_dir)
    first = spawn(["apply", "--yes", str(task)], env)
    run_id = wait_for_run(state_dir)
    wait_for_container(docker_client, run_id)
    second = kagura(["apply", "--yes", str(task)], env)
    _release(project)
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
    task = write_task(project, "slow", {"steps": [HOLD], "verify": ["true"]})
    first = spawn(["apply", "--yes", str(task)], cli_env(state_dir))
    run_id = wait_for_run(state_dir)
    wait_for_container(docker_client, run_id)
    # Another state directory, and the same root reached through a symlink.
    other_state = tmp_path / "other-state"
    link = tmp_path / "link"
    link.symlink_to(project)
    second = kagura(["apply", "--yes", str(link / "task.yml")], cli_env(other_state))
    _release(project)
    assert second.returncode == 6, second.stderr
    assert f"project root {project} is already being applied" in second.stderr
    assert "any state directory" in second.stderr
    assert run_ids(other_state) == []  # the refused apply started nothing
    out, _ = first.communicate(timeout=120)
    assert first.returncode == 0, out
    assert leftovers(docker_client, run_id) == []


def test_a_root_inside_a_live_runs_root_is_refused_both_ways(tmp_path: Path) -> None:
    """Nested roots exclude each other whichever starts first; siblings do not."""
    outer = tmp_path / "outer"
    (outer / "inner").mkdir(parents=True)
    (outer / "sibling").mkdir()
    held = root_locks(str(outer / "inner"), {})
    try:
        with pytest.raises(RefusedError, match="holds the project root of a run in progress"):
            root_locks(str(outer), {})
        for fd in root_locks(str(outer / "sibling"), {}):  # beside it: fine
            os.close(fd)
    finally:
        for fd in held:
            os.close(fd)
    held = root_locks(str(outer), {})
    try:
        with pytest.raises(RefusedError, match=f"is inside {outer}, which another process"):
            root_locks(str(outer / "inner"), {})
        # A child its parent dispatched into its own root: the parent names that root.
        child_env = {PARENT_ENV: "1", PARENT_ROOT_ENV: str(outer)}
        child_held = root_locks(str(outer / "inner"), child_env)
        try:
            # And its own child, inside both: the environment a child apply gives it.
            grandchild_env = child_environment(child_env, parent_root=str(outer / "inner"))
            (outer / "inner" / "deeper").mkdir()
            for fd in root_locks(str(outer / "inner" / "deeper"), grandchild_env):
                os.close(fd)
            with pytest.raises(RefusedError):  # not named: still refused
                root_locks(str(outer / "inner" / "deeper"), child_env)
        finally:
            for fd in child_held:
                os.close(fd)
    finally:
        for fd in held:
            os.close(fd)


def test_an_outer_run_cannot_forge_an_inner_runs_verify_evidence(
    tmp_path: Path, state_dir: Path, docker_client: Any
) -> None:
    """Two operators' applies, one root inside the other. The inner run's step writes
    "fail" where its verify looks; the outer agent overwrites it with "pass" while the
    inner run is live. The outer run is refused: the inner verify reads its own result."""
    outer = make_project(tmp_path, "outer")
    inner = make_project(outer, "inner")
    inner_task = write_task(
        inner,
        "inner",
        {"steps": ["echo fail > result", HOLD], "verify": ["grep -q pass result"]},
    )
    forge = "for i in $(seq 100); do [ -f inner/result ] && break; sleep 0.1; done; echo pass > inner/result"
    outer_task = outer / "outer-task.yml"
    write_task(outer, "outer", {"steps": [forge], "verify": ["true"]}).rename(outer_task)
    first = spawn(["apply", "--yes", str(inner_task)], cli_env(state_dir))
    run_id = wait_for_run(state_dir)
    wait_for_container(docker_client, run_id)
    other_state = tmp_path / "other-state"
    second = kagura(["apply", "--yes", str(outer_task)], cli_env(other_state))
    _release(inner)
    out, _ = first.communicate(timeout=120)
    assert (inner / "result").read_text() == "fail\n", "the outer agent forged the evidence"
    assert second.returncode == 6, second.stderr[-2000:]
    assert "holds the project root of a run in progress" in second.stderr
    assert first.returncode == 1, out  # its own evidence: verify fails
    assert leftovers(docker_client, run_id) == []


def test_a_folder_above_that_cannot_be_locked_is_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file system above the root without flock (ENOLCK on some network mounts) is no
    reason to refuse the run: that folder is simply not locked."""
    import errno
    import fcntl

    root = tmp_path / "root"
    root.mkdir()
    real_flock = fcntl.flock
    root_ino = root.stat().st_ino

    def flaky(fd: int, op: int) -> None:
        if os.fstat(fd).st_ino != root_ino:
            raise OSError(errno.ENOLCK, "No locks available")
        real_flock(fd, op)

    monkeypatch.setattr(fcntl, "flock", flaky)
    held = root_locks(str(root), {})
    try:
        assert len(held) == 1  # the root itself, exclusively
    finally:
        for fd in held:
            os.close(fd)
