"""The host-side setuid/setgid check of a run's project root (apply/setid.py), unit level:
what it clears and keeps, the ctime bound, its bound on work, and a symlink swapped in
mid-walk never making it chmod anything outside the root."""

from __future__ import annotations

import os
import resource
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kagura_agent.apply import setid
from kagura_agent.apply.setid import clear_setid, ctime_floor

REPO = Path(__file__).resolve().parents[1]


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def _file(path: Path, mode: int) -> Path:
    path.write_bytes(b"#!/bin/sh\n")
    path.chmod(mode)
    return path


def _dir(path: Path, mode: int) -> Path:
    path.mkdir()
    path.chmod(mode)
    return path


def test_clears_write_for_others_keeps_group_write(tmp_path: Path) -> None:
    """``chmod -R 777`` by the agent would let any local user rewrite what the operator
    runs next; write for others comes off what the run changed, group write stays."""
    root = _dir(tmp_path / "root", 0o755)
    since = ctime_floor()
    root.chmod(0o777)
    _file(root / "run.sh", 0o777)
    _dir(root / "shared", 0o1777)
    _file(root / "shared" / "team", 0o664)
    # Changed before the run started (a bound in the future): left as it is.
    assert clear_setid(str(root), since + 3600).world_writable == ()
    assert _mode(root / "run.sh") == 0o777
    report = clear_setid(str(root), since)
    assert sorted(report.world_writable) == [".", "run.sh", "shared"]
    assert _mode(root) == 0o775 and _mode(root / "run.sh") == 0o775
    assert _mode(root / "shared") == 0o1775 and _mode(root / "shared" / "team") == 0o664
    assert report.cleared == ()
    [line] = report.summary()
    assert line.startswith("cleared write for others on 3 entries: ")


def test_clears_setuid_setgid_files_and_setuid_dirs_keeps_setgid_dirs(tmp_path: Path) -> None:
    root = _dir(tmp_path / "root", 0o755)
    since = ctime_floor()
    _file(root / "x", 0o4755)
    _dir(root / "d", 0o2775)
    _file(root / "d" / "g", 0o2755)
    _dir(root / "u", 0o4755)
    _file(root / "u" / "both", 0o6711)
    _file(root / "plain", 0o755)
    report = clear_setid(str(root), since)
    assert sorted(report.cleared) == ["d/g", "u", "u/both", "x"]
    assert _mode(root / "x") == 0o755 and _mode(root / "d" / "g") == 0o755
    assert _mode(root / "u") == 0o755 and _mode(root / "u" / "both") == 0o711
    assert _mode(root / "d") == 0o2775  # a setgid directory is kept (see the module)
    assert _mode(root / "plain") == 0o755
    assert report.problems == () and not report.truncated
    [line] = report.summary()
    assert line.startswith("cleared setuid/setgid on 4 file(s): ")


def test_the_root_itself_is_checked(tmp_path: Path) -> None:
    root = _dir(tmp_path / "root", 0o4755)
    assert clear_setid(str(root), ctime_floor()).cleared == (".",)
    assert _mode(root) == 0o755


def test_entries_unchanged_since_the_run_started_are_left(tmp_path: Path) -> None:
    """The operator's own setuid file, older than the run, is not the run's doing."""
    root = _dir(tmp_path / "root", 0o755)
    _file(root / "mine", 0o4755)
    report = clear_setid(str(root), ctime_floor() + 60)
    assert report.cleared == () and _mode(root / "mine") == 0o4755


def test_names_are_neutralised_and_a_few_shown(tmp_path: Path) -> None:
    root = _dir(tmp_path / "root", 0o755)
    since = ctime_floor()
    _file(root / "evil\n\x1b[2Jname", 0o4755)
    for i in range(7):
        _file(root / f"f{i}", 0o4755)
    [line] = clear_setid(str(root), since).summary()
    assert "\n" not in line and "\x1b" not in line
    assert line.startswith("cleared setuid/setgid on 8 file(s): ") and line.endswith(", ...")


def test_the_walk_is_bounded_and_says_so(tmp_path: Path) -> None:
    root = _dir(tmp_path / "root", 0o755)
    for i in range(10):
        _file(root / f"f{i}", 0o644)
    report = clear_setid(str(root), ctime_floor(), max_entries=4)
    assert report.truncated and report.scanned == 4
    assert "stopped at its bound after 4 entries" in report.summary()[-1]


def test_many_subdirectories_do_not_exhaust_descriptors(tmp_path: Path) -> None:
    """Only the directories on the walk's current path are open: more sibling folders
    than there are descriptors to spare are all checked."""
    root = _dir(tmp_path / "root", 0o755)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    # The limit bounds descriptor numbers: 32 above the highest one open now (a whole
    # suite's process holds more than 64); the free numbers below it count too. A walk
    # holding every folder open would run out 50 folders before the end.
    open_now = [int(fd) for fd in os.listdir("/proc/self/fd")]
    limit = max(open_now) + 33
    folders = limit - len(open_now) + 50
    since = ctime_floor()
    for i in range(folders):
        _file(_dir(root / f"d{i}", 0o755) / "x", 0o4755)
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
    try:
        report = clear_setid(str(root), since)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert len(report.cleared) == folders and report.problems == ()


def test_a_tree_deeper_than_the_bound_is_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(setid, "MAX_DEPTH", 3)
    root = _dir(tmp_path / "root", 0o755)
    since = ctime_floor()
    deep = root / "a" / "b" / "c" / "d"
    deep.mkdir(parents=True)
    _file(root / "a" / "x", 0o4755)
    report = clear_setid(str(root), since)
    assert report.cleared == ("a/x",)
    assert report.problems == ("a/b/c (deeper than 3 levels)",)
    assert "could not reach 1 entry: a/b/c (deeper than 3 levels)" in report.summary()[-1]


def test_a_missing_root_is_reported_not_raised(tmp_path: Path) -> None:
    report = clear_setid(str(tmp_path / "gone"), ctime_floor())
    assert report.cleared == () and len(report.problems) == 1


def _swap_on_open(
    monkeypatch: pytest.MonkeyPatch, name: str, swap: Callable[[], None]
) -> list[str]:
    """Run ``swap`` just before the walk opens ``name`` (after it lstat'ed it)."""
    real_open = os.open
    opened: list[str] = []

    def racing_open(path: Any, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
        if dir_fd is not None and path == name and not opened:
            opened.append(path)
            swap()
        return real_open(path, flags, mode, dir_fd=dir_fd)

    monkeypatch.setattr(os, "open", racing_open)
    return opened


@pytest.mark.parametrize("kind", ["file", "dir"])
def test_a_symlink_swapped_in_mid_walk_changes_nothing_outside(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """The agent replaces what the walk just lstat'ed with a symlink to the operator's
    setuid file (or a folder of them) outside the root: the walk must not follow it."""
    outside = _dir(tmp_path / "outside", 0o755)
    target = _file(outside / "operator-suid", 0o4755)
    root = _dir(tmp_path / "root", 0o755)
    since = ctime_floor()
    if kind == "file":
        _file(root / "bait", 0o4755)
        link_to = target
    else:
        _dir(root / "bait", 0o4755)
        _file(root / "bait" / "inner", 0o4755)
        link_to = outside

    def swap() -> None:
        moved = tmp_path / "moved"
        os.rename(root / "bait", moved)
        os.symlink(link_to, root / "bait")

    opened = _swap_on_open(monkeypatch, "bait", swap)
    report = clear_setid(str(root), since)
    monkeypatch.undo()
    assert opened == ["bait"]  # the swap happened between lstat and open
    assert _mode(target) == 0o4755  # nothing outside the root changed
    assert _mode(outside) == 0o755
    assert report.cleared == ()
    assert (root / "bait").is_symlink()


def test_a_file_swapped_for_another_inode_is_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hard link to an outside file swapped in is not the inode lstat saw: skipped."""
    outside = _file(tmp_path / "operator-suid", 0o4755)
    root = _dir(tmp_path / "root", 0o755)
    since = ctime_floor()
    _file(root / "bait", 0o4755)

    def swap() -> None:
        os.unlink(root / "bait")
        os.link(outside, root / "bait")

    _swap_on_open(monkeypatch, "bait", swap)
    report = clear_setid(str(root), since)
    monkeypatch.undo()
    assert _mode(outside) == 0o4755 and report.cleared == ()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another operator uid")
def test_an_operator_clears_a_setuid_file_it_cannot_read(tmp_path: Path) -> None:
    """Mode 4111 has no read bit for the owner: a non-root operator cannot open it
    O_RDONLY; the walk changes it through an O_PATH fd of the inode it lstat'ed."""
    base = Path(tempfile.mkdtemp(prefix="kagura-setid-"))
    try:
        os.chown(base, 1000, 1000)
        target = _file(base / "x", 0o755)
        os.chown(target, 1000, 1000)
        target.chmod(0o4111)
        script = (
            "import os, sys; from kagura_agent.apply.setid import clear_setid;"
            "os.setgroups([]); os.setgid(1000); os.setuid(1000);"
            "r = clear_setid(sys.argv[1], 0); print(r.cleared, r.problems)"
        )
        done = subprocess.run(
            [sys.executable, "-c", script, str(base)],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            timeout=60,
        )
        assert done.stdout.strip() == "('x',) ()", done.stderr
        assert _mode(target) == 0o111
    finally:
        shutil.rmtree(base)
