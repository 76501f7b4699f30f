"""Duplex byte streams the host-side brain channel runs over.

* ``ProcessStream``: an asyncio subprocess's stdin/stdout pipes (tests; ``runtime: host``
  runs the same entrypoint as a local process).
* ``DockerAttachStream``: the socket docker-py's ``attach_socket`` returns for a
  container created with ``stdin_open=True, tty=False``. Without a TTY Docker
  multiplexes stdout and stderr into frames with an 8-byte header
  (``[stream, 0, 0, 0, size as big-endian uint32]``); ``FrameDemuxer`` splits them.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections import deque
from typing import Any, Protocol

from kagura_agent.hostproc import python_code_argv, start

CHUNK = 65536
STDOUT, STDERR = 1, 2
_HEADER = struct.Struct(">BxxxL")
STDERR_TAIL_BYTES = 64 * 1024
ENTRYPOINT = "from kagura_agent.brain.entrypoint import main\nraise SystemExit(main())\n"


class StreamClosed(ConnectionError):
    """The other side of the stream went away while we were writing."""


class DuplexStream(Protocol):
    """What BrainChannel needs: the container's stdout in, its stdin out."""

    async def read(self) -> bytes:
        """The next chunk of the container's stdout; b"" at end of stream."""
        ...

    async def write(self, data: bytes) -> None:
        """Write to the container's stdin (raises StreamClosed)."""
        ...

    async def close(self) -> None:
        """Close our end of the stream."""
        ...


class ProcessStream:
    """A local subprocess running the entrypoint, attached through pipes."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        if proc.stdin is None or proc.stdout is None:
            raise ValueError("the process needs stdin=PIPE and stdout=PIPE")
        self.proc = proc
        self._stdin = proc.stdin
        self._stdout = proc.stdout

    async def read(self) -> bytes:
        return await self._stdout.read(CHUNK)

    async def write(self, data: bytes) -> None:
        try:
            self._stdin.write(data)
            await self._stdin.drain()
        except (BrokenPipeError, ConnectionResetError, RuntimeError) as exc:
            raise StreamClosed(str(exc)) from exc

    async def close(self) -> None:
        if not self._stdin.is_closing():
            self._stdin.close()


async def start_local_entrypoint(*, env: dict[str, str]) -> ProcessStream:
    """Run the entrypoint as a local process (``runtime: host``) and attach to it.

    ``env`` is the whole child environment (pass KAGURA_CREDS_DIR pointing at a private
    0700 directory: the host default /run/kagura/creds is rarely writable). It starts
    isolated in the file system's root (hostproc), as the container's does: the project
    root is the agent's writing, and the turn names it as the engines' working directory.
    Stop it with the channel's escalation: ``on_stop=stream.proc.terminate,
    on_kill=stream.proc.kill``.
    """
    proc = await start(
        python_code_argv(ENTRYPOINT),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        env=env,
    )
    return ProcessStream(proc)


class FrameDemuxer:
    """Incremental parser for Docker's multiplexed attach stream."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        """Add bytes; return every complete (stream, payload) frame they finish."""
        self._buffer += data
        frames: list[tuple[int, bytes]] = []
        while len(self._buffer) >= _HEADER.size:
            kind, size = _HEADER.unpack_from(self._buffer)
            end = _HEADER.size + size
            if len(self._buffer) < end:
                break
            frames.append((kind, bytes(self._buffer[_HEADER.size : end])))
            del self._buffer[:end]
        return frames


class DockerAttachStream:
    """docker-py ``attach_socket(params={"stdin": 1, "stdout": 1, "stderr": 1,
    "stream": 1})`` wrapped as a DuplexStream; stderr frames are kept as a bounded tail
    for diagnostics, never mixed into the event stream."""

    def __init__(self, attached: Any) -> None:
        # docker-py returns a SocketIO wrapping the real socket as ``_sock``.
        raw = getattr(attached, "_sock", attached)
        if not isinstance(raw, socket.socket):
            raise TypeError(f"expected a socket from attach_socket, got {type(raw).__name__}")
        self._attached = attached
        self._sock = raw
        self._sock.setblocking(False)
        self._demux = FrameDemuxer()
        self._pending: deque[bytes] = deque()
        self._stderr = bytearray()

    @property
    def stderr_tail(self) -> str:
        """The last bytes the container wrote to stderr."""
        return self._stderr.decode(errors="replace")

    async def read(self) -> bytes:
        loop = asyncio.get_running_loop()
        while not self._pending:
            try:
                data = await loop.sock_recv(self._sock, CHUNK)
            except (ConnectionResetError, OSError):
                return b""
            if not data:
                return b""
            for kind, payload in self._demux.feed(data):
                if kind == STDERR:
                    self._stderr += payload
                    del self._stderr[:-STDERR_TAIL_BYTES]
                else:
                    self._pending.append(payload)
        return self._pending.popleft()

    async def write(self, data: bytes) -> None:
        try:
            await asyncio.get_running_loop().sock_sendall(self._sock, data)
        except OSError as exc:
            raise StreamClosed(str(exc)) from exc

    async def close(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_WR)
        self._sock.close()
        close = getattr(self._attached, "close", None)
        if callable(close):
            close()
