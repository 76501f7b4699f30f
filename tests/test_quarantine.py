"""A project root the aftercare walk cannot finish is quarantined (apply/aftercare/quarantine.py):
after ``kill -9`` the next apply's sweep of dead runs does it, loudly (red lines that say
what it means and the command that lifts it), never as a quiet note; apply then refuses
the root until ``kagura-agent aftercare ROOT`` has checked it to the end."""

from __future__ import annotations

import stat
import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from apply_helpers import plan_for_root

from kagura_agent.apply.aftercare.quarantine import refuse_quarantined
from kagura_agent.apply.aftercare.root import check_again
from kagura_agent.apply.aftercare.setid import CTIME_SLACK
from kagura_agent.apply.records.progress import Severity
from kagura_agent.apply.records.runs import open_run, sweep_dead_runs
from kagura_agent.clock import FixedClock
from kagura_agent.errors import RefusedError
from kagura_agent.state import open_store


class _NoContainers:
    def list(self, labels: dict[str, str]) -> list[str]:
        return []

    def remove(self, container_id: str, *, force: bool = False) -> None:
        raise AssertionError("nothing to remove")


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "root"
    path.mkdir()
    path.chmod(0o755)
    yield path
    subprocess.run(["chattr", "-R", "-i", str(path)], check=False, capture_output=True)


def _immutable(path: Path, on: bool) -> None:
    """What not even root may chmod: the walk's change fails (EPERM)."""
    subprocess.run(["chattr", "+i" if on else "-i", str(path)], check=True)


@pytest.mark.usefixtures("without_docker")
def test_after_kill_9_the_sweep_quarantines_a_root_it_cannot_finish(
    root: Path, tmp_path: Path, state_dir: Path
) -> None:
    clock = FixedClock(datetime.now(UTC).replace(microsecond=0))
    plan = plan_for_root(tmp_path, root)
    with open_store() as store:
        open_run(store, plan, "run-dead", clock)
        with store.transaction() as conn:
            conn.execute("UPDATE runs SET pid_start = 'not-a-process-here'")
    stuck = root / "Leak-5f3a9c2e7b1d"
    stuck.write_bytes(b"#!/bin/sh\n")
    stuck.chmod(0o4755)
    (root / "fine").write_bytes(b"")
    (root / "fine").chmod(0o4755)
    _immutable(stuck, True)
    said: list[tuple[str, Severity]] = []
    with open_store() as store:
        swept = sweep_dead_runs(
            store,
            _NoContainers(),  # type: ignore[arg-type]
            clock,
            lambda finding: said.append((finding.message, finding.severity)),
        )
    assert swept == ["run-dead"]
    red = [line for line, severity in said if severity == Severity.PROBLEM]
    real = root.resolve()
    assert red[0].startswith(
        f"QUARANTINED {real}: the aftercare could not check 1 entry (Operation not permitted: 1)"
    )
    assert red[1] == (
        "the root's mode is now 0700 (was 0755) and its access ACL is removed: no other user"
        " can enter it; apply refuses it until it is checked again"
    )
    assert red[2] == f"to check it again and lift this: kagura-agent aftercare {real}"
    assert all("Leak-" not in line for line, _ in said)  # the agent chose the names
    assert stat.S_IMODE(root.stat().st_mode) == 0o700
    assert stat.S_IMODE((root / "fine").stat().st_mode) == 0o755  # the rest was cleared

    with open_store() as store:
        with pytest.raises(RefusedError) as refused:
            refuse_quarantined(store, str(root))
        assert (
            refused.value.hint
            == f"check it again and lift the quarantine: kagura-agent aftercare {real}"
        )
        with pytest.raises(RefusedError, match="stays quarantined: still could not check 1 "):
            check_again(store, str(root))
        assert stat.S_IMODE(root.stat().st_mode) == 0o700
        _immutable(stuck, False)
        walk, mode = check_again(store, str(root))
        assert walk.complete and mode == 0o755
        assert stat.S_IMODE(root.stat().st_mode) == 0o755
        assert stat.S_IMODE(stuck.stat().st_mode) == 0o755
        refuse_quarantined(store, str(root))  # lifted: no refusal
        with pytest.raises(RefusedError, match="is not quarantined"):
            check_again(store, str(root))


def _git(cwd: Path, *args: str) -> None:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "HOME": str(cwd)}
    env |= {"GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t", "PATH": "/usr/bin:/bin"}
    env["GIT_CONFIG_GLOBAL"] = "/dev/null"
    done = subprocess.run(
        ["git", "-c", "protocol.file.allow=always", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.usefixtures("without_docker")
def test_a_planted_repository_it_cannot_move_aside_quarantines_the_root(
    root: Path, tmp_path: Path, state_dir: Path
) -> None:
    """Not only the setid walk: a submodule whose planted repository cannot be moved aside
    (its folder immutable) is a check the aftercare could not finish — the operator's
    next git status would run the agent's configuration. Quarantined, said in red."""
    source = tmp_path / "lib-src"
    source.mkdir()
    _git(source, "init", "-q")
    _git(source, "commit", "-q", "--allow-empty", "-m", "one")
    _git(root, "init", "-q")
    _git(root, "submodule", "add", "-q", str(source), "lib")
    _git(root, "commit", "-q", "-m", "submodule")
    time.sleep(CTIME_SLACK + 1.1)
    clock = FixedClock(datetime.now(UTC).replace(microsecond=0))
    with open_store() as store:
        open_run(store, plan_for_root(tmp_path, root), "run-dead", clock)
        with store.transaction() as conn:
            conn.execute("UPDATE runs SET pid_start = 'not-a-process-here'")
    (root / "lib" / ".git").unlink()
    planted = root / "lib" / ".git"
    planted.mkdir()
    for name in ("objects", "refs"):
        (planted / name).mkdir()
    (planted / "HEAD").write_text("ref: refs/heads/main\n")
    (planted / "config").write_text("[core]\n\tfsmonitor = touch PWNED; false\n")
    _immutable(root / "lib", True)
    said: list[tuple[str, Severity]] = []
    with open_store() as store:
        sweep_dead_runs(
            store,
            _NoContainers(),  # type: ignore[arg-type]
            clock,
            lambda finding: said.append((finding.message, finding.severity)),
        )
        red = [line for line, severity in said if severity == Severity.PROBLEM]
        assert red and red[0].startswith(
            f"QUARANTINED {root.resolve()}: the aftercare could not check 1 entry"
            " (a submodule or the root's repository: 1)"
        ), said
        assert stat.S_IMODE(root.stat().st_mode) == 0o700
        _immutable(root / "lib", False)
        check_again(store, str(root))  # now moved aside: lifted
    assert (root / "lib" / ".git.kagura-refused-1" / "config").exists()
    assert stat.S_IMODE(root.stat().st_mode) == 0o755
