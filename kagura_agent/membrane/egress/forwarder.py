"""Inside the agent container: 127.0.0.1:PORT -> the proxy's Unix socket, byte for byte.

The agent container runs with ``network_mode: none``: its only interface is loopback and
there is no route to the host, the Docker networks or anything else. The run's proxy is
reachable only through a Unix socket on a volume shared with the proxy container. Tools
expect an HTTP proxy on a TCP port (``HTTPS_PROXY=http://127.0.0.1:3128``), so this
forwarder listens there and copies each connection to the socket, where socat hands it to
squid. Nothing is parsed here: the proxy sees exactly what the tool sent.

Stdlib only, and importable on its own: images without kagura-agent run this file with
``python3 -c``. apply makes it part of the agent container's own command
(:func:`launcher`): it binds the forwarder's ports, forks the forwarder, and execs the
image's entrypoint — so the ports listen before the entrypoint runs, with no ``docker
exec`` and no readiness line to wait for. :func:`command` is the same forwarder alone,
for a ``docker exec`` into a running container. asyncio is imported only where it runs,
after the fork: the entrypoint's start does not wait for it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import socket
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import asyncio

SOCKET_ENV = "KAGURA_EGRESS_SOCKET"
PORT_ENV = "KAGURA_EGRESS_PORT"
CHUNK = 1024 * 1024


async def _pipe(loop: asyncio.AbstractEventLoop, src: socket.socket, dst: socket.socket) -> None:
    try:
        if hasattr(os, "splice"):
            await _splice(loop, src, dst)
        else:
            await _copy(loop, src, dst)
    except OSError:
        pass
    finally:
        # Half-close: the other direction may still be carrying the response.
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)


async def _copy(loop: asyncio.AbstractEventLoop, src: socket.socket, dst: socket.socket) -> None:
    buffer = bytearray(CHUNK)
    view = memoryview(buffer)
    while count := await loop.sock_recv_into(src, buffer):
        await loop.sock_sendall(dst, view[:count])


async def _ready(loop: asyncio.AbstractEventLoop, sock: socket.socket, write: bool) -> None:
    done: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not done.done():
            done.set_result(None)

    fd = sock.fileno()
    if write:
        loop.add_writer(fd, wake)
    else:
        loop.add_reader(fd, wake)
    try:
        await done
    finally:
        (loop.remove_writer if write else loop.remove_reader)(fd)


async def _splice(loop: asyncio.AbstractEventLoop, src: socket.socket, dst: socket.socket) -> None:
    """Kernel-side copy through a pipe (no bytes through Python): src -> pipe -> dst."""
    flags = os.SPLICE_F_MOVE | os.SPLICE_F_NONBLOCK
    read_end, write_end = os.pipe2(os.O_NONBLOCK)
    try:
        with contextlib.suppress(OSError):
            fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, CHUNK)
        while True:
            try:
                count = os.splice(src.fileno(), write_end, CHUNK, flags=flags)
            except BlockingIOError:
                await _ready(loop, src, write=False)
                continue
            if count == 0:
                return
            while count:
                try:
                    count -= os.splice(read_end, dst.fileno(), count, flags=flags)
                except BlockingIOError:
                    await _ready(loop, dst, write=True)
    finally:
        os.close(read_end)
        os.close(write_end)


# Connections relayed by threads of their own at once (the rest stay on the event loop):
# two threads with blocking splice cost ~0.4 s of CPU per GiB against ~0.7 s for the
# event loop, which re-arms epoll at every EAGAIN (bench/egress_throughput.py). Threads
# count against the agent container's pids limit, so only a few: a burst of connections
# does not take processes from the agent's tools. A connection whose second thread cannot
# be had polls both directions in its one thread.
THREADED_MAX = 8
_threaded = threading.BoundedSemaphore(THREADED_MAX)


def _pump_blocking(src: socket.socket, dst: socket.socket) -> None:
    """One direction on blocking sockets: src -> pipe -> dst, until src's end of file."""
    read_end, write_end = os.pipe()
    try:
        with contextlib.suppress(OSError):
            fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, CHUNK)
        while count := os.splice(src.fileno(), write_end, CHUNK, flags=os.SPLICE_F_MOVE):
            while count:
                count -= os.splice(read_end, dst.fileno(), count, flags=os.SPLICE_F_MOVE)
    except OSError:
        pass
    finally:
        os.close(read_end)
        os.close(write_end)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)  # half-close, as the loop does


def _relay_threads(client: socket.socket, upstream: socket.socket) -> None:
    try:
        client.setblocking(True)
        upstream.setblocking(True)
        back = threading.Thread(target=_pump_blocking, args=(upstream, client), daemon=True)
        try:
            back.start()
        except RuntimeError:  # no second thread (pids limit): both directions here
            client.setblocking(False)
            upstream.setblocking(False)
            _splice_both(client, upstream)
            return
        _pump_blocking(client, upstream)
        back.join()
    finally:
        client.close()
        upstream.close()
        _threaded.release()


class _Lane:
    """One direction of a connection: src -> pipe -> dst."""

    def __init__(self, src: socket.socket, dst: socket.socket) -> None:
        self.src, self.dst = src, dst
        self.read_end, self.write_end = os.pipe2(os.O_NONBLOCK)
        with contextlib.suppress(OSError):
            fcntl.fcntl(self.write_end, fcntl.F_SETPIPE_SZ, CHUNK)
        self.queued = 0  # bytes in the pipe, not yet written to dst
        self.open = True  # src has not reached end of file

    def move(self) -> None:
        flags = os.SPLICE_F_MOVE | os.SPLICE_F_NONBLOCK
        if not self.queued and self.open:
            try:
                count = os.splice(self.src.fileno(), self.write_end, CHUNK, flags=flags)
            except BlockingIOError:
                count = -1
            if count == 0:
                self.open = False
                with contextlib.suppress(OSError):
                    self.dst.shutdown(socket.SHUT_WR)  # half-close, as the loop does
            elif count > 0:
                self.queued = count
        while self.queued:
            try:
                self.queued -= os.splice(self.read_end, self.dst.fileno(), self.queued, flags=flags)
            except BlockingIOError:
                return

    def close(self) -> None:
        os.close(self.read_end)
        os.close(self.write_end)


def _splice_both(client: socket.socket, upstream: socket.socket) -> None:
    """Both directions of one connection in this thread: poll, then splice via two pipes."""
    lanes: list[_Lane] = []
    try:
        lanes = [_Lane(client, upstream), _Lane(upstream, client)]
        poller = select.poll()
        while any(lane.open or lane.queued for lane in lanes):
            wanted: dict[int, int] = {}
            for lane in lanes:
                if lane.queued:
                    fd, event = lane.dst.fileno(), select.POLLOUT
                elif lane.open:
                    fd, event = lane.src.fileno(), select.POLLIN
                else:
                    continue
                wanted[fd] = wanted.get(fd, 0) | event
            for fd in (client.fileno(), upstream.fileno()):
                with contextlib.suppress(KeyError):
                    poller.unregister(fd)
                if fd in wanted:
                    poller.register(fd, wanted[fd])
            poller.poll()
            for lane in lanes:
                lane.move()
    except OSError:
        pass  # either side gone: the tool sees its connection closed
    finally:
        for lane in lanes:
            lane.close()


async def _relay(client: socket.socket, path: str) -> None:
    import asyncio

    loop = asyncio.get_running_loop()
    upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    upstream.setblocking(False)
    handed_off = False
    try:
        await loop.sock_connect(upstream, path)
        if hasattr(os, "splice") and _threaded.acquire(blocking=False):
            try:
                thread = threading.Thread(target=_relay_threads, args=(client, upstream))
                thread.daemon = True
                thread.start()
                handed_off = True
                return
            except RuntimeError:  # no thread to be had (pids limit): stay on the loop
                _threaded.release()
        await asyncio.gather(_pipe(loop, client, upstream), _pipe(loop, upstream, client))
    except OSError:
        pass  # proxy gone: the tool sees its connection closed, as with no route
    finally:
        if not handed_off:
            upstream.close()
            client.close()


def ready_line(path: str, port: int) -> str:
    """What the forwarder prints on stderr once it listens (start_forwarder waits for it)."""
    return f"forwarder: 127.0.0.1:{port} -> {path}"


def listen(port: int, host: str = "127.0.0.1") -> socket.socket:
    """The forwarder's listening socket (bound now, so a port clash fails at start)."""
    server = socket.create_server((host, port), backlog=256)
    server.setblocking(False)
    return server


async def serve(server: socket.socket, path: str) -> None:
    """Accept forever on ``server``, relaying every connection to the Unix socket ``path``."""
    import asyncio

    loop = asyncio.get_running_loop()
    tasks: set[asyncio.Task[None]] = set()
    while True:
        client, _ = await loop.sock_accept(server)
        client.setblocking(False)
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        task = loop.create_task(_relay(client, path))
        tasks.add(task)
        task.add_done_callback(tasks.discard)


def command(path: str, port: int) -> list[str]:
    """argv that runs this forwarder with a bare ``python3`` (no kagura-agent installed)."""
    source = Path(__file__).read_text(encoding="utf-8")
    return ["python3", *ISOLATED, "-c", source, path, str(port)]


# Every python3 kagura starts in the agent's container is isolated (no working directory
# or script folder on sys.path, no PYTHON* variable, no user site) and starts in / (see
# hardening.START_DIR): run 1 of a root could otherwise leave a socket.py in /workspace
# for run 2's launcher, forwarder and entrypoint to import before anything else.
ISOLATED = ("-I",)
# The agent container's entrypoint (python3 -I -c STUB SPEC SOURCE -- ARGV...): only socket
# and os before the exec, so the image's entrypoint starts one bare python3 start later
# than it would alone. It moves to / first, so the image's entrypoint starts there
# whatever the container's working directory (a `python3 -m` entrypoint of an image that
# predates -I then finds / first on sys.path: read-only). The child holds no end of the
# brain channel (the container's stdin and stdout): its stdin, stdout and stderr are
# /dev/null before anything else runs, then it execs a fresh python3 running this file
# (SOURCE) on the bound sockets, so nothing of the stub or of the entrypoint's argv is in
# its memory or command line.
SERVE_FDS = "--serve-fds"  # as written in the stub
_LAUNCH_STUB = """\
import os, socket, sys
os.chdir("/")
spec, source, sep, argv = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
assert sep == "--" and argv, "usage: SPEC SOURCE -- ARGV..."
servers = []
for item in spec.split(","):
    port, _, path = item.partition("=")
    server = socket.create_server(("127.0.0.1", int(port)), backlog=256)
    servers.append((server, path))
if os.fork() == 0:
    try:
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        fds = []
        for server, path in servers:
            os.set_inheritable(server.fileno(), True)
            fds.append(f"{server.fileno()}={path}")
        os.execvp("python3", ["python3", "-I", "-c", source, "--serve-fds", ",".join(fds)])
    finally:
        os._exit(127)
for server, _ in servers:
    server.close()
os.execvp(argv[0], argv)
"""


def launcher(pairs: Sequence[tuple[str, int]], argv: Sequence[str]) -> list[str]:
    """A container entrypoint: listen on each ``(socket path, port)`` pair, fork the
    forwarder, then exec ``argv`` (the image's own entrypoint and command). The ports
    listen before ``argv`` runs; a port that cannot be bound ends the container."""
    spec = ",".join(f"{port}={path}" for path, port in pairs)
    source = Path(__file__).read_text(encoding="utf-8")
    return ["python3", *ISOLATED, "-c", _LAUNCH_STUB, spec, source, "--", *argv]


def _serve_all(servers: list[tuple[socket.socket, str]]) -> None:
    import asyncio

    async def run() -> None:
        await asyncio.gather(*(serve(server, path) for server, path in servers))

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run())


def _undumpable() -> None:
    """Out of the tools' reach, like the entrypoint: no ptrace of this process and no
    /proc/PID/{mem,fd} for the agent's tools (same uid, no CAP_SYS_PTRACE)."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE, 0


def main(argv: list[str]) -> int:
    if argv[:1] == [SERVE_FDS] and len(argv) == 2:
        servers = []
        for item in argv[1].split(","):
            fd, _, path = item.partition("=")
            server = socket.socket(fileno=int(fd))
            server.setblocking(False)
            servers.append((server, path))
        _serve_all(servers)
        return 0
    path = argv[0] if argv else os.environ.get(SOCKET_ENV, "")
    port = int(argv[1] if len(argv) > 1 else os.environ.get(PORT_ENV, "3128"))
    if not path:
        print("forwarder: no proxy socket given", file=sys.stderr)
        return 2
    server = listen(port)
    print(ready_line(path, port), file=sys.stderr, flush=True)
    _serve_all([(server, path)])
    return 0


if __name__ == "__main__":
    _undumpable()
    raise SystemExit(main(sys.argv[1:]))
