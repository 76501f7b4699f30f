"""The server side of RFC 6455 WebSockets, for the chat fakes in testing/ (stdlib only).

Just what a fake needs: buffered reads of masked client frames, unmasked writes, the
closing handshake. The HTTP upgrade itself is each fake's (their URLs and checks differ).
"""

from __future__ import annotations

import contextlib
import json
import socket
import struct
import threading
from collections.abc import Callable
from typing import Any

WS_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"  # RFC 6455 section 1.3
CONT, TEXT, BINARY, CLOSE, PING, PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA


class ProtocolError(Exception):
    pass


class Link:
    """The server side of one WebSocket: buffered reads, unmasked writes."""

    def __init__(self, sock: socket.socket, buffered: bytes = b"") -> None:
        self.sock = sock
        self._buffer = bytearray(buffered)
        self._send_lock = threading.Lock()
        self.closing = False

    def read_exact(self, size: int) -> bytes:
        while len(self._buffer) < size:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise ConnectionError("the client closed the connection")
            self._buffer += chunk
        data = bytes(self._buffer[:size])
        del self._buffer[:size]
        return data

    def read_frame(self) -> tuple[bool, int, bytes]:
        first, second = self.read_exact(2)
        length = second & 0x7F
        if length == 126:
            (length,) = struct.unpack("!H", self.read_exact(2))
        elif length == 127:
            (length,) = struct.unpack("!Q", self.read_exact(8))
        if not second & 0x80:
            raise ProtocolError("a client frame must be masked")  # RFC 6455 section 5.1
        mask = self.read_exact(4)
        payload = bytes(b ^ mask[i % 4] for i, b in enumerate(self.read_exact(length)))
        return bool(first & 0x80), first & 0x0F, payload

    def send(self, opcode: int, payload: bytes) -> None:
        size = len(payload)
        if size < 126:
            header = struct.pack("!BB", 0x80 | opcode, size)
        elif size < 1 << 16:
            header = struct.pack("!BBH", 0x80 | opcode, 126, size)
        else:
            header = struct.pack("!BBQ", 0x80 | opcode, 127, size)
        with self._send_lock:
            self.sock.sendall(header + payload)

    def send_json(self, message: dict[str, Any]) -> None:
        self.send(TEXT, json.dumps(message).encode())

    def close(self, code: int) -> None:
        """Start (or answer) the closing handshake, then drop the TCP connection."""
        with contextlib.suppress(OSError):  # the client may be gone already
            if not self.closing:
                self.closing = True
                self.send(CLOSE, struct.pack("!H", code))
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


class Listener:
    """A TCP listener on 127.0.0.1: each accepted socket goes to ``serve`` in a thread."""

    def __init__(self, serve: Callable[[socket.socket], None]) -> None:
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._sock.settimeout(0.05)  # so the accept loop notices close()
        self._open = True
        self.port: int = self._sock.getsockname()[1]
        threading.Thread(target=self._accept_loop, args=(serve,), daemon=True).start()

    def _accept_loop(self, serve: Callable[[socket.socket], None]) -> None:
        while self._open:
            try:
                sock, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return  # closed by close()
            sock.settimeout(None)
            threading.Thread(target=serve, args=(sock,), daemon=True).start()

    def close(self) -> None:
        self._open = False
        self._sock.close()
