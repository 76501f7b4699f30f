"""Clear the setuid and setgid bits a run left in its project root, on the host.

The agent runs as the project root's owner, so inside the container it can ``chmod u+s``
or ``g+s`` a file it wrote. There that is harmless (no-new-privileges), but the project
root is a bind mount of a host folder: on the host the file stays setuid to the operator,
and any other local user who can reach the folder runs it as the operator. So once the
run's last container is gone, apply walks the root and clears both bits on every regular
file, and the setuid bit on every directory, whose ctime is at or after the run's start
(``chmod`` sets ctime, so nothing the run changed escapes that bound).

A setgid directory is left alone: executing it grants nothing, it only makes new entries
inherit its group, and ``mkdir`` copies it from the parent, so every directory the agent
makes in a shared-group folder of the operator carries it legitimately.

The same walk takes the write bit for others (``o+w``) off every regular file and
directory the run changed: ``chmod -R 777`` from the agent would otherwise let any local
user of the host rewrite the operator's project — a script, a Makefile, a hook — that the
operator then runs. Group write is left alone (the group is the operator's own, and a
shared-group folder means it).

The walk holds a directory fd per level and never follows a symlink: each entry is
``lstat``-ed through its directory's fd, opened ``O_NOFOLLOW`` relative to that fd, and
changed with ``fchmod`` only when the open file is the inode that was ``lstat``-ed (same
``st_dev`` and ``st_ino``), so an entry swapped for a symlink mid-walk is skipped. It stays
on the root's device (another mount is not the bind mount the agent wrote through) and is
bounded in entries, time and depth; what it cleared, skipped or could not finish is reported.
"""

from __future__ import annotations

import errno
import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass

from kagura_agent.hygiene import neutralise

MAX_ENTRIES = 2_000_000
MAX_SECONDS = 120.0
MAX_DEPTH = 256  # open directory fds at once; below Python's recursion limit
# ctime comes from the kernel's coarse clock, which may lag time.time() slightly.
CTIME_SLACK = 2
SHOWN = 5

_OPEN = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_SET_ID = stat.S_ISUID | stat.S_ISGID
_FILE_BITS = _SET_ID | stat.S_IWOTH  # cleared on a regular file the run changed
_DIR_BITS = stat.S_ISUID | stat.S_IWOTH  # on a directory (setgid kept: see above)


@dataclass(frozen=True)
class SetidReport:
    """What one walk did: names are relative to the root (raw; ``summary`` neutralises)."""

    cleared: tuple[str, ...] = ()
    problems: tuple[str, ...] = ()
    scanned: int = 0
    truncated: bool = False
    world_writable: tuple[str, ...] = ()  # entries whose write bit for others was cleared

    def summary(self) -> list[str]:
        """Lines for the live view (empty when there is nothing to say)."""
        lines = []
        if self.cleared:
            lines.append(
                f"cleared setuid/setgid on {len(self.cleared)} file(s): {_names(self.cleared)}"
            )
        if self.world_writable:
            lines.append(
                f"cleared write for others on {len(self.world_writable)} entr"
                f"{'y' if len(self.world_writable) == 1 else 'ies'}:"
                f" {_names(self.world_writable)}"
            )
        if self.problems:
            lines.append(
                f"setuid/setgid check could not reach {len(self.problems)} entr"
                f"{'y' if len(self.problems) == 1 else 'ies'}: {_names(self.problems)}"
            )
        if self.truncated:
            lines.append(
                f"setuid/setgid check stopped at its bound after {self.scanned} entries;"
                " the rest of the project root was not checked"
            )
        return lines


def ctime_floor() -> int:
    """The ctime bound for a run starting now (seconds since the epoch, host clock)."""
    return int(time.time()) - CTIME_SLACK


def clear_setid(
    root: str,
    since: float,
    *,
    max_entries: int = MAX_ENTRIES,
    max_seconds: float = MAX_SECONDS,
    monotonic: Callable[[], float] = time.monotonic,
) -> SetidReport:
    """Clear setuid/setgid under ``root`` on entries changed at or after ``since``.
    Never raises OSError: what it cannot do is reported in the result."""
    walk = _Walk(since, monotonic() + max_seconds, max_entries, monotonic)
    try:
        root_fd = os.open(os.path.realpath(root), _OPEN | os.O_DIRECTORY)
    except OSError as exc:
        return SetidReport(problems=(f"{root} ({exc.strerror})",))
    try:
        walk.run(root_fd)
    finally:
        os.close(root_fd)
    return SetidReport(
        tuple(walk.cleared),
        tuple(walk.problems),
        walk.scanned,
        walk.truncated,
        tuple(walk.world_writable),
    )


class _Walk:
    def __init__(
        self, since: float, deadline: float, max_entries: int, monotonic: Callable[[], float]
    ) -> None:
        self.since = since
        self.deadline = deadline
        self.max_entries = max_entries
        self.monotonic = monotonic
        self.cleared: list[str] = []
        self.world_writable: list[str] = []
        self.problems: list[str] = []
        self.scanned = 0
        self.truncated = False

    def run(self, root_fd: int) -> None:
        root = os.fstat(root_fd)
        self._clear(root_fd, ".")
        self._scan(root_fd, "", root.st_dev, 0)

    def _scan(self, dir_fd: int, prefix: str, device: int, depth: int) -> None:
        """Check the entries of one directory, then walk its subdirectories, depth first.
        Only the directories on the current path are open (at most MAX_DEPTH fds): a
        folder of many subdirectories cannot exhaust the host's descriptors."""
        try:
            entries = list(os.scandir(dir_fd))
        except OSError as exc:
            self.problems.append(f"{prefix or '.'} ({exc.strerror})")
            return
        for entry in entries:
            if self.truncated:
                return
            self.scanned += 1
            if self.scanned >= self.max_entries or (
                self.scanned % 1024 == 0 and self.monotonic() > self.deadline
            ):
                self.truncated = True
                return
            name, rel = entry.name, prefix + entry.name
            try:
                seen = entry.stat(follow_symlinks=False)
            except OSError:
                continue  # gone since it was listed
            if seen.st_dev != device:
                continue  # another mount: not what the run wrote through
            is_dir = stat.S_ISDIR(seen.st_mode)
            if not is_dir and not (stat.S_ISREG(seen.st_mode) and self._suspect(seen)):
                continue
            fd = self._open(dir_fd, name, seen, rel, directory=is_dir)
            if fd is None:
                continue
            try:
                self._clear(fd, rel)
                if not is_dir:
                    continue
                if depth + 1 >= MAX_DEPTH:
                    self.problems.append(f"{rel} (deeper than {MAX_DEPTH} levels)")
                else:
                    self._scan(fd, rel + "/", device, depth + 1)
            finally:
                os.close(fd)

    def _suspect(self, st: os.stat_result) -> bool:
        bits = _DIR_BITS if stat.S_ISDIR(st.st_mode) else _FILE_BITS
        return bool(st.st_mode & bits) and st.st_ctime >= self.since

    def _open(
        self, dir_fd: int, name: str, seen: os.stat_result, rel: str, *, directory: bool
    ) -> int | None:
        """``name`` opened without following a symlink, if it is still the inode lstat saw."""
        flags = _OPEN | (os.O_DIRECTORY if directory else 0)
        try:
            fd = os.open(name, flags, dir_fd=dir_fd)
        except OSError as exc:
            if exc.errno == errno.EACCES and not directory:  # EACCES: mode 4000 has no read bit
                return self._open_path(dir_fd, name, seen)
            # ELOOP (swapped for a symlink), ENOTDIR, ENOENT: not the entry we saw; any
            # other failure (EACCES, EMFILE, EIO) leaves it unchecked, and is reported.
            if exc.errno not in (errno.ELOOP, errno.ENOTDIR, errno.ENOENT):
                self.problems.append(f"{rel} ({exc.strerror})")
            return None
        if not _same(os.fstat(fd), seen):
            os.close(fd)
            return None
        return fd

    def _open_path(self, dir_fd: int, name: str, seen: os.stat_result) -> int | None:
        """An ``O_PATH`` fd of an unreadable file (chmod through /proc/self/fd, below)."""
        try:
            fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
        except OSError:
            return None
        st = os.fstat(fd)
        if not _same(st, seen) or not stat.S_ISREG(st.st_mode):
            os.close(fd)
            return None
        return fd

    def _clear(self, fd: int, rel: str) -> None:
        st = os.fstat(fd)
        if not self._suspect(st):
            return
        bits = _DIR_BITS if stat.S_ISDIR(st.st_mode) else _FILE_BITS
        mode = stat.S_IMODE(st.st_mode) & ~bits
        try:
            os.fchmod(fd, mode)
        except OSError as exc:
            # EBADF: an O_PATH fd (_open_path), changed through its magic link, which
            # names this inode only.
            if exc.errno != errno.EBADF:
                self.problems.append(f"{rel} ({exc.strerror})")
                return
            try:
                os.chmod(f"/proc/self/fd/{fd}", mode)
            except OSError as again:
                self.problems.append(f"{rel} ({again.strerror})")
                return
        if st.st_mode & bits & ~stat.S_IWOTH:
            self.cleared.append(rel)
        if st.st_mode & stat.S_IWOTH:
            self.world_writable.append(rel)


def _same(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _names(names: tuple[str, ...]) -> str:
    shown = [
        neutralise(os.fsencode(n).decode("utf-8", "backslashreplace"), newlines=False)
        for n in names[:SHOWN]
    ]
    return ", ".join(shown) + (", ..." if len(names) > SHOWN else "")
