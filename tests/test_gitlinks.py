"""A run cannot plant a submodule repository whose configuration the operator's next
``git status`` in the project root would run (apply/aftercare/gitlinks.py).

``git status`` in a superproject runs ``git status`` in every populated submodule, with
that repository's own configuration: ``core.fsmonitor`` there is a command. Each attack
below is what an agent can do with write access to the root and none to its ``.git``;
after the check the operator's ``git status`` runs nothing of it, and a submodule the
run did not touch is left alone.
"""

from __future__ import annotations

import os
import subprocess
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from apply_helpers import (
    AGENT_UID,
    cli_env,
    kagura,
    leftovers,
    manifest_set,
    plan_for_root,
    run_ids,
    write_task,
)

from kagura_agent.apply.aftercare.gitlinks import check_gitlinks, check_root_repository, snapshot
from kagura_agent.apply.aftercare.setid import ctime_floor
from kagura_agent.apply.records.runs import open_run, sweep_dead_runs
from kagura_agent.clock import FixedClock
from kagura_agent.state import open_store

pytestmark = pytest.mark.skipif(
    subprocess.run(["which", "git"], capture_output=True).returncode != 0, reason="no git"
)


def _git(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            "git",
            "-c",
            "safe.directory=*",
            "-c",
            "protocol.file.allow=always",
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            *args,
        ],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=False,
    )


def _superproject(base: Path, name: str = "project") -> Path:
    """A project root holding two submodules, ``lib`` and ``vendor/tool``."""
    source = base / "lib-src"
    source.mkdir()
    assert _git(source, "init", "-q").returncode == 0
    assert _git(source, "commit", "-q", "--allow-empty", "-m", "one").returncode == 0
    root = base / name
    root.mkdir()
    assert _git(root, "init", "-q").returncode == 0
    for path in ("lib", "vendor/tool"):
        added = _git(root, "submodule", "add", "-q", str(source), path)
        assert added.returncode == 0, added.stderr
    assert _git(root, "commit", "-q", "-m", "submodules").returncode == 0
    time.sleep(0.2)  # the operator's checkout is older than the run
    return root


def _plant_repo(folder: Path, marker: Path) -> None:
    """A minimal repository whose configuration runs a command on ``git status``."""
    folder.mkdir(parents=True)
    (folder / "HEAD").write_text("ref: refs/heads/main\n")
    (folder / "objects").mkdir()
    (folder / "refs").mkdir()
    (folder / "config").write_text(
        f"[core]\n\trepositoryformatversion = 0\n\tfsmonitor = touch {marker}; false\n"
    )


def _status_runs_nothing(root: Path, marker: Path) -> None:
    _git(root, "status")
    assert not marker.exists(), "the operator's git status ran the agent's command"


def _attack_and_check(tmp_path: Path, attack: Any) -> tuple[Path, list[str]]:
    root = _superproject(tmp_path)
    marker = tmp_path / "PWNED"
    before = snapshot(str(root))
    since = ctime_floor()
    attack(root, marker)
    # Without the check the operator's git status runs the planted command.
    lines = check_gitlinks(str(root), since, before).summary()
    _status_runs_nothing(root, marker)
    return root, lines


def test_a_submodule_gitfile_replaced_by_a_repository_is_moved_aside(tmp_path: Path) -> None:
    def attack(root: Path, marker: Path) -> None:
        (root / "lib" / ".git").unlink()
        _plant_repo(root / "lib" / ".git", marker)

    root, lines = _attack_and_check(tmp_path, attack)
    assert any("lib/.git -> lib/.git.kagura-refused-1" in line for line in lines), lines
    assert (root / "lib" / ".git.kagura-refused-1" / "config").exists()  # kept, not deleted
    assert (root / "vendor" / "tool" / ".git").is_file()  # untouched submodule left alone


def test_a_repository_in_an_uninitialised_submodule_is_moved_aside(tmp_path: Path) -> None:
    def attack(root: Path, marker: Path) -> None:
        (root / "vendor" / "tool" / ".git").unlink()  # as after `submodule deinit`
        _plant_repo(root / "vendor" / "tool" / ".git", marker)

    _root, lines = _attack_and_check(tmp_path, attack)
    assert any("vendor/tool/.git" in line for line in lines), lines


def test_a_gitfile_pointing_into_the_root_is_moved_aside(tmp_path: Path) -> None:
    def attack(root: Path, marker: Path) -> None:
        _plant_repo(root / "elsewhere", marker)
        (root / "lib" / ".git").write_text("gitdir: ../elsewhere\n")

    _root, lines = _attack_and_check(tmp_path, attack)
    assert any("lib/.git" in line for line in lines), lines


def test_a_submodule_folder_swapped_for_a_symlink_is_moved_aside(tmp_path: Path) -> None:
    def attack(root: Path, marker: Path) -> None:
        _plant_repo(root / "decoy" / ".git", marker)
        (root / "vendor" / "tool" / ".git").unlink()
        (root / "vendor" / "tool").rmdir()
        (root / "vendor" / "tool").symlink_to(root / "decoy")

    root, lines = _attack_and_check(tmp_path, attack)
    assert any("vendor/tool -> vendor/tool.kagura-refused-1" in line for line in lines), lines
    assert (root / "vendor" / "tool.kagura-refused-1").is_symlink()


def test_a_repository_staged_by_an_earlier_run_and_moved_in_is_moved_aside(
    tmp_path: Path,
) -> None:
    """Its files' ctimes are older than the run: only the snapshot of what was at the
    gitlink path before the run tells it is not the submodule's."""
    root = _superproject(tmp_path)
    marker = tmp_path / "PWNED"
    _plant_repo(root / "stash" / "lib" / ".git", marker)  # an earlier run's
    time.sleep(0.2)
    before = snapshot(str(root))
    since = ctime_floor()
    os.rename(root / "lib", root / "old-lib")
    os.rename(root / "stash" / "lib", root / "lib")
    lines = check_gitlinks(str(root), since, before).summary()
    _status_runs_nothing(root, marker)
    assert lines, "nothing was moved aside"


def test_a_root_inside_a_larger_checkout_is_checked_too(tmp_path: Path) -> None:
    """The root is ``vendor`` of a checkout: the operator's git status in the checkout
    would run the submodule ``vendor/tool`` planted inside the root."""
    checkout = _superproject(tmp_path)
    root = checkout / "vendor"
    marker = tmp_path / "PWNED"
    before = snapshot(str(root))
    since = ctime_floor()
    (root / "tool" / ".git").unlink()
    _plant_repo(root / "tool" / ".git", marker)
    lines = check_gitlinks(str(root), since, before).summary()
    _status_runs_nothing(checkout, marker)
    assert any("tool/.git -> tool/.git.kagura-refused-1" in line for line in lines), lines


def test_a_run_that_leaves_submodules_alone_changes_nothing(tmp_path: Path) -> None:
    root = _superproject(tmp_path)
    before = snapshot(str(root))
    since = ctime_floor()
    (root / "lib" / "work.txt").write_text("the agent's work inside the submodule\n")
    assert check_gitlinks(str(root), since, before).summary() == []
    assert _git(root / "lib", "status", "--short").stdout.strip() == "?? work.txt"


def test_an_agent_planting_a_submodule_repository_is_stopped(
    docker_client: Any, tmp_path: Path, state_dir: Path
) -> None:
    """From inside a real container: the step replaces ``lib/.git`` with a repository whose
    ``core.fsmonitor`` would run on the operator's next ``git status`` in the root."""
    manifests = manifest_set(tmp_path)
    root = _superproject(tmp_path)
    marker = tmp_path / "PWNED"
    subprocess.run(["chown", "-R", f"{AGENT_UID}:{AGENT_UID}", str(root)], check=True)
    plant = (
        "rm lib/.git && mkdir -p lib/.git/objects lib/.git/refs"
        " && echo 'ref: refs/heads/main' > lib/.git/HEAD"
        f" && printf '[core]\\n\\tfsmonitor = touch {marker}; false\\n' > lib/.git/config"
    )
    task = write_task(root, "plant-submodule", {"steps": [plant], "verify": ["true"]})
    done = kagura(["apply", "--yes", "--manifests", str(manifests), str(task)], cli_env(state_dir))
    assert done.returncode == 0, done.stderr[-3000:]
    _status_runs_nothing(root, marker)
    assert (root / "lib" / ".git.kagura-refused-1" / "config").exists(), "the step ran"
    assert "moved aside a git repository the run planted" in done.stderr + done.stdout
    [run_id] = run_ids(state_dir)
    assert leftovers(docker_client, run_id) == []


def _plant_bare(root: Path, marker: Path) -> None:
    """HEAD, objects/, refs/ and a config at the top of ``root``: git takes it for a
    repository whose work tree is ``root`` and whose fsmonitor is a command."""
    (root / "objects").mkdir()
    (root / "refs").mkdir()
    (root / "HEAD").write_text("ref: refs/heads/main\n")
    (root / "config").write_text(
        f"[core]\n\tbare = false\n\tworktree = {root}\n\tfsmonitor = touch {marker}; false\n"
    )


def test_a_root_planted_as_a_repository_is_no_repository_after_the_run(tmp_path: Path) -> None:
    """A root with no .git: git looking for a repository from it (or below) takes the root
    itself for one. Its HEAD is moved aside; a root with a .git keeps a HEAD file."""
    root = tmp_path / "plain"
    root.mkdir()
    marker = tmp_path / "PWNED"
    before = snapshot(str(root))
    since = ctime_floor()
    _plant_bare(root, marker)
    (root / "src").mkdir()
    lines = check_root_repository(str(root), since, before).summary()
    for folder in (root, root / "src"):
        _status_runs_nothing(folder, marker)
    assert any("HEAD -> HEAD.kagura-refused-1" in line for line in lines), lines
    repo = _superproject(tmp_path, "repo")
    (repo / "HEAD").write_text("a file of the project\n")
    assert check_root_repository(str(repo), since).summary() == []
    assert (repo / "HEAD").exists()


def test_an_agent_planting_its_root_as_a_repository_is_stopped(
    docker_client: Any, tmp_path: Path, state_dir: Path
) -> None:
    """From inside a real container (the root's host path is in /proc/self/mountinfo; the
    test names it): the operator's next git status in the root runs nothing of it."""
    manifests = manifest_set(tmp_path)
    root = tmp_path / "plain"
    root.mkdir()
    os.chown(root, AGENT_UID, AGENT_UID)
    marker = tmp_path / "PWNED"
    plant = (
        "mkdir objects refs && echo 'ref: refs/heads/main' > HEAD && printf '[core]\\n"
        f"\\tbare = false\\n\\tworktree = {root}\\n\\tfsmonitor = touch {marker}; false\\n'"
        " > config"
    )
    task = write_task(root, "plant-root", {"steps": [plant], "verify": ["true"]})
    done = kagura(["apply", "--yes", "--manifests", str(manifests), str(task)], cli_env(state_dir))
    assert done.returncode == 0, done.stderr[-3000:]
    assert (root / "config").exists(), "the step ran"
    _status_runs_nothing(root, marker)
    assert "moved aside a git repository the run planted: HEAD" in done.stderr + done.stdout
    [run_id] = run_ids(state_dir)
    assert leftovers(docker_client, run_id) == []


def test_a_planted_root_repository_cannot_hold_the_run_open(
    docker_client: Any, tmp_path: Path, state_dir: Path
) -> None:
    """Its config includes a FIFO: a git command that took the root for a repository would
    block on it. apply moves the planted HEAD aside before it asks git for the gitlinks,
    so the run ends at once."""
    manifests = manifest_set(tmp_path)
    root = tmp_path / "plain"
    root.mkdir()
    os.chown(root, AGENT_UID, AGENT_UID)
    plant = (
        "mkdir objects refs && mkfifo fifo && echo 'ref: refs/heads/main' > HEAD && printf"
        f" '[core]\\n\\tbare = false\\n\\tworktree = {root}\\n[include]\\n\\tpath = {root}/fifo\\n'"
        " > config"
    )
    task = write_task(root, "plant-fifo", {"steps": [plant], "verify": ["true"]})
    started = time.monotonic()
    done = kagura(["apply", "--yes", "--manifests", str(manifests), str(task)], cli_env(state_dir))
    took = time.monotonic() - started
    assert done.returncode == 0, done.stderr[-3000:]
    assert (root / "fifo").exists(), "the step ran"
    assert took < 29, f"the run's end waited {took:.0f}s on git (its timeout is 30 s)"
    [run_id] = run_ids(state_dir)
    assert leftovers(docker_client, run_id) == []


class _NoContainers:
    """The two calls sweep_dead_runs makes of a runtime: the dead run has none left."""

    def list(self, labels: dict[str, str]) -> list[str]:
        return []

    def remove(self, container_id: str, *, force: bool = False) -> None:
        raise AssertionError("nothing to remove")


@pytest.mark.usefixtures("without_docker")
def test_after_kill_9_the_next_applys_sweep_moves_it_aside_and_says_so(
    tmp_path: Path, state_dir: Path
) -> None:
    """The run's apply died before its own check: the next apply's sweep of dead runs does
    it by ctime, and says what it moved in its live view."""
    root = _superproject(tmp_path)
    marker = tmp_path / "PWNED"
    clock = FixedClock(datetime.now(UTC).replace(microsecond=0))
    row = plan_for_root(tmp_path, root)
    with open_store() as store:
        open_run(store, row, "run-dead", clock)
        with store.transaction() as conn:
            conn.execute("UPDATE runs SET pid_start = 'not-a-process-here'")
    (root / "lib" / ".git").unlink()
    _plant_repo(root / "lib" / ".git", marker)
    said: list[str] = []
    with open_store() as store:
        swept = sweep_dead_runs(
            store,
            _NoContainers(),
            clock,
            lambda finding: said.append(finding.message),
        )
    assert swept == ["run-dead"]
    _status_runs_nothing(root, marker)
    # The names are the agent's (and its run's redactor died with it): a count, no name.
    assert any("git repositories the run planted" in s and "withheld" in s for s in said), said
    assert not any("lib" in s for s in said), said
