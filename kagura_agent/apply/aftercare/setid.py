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

The walk (apply/aftercare/treewalk.py) goes through directory fds, to any depth, and never follows
a symlink: each entry is ``lstat``-ed through its directory's fd, opened ``O_NOFOLLOW``
relative to that fd, and changed with ``fchmod`` only when the open file is the inode that
was ``lstat``-ed (same ``st_dev`` and ``st_ino``), so an entry swapped for a symlink
mid-walk is skipped. FIFOs, sockets and symlinks are ``lstat``-ed only, never opened. It
stays on the root's device (another mount is not the bind mount the agent wrote through)
and is bounded in entries and time. Whatever it could not reach or change — a bound
reached, an I/O error, a directory it may not read — is in ``problems``: the root may still
hold what the run left, and the caller quarantines it (apply/aftercare/quarantine.py).

The same walk removes the POSIX ACL entries the run added that grant another user or
group access (apply/aftercare/acl.py: the rule, what it keeps of an operator's shared-group ACLs,
and its residue). A regular file the run changed is checked through its directory's fd
(``llistxattr``, then ``lgetxattr`` when it has an access ACL) and opened only when
something is to be removed; ACLs are read and written through ``/proc/self/fd/N`` of the
open fd (``O_PATH`` when unreadable).
"""

from __future__ import annotations

import errno
import functools
import os
import stat
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from kagura_agent.apply.aftercare import acl
from kagura_agent.apply.aftercare.treewalk import KEPT, Directory, TreeWalk, Unreached, open_root
from kagura_agent.hygiene import neutralise
from kagura_agent.state.history import CTIME_SLACK

MAX_ENTRIES = 2_000_000
MAX_SECONDS = 120.0
SHOWN = 5
SHOWN_CHARS = 120  # a name deeper than this is shown by its end
BOUND_REASON = "the walk stopped at its bound"
# What a killed run's report shows for the names the agent chose (see summary).
WITHHELD_NAMES = "names withheld (the run was killed)"

_OPEN = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_SET_ID = stat.S_ISUID | stat.S_ISGID
_FILE_BITS = _SET_ID | stat.S_IWOTH  # cleared on a regular file the run changed
_DIR_BITS = stat.S_ISUID | stat.S_IWOTH  # on a directory (setgid kept: see above)

_Limit = dict[acl.Key, int] | None  # what a folder's default ACL allows; None: nothing
_Rel = Callable[[], str]  # an entry's path from the root, built only when it is reported
_Inherited = tuple[_Limit, bool]  # a directory's: its folder's ACL limit, whether it changed


@dataclass(frozen=True)
class Names:
    """Entries of one kind: the first ``KEPT`` by name (relative to the root, raw:
    ``summary`` neutralises), all of them counted (a deep tree's names are long)."""

    shown: tuple[str, ...] = ()
    count: int = 0

    def __bool__(self) -> bool:
        return self.count > 0


class _Found:
    def __init__(self) -> None:
        self.shown: list[str] = []
        self.count = 0

    def add(self, rel: _Rel) -> None:
        self.count += 1
        if len(self.shown) < KEPT:
            self.shown.append(rel() or ".")

    def names(self) -> Names:
        return Names(tuple(self.shown), self.count)


@dataclass(frozen=True)
class SetidReport:
    """What one walk did. ``problems``: what it could not reach or change (with why)."""

    cleared: Names = Names()
    problems: Names = Names()
    scanned: int = 0
    truncated: bool = False
    world_writable: Names = Names()  # entries whose write bit for others was cleared
    acl_removed: Names = Names()  # entries an ACL granting others was removed from
    why: tuple[tuple[str, int], ...] = ()  # the problems' reasons and their counts

    @property
    def complete(self) -> bool:
        """Every entry reached and every change made: nothing of the run can be left."""
        return not self.problems and not self.truncated

    def summary(self, *, withhold_names: bool = False) -> list[str]:
        """Lines for the live view (empty when there is nothing to say). With
        ``withhold_names`` (a killed run's root, swept by a later run: the agent chose the
        names, and the redactor that knew its credentials died with it) no name is shown.
        What could not be reached is not among them: the quarantine says it
        (apply/aftercare/quarantine.py)."""

        def _names(names: Names) -> str:
            return WITHHELD_NAMES if withhold_names else shown(names)

        lines = []
        if self.cleared:
            lines.append(
                f"cleared setuid/setgid on {self.cleared.count} file(s): {_names(self.cleared)}"
            )
        if self.world_writable:
            lines.append(
                f"cleared write for others on {_entries(self.world_writable.count)}:"
                f" {_names(self.world_writable)}"
            )
        if self.acl_removed:
            lines.append(
                "removed ACL entries granting other users on"
                f" {_entries(self.acl_removed.count)}: {_names(self.acl_removed)}"
            )
        return lines


def ctime_floor() -> int:
    """The ctime bound for a run starting now (seconds since the epoch, host clock)."""
    return int(time.time()) - CTIME_SLACK


def clear_setid(
    root: str,
    since: float,
    *,
    root_acl: str | None = None,
    max_entries: int | None = MAX_ENTRIES,
    max_seconds: float | None = MAX_SECONDS,
    monotonic: Callable[[], float] = time.monotonic,
) -> SetidReport:
    """Clear setuid/setgid under ``root`` on entries changed at or after ``since``, and the
    ACL entries granting others (``root_acl``: the directories' ACLs at the run's start,
    from ``acl.snapshot``; None when not recorded: the root's are then kept as they are).
    ``max_entries``/``max_seconds`` None: no bound (the operator's ``aftercare``).
    Never raises OSError: what it cannot do is reported in ``problems``."""
    deadline = None if max_seconds is None else monotonic() + max_seconds
    walk = _Walk(since, deadline, max_entries, monotonic, root_acl)
    try:
        root_fd, added = open_root(root)
    except OSError as exc:
        walk.unreached.add(".", exc.strerror or str(exc))
    else:
        try:
            walk.run(root_fd, added)
        finally:
            os.close(root_fd)
    return SetidReport(
        walk.cleared.names(),
        Names(tuple(walk.unreached.shown), walk.unreached.count),
        walk.scanned,
        walk.truncated,
        walk.world_writable.names(),
        walk.acl_removed.names(),
        tuple(sorted(walk.unreached.reasons.items())),
    )


class _Walk:
    def __init__(
        self,
        since: float,
        deadline: float | None,
        max_entries: int | None,
        monotonic: Callable[[], float],
        root_acl: str | None = None,
    ) -> None:
        self.since = since
        self.deadline = deadline
        self.max_entries = sys.maxsize if max_entries is None else max_entries
        self.monotonic = monotonic
        self.cleared = _Found()
        self.world_writable = _Found()
        self.acl_removed = _Found()
        self.unreached = Unreached()
        self.scanned = 0
        self.truncated = False
        self.acls = True  # False once the file system says it has no ACLs
        self.snapshot = None if root_acl is None else acl.from_snapshot(root_acl)

    def run(self, root_fd: int, root_added: int) -> None:
        root = os.fstat(root_fd)
        if self.snapshot is None:  # not recorded: keep what the root has
            path = f"/proc/self/fd/{root_fd}"
            self.snapshot = {
                root.st_ino: (
                    self._read(path, acl.ACCESS, _root),
                    self._read(path, acl.DEFAULT, _root),
                )
            }
        walk: TreeWalk[_Inherited] = TreeWalk(
            root_fd,
            (None, root.st_ctime >= self.since),
            root_added=root_added,
            unreached=self.unreached,
        )
        for directory in walk:
            self._directory(walk, directory, root.st_dev)

    def _directory(
        self, walk: TreeWalk[_Inherited], directory: Directory[_Inherited], device: int
    ) -> None:
        """The directory itself, then each entry in it: regular files are checked (and
        opened only when there is something to clear), subdirectories pushed to walk."""
        dir_fd, names, (inherited, changed) = directory
        limit = self._clear(dir_fd, functools.partial(walk.rel, ""), inherited, changed=changed)
        since, max_entries = self.since, self.max_entries
        for index, name in enumerate(names):
            if self.scanned >= max_entries or (
                not self.scanned & 1023
                and self.deadline is not None
                and self.monotonic() > self.deadline
            ):
                self.truncated = True
                for rest in names[index:]:
                    self.unreached.add(walk.rel(rest), BOUND_REASON)
                walk.stop(BOUND_REASON)
                return
            try:
                seen = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            except FileNotFoundError:
                continue  # gone since it was listed
            except OSError as exc:
                self.unreached.add(walk.rel(name), exc.strerror or str(exc))
                continue
            self.scanned += 1
            if seen.st_dev != device:
                continue  # another mount: not what the run wrote through
            mode = seen.st_mode
            if stat.S_ISDIR(mode):
                walk.push(name, seen, (limit, seen.st_ctime >= since))
            # FIFOs, sockets, symlinks are only lstat-ed; a regular file the run changed is
            # opened only when there is something to clear.
            elif (
                stat.S_ISREG(mode)
                and seen.st_ctime >= since
                and (mode & _FILE_BITS or self._acl_to_strip(dir_fd, name, limit))
            ):
                self._file(dir_fd, name, seen, limit, functools.partial(walk.rel, name))

    def _file(self, dir_fd: int, name: str, seen: os.stat_result, limit: _Limit, rel: _Rel) -> None:
        fd = self._open(dir_fd, name, seen, rel)
        if fd is None:
            return
        try:
            self._clear(fd, rel, limit, changed=True)
        finally:
            os.close(fd)

    def _suspect(self, st: os.stat_result) -> bool:
        bits = _DIR_BITS if stat.S_ISDIR(st.st_mode) else _FILE_BITS
        return bool(st.st_mode & bits) and st.st_ctime >= self.since

    def _open(self, dir_fd: int, name: str, seen: os.stat_result, rel: _Rel) -> int | None:
        """The regular file ``name`` opened without following a symlink, if it is still
        the inode lstat saw."""
        try:
            fd = os.open(name, _OPEN, dir_fd=dir_fd)
        except OSError as exc:
            if exc.errno == errno.EACCES:  # EACCES: mode 4000 has no read bit
                return self._open_path(dir_fd, name, seen)
            # ELOOP (swapped for a symlink), ENOTDIR, ENOENT: not the entry we saw; any
            # other failure (EMFILE, EIO) leaves it unchecked, and is reported.
            if exc.errno not in (errno.ELOOP, errno.ENOTDIR, errno.ENOENT):
                self.unreached.add(rel(), exc.strerror or str(exc))
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

    def _acl_to_strip(self, dir_fd: int, name: str, limit: _Limit) -> bool:
        """Whether a changed regular file's access ACL has an entry ``limit`` does not
        allow: one lgetxattr, the last component not followed (a symlink has no ACL)."""
        if not self.acls:
            return False
        path = f"/proc/self/fd/{dir_fd}/{name}"
        try:
            # listxattr first: no exception for the common file without any (~2x faster)
            if acl.ACCESS not in os.listxattr(path, follow_symlinks=False):
                return False
            entries = acl.read(path, acl.ACCESS, follow=False)
        except OSError as exc:
            if exc.errno in (errno.EOPNOTSUPP, errno.ENOTSUP):
                self.acls = False
                return False
            return exc.errno != errno.ENOENT  # open it: _clear reports what it cannot read
        except acl.AclError:
            return True
        return entries is not None and acl.strip_access(entries, limit) is not None

    def _read(self, path: str, name: str, rel: _Rel) -> list[acl.Entry] | None:
        if not self.acls:
            return None
        try:
            return acl.read(path, name, follow=True)
        except OSError as exc:
            if exc.errno in (errno.EOPNOTSUPP, errno.ENOTSUP):
                self.acls = False
            else:
                self.unreached.add(rel(), f"ACL: {exc.strerror}")
        except acl.AclError as exc:
            self.unreached.add(rel(), str(exc))
        return None

    def _write(self, path: str, name: str, entries: list[acl.Entry] | None, rel: _Rel) -> bool:
        try:
            if entries is None:
                os.removexattr(path, name)
            else:
                os.setxattr(path, name, acl.build(entries))
        except OSError as exc:
            self.unreached.add(rel(), f"ACL: {exc.strerror}")
            return False
        return True

    def _clear_acl(self, fd: int, rel: _Rel, inherited: _Limit, *, changed: bool) -> _Limit:
        """Remove what ``acl`` says the run added; returns what this directory allows its
        own entries (its default ACL when unchanged, else what is left of it)."""
        path = f"/proc/self/fd/{fd}"
        st = os.fstat(fd)
        is_dir = stat.S_ISDIR(st.st_mode)
        default = self._read(path, acl.DEFAULT, rel) if is_dir else None
        if not changed:
            return _limit(default)
        access_limit = default_limit = inherited
        recorded = self.snapshot.get(st.st_ino) if is_dir and self.snapshot else None
        if recorded is not None:
            access_limit, default_limit = _limit(recorded[0]), _limit(recorded[1])
        removed = False
        access = self._read(path, acl.ACCESS, rel)
        if access is not None:
            stripped = acl.strip_access(access, access_limit)
            if stripped is not None and self._write(path, acl.ACCESS, stripped, rel):
                removed = True
        if default is not None and not acl.within(default, default_limit):
            fallback = (
                None
                if default_limit is None
                else [(tag, perm, ident) for (tag, ident), perm in default_limit.items()]
            )
            if self._write(path, acl.DEFAULT, fallback, rel):
                removed, default = True, fallback
        if removed:
            self.acl_removed.add(rel)
        return _limit(default)

    def _clear(self, fd: int, rel: _Rel, inherited: _Limit, *, changed: bool) -> _Limit:
        inner = self._clear_acl(fd, rel, inherited, changed=changed)
        self._clear_bits(fd, rel)
        return inner

    def _clear_bits(self, fd: int, rel: _Rel) -> None:
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
                self.unreached.add(rel(), exc.strerror or str(exc))
                return
            try:
                os.chmod(f"/proc/self/fd/{fd}", mode)
            except OSError as again:
                self.unreached.add(rel(), again.strerror or str(again))
                return
        if st.st_mode & bits & ~stat.S_IWOTH:
            self.cleared.add(rel)
        if st.st_mode & stat.S_IWOTH:
            self.world_writable.add(rel)


def _root() -> str:
    return "."


def _entries(count: int) -> str:
    return f"{count} entr{'y' if count == 1 else 'ies'}"


def _limit(entries: list[acl.Entry] | None) -> _Limit:
    return None if entries is None else acl.allowed(entries)


def _same(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def shown(names: Names) -> str:
    """A few of ``names`` for one line: neutralised, a long one by its end."""
    out = []
    for name in names.shown[:SHOWN]:
        text = neutralise(os.fsencode(name).decode("utf-8", "backslashreplace"), newlines=False)
        out.append(text if len(text) <= SHOWN_CHARS else "…" + text[-SHOWN_CHARS:])
    return ", ".join(out) + (", ..." if names.count > SHOWN else "")
