"""Walk a directory tree of any depth through directory fds, never following a symlink.

The aftercare walks (setid.py, and the start-of-run ACL record in acl.py) must reach every
entry an agent can make in its project root: a chain of 300 or 100,000 directories, a
directory it ``chmod 000``-ed, names with newlines or escapes, FIFOs and sockets, hard
links. So this walk is

- an explicit stack, not recursion: no depth is too deep for it;
- relative to directory fds (``openat``/``fstatat`` of one name at a time): no path is
  ever built, so no ``PATH_MAX`` and no symlink on the way can be followed;
- bounded in descriptors: at most ``FD_BUDGET`` directories are open at once. The
  shallowest open level gives up its fd when a deeper one needs one, and when the walk
  comes back up to it, it is opened again as ``..`` of the child it left and must be the
  inode (``st_dev``, ``st_ino``) it was. If it is not (someone moved the tree under the
  walk) the walk stops and says so: what it had not reached is then reported unreached.

A directory its owner cannot list (mode 000 from the agent) stops only an operator that is
not root (root reads any directory): when the operator owns it, it is opened ``O_PATH``
(never through a symlink), given ``u+rx`` through its ``/proc/self/fd`` link (that names
the one inode), walked, and given back the mode it had (less what the caller cleared) when
the walk leaves it.

Names are what the kernel gives (``str`` with surrogate escapes); the caller neutralises
them before anything is shown. What the walk could not reach is in ``unreached``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Generic, NamedTuple, TypeVar

FD_BUDGET = 64
KEPT = 50  # unreached entries kept by name (the rest are counted)
MOVED = "the tree moved under the walk"

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_OWNER_RX = stat.S_IRUSR | stat.S_IXUSR

T = TypeVar("T")


class Unreached:
    """Entries a walk could not check: the first ``KEPT`` by name, all of them counted,
    and how many for each reason (reasons are the walk's own words, never a name)."""

    def __init__(self) -> None:
        self.shown: list[str] = []
        self.count = 0
        self.reasons: dict[str, int] = {}

    def add(self, rel: str, reason: str) -> None:
        self.count += 1
        self.reasons[reason] = self.reasons.get(reason, 0) + 1
        if len(self.shown) < KEPT:
            self.shown.append(f"{rel or '.'} ({reason})")

    def count_only(self) -> bool:
        """Whether the next entry is only counted (so its name need not be built)."""
        return len(self.shown) >= KEPT

    def __bool__(self) -> bool:
        return self.count > 0


class _Child(NamedTuple, Generic[T]):
    name: str
    ident: tuple[int, int]
    seen: os.stat_result
    state: T


@dataclass
class _Level(Generic[T]):
    fd: int | None
    ident: tuple[int, int]
    name: str
    added: int  # mode bits given for the walk, taken back when it leaves
    children: list[_Child[T]] = field(default_factory=list)  # subdirectories still to walk


class Directory(NamedTuple, Generic[T]):
    """One directory: its fd (open while the caller handles it), the names in it, and the
    state the caller gave it (``push``; the root's: ``root_state``)."""

    fd: int
    names: list[str]
    state: T


@dataclass
class TreeWalk(Generic[T]):
    """Depth first over the directories under ``root_fd`` (not closed here: the walk holds
    a duplicate), the root first. For each directory yielded the caller ``lstat``-s its
    names through its fd and ``push``-es the subdirectories to walk (later, each opened
    by ``open_dir`` relative to its folder's fd). ``stop`` ends the walk, counting what
    it had not reached yet as unreached."""

    root_fd: int
    root_state: T
    root_added: int = 0  # what open_root gave the root (taken back at the end)
    dirs_only: bool = False  # list directories only (told by d_type: no stat for a file)
    fd_budget: int | None = None  # None: FD_BUDGET
    unreached: Unreached = field(default_factory=Unreached)
    _stack: list[_Level[T]] = field(default_factory=list)
    _open: int = 0  # levels holding an fd: always the deepest ones
    _stopped: str | None = None

    def __iter__(self) -> Iterator[Directory[T]]:
        fd = os.dup(self.root_fd)
        self._stack.append(_Level(fd, _ident(os.fstat(fd)), "", self.root_added))
        self._open = 1
        try:
            names = self._list(fd, "")
            if names is not None:
                yield Directory(fd, names, self.root_state)
            while self._stack and self._stopped is None:
                level = self._stack[-1]
                if not level.children:
                    self._leave()
                    continue
                child = level.children.pop()
                assert level.fd is not None  # the deepest level is always open
                entered = self._enter(level.fd, child)
                if entered is not None:
                    yield entered
            if self._stopped is not None:
                self._abandon(self._stopped)
        finally:
            self.close()

    def rel(self, name: str) -> str:
        """``name`` in the directory last yielded, as a path relative to the root ("" and
        the root: "")."""
        parts = [level.name for level in self._stack[1:]]
        return "/".join([*parts, name]) if name else "/".join(parts)

    def push(self, name: str, seen: os.stat_result, state: T) -> None:
        """Walk the subdirectory ``name`` (``lstat``-ed as ``seen``) of the directory last
        yielded, with ``state``; it is opened when its turn comes (``open_dir``)."""
        self._stack[-1].children.append(_Child(name, _ident(seen), seen, state))

    def stop(self, reason: str) -> None:
        """End the walk; every directory not walked yet is counted unreached."""
        self._stopped = reason

    def close(self) -> None:
        while self._stack:
            level = self._stack.pop()
            if level.fd is not None:
                _restore(level.fd, level.added)
                os.close(level.fd)
        self._open = 0

    def _enter(self, parent_fd: int, child: _Child[T]) -> Directory[T] | None:
        try:
            opened = open_dir(parent_fd, child.name, child.seen)
        except OSError as exc:
            self.unreached.add(self.rel(child.name), exc.strerror or str(exc))
            return None
        if opened is None:
            return None  # no longer the directory lstat saw: not walked
        fd, added = opened
        self._stack.append(_Level(fd, child.ident, child.name, added))
        self._open += 1
        # The open levels are always the deepest: past the budget, the first of them closes.
        if self._open > (self.fd_budget or FD_BUDGET):
            shallowest = self._stack[len(self._stack) - self._open]
            assert shallowest.fd is not None
            os.close(shallowest.fd)
            shallowest.fd = None
            self._open -= 1
        names = self._list(fd, "")
        return None if names is None else Directory(fd, names, child.state)

    def _list(self, fd: int, name: str) -> list[str] | None:
        try:
            with os.scandir(fd) as listing:
                return [
                    entry.name
                    for entry in listing
                    if not self.dirs_only or entry.is_dir(follow_symlinks=False)
                ]
        except OSError as exc:
            self.unreached.add(self.rel(name), exc.strerror or str(exc))
            return None

    def _leave(self) -> None:
        level = self._stack.pop()
        self._open -= 1
        assert level.fd is not None
        try:
            if self._stack and self._stack[-1].fd is None:
                if self._reopen_parent(level):
                    self._open += 1
                else:
                    self._stopped = MOVED
                    self.unreached.add(self.rel(""), MOVED)
        finally:
            _restore(level.fd, level.added)
            os.close(level.fd)

    def _reopen_parent(self, child: _Level[T]) -> bool:
        assert child.fd is not None
        parent = self._stack[-1]
        try:
            fd = os.open("..", DIR_FLAGS, dir_fd=child.fd)
        except OSError:
            return False
        if _ident(os.fstat(fd)) != parent.ident:
            os.close(fd)
            return False
        parent.fd = fd
        return True

    def _abandon(self, reason: str) -> None:
        """Count every directory still waiting on the stack as unreached."""
        parts: list[str] = []
        for depth, level in enumerate(self._stack):
            if depth:
                parts.append(level.name)
            for child in level.children:
                rel = "" if self.unreached.count_only() else "/".join([*parts, child.name])
                self.unreached.add(rel, reason)
            level.children = []


def open_dir(dir_fd: int, name: str, seen: os.stat_result) -> tuple[int, int] | None:
    """``name`` (a directory, ``lstat``-ed as ``seen``) opened for reading without
    following a symlink, and the mode bits given to it to read it (0 unless the operator
    owns an unreadable directory: see the module). None when it is no longer the entry
    ``seen`` (gone, swapped for a symlink or another inode). Raises OSError otherwise."""
    try:
        fd = os.open(name, DIR_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.ENOENT):
            return None
        if exc.errno != errno.EACCES or seen.st_uid != os.geteuid():
            raise
        return _open_unreadable(dir_fd, name, seen)
    if _ident(os.fstat(fd)) != _ident(seen):
        os.close(fd)
        return None
    return fd, 0


def open_root(path: str) -> tuple[int, int]:
    """The project root opened as ``open_dir`` opens a directory (its last component not
    followed: callers pass a real path). Raises OSError."""
    parent, name = os.path.split(os.path.realpath(path))
    parent_fd = os.open(parent or "/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        seen = os.stat(name, dir_fd=parent_fd, follow_symlinks=False) if name else None
        if seen is None:
            return os.open("/", DIR_FLAGS), 0
        if not stat.S_ISDIR(seen.st_mode):
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), path)
        opened = open_dir(parent_fd, name, seen)
        if opened is None:
            raise FileNotFoundError(errno.ENOENT, "changed while it was opened", path)
        return opened
    finally:
        os.close(parent_fd)


def _open_unreadable(dir_fd: int, name: str, seen: os.stat_result) -> tuple[int, int] | None:
    path_fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        st = os.fstat(path_fd)
        if _ident(st) != _ident(seen) or not stat.S_ISDIR(st.st_mode):
            return None
        added = _OWNER_RX & ~st.st_mode
        magic = f"/proc/self/fd/{path_fd}"
        os.chmod(magic, stat.S_IMODE(st.st_mode) | added)
        try:
            fd = os.open(magic, DIR_FLAGS & ~os.O_NOFOLLOW)
        except OSError:
            os.chmod(magic, stat.S_IMODE(st.st_mode))
            raise
        return fd, added
    finally:
        os.close(path_fd)


def _restore(fd: int, added: int) -> None:
    if not added:
        return
    # When it fails, the directory keeps u+rx: more than it had, for its owner only.
    with contextlib.suppress(OSError):
        os.fchmod(fd, stat.S_IMODE(os.fstat(fd).st_mode) & ~added)


def _ident(st: os.stat_result) -> tuple[int, int]:
    return st.st_dev, st.st_ino
