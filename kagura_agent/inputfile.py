"""Reading a file a user named: bounded, never blocking, never a traceback.

Every file a command reads because someone named it (a manifest or task, a saved plan,
``--facts``, ``--prompt-file``, a file a review lists) goes through ``read_bytes`` or
``read_text``. Only a regular file is read: a FIFO would block the command forever, a
device (``/dev/zero``, ``/dev/urandom``) never ends, and a directory is no file. The
check is made before opening (opening some devices has effects of its own) and again on
the open descriptor, which is opened non-blocking in case the path changed in between.
At most ``limit`` bytes are read, whatever the file's size says (it may grow).

A refusal is an ``Unreadable`` (a ``UsageError``, exit 2) whose ``reason`` says what is
wrong without the path, for callers that locate it themselves (the manifest loader
turns it into a diagnostic at ``file:1:1``).
"""

from __future__ import annotations

import os
import stat

from kagura_agent.errors import UsageError

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


class Unreadable(UsageError):
    """A named file that cannot be read as input; ``reason`` omits the path."""

    def __init__(self, path: str | os.PathLike[str], reason: str, *, too_big: int = 0) -> None:
        super().__init__(f"cannot read {os.fspath(path)}: {reason}")
        self.reason = reason
        self.too_big = too_big  # the size seen when the file was over the limit


def empty_folder(path: str) -> bool:
    """A real folder (not a link to one) with nothing in it: it holds nothing to read."""
    try:
        if os.path.islink(path) or not os.path.isdir(path):
            return False
        with os.scandir(path) as entries:
            return next(entries, None) is None
    except OSError:
        return False


def _not_regular(mode: int) -> str:
    for test, name in _KINDS:
        if test(mode):
            return f"it is {name}, not a regular file"
    return "it is not a regular file"


def read_bytes(path: str | os.PathLike[str], limit: int) -> bytes:
    """The content of the regular file ``path``, refused when it is over ``limit`` bytes."""
    try:
        before = os.stat(path)
        if not stat.S_ISREG(before.st_mode):
            raise Unreadable(path, _not_regular(before.st_mode))
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError as exc:
        raise Unreadable(path, exc.strerror or str(exc)) from None
    except ValueError as exc:  # an embedded NUL in the path
        raise Unreadable(path, str(exc)) from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise Unreadable(path, _not_regular(mode))
        size = os.fstat(fd).st_size
        if size > limit:
            raise Unreadable(path, _over(size, limit), too_big=size)
        chunks: list[bytes] = []
        left = limit + 1  # one byte past the limit: the file may have grown since fstat
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    except OSError as exc:
        raise Unreadable(path, exc.strerror or str(exc)) from None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > limit:
        raise Unreadable(path, _over(len(data), limit), too_big=len(data))
    return data


def read_text(path: str | os.PathLike[str], limit: int) -> str:
    """``read_bytes`` decoded as UTF-8; bytes that are not UTF-8 are refused with the
    line and column where they start."""
    return decode(read_bytes(path, limit), path)


def decode(data: bytes, path: str | os.PathLike[str]) -> str:
    """``data`` as UTF-8 text, or an ``Unreadable`` naming where it stops being UTF-8."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        col = len(data[data.rfind(b"\n", 0, exc.start) + 1 : exc.start].decode("utf-8", "replace"))
        raise Unreadable(
            path,
            f"not UTF-8 text (byte 0x{data[exc.start]:02x} at line {line}, column {col + 1})",
        ) from None


def _over(size: int, limit: int) -> str:
    shown = f"{limit // 1024} KiB" if limit < 1 << 20 else f"{limit // (1 << 20)} MiB"
    return f"it is {size} bytes, more than the {shown} allowed"
