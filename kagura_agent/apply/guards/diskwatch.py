"""Bound what a run adds to its project root (the plan's ``budget.disk_bytes``).

The project root is a bind mount of a host directory, so nothing in the container bounds
it. Mechanism: a watched quota, measured while the run is held still.

- A host thread reads two counts, every 0.05 s and faster as the budget comes closer (a
  quarter of the time the run would need at its recent rate, down to 2 ms): what the
  run's containers have written (apply/guards/cgroupio.WriteMeter: the bytes their processes
  dirtied, which only the project root takes — an upper bound on what they added), and
  the growth of the root's file system (``statvfs``, constant time).
- When the last measure plus what was written since passes the budget, or when the file
  system has grown past it (another process may have done that: then at most every ten
  times the last measure's duration), the run's containers are frozen (cgroup freezer),
  the root is measured by a scan of allocated blocks that stays on the root's device and
  never follows symlinks, and the containers are thawed — or, past the budget, every
  process in them is killed first, so none writes again.

Another process filling the same disk no longer spaces the measures out: the meter is the
run's own. What the meter cannot see — an allocation without a write (``fallocate``), an
empty file's inode — is caught by the file system's growth, polled; a single file cannot
pass the budget at all (the container's RLIMIT_FSIZE, membrane/hardening.py). When the
meter cannot read every process (apply not running as root) it answers None and the file
system's growth alone decides, as before. docs/membrane.md has the figures, and says why
this and not a size-limited volume.

Every entry is charged at least one block of the file system (``f_frsize``), in the
tree's measure and in the file system's (its used inodes count as blocks): an empty file
allocates no data block but takes an inode, and a host's inodes run out long before its
bytes do (ext4 makes one per 16 KiB), so a run creating millions of empty files would
otherwise exhaust the host's file system while staying at zero bytes.

A file the run deleted while a process of its containers still holds it open (or mapped)
keeps its blocks, but is in no folder the scan walks: written that way, a run could fill
the host's disk for as long as it lives while the tree stays empty. So the measure also
counts the deleted files on the root's device that the containers' processes hold (their
``/proc/PID/fd`` and ``/proc/PID/map_files``, which the host can read as root or as the
agent's user; each inode once); the meter counts their writes all the same. A descriptor
parked in flight on a Unix socket (sent with SCM_RIGHTS and never received) belongs to no
process and is not seen by the measure: see docs/membrane.md.
"""

from __future__ import annotations

import contextlib
import os
import stat
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path

from kagura_agent.units import format_size

POLL_SECONDS = 0.05
MIN_POLL_SECONDS = 0.002
FS_POLL_SECONDS = 0.005  # statvfs: a few microseconds
SCAN_SECONDS = 0.05  # the least time between two measures the file system's growth asks for
# The longest the root goes unmeasured whatever the signals say: the file system is
# shared, and what another process frees there hides what the run adds (at most a tenth
# of the time is spent measuring, as for the other measures).
RESCAN_SECONDS = 30.0
MAX_SCAN_ENTRIES = 2_000_000


def tree_bytes(root: str | Path) -> int:
    """Bytes allocated under ``root`` (st_blocks, at least one block of the file system
    per entry: an inode is spent however small the file), on its device only, symlinks
    not followed; stops counting after MAX_SCAN_ENTRIES entries."""
    top = os.lstat(root)
    block = _block_size(root)
    total, seen, stack = 0, 0, [str(root)]
    while stack and seen < MAX_SCAN_ENTRIES:
        try:
            entries = list(os.scandir(stack.pop()))
        except OSError:
            continue
        for entry in entries:
            seen += 1
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            total += max(info.st_blocks * 512, block)
            if entry.is_dir(follow_symlinks=False) and info.st_dev == top.st_dev:
                stack.append(entry.path)
    return total


def held_deleted_bytes(pids: Iterable[int], device: int, block: int = 4096) -> int:
    """Bytes of deleted regular files on ``device`` that processes ``pids`` hold open or
    mapped (at least one block each, each inode once)."""
    seen: set[int] = set()
    total = 0
    for pid in pids:
        for folder in (f"/proc/{pid}/fd", f"/proc/{pid}/map_files"):
            try:
                names = os.listdir(folder)
            except OSError:
                continue  # ended, or not ours to read
            for name in names:
                try:
                    info = os.stat(f"{folder}/{name}")
                except OSError:
                    continue
                if (
                    info.st_nlink == 0
                    and info.st_dev == device
                    and stat.S_ISREG(info.st_mode)
                    and info.st_ino not in seen
                ):
                    seen.add(info.st_ino)
                    total += max(info.st_blocks * 512, block)
    return total


def _block_size(root: str | Path) -> int:
    return os.statvfs(root).f_frsize or 4096


def _fs_used(root: str | Path) -> int:
    """Bytes in use on ``root``'s file system, each used inode counted as one block too
    (a file system without inode counts, btrfs, reports 0 of them)."""
    stats = os.statvfs(root)
    inodes = stats.f_files - stats.f_ffree
    return (stats.f_blocks - stats.f_bfree + inodes) * stats.f_frsize


def _unmetered() -> int | None:
    return None


@contextlib.contextmanager
def _not_held() -> Iterator[bool]:
    yield False


@dataclass(frozen=True)
class Cadence:
    """How often the watch reads and measures: the write count at least every
    ``poll_seconds``; the root, while the file system's growth is past the budget, at most
    every ``scan_seconds``; the root whatever the signals, every ``rescan_seconds``."""

    poll_seconds: float = POLL_SECONDS
    scan_seconds: float = SCAN_SECONDS
    rescan_seconds: float = RESCAN_SECONDS


class DiskWatch:
    """Call ``on_over(reason)`` once when ``root`` has grown by more than ``budget``."""

    def __init__(
        self,
        root: str | Path,
        budget: int,
        on_over: Callable[[str], None],
        *,
        cadence: Cadence = Cadence(),
        holders: Callable[[], Iterable[int]] = tuple,
        meter: Callable[[], int | None] = _unmetered,
        hold: Callable[[], AbstractContextManager[bool]] = _not_held,
    ) -> None:
        """``holders``: the host pids of every process in the run's containers now (read
        only when the root is measured). ``meter``: what those containers have written so
        far (apply/guards/cgroupio.WriteMeter), None when unknown; ``hold``: a context in which
        they write nothing (apply/guards/cgroupio.Freezer), entered while the root is measured."""
        self.root = str(root)
        self.holders = holders
        self.budget = budget
        self.on_over = on_over
        self.poll_seconds = cadence.poll_seconds
        self.scan_seconds = cadence.scan_seconds
        self.rescan_seconds = cadence.rescan_seconds
        self.meter = meter
        self.hold = hold
        self.exceeded: str | None = None
        self.peak = 0  # the most the root was measured to have grown
        self.scans = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._root_start = 0
        self._fs_start = 0
        self._final_done = False
        self.late = False  # exceeded found by the last measure at stop(), not while running

    def start(self) -> DiskWatch:
        self._root_start = tree_bytes(self.root)
        self._fs_start = _fs_used(self.root)
        self._thread = threading.Thread(target=self._loop, name="kagura-diskwatch", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop watching; then measure the root once more: a step that wrote past the
        budget between two readings and ended (the file-size limit stops one file 1 MiB
        past it) is past it all the same — the file system's own figures may not show it
        yet (blocks are allocated at writeback) — and ``exceeded`` says so (``late``:
        found here, nobody stopped)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self.exceeded is not None or self._final_done or self._thread is None:
            return
        self._final_done = True
        try:
            grown = tree_bytes(self.root) - self._root_start + self._held()
        except OSError:
            return
        self.peak = max(self.peak, grown)
        if grown > self.budget:
            self.exceeded = self._reason(grown)
            self.late = True

    def _reason(self, grown: int) -> str:
        return (
            f"the run added {format_size(grown)} to the project root,"
            f" past its disk budget of {format_size(self.budget)}"
        )

    def _held(self) -> int:
        try:
            device, block = os.lstat(self.root).st_dev, _block_size(self.root)
            return held_deleted_bytes(self.holders(), device, block)
        except OSError:
            return 0

    def _loop(self) -> None:
        """Measure the root, its writers held still, when the run may have passed its
        budget: when what its containers wrote since the last measure, added to that
        measure, passes the budget; or when the file system as a whole has grown past it
        (what the meter does not see: an allocation, an empty file; everything when there
        is no meter). Readings come faster as the budget comes closer (``_wait``)."""
        last_scan = cost = 0.0  # when the root was last measured, and what that took
        started = time.monotonic()  # start() measured it then (the periodic measure's zero)
        recheck = False  # an unheld measure found the budget passed: measure it held
        measured = 0  # the root's growth at the last measure
        since = self.meter()  # the meter then
        written_rate, fs_rate = _Rate(), _Rate()
        written, next_reading = since, 0.0
        while not self._stop.is_set():
            try:
                used = _fs_used(self.root)
            except OSError:
                return
            # Growth from the lowest the file system has been since the start: another
            # process freeing space there must not hide what the run adds after it.
            self._fs_start = min(self._fs_start, used)
            grown_fs = used - self._fs_start
            now = time.monotonic()
            if now >= next_reading:  # the file system's growth is read more often (cheaper)
                written = self.meter()
            bound = None if written is None or since is None else measured + written - since
            since_scan = now - last_scan
            # The run's own writes may have passed the budget: measured at once, unless
            # the last measure was under twice its own time ago (the run is held at most
            # a third of the time, rewriting a file near its budget).
            metered = bound is not None and bound > self.budget and since_scan >= 2 * cost
            # The file system's growth may be another process's: while it is past the
            # budget, measured again after ten times what the last measure took.
            spread = grown_fs > self.budget and since_scan >= max(self.scan_seconds, 10 * cost)
            # Whatever the signals say, measured now and then (a freeing neighbour may
            # hide writes made before it, too) — without holding the run: nothing says it
            # is near its budget, and a held container refuses `docker exec` (verify, the
            # agent's branch). Past the budget, it is measured again held before it stops.
            stale = now - max(last_scan, started) >= max(self.rescan_seconds, 10 * cost)
            if metered or spread or stale or recheck:
                held, recheck = metered or spread or recheck, False
                with self.hold() if held else contextlib.nullcontext():
                    # Nothing is written while held: the meter now is the measure's. (Not
                    # read, the older reading stays: it can only make the bound larger;
                    # unheld, what is written during the walk may count twice: larger too.)
                    fresh = self.meter()
                    since = written = fresh if fresh is not None else since
                    began = time.monotonic()
                    grown = tree_bytes(self.root) - self._root_start + self._held()
                    self.scans += 1
                    last_scan, measured = time.monotonic(), grown
                    cost = last_scan - began
                    self.peak = max(self.peak, grown)
                    if grown > self.budget and not held:
                        recheck = True  # measured again at once, held
                    elif grown > self.budget:
                        self.exceeded = self._reason(grown)
                        self.on_over(self.exceeded)  # killed while held: nothing more written
                        return
                bound = measured
            if now >= next_reading:
                headroom = None if bound is None else self.budget - bound
                next_reading = now + _wait(
                    written_rate.ahead(written, now, headroom), self.poll_seconds
                )
            # The file system's growth, while it is below the budget, as often as the
            # budget's closeness asks and at least every FS_POLL_SECONDS: an allocation
            # (fallocate, empty files) is in no write count, and can be fast.
            fs_next = now + min(
                FS_POLL_SECONDS, _wait(fs_rate.ahead(grown_fs, now, self.budget - grown_fs), 1.0)
            )
            self._stop.wait(max(0.0, min(next_reading, fs_next) - time.monotonic()))


class _Rate:
    """How fast a count grows, and so how soon it could pass a limit."""

    def __init__(self) -> None:
        self._last: tuple[float, int] | None = None
        self.per_second = 0.0

    def ahead(self, value: int | None, now: float, headroom: int | None) -> float:
        """Seconds before ``value`` could have grown by ``headroom`` at its recent rate
        (infinite when it does not grow or there is no headroom to watch)."""
        if value is None or headroom is None or headroom <= 0:
            self._last = None
            return float("inf")
        if self._last is not None and now > self._last[0]:
            fresh = (value - self._last[1]) / (now - self._last[0])
            self.per_second = max(fresh, self.per_second * 0.5)
        self._last = (now, value)
        return headroom / self.per_second if self.per_second > 0 else float("inf")


def _wait(ahead: float, poll: float) -> float:
    """A quarter of the time the run needs to pass its budget at its recent rate, between
    MIN_POLL_SECONDS and ``poll``: readings come faster as the budget comes closer."""
    return min(poll, max(MIN_POLL_SECONDS, ahead / 4))
