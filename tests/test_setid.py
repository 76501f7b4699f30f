"""The host-side setuid/setgid check of a run's project root (apply/aftercare/setid.py), unit level:
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

from kagura_agent.apply.aftercare import setid
from kagura_agent.apply.aftercare.setid import clear_setid, ctime_floor

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
    assert not clear_setid(str(root), since + 3600).world_writable
    assert _mode(root / "run.sh") == 0o777
    report = clear_setid(str(root), since)
    assert sorted(report.world_writable.shown) == [".", "run.sh", "shared"]
    assert _mode(root) == 0o775 and _mode(root / "run.sh") == 0o775
    assert _mode(root / "shared") == 0o1775 and _mode(root / "shared" / "team") == 0o664
    assert not report.cleared
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
    assert sorted(report.cleared.shown) == ["d/g", "u", "u/both", "x"]
    assert _mode(root / "x") == 0o755 and _mode(root / "d" / "g") == 0o755
    assert _mode(root / "u") == 0o755 and _mode(root / "u" / "both") == 0o711
    assert _mode(root / "d") == 0o2775  # a setgid directory is kept (see the module)
    assert _mode(root / "plain") == 0o755
    assert report.complete and not report.problems
    [line] = report.summary()
    assert line.startswith("cleared setuid/setgid on 4 file(s): ")


def test_the_root_itself_is_checked(tmp_path: Path) -> None:
    root = _dir(tmp_path / "root", 0o4755)
    assert clear_setid(str(root), ctime_floor()).cleared.shown == (".",)
    assert _mode(root) == 0o755


def test_entries_unchanged_since_the_run_started_are_left(tmp_path: Path) -> None:
    """The operator's own setuid file, older than the run, is not the run's doing."""
    root = _dir(tmp_path / "root", 0o755)
    _file(root / "mine", 0o4755)
    report = clear_setid(str(root), ctime_floor() + 60)
    assert not report.cleared and _mode(root / "mine") == 0o4755


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
    # Not reached: the root is quarantined by the caller (apply/aftercare/quarantine.py).
    assert not report.complete and report.why == ((setid.BOUND_REASON, 6),)


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
    assert report.cleared.count == folders and report.complete


def _chain(root: Path, depth: int, name: str = "d") -> int:
    """``depth`` nested directories under ``root``, made through fds (the path is longer
    than PATH_MAX); returns an fd of the deepest (the caller closes it)."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(depth):
        os.mkdir(name, dir_fd=fd)
        inner = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = inner
    return fd


def _plant(dir_fd: int, name: str, mode: int) -> None:
    fd = os.open(name, os.O_CREAT | os.O_WRONLY, 0o700, dir_fd=dir_fd)
    os.fchmod(fd, mode)
    os.close(fd)


def _rm(path: Path) -> None:
    """rm -rf: coreutils walks any depth (shutil.rmtree recurses)."""
    subprocess.run(["chmod", "-R", "u+rwx", str(path)], check=False)
    subprocess.run(["rm", "-rf", str(path)], check=True)


def test_a_tree_of_any_depth_is_walked_to_its_end(tmp_path: Path) -> None:
    """A setuid file 262 directories deep survived the walk's old depth bound (256) as
    "could not reach 1 entry". 3,000 levels (a path far past PATH_MAX, deeper than
    Python's recursion limit), setuid files at the top, the middle and the bottom, with
    names holding a newline and an escape, a FIFO, a socket and a hard link beside them:
    every bit is cleared, within a handful of descriptors, and nothing is unreached."""
    root = _dir(tmp_path / "root", 0o755)
    try:
        since = ctime_floor()
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        middle = _chain(root, 1500)
        _plant(middle, "mid\nline\x1b[2J", 0o4755)
        bottom = _chain(Path(f"/proc/self/fd/{middle}"), 1500)
        _plant(bottom, "x", 0o6755)
        os.link("x", "hard", src_dir_fd=bottom, dst_dir_fd=bottom)
        os.mkfifo("fifo", dir_fd=bottom)
        sock = subprocess.run(
            [
                sys.executable,
                "-c",
                "import socket,sys; socket.socket(socket.AF_UNIX).bind(sys.argv[1])",
                f"/proc/self/fd/{bottom}/sock",
            ],
            pass_fds=(bottom,),
            check=True,
        )
        assert sock.returncode == 0
        os.close(middle)
        _file(root / "top", 0o4755)
        # Descriptors: every number up to those open now, and the walk's budget beside.
        open_now = [int(fd) for fd in os.listdir("/proc/self/fd")]
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(open_now) + 80, hard))
        try:
            report = clear_setid(str(root), since)
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        assert report.complete, report.problems
        assert report.cleared.count == 3  # top, mid…, x (hard is the same inode)
        assert stat.S_IMODE(os.stat("x", dir_fd=bottom).st_mode) == 0o755
        assert stat.S_IMODE(os.stat("hard", dir_fd=bottom).st_mode) == 0o755
        assert _mode(root / "top") == 0o755
        assert report.scanned == 3000 + 1 + 4 + 1  # dirs, mid, x/hard/fifo/sock, top
        [line] = report.summary()
        assert "\n" not in line and "\x1b" not in line and "…" in line  # deep names cut
        os.close(bottom)
    finally:
        _rm(root)


def test_the_walk_holds_a_bounded_number_of_descriptors_and_keeps_its_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a budget of 3 open directories, a chain of 40 is walked: a level that gave up
    its fd is opened again as '..' of its child and must be the same inode. A subtree
    moved out from under the walk stops it, reported (never a chmod elsewhere)."""
    from kagura_agent.apply.aftercare import treewalk

    root = _dir(tmp_path / "root", 0o755)
    since = ctime_floor()
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    for i in range(40):
        os.mkdir(f"d{i}", dir_fd=fd)
        _plant(fd, f"f{i}", 0o4755)
        inner = os.open(f"d{i}", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = inner
    os.close(fd)
    real_iter = treewalk.TreeWalk.__iter__

    def small_budget(self: treewalk.TreeWalk[Any]) -> Any:
        self.fd_budget = 3
        return real_iter(self)

    monkeypatch.setattr(treewalk.TreeWalk, "__iter__", small_budget)
    report = clear_setid(str(root), since)
    assert report.complete and report.cleared.count == 40

    moved = tmp_path / "moved"

    def move() -> None:
        os.rename(root / "d0" / "d1" / "d2", moved)

    _swap_on_open(monkeypatch, "d30", move)
    report = clear_setid(str(root), since)
    monkeypatch.undo()
    # Back at d2, its folder's fd given up: '..' of d2 is no longer d1. The walk stops
    # there rather than guess, and says so: the caller quarantines the root.
    assert not report.complete
    assert [why for why, _ in report.why] == ["the tree moved under the walk"]
    assert report.problems.shown[0] == "d0/d1 (the tree moved under the walk)"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another operator uid")
def test_an_operator_walks_directories_the_agent_made_unreadable(tmp_path: Path) -> None:
    """The agent ``chmod 000``s its directories (and the root): an operator that is not
    root cannot list them. The walk gives each u+rx, clears what is inside, and gives it
    back its mode; nothing is left unreached."""
    base = Path(tempfile.mkdtemp(prefix="kagura-setid-"))
    try:
        os.chown(base, 1000, 1000)
        root = base / "root"
        root.mkdir()
        deep = root / "a" / "b"
        deep.mkdir(parents=True)
        target = _file(deep / "x", 0o755)
        for path in (root, root / "a", deep, target):
            os.chown(path, 1000, 1000)
        target.chmod(0o4755)  # after chown, which clears it
        for path in (deep, root / "a", root):
            path.chmod(0)
        script = (
            "import os, sys; from kagura_agent.apply.aftercare.setid import clear_setid;"
            "os.setgroups([]); os.setgid(1000); os.setuid(1000);"
            "r = clear_setid(sys.argv[1], 0);"
            "print(r.cleared.shown, r.problems.shown, r.complete)"
        )
        done = subprocess.run(
            [sys.executable, "-c", script, str(root)],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            timeout=60,
        )
        assert done.stdout.strip() == "('a/b/x',) () True", done.stderr
        assert _mode(target) == 0o755
        assert _mode(root) == _mode(root / "a") == _mode(deep) == 0  # given back
    finally:
        _rm(base)


def test_a_missing_root_is_reported_not_raised(tmp_path: Path) -> None:
    report = clear_setid(str(tmp_path / "gone"), ctime_floor())
    assert not report.cleared and report.problems.count == 1 and not report.complete


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
    assert not report.cleared
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
    assert _mode(outside) == 0o4755 and not report.cleared


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
            "import os, sys; from kagura_agent.apply.aftercare.setid import clear_setid;"
            "os.setgroups([]); os.setgid(1000); os.setuid(1000);"
            "r = clear_setid(sys.argv[1], 0); print(r.cleared.shown, r.problems.shown)"
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
