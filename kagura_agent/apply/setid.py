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

The same walk removes the POSIX ACL entries the run added that grant another user or
group access (apply/acl.py: the rule, what it keeps of an operator's shared-group ACLs,
and its residue). A regular file the run changed is checked through its directory's fd
(``llistxattr``, then ``lgetxattr`` when it has an access ACL) and opened only when
something is to be removed; ACLs are read and written through ``/proc/self/fd/N`` of the
open fd (``O_PATH`` when unreadable).
"""

from __future__ import annotations

import errno
import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass

from kagura_agent.apply import acl
from kagura_agent.hygiene import neutralise

MAX_ENTRIES = 2_000_000
MAX_SECONDS = 120.0
MAX_DEPTH = 256  # open directory fds at once; below Python's recursion limit
# ctime comes from the kernel's coarse clock, which may lag time.time() slightly.
CTIME_SLACK = 2
SHOWN = 5
# What a killed run's report shows for the names the agent chose (see summary).
WITHHELD_NAMES = "names withheld (the run was killed)"

_OPEN = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_SET_ID = stat.S_ISUID | stat.S_ISGID
_FILE_BITS = _SET_ID | stat.S_IWOTH  # cleared on a regular file the run changed
_DIR_BITS = stat.S_ISUID | stat.S_IWOTH  # on a directory (setgid kept: see above)

_Limit = dict[acl.Key, int] | None  # what a folder's default ACL allows; None: nothing


@dataclass(frozen=True)
class SetidReport:
    """What one walk did: names are relative to the root (raw; ``summary`` neutralises)."""

    cleared: tuple[str, ...] = ()
    problems: tuple[str, ...] = ()
    scanned: int = 0
    truncated: bool = False
    world_writable: tuple[str, ...] = ()  # entries whose write bit for others was cleared
    acl_removed: tuple[str, ...] = ()  # entries an ACL granting others was removed from

    def summary(self, *, withhold_names: bool = False) -> list[str]:
        """Lines for the live view (empty when there is nothing to say). With
        ``withhold_names`` (a killed run's root, swept by a later run: the agent chose the
        names, and the redactor that knew its credentials died with it) no name is shown."""

        def _names(names: tuple[str, ...]) -> str:
            return WITHHELD_NAMES if withhold_names else _shown(names)

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
        if self.acl_removed:
            lines.append(
                f"removed ACL entries granting other users on {len(self.acl_removed)} entr"
                f"{'y' if len(self.acl_removed) == 1 else 'ies'}: {_names(self.acl_removed)}"
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
    root_acl: str | None = None,
    max_entries: int = MAX_ENTRIES,
    max_seconds: float = MAX_SECONDS,
    monotonic: Callable[[], float] = time.monotonic,
) -> SetidReport:
    """Clear setuid/setgid under ``root`` on entries changed at or after ``since``, and the
    ACL entries granting others (``root_acl``: the directories' ACLs at the run's start,
    from ``acl.snapshot``; None when not recorded: the root's are then kept as they are).
    Never raises OSError: what it cannot do is reported in the result."""
    walk = _Walk(since, monotonic() + max_seconds, max_entries, monotonic, root_acl)
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
        tuple(walk.acl_removed),
    )


class _Walk:
    def __init__(
        self,
        since: float,
        deadline: float,
        max_entries: int,
        monotonic: Callable[[], float],
        root_acl: str | None = None,
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
        self.acl_removed: list[str] = []
        self.acls = True  # False once the file system says it has no ACLs
        self.snapshot = None if root_acl is None else acl.from_snapshot(root_acl)

    def run(self, root_fd: int) -> None:
        root = os.fstat(root_fd)
        if self.snapshot is None:  # not recorded: keep what the root has
            path = f"/proc/self/fd/{root_fd}"
            self.snapshot = {
                root.st_ino: (self._read(path, acl.ACCESS, "."), self._read(path, acl.DEFAULT, "."))
            }
        limit = self._clear(root_fd, ".", None, changed=root.st_ctime >= self.since)
        self._scan(root_fd, "", root.st_dev, 0, limit)

    def _scan(self, dir_fd: int, prefix: str, device: int, depth: int, limit: _Limit) -> None:
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
            changed = seen.st_ctime >= self.since
            if not is_dir and not (
                stat.S_ISREG(seen.st_mode)
                and (self._suspect(seen) or (changed and self._acl_to_strip(dir_fd, name, limit)))
            ):
                continue
            fd = self._open(dir_fd, name, seen, rel, directory=is_dir)
            if fd is None:
                continue
            try:
                inner = self._clear(fd, rel, limit, changed=changed)
                if not is_dir:
                    continue
                if depth + 1 >= MAX_DEPTH:
                    self.problems.append(f"{rel} (deeper than {MAX_DEPTH} levels)")
                else:
                    self._scan(fd, rel + "/", device, depth + 1, inner)
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

    def _read(self, path: str, name: str, rel: str) -> list[acl.Entry] | None:
        if not self.acls:
            return None
        try:
            return acl.read(path, name, follow=True)
        except OSError as exc:
            if exc.errno in (errno.EOPNOTSUPP, errno.ENOTSUP):
                self.acls = False
            else:
                self.problems.append(f"{rel} (ACL: {exc.strerror})")
        except acl.AclError as exc:
            self.problems.append(f"{rel} ({exc})")
        return None

    def _write(self, path: str, name: str, entries: list[acl.Entry] | None, rel: str) -> bool:
        try:
            if entries is None:
                os.removexattr(path, name)
            else:
                os.setxattr(path, name, acl.build(entries))
        except OSError as exc:
            self.problems.append(f"{rel} (ACL: {exc.strerror})")
            return False
        return True

    def _clear_acl(self, fd: int, rel: str, inherited: _Limit, *, changed: bool) -> _Limit:
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
            self.acl_removed.append(rel)
        return _limit(default)

    def _clear(self, fd: int, rel: str, inherited: _Limit, *, changed: bool) -> _Limit:
        inner = self._clear_acl(fd, rel, inherited, changed=changed)
        self._clear_bits(fd, rel)
        return inner

    def _clear_bits(self, fd: int, rel: str) -> None:
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


def _limit(entries: list[acl.Entry] | None) -> _Limit:
    return None if entries is None else acl.allowed(entries)


def _same(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _shown(names: tuple[str, ...]) -> str:
    shown = [
        neutralise(os.fsencode(n).decode("utf-8", "backslashreplace"), newlines=False)
        for n in names[:SHOWN]
    ]
    return ", ".join(shown) + (", ..." if len(names) > SHOWN else "")
