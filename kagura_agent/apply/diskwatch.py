"""Bound what a run adds to its project root (the plan's ``budget.disk_bytes``).

The project root is a bind mount of a host directory, so nothing in the container bounds
it. Mechanism: a watched quota. A host thread polls ``statvfs`` of the root's file
system every 0.05 s — constant time, whatever the size of the tree. Only when the file
system as a whole has grown past the budget since the run started (which a run that
stays inside its budget cannot cause) does it measure the root itself, by a scan of
allocated blocks that stays on the root's device and never follows symlinks, at most
once a second while others fill the disk. When the root has grown past the budget the
run's container is killed and the reason recorded. docs/membrane.md says why this and
not a size-limited volume.

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
agent's user; each inode once). A descriptor parked in flight on a Unix socket (sent with
SCM_RIGHTS and never received) belongs to no process and is not seen: see
docs/membrane.md.
"""

from __future__ import annotations

import os
import stat
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from kagura_agent.units import format_size

POLL_SECONDS = 0.05
SCAN_SECONDS = 1.0
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


class DiskWatch:
    """Call ``on_over(reason)`` once when ``root`` has grown by more than ``budget``."""

    def __init__(
        self,
        root: str | Path,
        budget: int,
        on_over: Callable[[str], None],
        *,
        poll_seconds: float = POLL_SECONDS,
        scan_seconds: float = SCAN_SECONDS,
        holders: Callable[[], Iterable[int]] = tuple,
    ) -> None:
        """``holders``: the host pids of every process in the run's containers now (read
        only when the file system has grown past the budget)."""
        self.root = str(root)
        self.holders = holders
        self.budget = budget
        self.on_over = on_over
        self.poll_seconds = poll_seconds
        self.scan_seconds = scan_seconds
        self.exceeded: str | None = None
        self.peak = 0  # the most the root was measured to have grown
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._root_start = 0
        self._fs_start = 0

    def start(self) -> DiskWatch:
        self._root_start = tree_bytes(self.root)
        self._fs_start = _fs_used(self.root)
        self._thread = threading.Thread(target=self._loop, name="kagura-diskwatch", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _held(self) -> int:
        try:
            device, block = os.lstat(self.root).st_dev, _block_size(self.root)
            return held_deleted_bytes(self.holders(), device, block)
        except OSError:
            return 0

    def _loop(self) -> None:
        last_scan = 0.0
        while not self._stop.is_set():
            try:
                grown_fs = _fs_used(self.root) - self._fs_start
            except OSError:
                return
            now = time.monotonic()
            if grown_fs > self.budget and now - last_scan >= self.scan_seconds:
                last_scan = now
                grown = tree_bytes(self.root) - self._root_start + self._held()
                self.peak = max(self.peak, grown)
                if grown > self.budget:
                    self.exceeded = (
                        f"the run added {format_size(grown)} to the project root,"
                        f" past its disk budget of {format_size(self.budget)}"
                    )
                    self.on_over(self.exceeded)
                    return
            self._stop.wait(self.poll_seconds)
