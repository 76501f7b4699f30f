"""POSIX ACLs a run left in its project root: the parser and the rule (apply/aftercare/setid.py
walks).

Inside its container the agent owns the project root's files, so it can add an ACL entry
(``setfacl -m u:NAME:rwx``, or a default ACL on a folder that every later file inherits)
and leave the operator's project writable by another local user after the run. The mode
bits say nothing of it. So the setid walk, on every entry the run changed (ctime at or
after its start), also reads the access ACL (``system.posix_acl_access``) and, on a
directory, the default ACL (``system.posix_acl_default``), and removes what the run added.

The rule keeps an operator's shared-group setup working:

- an entry the run did not change (ctime before the run) is not looked at: its ACLs stay;
- the access and default ACLs of every directory that had any when the run started are
  recorded then (``snapshot``: directories only, cheap) and are what the directory may
  keep; a directory without a record (made by the run, or without ACLs then) may keep
  what its folder's default ACL allows (what ``mkdir`` copies);
- the ACL a directory *allows* its new entries is its default ACL when the run did not
  change the directory, else what is left of it after the check below;
- on an entry the run changed, a named user or group entry of its access ACL is kept
  only when it is allowed (above: the directory's record, else its folder's default ACL
  grants that user or group at least those permissions: what a file created in a folder
  with a default ACL inherits passes); any other named entry is
  removed (and the group class narrowed to what the owning group had, so removing the
  mask never widens the group's access);
- a default ACL on a directory the run changed is kept only when every entry of it is
  within what is allowed (its record, else its folder's default ACL); otherwise it is
  set back to that (or removed when nothing is allowed).

Residue: a regular file with a named entry of its own (not inherited from its folder's
default ACL, and beyond it) that the run changed (a write changes ctime) loses that entry:
files are not recorded at the start (that would open every file). ACLs the operator set
in the ``CTIME_SLACK`` seconds (setid.py) before the run count as the run's. A directory
the start-of-run record did not reach in its time bound is judged by its folder's default
ACL. On a file system without ACL support (``EOPNOTSUPP``) the check is skipped.

The xattr format is the kernel's: a little-endian ``u32`` version (2), then entries of
``u16`` tag, ``u16`` permissions, ``u32`` id (the id is unused on the owner, owning group,
mask and others entries).
"""

from __future__ import annotations

import errno
import json
import os
import stat
import struct
import time

from kagura_agent.apply.aftercare.treewalk import TreeWalk, open_root

ACCESS = "system.posix_acl_access"
DEFAULT = "system.posix_acl_default"
VERSION = 2

USER_OBJ = 0x01
USER = 0x02
GROUP_OBJ = 0x04
GROUP = 0x08
MASK = 0x10
OTHER = 0x20
UNDEFINED_ID = 0xFFFFFFFF
NAMED = (USER, GROUP)

_HEADER = struct.Struct("<I")
_ENTRY = struct.Struct("<HHI")

Entry = tuple[int, int, int]  # tag, permissions (rwx = 4|2|1), id
Key = tuple[int, int]  # tag, id


class AclError(ValueError):
    """An ACL xattr that is not in the kernel's format."""


def parse(data: bytes) -> list[Entry]:
    """The entries of an ACL xattr value."""
    if len(data) < _HEADER.size or (len(data) - _HEADER.size) % _ENTRY.size:
        raise AclError(f"ACL of {len(data)} bytes")
    (version,) = _HEADER.unpack_from(data)
    if version != VERSION:
        raise AclError(f"ACL version {version}")
    return [
        _ENTRY.unpack_from(data, offset) for offset in range(_HEADER.size, len(data), _ENTRY.size)
    ]


def build(entries: list[Entry]) -> bytes:
    """An ACL xattr value; entries sorted by tag and id, as the kernel requires."""
    return _HEADER.pack(VERSION) + b"".join(
        _ENTRY.pack(tag, perm, ident) for tag, perm, ident in sorted(entries)
    )


def allowed(entries: list[Entry]) -> dict[Key, int]:
    return {(tag, ident): perm for tag, perm, ident in entries}


def within(entries: list[Entry], limit: dict[Key, int] | None) -> bool:
    """Every entry present in ``limit`` with at least its permissions."""
    if limit is None:
        return not entries
    return all(perm & ~limit.get((tag, ident), 0) == 0 for tag, perm, ident in entries)


def strip_access(entries: list[Entry], limit: dict[Key, int] | None) -> list[Entry] | None:
    """The access ACL without the named entries ``limit`` does not allow; None when
    nothing is to be removed. With no named entry left the mask goes too and the owning
    group keeps what the mask let it have (the kernel then folds the ACL into the mode)."""
    limit = limit or {}
    drop = [e for e in entries if e[0] in NAMED and e[1] & ~limit.get((e[0], e[2]), 0)]
    if not drop:
        return None
    kept = [e for e in entries if e not in drop]
    if any(e[0] in NAMED for e in kept):
        return kept
    mask = next((perm for tag, perm, _ in kept if tag == MASK), 7)
    return [
        (tag, perm & mask if tag == GROUP_OBJ else perm, ident)
        for tag, perm, ident in kept
        if tag != MASK
    ]


def read(path: str, name: str, *, follow: bool) -> list[Entry] | None:
    """The ACL ``name`` of ``path``, or None when there is none. ``follow`` only for a
    /proc/self/fd/N magic link (it names that one inode). Raises OSError (EOPNOTSUPP: no
    ACLs on this file system) and AclError."""
    try:
        data = os.getxattr(path, name, follow_symlinks=follow)
    except OSError as exc:
        if exc.errno == errno.ENODATA:
            return None
        raise
    return parse(data)


SNAPSHOT_SECONDS = 10.0

Snapshot = dict[int, tuple[list[Entry] | None, list[Entry] | None]]  # inode: access, default


def snapshot(root: str, *, max_seconds: float = SNAPSHOT_SECONDS) -> str:
    """The access and default ACLs of every directory under the project root that has one,
    by inode, at the start of a run (JSON, hex), for the walk after it: the run changes a
    folder's ctime whenever it adds or removes an entry in it, so a folder's ACLs cannot
    be judged by ctime. Directories only (files are not opened), never through a symlink,
    to any depth (apply/aftercare/treewalk.py), on the root's device; bounded in time (a folder not
    reached is judged by its parent's default ACL)."""
    found: dict[str, list[str | None]] = {}
    deadline = time.monotonic() + max_seconds
    try:
        root_fd, added = open_root(root)
    except OSError:
        return json.dumps({"dirs": found})
    try:
        device = os.fstat(root_fd).st_dev
        walk: TreeWalk[None] = TreeWalk(root_fd, None, root_added=added, dirs_only=True)
        for directory in walk:
            _record(directory.fd, found)
            if time.monotonic() > deadline:
                walk.stop("the ACL record's time bound")
                continue
            for name in directory.names:
                try:
                    seen = os.stat(name, dir_fd=directory.fd, follow_symlinks=False)
                except OSError:
                    continue
                if stat.S_ISDIR(seen.st_mode) and seen.st_dev == device:
                    walk.push(name, seen, None)
    finally:
        os.close(root_fd)
    return json.dumps({"dirs": found}, sort_keys=True)


def _record(fd: int, found: dict[str, list[str | None]]) -> None:
    try:
        names = os.listxattr(fd)
    except OSError:
        return  # EOPNOTSUPP: no ACLs here
    if ACCESS in names or DEFAULT in names:
        found[str(os.fstat(fd).st_ino)] = [_hex(fd, ACCESS, names), _hex(fd, DEFAULT, names)]


def _hex(fd: int, name: str, names: list[str]) -> str | None:
    if name not in names:
        return None
    try:
        return os.getxattr(fd, name).hex()
    except OSError:
        return None


def from_snapshot(text: str) -> Snapshot | None:
    """The ACLs recorded by ``snapshot``; None when unreadable (then none are judged by it)."""
    try:
        dirs = json.loads(text)["dirs"]
        return {
            int(ino): (
                parse(bytes.fromhex(access)) if access else None,
                parse(bytes.fromhex(default)) if default else None,
            )
            for ino, (access, default) in dirs.items()
        }
    except (ValueError, TypeError, KeyError, AttributeError):  # AclError is a ValueError
        return None
