"""What a container's processes write, read from the host as they write it; and holding
them still while the host measures.

The project root is the only block-backed file system a run's container can write (its
root file system is read-only, the rest is tmpfs), so the bytes its processes dirty in
the page cache (``write_bytes`` of /proc/PID/io, counted when a page is dirtied, by
``write`` and through ``mmap`` alike) bound what they added to the root from above:
an overwrite or a deleted file counts too, a byte that reached the root without being
written (an ``fallocate``, an empty file's inode) does not. ``WriteMeter`` sums it over
the processes of the containers' cgroups (a reaped child's bytes move into its reaper's
count; a process gone since the last reading keeps what it was last seen to have written,
so the sum never falls). It answers None — and the disk watch falls back on the file
system's own growth — whenever a process it should read cannot be read (apply not
running as root, a process that made itself non-dumpable): an unread process could have
written anything.

``Freezer`` holds every process of those cgroups still (the cgroup freezer: v1
``freezer.state``, v2 ``cgroup.freeze``) for the moment the disk watch measures the tree,
so nothing is written while the measure is taken; and kills each of them there when the
measure is past the budget. Linux only; reads and writes /proc and
/sys/fs/cgroup, nothing else.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterable, Iterator

CGROUP_ROOT = "/sys/fs/cgroup"


def _mounts() -> dict[str, str]:
    """Mount point of each cgroup hierarchy by controller ("" for the v2 unified one)."""
    found: dict[str, str] = {}
    try:
        lines = open("/proc/self/mounts", encoding="utf-8").read().splitlines()  # noqa: SIM115
    except OSError:
        return found
    for line in lines:
        parts = line.split()
        if len(parts) < 4:
            continue
        if parts[2] == "cgroup2":
            found.setdefault("", parts[1])
        elif parts[2] == "cgroup":
            for option in parts[3].split(","):
                found.setdefault(option, parts[1])
    return found


def _paths(pid: int | str) -> dict[str, str]:
    """``pid``'s cgroup path by controller ("" for the unified hierarchy)."""
    try:
        lines = open(f"/proc/{pid}/cgroup", encoding="utf-8").read().splitlines()  # noqa: SIM115
    except OSError:
        return {}
    paths = {}
    for line in lines:
        _, controllers, path = line.split(":", 2)
        for name in controllers.split(",") if controllers else [""]:
            paths[name] = path
    return paths


def cgroup_dir(pid: int, controller: str) -> str | None:
    """The cgroup folder of ``pid`` in ``controller``'s hierarchy (v1), else in the
    unified one (v2); None when there is none or it cannot be read — and never a
    hierarchy's root nor this process's own cgroup (a pid that is no container's init
    must not have its host's processes frozen or killed)."""
    mounts = _mounts()
    paths, own = _paths(pid), _paths("self")
    for name in (controller, ""):
        if name in paths and name in mounts:
            if paths[name] in ("/", own.get(name)):
                return None
            folder = mounts[name] + paths[name]
            if os.path.isdir(folder):
                return folder
    return None


def _procs(folder: str) -> list[int]:
    with open(os.path.join(folder, "cgroup.procs"), encoding="utf-8") as handle:
        return [int(word) for word in handle.read().split()]


def _write_bytes(pid: int) -> int | None:
    """``write_bytes`` of /proc/PID/io; None when the process is gone; PermissionError
    when it may not be read."""
    try:
        with open(f"/proc/{pid}/io", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("write_bytes:"):
                    return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None


class WriteMeter:
    """Bytes the processes of some containers have dirtied so far, never falling."""

    def __init__(self, inits: Callable[[], Iterable[int]]) -> None:
        """``inits``: the host pids of the containers' inits now (their cgroups are found
        from them, once each)."""
        self._inits = inits
        self._folders: dict[int, str] = {}
        self._seen: dict[int, int] = {}  # live pid -> bytes when last read
        self._retired = 0  # bytes of processes gone since

    def _cgroups(self) -> list[str] | None:
        """The containers' cgroup folders; None when one of a live container cannot be
        found. A container that has ended (its init gone, or its cgroup removed) has no
        process left to write: it is left out."""
        folders = []
        for init in self._inits():
            if init not in self._folders:
                folder = cgroup_dir(init, "pids")
                if folder is None:
                    if os.path.exists(f"/proc/{init}"):
                        return None
                    continue
                self._folders[init] = folder
            if os.path.isdir(self._folders[init]):
                folders.append(self._folders[init])
        return folders

    def pids(self) -> list[int]:
        """Every process of the containers now (their cgroups' members; none when unknown)."""
        try:
            folders = self._cgroups() or []
            return sorted({pid for folder in folders for pid in _procs(folder)})
        except (OSError, ValueError):
            return []

    def read(self) -> int | None:
        """The total so far, or None when some process could not be read."""
        try:
            folders = self._cgroups()
            if folders is None:
                return None
            pids = {pid for folder in folders for pid in _procs(folder)}
            now: dict[int, int] = {}
            for pid in pids:
                value = _write_bytes(pid)
                if value is not None:
                    now[pid] = value
        except (OSError, ValueError):
            return None  # unreadable (EACCES on /proc/PID/io), or a cgroup gone: unknown
        for pid, before in self._seen.items():
            if pid not in now or now[pid] < before:  # gone, or its pid taken by another
                self._retired += before
        self._seen = now
        return self._retired + sum(now.values())


class Freezer:
    """Freezes and thaws the cgroups of some containers (root only; else a no-op that
    says so: ``hold`` yields False)."""

    def __init__(self, inits: Callable[[], Iterable[int]]) -> None:
        self._inits = inits

    def _files(self) -> list[tuple[str, str, str]]:
        """(file, frozen value, thawed value) per container."""
        files = []
        for init in self._inits():
            folder = cgroup_dir(init, "freezer")
            if folder is None:
                continue
            if os.path.exists(os.path.join(folder, "freezer.state")):
                files.append((os.path.join(folder, "freezer.state"), "FROZEN", "THAWED"))
            elif os.path.exists(os.path.join(folder, "cgroup.freeze")):
                files.append((os.path.join(folder, "cgroup.freeze"), "1", "0"))
        return files

    def kill_all(self) -> None:
        """SIGKILL to every process of the cgroups, each one: a held process then dies as
        it is thawed, where a signal to the init alone would leave the others a moment to
        run (and write) before the namespace ends them."""
        for path, _, _ in self._files():
            with contextlib.suppress(OSError, ValueError):
                for pid in _procs(os.path.dirname(path)):
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGKILL)

    @contextlib.contextmanager
    def hold(self, timeout: float = 1.0) -> Iterator[bool]:
        """Every process held still inside the block (True), or as far as could be done
        (False: nothing frozen, or not within ``timeout``); thawed on the way out."""
        files = self._files()
        frozen: list[tuple[str, str]] = []
        try:
            for path, cold, warm in files:
                with contextlib.suppress(OSError):
                    _write(path, cold)
                    frozen.append((path, warm))
            yield bool(files) and len(frozen) == len(files) and _settled(frozen, timeout)
        finally:
            for path, warm in frozen:
                with contextlib.suppress(OSError):
                    _write(path, warm)


def _write(path: str, value: str) -> None:
    with open(path, "w", encoding="ascii") as handle:
        handle.write(value)


def _settled(frozen: list[tuple[str, str]], timeout: float) -> bool:
    """v1 says FREEZING until every task has stopped; v2's write returns when frozen (its
    cgroup.events says frozen 1)."""
    deadline = time.monotonic() + timeout
    for path, _ in frozen:
        if not path.endswith("freezer.state"):
            continue
        while True:
            with contextlib.suppress(OSError), open(path, encoding="ascii") as handle:
                if handle.read().strip() == "FROZEN":
                    break
            if time.monotonic() > deadline:
                return False
            time.sleep(0.001)
    return True
