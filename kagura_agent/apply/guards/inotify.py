"""A minimal inotify watcher (Linux, ctypes, no dependency) for the hijack tripwires.

inotify watches an inode, not a path: a file the host reaches through a bind mount or
through ``/proc/<container pid>/root`` reports the container's opens and reads too,
whatever mount namespace they come from. ``Watcher`` runs one thread that blocks in
``poll`` on the inotify descriptor and a wake-up pipe, and calls ``on_event(path, mask)``
for every event that is not bookkeeping (the watch going away when the container's
tmpfs is unmounted).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import select
import struct
import threading
from collections.abc import Callable

IN_ACCESS = 0x001
IN_MODIFY = 0x002
IN_ATTRIB = 0x004
IN_OPEN = 0x020
IN_MOVED_FROM = 0x040
IN_MOVED_TO = 0x080
IN_CREATE = 0x100
IN_DELETE = 0x200
IN_DELETE_SELF = 0x400
IN_MOVE_SELF = 0x800
IN_UNMOUNT = 0x2000
IN_Q_OVERFLOW = 0x4000
IN_IGNORED = 0x8000
IN_ISDIR = 0x40000000
IN_CLOEXEC = 0o2000000
IN_NONBLOCK = 0o4000

# Anything the agent can do to a watched file or directory: open, read, change, remove.
TOUCHED = (
    IN_ACCESS
    | IN_OPEN
    | IN_MODIFY
    | IN_ATTRIB
    | IN_MOVED_FROM
    | IN_MOVED_TO
    | IN_CREATE
    | IN_DELETE
    | IN_DELETE_SELF
    | IN_MOVE_SELF
)
_HEADER = struct.Struct("iIII")  # wd, mask, cookie, len

_NAMES = {
    IN_ACCESS: "read",
    IN_OPEN: "open",
    IN_MODIFY: "write",
    IN_ATTRIB: "attrib",
    IN_MOVED_FROM: "move",
    IN_MOVED_TO: "move",
    IN_CREATE: "create",
    IN_DELETE: "delete",
    IN_DELETE_SELF: "delete",
    IN_MOVE_SELF: "move",
    IN_Q_OVERFLOW: "overflow",
}


def describe(mask: int) -> str:
    """``open``, ``read``, … for an event mask (the first match, for messages)."""
    for bit, name in _NAMES.items():
        if mask & bit:
            return name
    return hex(mask)


class InotifyError(OSError):
    """inotify is not available or a path cannot be watched."""


def _libc() -> ctypes.CDLL:
    name = ctypes.util.find_library("c") or "libc.so.6"
    libc = ctypes.CDLL(name, use_errno=True)
    libc.inotify_init1.argtypes = [ctypes.c_int]
    libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
    return libc


class Watcher:
    """Watches paths; ``on_event(path, mask)`` runs on the watcher's thread."""

    def __init__(self, on_event: Callable[[str, int], None]) -> None:
        try:
            self._libc = _libc()
            fd = self._libc.inotify_init1(IN_CLOEXEC | IN_NONBLOCK)
        except (OSError, AttributeError) as exc:
            raise InotifyError(f"inotify unavailable: {exc}") from exc
        if fd < 0:
            err = ctypes.get_errno()
            raise InotifyError(err, f"inotify_init1: {os.strerror(err)}")
        self._fd = fd
        self._wake_r, self._wake_w = os.pipe()
        self._paths: dict[int, str] = {}
        self._on_event = on_event
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def add(self, path: str, mask: int = TOUCHED, *, label: str | None = None) -> None:
        """Watch ``path`` (resolved now: the watch follows the inode, not the name);
        events name it ``label`` (default: the path)."""
        wd = self._libc.inotify_add_watch(self._fd, os.fsencode(path), mask)
        if wd < 0:
            err = ctypes.get_errno()
            raise InotifyError(err, f"cannot watch {label or path}: {os.strerror(err)}")
        self._paths[wd] = label or path

    def drain(self) -> None:
        """Drop events queued so far (the host's own writes while planting)."""
        with contextlib.suppress(BlockingIOError):
            while os.read(self._fd, 65536):
                pass

    def start(self) -> Watcher:
        self._thread = threading.Thread(target=self._loop, name="kagura-inotify", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop watching (idempotent); no ``on_event`` call starts after this returns."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        for fd in (self._fd, self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)

    def _loop(self) -> None:
        poller = select.poll()
        poller.register(self._fd, select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        while not self._stopped.is_set():
            try:
                ready = poller.poll()
            except OSError:
                return
            if self._stopped.is_set():
                return
            if not any(fd == self._fd for fd, _ in ready):
                continue
            try:
                data = os.read(self._fd, 65536)
            except BlockingIOError:
                continue
            except OSError:
                return
            self._dispatch(data)

    def _dispatch(self, data: bytes) -> None:
        offset = 0
        while offset + _HEADER.size <= len(data):
            wd, mask, _cookie, length = _HEADER.unpack_from(data, offset)
            raw = data[offset + _HEADER.size : offset + _HEADER.size + length]
            offset += _HEADER.size + length
            if mask & (IN_IGNORED | IN_UNMOUNT) or self._stopped.is_set():
                continue
            path = self._paths.get(wd, "?")
            name = raw.rstrip(b"\0").decode("utf-8", "replace")
            self._on_event(f"{path}/{name}" if name else path, mask)
