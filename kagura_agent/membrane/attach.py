"""Reading Docker's multiplexed attach stream (no TTY) from a raw socket.

Without a TTY every chunk the container writes arrives behind an 8-byte header:
one byte stream id (1 stdout, 2 stderr), three zero bytes, a big-endian uint32 length.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterator

STDOUT = 1
STDERR = 2


def _read_exact(sock: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            break
        data += chunk
    return bytes(data)


def read_frames(sock: socket.socket) -> Iterator[tuple[int, bytes]]:
    """Yield ``(stream_id, payload)`` until the container closes its output."""
    while True:
        header = _read_exact(sock, 8)
        if len(header) < 8:
            return
        stream_id, length = struct.unpack(">BxxxL", header)
        yield stream_id, _read_exact(sock, length)


def stdout_lines(sock: socket.socket) -> Iterator[bytes]:
    """Yield complete stdout lines (without the newline); stderr is dropped."""
    pending = b""
    for stream_id, payload in read_frames(sock):
        if stream_id != STDOUT:
            continue
        pending += payload
        *lines, pending = pending.split(b"\n")
        yield from lines
    if pending:
        yield pending
