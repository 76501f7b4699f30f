"""No submodule repository planted in the project root for the operator's next git command.

The root's own ``.git`` is mounted read-only (manifest/task.py ``git_metadata``), but a
submodule's is not: at every gitlink path of the superproject's index, ``git status`` in
the root runs ``git status`` inside the submodule's work tree, with *that* repository's
configuration — and ``core.fsmonitor`` there is a command. The agent writes anything
under the root, so it can replace ``lib/.git`` (a gitfile into ``.git/modules``) with a
directory of its own, write one into an uninitialised submodule's empty folder, point
the gitfile at a folder of its own, or swap ``lib`` for a symlink: the operator's next
``git status`` would run the agent's command on the host, as the operator.

So once the run's last container is gone, apply reads the gitlink paths from the
superproject's index (``git ls-files --stage``; the index is in the protected ``.git``)
and, for each, moves aside what the run made of it: a path component (below the root)
or the ``.git`` entry that is a symlink changed since the run started, or a ``.git``
whose repository the run changed (the entry itself, or — when that repository lies in
the root outside the protected ``.git`` — its ``config``, ``config.worktree``,
``commondir`` or ``hooks``). ``chmod``, writes and renames all set ctime, which no one
can set back, so "changed since" misses nothing the run did (the bound apply/aftercare/setid.py
uses). Moved aside means renamed to ``.git.kagura-refused-<n>`` (or
``<name>.kagura-refused-<n>``) in the same folder: git then sees no repository there,
nothing is deleted, and the operator can look. Every step opens each component relative
to its parent's fd without following a symlink.
"""

from __future__ import annotations

import contextlib
import os
import stat
import time
from dataclasses import dataclass

from kagura_agent.apply.aftercare.setid import WITHHELD_NAMES
from kagura_agent.hygiene import neutralise
from kagura_agent.manifest.gitinputs import host_git

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_REPO_PARTS = ("config", "config.worktree", "commondir", "hooks")
MAX_GITLINKS = 10_000
PLANTED_REPOSITORY = "a git repository the run planted (git would have run its configuration)"
GIT_TIMEOUT = 30.0


@dataclass(frozen=True)
class GitlinkReport:
    """What the check moved aside, (from, to) relative to the root, and what it could not
    do."""

    moved: tuple[tuple[str, str], ...] = ()
    problems: tuple[str, ...] = ()

    def summary(self, *, withhold_names: bool = False) -> list[str]:
        """Lines for the live view; with ``withhold_names`` (a killed run's root, swept by a
        later run: see setid.SetidReport.summary) counts, and no name the agent chose."""
        if withhold_names:
            lines = (
                [
                    f"moved aside {len(self.moved)} git repositor"
                    f"{'y' if len(self.moved) == 1 else 'ies'} the run planted"
                    f" (git would have run its configuration); {WITHHELD_NAMES}"
                ]
                if self.moved
                else []
            )
            if self.problems:
                lines.append(f"could not check {len(self.problems)} submodule(s); {WITHHELD_NAMES}")
            return lines
        lines = [
            f"moved aside a git repository the run planted: {neutralise(rel, newlines=False)}"
            f" -> {neutralise(to, newlines=False)} (git would have run its configuration)"
            for rel, to in self.moved
        ]
        lines += [
            f"could not check submodule {neutralise(p, newlines=False)}" for p in self.problems
        ]
        return lines


def gitlink_paths(root: str) -> list[str] | None:
    """The gitlink (submodule) paths under the root, relative to it, from the index of the
    work tree it is in (its own, or a larger checkout's: ``ls-files`` run in a folder lists
    that folder's entries); None when it is in none git can read, or git is not installed."""
    out = host_git(root, ["ls-files", "--stage", "-z"], GIT_TIMEOUT)
    if out is None:
        return None
    paths = []
    for record in out.split(b"\0"):
        meta, _, path = record.partition(b"\t")
        if meta.startswith(b"160000 ") and path:
            paths.append(os.fsdecode(path))
    return paths[:MAX_GITLINKS]


Identity = tuple[tuple[int, int], ...]
# A change the kernel stamps just after the snapshot may carry a ctime up to a clock tick
# before it (file times come from a coarse clock).
TICK = 0.05


@dataclass(frozen=True)
class Snapshot:
    """What was at the gitlink paths just before the run's first container existed."""

    taken: float
    ids: dict[str, Identity]


def snapshot(root: str) -> Snapshot:
    """Before the run: for each gitlink path, the (device, inode) of every component
    that exists, down to its ``.git``. A run that renames a folder it staged earlier
    (its files' ctimes are old) into a gitlink path changes one of these; and "changed
    since" can then mean since this moment (not the setuid walk's slack before it, which
    would take the operator's own ``git submodule update`` a second earlier for the run's)."""
    taken = time.time()
    real = os.path.realpath(root)
    found: dict[str, Identity] = {}
    for rel in gitlink_paths(real) or []:
        ids = []
        path = real
        for name in [*_parts(rel), ".git"]:
            path = os.path.join(path, name)
            try:
                st = os.lstat(path)
            except OSError:
                break
            ids.append((st.st_dev, st.st_ino))
            if not stat.S_ISDIR(st.st_mode):
                break
        found[rel] = tuple(ids)
    return Snapshot(taken, found)


def check_gitlinks(root: str, since: float, before: Snapshot | None = None) -> GitlinkReport:
    """Move aside, at every gitlink path of ``root``, what changed at or after ``since``
    (or, with ``before`` from :func:`snapshot`, is no longer what was there) and would
    make git run a repository the run wrote. Never raises OSError."""
    real = os.path.realpath(root)
    paths = gitlink_paths(real)
    if not paths:
        return GitlinkReport()
    if before is not None:
        since = max(since, before.taken - TICK)
    moved: list[tuple[str, str]] = []
    problems: list[str] = []
    try:
        root_fd = os.open(real, _DIR)
    except OSError as exc:
        return GitlinkReport(problems=(f"{root} ({exc.strerror})",))
    try:
        for rel in paths:
            known = None if before is None else before.ids.get(rel, ())
            try:
                found = _check_one(real, root_fd, rel, since, known)
            except OSError as exc:
                problems.append(f"{rel} ({exc.strerror})")
                continue
            if found is not None:
                moved.append(found)
    finally:
        os.close(root_fd)
    return GitlinkReport(tuple(moved), tuple(problems))


def check_root_repository(root: str, since: float, before: Snapshot | None = None) -> GitlinkReport:
    """Move aside a ``HEAD`` the run wrote at the top of a root that has no ``.git``.

    git looking for a repository from the root, or any folder below it, first tries
    ``.git``, then takes the folder itself for a repository when it holds a ``HEAD``
    file, ``objects/`` and ``refs/``: with the agent's ``config`` beside them
    (``core.worktree``, ``core.fsmonitor``) the operator's next ``git status`` there would
    run the agent's command. Without its ``HEAD`` the folder is no repository. (A root
    with a ``.git`` of its own is found by it first; ``.git`` is read-only for the run.)
    Never raises OSError."""
    real = os.path.realpath(root)
    if before is not None:
        since = max(since, before.taken - TICK)
    try:
        fd = os.open(real, _DIR)
    except OSError as exc:
        return GitlinkReport(problems=(f"{root} ({exc.strerror})",))
    try:
        if _has_git(fd):
            return GitlinkReport()
        try:
            st = os.lstat("HEAD", dir_fd=fd)
        except FileNotFoundError:
            return GitlinkReport()
        if st.st_ctime < since or stat.S_ISDIR(st.st_mode):
            return GitlinkReport()
        return GitlinkReport(moved=(_move_aside(fd, "HEAD", "HEAD"),))
    except OSError as exc:
        return GitlinkReport(problems=(f"HEAD ({exc.strerror})",))
    finally:
        os.close(fd)


def _has_git(root_fd: int) -> bool:
    """Whether the root has a ``.git`` git would use (not absent, not the empty folder apply
    holds in its place during a run)."""
    try:
        st = os.lstat(".git", dir_fd=root_fd)
    except FileNotFoundError:
        return False
    if not stat.S_ISDIR(st.st_mode):
        return True
    try:
        fd = os.open(".git", _DIR, dir_fd=root_fd)
    except OSError:
        return True
    try:
        return bool(os.listdir(fd))
    finally:
        os.close(fd)


def _parts(rel: str) -> list[str]:
    parts = [p for p in rel.split("/") if p]
    return [] if any(p in (".", "..") for p in parts) else parts


def _check_one(
    root: str, root_fd: int, rel: str, since: float, known: Identity | None
) -> tuple[str, str] | None:
    """Walk ``rel`` from the root; returns (from, to) when something was moved aside."""
    parts = _parts(rel)
    if not parts:
        return None
    fd = os.dup(root_fd)
    walked: list[str] = []
    try:
        for depth, name in enumerate([*parts, ".git"]):
            try:
                st = os.lstat(name, dir_fd=fd)
            except FileNotFoundError:
                return None  # nothing there: git sees no repository
            here = "/".join([*walked, name])
            replaced = known is not None and (
                depth >= len(known) or known[depth] != (st.st_dev, st.st_ino)
            )
            if stat.S_ISLNK(st.st_mode):
                # A symlink on the way (or as .git) leads git wherever it points.
                return _move_aside(fd, name, here) if replaced or st.st_ctime >= since else None
            if name == ".git":
                if replaced or st.st_ctime >= since or _repo_changed(root, fd, st, here, since):
                    return _move_aside(fd, name, here)
                return None
            if not stat.S_ISDIR(st.st_mode):
                return None
            if replaced:
                # A folder moved in on the gitlink path: what it holds may have been
                # staged by an earlier run; its .git is not the one that was there.
                known = ()
            nxt = os.open(name, _DIR, dir_fd=fd)
            os.close(fd)
            fd = nxt
            walked.append(name)
        return None
    finally:
        os.close(fd)


def _repo_changed(root: str, dir_fd: int, st: os.stat_result, here: str, since: float) -> bool:
    """Whether the repository ``.git`` names has its configuration or hooks changed since
    ``since``, when that repository lies in the root outside its protected ``.git``."""
    gitdir: str | None = os.path.join(root, here)
    if stat.S_ISREG(st.st_mode):
        gitdir = _gitfile_target(dir_fd, os.path.join(root, os.path.dirname(here)))
    elif not stat.S_ISDIR(st.st_mode):
        return True  # a FIFO, a socket, a device where git expects a repository
    if gitdir is None:
        return False  # not a gitfile git would follow
    protected = os.path.join(root, ".git")
    real = os.path.realpath(gitdir)
    if not _under(real, root) or _under(real, protected):
        return False  # the operator's own .git (read-only for the run) or outside the root
    for part in _REPO_PARTS:
        with contextlib.suppress(FileNotFoundError):
            if os.lstat(os.path.join(real, part)).st_ctime >= since:
                return True
    hooks = os.path.join(real, "hooks")
    if os.path.isdir(hooks) and not os.path.islink(hooks):
        for entry in os.scandir(hooks):
            with contextlib.suppress(FileNotFoundError):
                if entry.stat(follow_symlinks=False).st_ctime >= since:
                    return True
    return False


def _gitfile_target(dir_fd: int, folder: str) -> str | None:
    fd = os.open(".git", os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=dir_fd)
    try:
        head = os.read(fd, 4096)
    finally:
        os.close(fd)
    text = head.decode("utf-8", "replace").strip()
    if not text.startswith("gitdir:"):
        return None
    target = text[len("gitdir:") :].strip()
    return target if os.path.isabs(target) else os.path.join(folder, target)


def _move_aside(dir_fd: int, name: str, here: str) -> tuple[str, str]:
    for n in range(1, 1000):
        aside = f"{name}.kagura-refused-{n}"
        try:
            os.lstat(aside, dir_fd=dir_fd)
        except FileNotFoundError:
            os.rename(name, aside, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            return here, os.path.join(os.path.dirname(here), aside)
    raise OSError(0, "no free name to move it aside to")


def _under(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")
