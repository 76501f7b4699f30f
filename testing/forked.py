"""``python -m kagura_agent ARGV`` (or ``python -c CODE``) as a real child process, forked
from one that has already imported the package instead of started from nothing.

For tests where the process boundary matters but the interpreter's start does not: a
read that blocks (a FIFO, ``/dev/zero``) must be stopped by a timeout without taking the
test down; the child's own CPU time and peak RSS are measured (``os.wait4``); output is
bytes on real file descriptors; processes run at the same time. Each child has its own
pid, environment, working directory, standard streams, exit status and resource usage,
and ends through the interpreter's own exit (``SystemExit``, atexit handlers, flushes),
as ``python -m kagura_agent`` does. What it does not have is a fresh interpreter: start-up
options and variables read only at start (``-I``, ``PYTHONPATH``, ``PYTHONWARNINGS``,
``sys.path[0]`` = the working directory) are the server's, and modules the server
imported are not imported again. A test about those (isolation, shadowing modules, the
import graph, ``-I``) keeps a real ``subprocess``.

One server per test process (started on first use, ended when that process ends: it
reads EOF). It imports the CLI, builds its parsers and compiles the manifest schemas once
(~0.5 s of CPU), then each
child costs a fork (~10 ms) instead of an interpreter start and the package's imports.
The server serves one request at a time: ``spawn`` several children, then ``wait`` each.
"""

from __future__ import annotations

import array
import atexit
import contextlib
import gc
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

REPO = Path(__file__).resolve().parents[1]
# Imported (and the parsers built) in the server before any fork: what validate, plan,
# show and the state commands need, so a child imports little or nothing.
WARM = (
    "kagura_agent.cli.main",
    "kagura_agent.manifest.workspace",
    "kagura_agent.plan.build",
    "kagura_agent.plan.planfile",
    "kagura_agent.plan.render",
    "kagura_agent.state",
    "jsonschema",
)
_MAX_MESSAGE = 1 << 20


@dataclass
class Forked:
    """What ``subprocess.run`` would return, and the child's own resource usage."""

    args: list[str]
    returncode: int
    stdout: bytes
    stderr: bytes
    cpu_s: float  # user + system CPU time of the child (not of the server or the test)
    maxrss_kib: int  # the child's peak resident set (includes what it shares with the server)

    def text(self) -> subprocess.CompletedProcess[str]:
        """As ``subprocess.run(..., text=True)`` would have returned it."""
        return subprocess.CompletedProcess(
            self.args,
            self.returncode,
            self.stdout.decode(errors="replace"),
            self.stderr.decode(errors="replace"),
        )


class Child:
    """A child the server forked; ``wait`` reaps it (killing it after ``timeout``)."""

    def __init__(self, server: _Server, pid: int, args: list[str], files: list[Any]) -> None:
        self.server = server
        self.pid = pid
        self.args = args
        self._files = files  # stdin, stdout, stderr (temporary files)

    def wait(self, timeout: float) -> Forked:
        """Reap the child; one still running after ``timeout`` seconds is killed and
        ``subprocess.TimeoutExpired`` raised (with what it had written)."""
        killed = threading.Event()

        def kill() -> None:
            killed.set()
            self.kill()

        killer = threading.Timer(timeout, kill)
        killer.start()
        try:
            done = self.server.request({"op": "wait", "pid": self.pid})
        finally:
            killer.cancel()
        stdin, stdout, stderr = self._files
        outputs = []
        for file in (stdout, stderr):
            file.seek(0)
            outputs.append(file.read())
            file.close()
        stdin.close()
        if killed.is_set():
            raise subprocess.TimeoutExpired(self.args, timeout, outputs[0], outputs[1])
        status = int(done["status"])
        return Forked(
            self.args,
            os.waitstatus_to_exitcode(status),
            outputs[0],
            outputs[1],
            float(done["cpu_s"]),
            int(done["maxrss_kib"]),
        )

    def kill(self) -> None:
        # The child is the server's and not reaped before its wait: the pid is still it.
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)


class _Server:
    def __init__(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        path = [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
        self.process = subprocess.Popen(
            [sys.executable, "-c", "import testing.forked as f; f.serve()", str(theirs.fileno())],
            pass_fds=[theirs.fileno()],
            env=env,
            cwd="/",
        )
        theirs.close()
        self.socket = ours
        self.owner = os.getpid()
        self.lock = threading.Lock()
        atexit.register(self.close)

    def close(self) -> None:
        """End the server (it reads end of file) and reap it, so its CPU time and its
        children's count in this process's (``/usr/bin/time`` of a test run sees them)."""
        if self.owner != os.getpid():
            return
        self.socket.close()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def request(self, message: dict[str, Any], fds: Sequence[int] = ()) -> dict[str, Any]:
        with self.lock:
            ancillary = []
            if fds:
                ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))]
            self.socket.sendmsg([json.dumps(message).encode()], ancillary)
            data = self.socket.recv(_MAX_MESSAGE)
        if not data:
            raise RuntimeError(f"the fork server ended (exit {self.process.poll()})")
        answer: dict[str, Any] = json.loads(data)
        if "error" in answer:
            raise RuntimeError(f"the fork server refused: {answer['error']}")
        return answer


_server: _Server | None = None
_server_lock = threading.Lock()


def _the_server() -> _Server:
    global _server
    with _server_lock:
        if _server is None or _server.owner != os.getpid() or _server.process.poll() is not None:
            _server = _Server()
        return _server


def shutdown() -> None:
    """End this process's server, if it started one (a test run's last step)."""
    global _server
    with _server_lock:
        if _server is not None:
            _server.close()
            _server = None


def spawn(
    argv: Sequence[str],
    *,
    cwd: Path | str,
    env: Mapping[str, str],
    stdin: bytes | int = b"",
    code: str | None = None,
) -> Child:
    """Start ``python -m kagura_agent ARGV`` (or ``python -c CODE ARGV``) as a forked child.
    ``stdin`` is what it reads, or a file descriptor it gets as its standard input."""
    files = [tempfile.TemporaryFile() for _ in range(3)]  # noqa: SIM115 - closed by wait
    if isinstance(stdin, bytes):
        files[0].write(stdin)
        files[0].seek(0)
    fds = [stdin if isinstance(stdin, int) else files[0].fileno(), *(f.fileno() for f in files[1:])]
    message = {"op": "spawn", "argv": list(argv), "cwd": str(cwd), "env": dict(env), "code": code}
    answer = _the_server().request(message, fds)
    shown = ["-c", "CODE"] if code is not None else ["-m", "kagura_agent"]
    return Child(_the_server(), int(answer["pid"]), [sys.executable, *shown, *argv], files)


def run(
    argv: Sequence[str],
    *,
    cwd: Path | str,
    env: Mapping[str, str],
    stdin: bytes = b"",
    timeout: float = 120,
    code: str | None = None,
) -> Forked:
    """``spawn`` and ``wait``: a child that blocks is killed after ``timeout`` seconds."""
    return spawn(argv, cwd=cwd, env=env, stdin=stdin, code=code).wait(timeout)


# --- the server ------------------------------------------------------------------------


def serve() -> None:
    """The server's loop (``python -c 'import testing.forked as f; f.serve()' FD``)."""
    import importlib

    channel = socket.socket(fileno=int(sys.argv[1]))
    for name in WARM:
        importlib.import_module(name)
    from kagura_agent.cli import main as cli

    for json_errors in (False, True):  # the parsers are cached per process
        cli.cached_parser(json_errors=json_errors)
    # The compiled schema validators (cached per process; a pass is also cached on disk,
    # but each test's cache directory starts empty): pure functions of the packaged schemas.
    from kagura_agent.manifest import schema

    for kind in schema.KINDS:
        schema._validator(kind)
    # What the server holds is never collected in a child: a collection there would write
    # to every shared page (copy on write) for nothing.
    gc.freeze()
    while True:
        try:
            data, ancillary, _flags, _addr = channel.recvmsg(_MAX_MESSAGE, socket.CMSG_SPACE(64))
        except OSError:
            return
        if not data:
            return  # the test process is gone
        message = json.loads(data)
        fds = [fd for level, kind, raw in ancillary for fd in _fds(level, kind, raw)]
        if message["op"] == "spawn":
            pid = os.fork()
            if pid == 0:  # the child: it never comes back here (SystemExit)
                channel.close()
                _become(message, fds)
                _child(message)
        for fd in fds:
            os.close(fd)
        try:
            if message["op"] == "spawn":
                answer: dict[str, Any] = {"pid": pid}
            elif message["op"] == "wait":
                _pid, status, usage = os.wait4(int(message["pid"]), 0)
                answer = {
                    "status": status,
                    "cpu_s": usage.ru_utime + usage.ru_stime,
                    "maxrss_kib": usage.ru_maxrss,
                }
            else:
                answer = {"error": f"unknown op {message['op']!r}"}
        except OSError as exc:
            answer = {"error": str(exc)}
        channel.send(json.dumps(answer).encode())


def _fds(level: int, kind: int, raw: bytes) -> list[int]:
    if (level, kind) != (socket.SOL_SOCKET, socket.SCM_RIGHTS):
        return []
    fds = array.array("i")
    fds.frombytes(raw[: len(raw) - (len(raw) % fds.itemsize)])
    return list(fds)


def _become(message: dict[str, Any], fds: list[int]) -> None:
    """In the child: the standard streams, environment and directory it was asked for."""
    for target, fd in enumerate(fds[:3]):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(message["cwd"])
    os.environ.clear()
    os.environ.update(message["env"])
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    encoding, _, errors = os.environ.get("PYTHONIOENCODING", "utf-8").partition(":")
    utf8_mode = os.environ.get("PYTHONUTF8") == "1"
    strict = errors or ("surrogateescape" if utf8_mode else "strict")
    sys.stdin = _stream(0, "r", encoding, strict, line_buffering=False)
    sys.stdout = _stream(1, "w", encoding, strict, line_buffering=os.isatty(1))
    sys.stderr = _stream(2, "w", encoding, "backslashreplace", line_buffering=True)


def _stream(fd: int, mode: str, encoding: str, errors: str, *, line_buffering: bool) -> Any:
    import io

    raw = io.FileIO(fd, mode, closefd=False)
    buffered: Any = io.BufferedReader(raw) if mode == "r" else io.BufferedWriter(raw)
    return io.TextIOWrapper(buffered, encoding, errors, line_buffering=line_buffering)


def _child(message: dict[str, Any]) -> NoReturn:
    """Run the command, then end as the interpreter would (SystemExit's code or message,
    a traceback and 1, an interrupt as SIGINT; atexit handlers; what the child made
    collected, so a connection left to the garbage collector is closed -- SQLite then
    folds its WAL back into the database; the streams flushed), but without tearing every
    module down: that would write to every page the child shares with the server (~50 ms
    of CPU) and shows nothing more."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    gc.enable()
    try:
        if message.get("code") is not None:
            sys.argv = ["-c", *message["argv"]]
            exec(compile(message["code"], "<string>", "exec"), {"__name__": "__main__"})
            code: object = 0
        else:
            from kagura_agent.cli.main import main

            sys.argv = [str(REPO / "kagura_agent" / "__main__.py"), *message["argv"]]
            code = main()
    except SystemExit as exc:
        code = exc.code
    except KeyboardInterrupt:
        _end(signal.SIGINT)
    except BaseException:
        sys.excepthook(*sys.exc_info())
        code = 1
    if code is None:
        status = 0
    elif isinstance(code, int):
        status = code & 0xFF
    else:
        print(code, file=sys.stderr)
        status = 1
    atexit._run_exitfuncs()
    gc.collect()  # the server's objects are frozen: only the child's are looked at
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            status = 120  # what the interpreter exits with when it cannot flush stdout
    os._exit(status)


def _end(signum: int) -> NoReturn:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
    os._exit(128 + signum)
