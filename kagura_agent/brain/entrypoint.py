"""The in-container side of the brain channel: ``python3 -m kagura_agent.brain.entrypoint``.

Reads JSON lines on stdin from the host::

    {"type": "turn", ...Turn fields...}
    {"type": "credentials", "lease": id, "files": {...}, "env": {...}}
    {"type": "revoke-credentials", "lease": id}
    {"type": "memory-result", "request": n, "ok": bool, "result": ..., "error": ...}
    {"type": "user-message", "lease": n, "text": ...}   steering: the next user message
    {"type": "capability-result", "request": n, "granted": bool, "message": ...}
    {"type": "budget", "lease": n, "wall_seconds": s}   an extended wall budget (acked)
    {"type": "budget-result", "request": n, "granted": bool, "message": ..., "turns": t,
     "cost_usd": d}                                      a turn/dollar budget answer
    {"type": "transcript-put", "lease": id, "cwd": dir, "data": b64, "last": bool}
    {"type": "transcript-get", "lease": id, "cwd": dir, "max_bytes": n, "chunk_bytes": c}
                                                         a session's transcript, in before
                                                         the turn and out after it
                                                         (brain/transcript.py)
    {"type": "stop"}

and writes JSON lines on stdout: brain events (see events.py) plus the control lines
``credentials-applied`` / ``credentials-revoked`` (acks, with the lease id) and
``memory-request`` (``request`` n, ``op`` recall|remember|get|explore|link|dispatch, op
fields; dispatch: a sub-agent, answered when it has finished), ``capability-request``
(``request`` n, ``kind``, ``name``, ``reason``: a mid-run ask for one more egress policy
or credential scope), ``budget-request`` (``request`` n, ``limit`` turns|cost_usd,
``turns``, ``cost_usd`` spent, ``reason``: the CLI ran out of that budget) and
``budget-extended``, and ``transcript-written`` / ``transcript-chunk`` /
``transcript-sent`` (brain/transcript.py). Only this
module writes to the real stdout: fd 1 is pointed at stderr so stray prints from
engines or libraries cannot corrupt the channel. Stdlib and the engines only.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any, BinaryIO

from kagura_agent.brain.capability import CapabilityBridge
from kagura_agent.brain.creds_dir import CredentialDir, CredentialPathError, creds_root
from kagura_agent.brain.engines import select_engine
from kagura_agent.brain.events import ErrorEvent, event_to_json, is_terminal
from kagura_agent.brain.guard import make_undumpable, run_as_init, writable_import_paths
from kagura_agent.brain.memory_bridge import MEMORY_SOCKET_ENV, BridgeMemory, serve_socket
from kagura_agent.brain.protocol import Turn
from kagura_agent.brain.transcript import (
    MAX_PUT_BYTES,
    TranscriptError,
    decoded,
    encoded_chunks,
    read_transcript,
    transcript_path,
    write_transcript,
)
from kagura_agent.errors import KaguraError

MAX_INPUT_LINE = 16 * 1024 * 1024


class Outbox:
    """Serialised JSON-lines writer on the private copy of the real stdout."""

    def __init__(self, stream: BinaryIO) -> None:
        self._stream = stream
        self._lock = threading.Lock()

    def send(self, obj: dict[str, Any]) -> None:
        data = (json.dumps(obj, separators=(",", ":")) + "\n").encode()
        with self._lock:
            self._stream.write(data)
            self._stream.flush()


def _reader(fd: int, loop: asyncio.AbstractEventLoop, inbox: asyncio.Queue[Any]) -> None:
    """Thread: parse stdin lines into the inbox; None marks EOF.

    Reads the raw fd (not sys.stdin.buffer): a daemon thread blocked inside a buffered
    reader makes the interpreter abort at shutdown, while a blocked os.read does not.
    """
    buffer = bytearray()
    dropping = False  # inside an oversized line: discard up to its newline
    while chunk := os.read(fd, 65536):
        buffer += chunk
        while (newline := buffer.find(b"\n")) >= 0:
            line = bytes(buffer[:newline])
            del buffer[: newline + 1]
            if dropping:
                dropping = False
            elif (msg := _parse(line)) is not None:
                loop.call_soon_threadsafe(inbox.put_nowait, msg)
        if len(buffer) > MAX_INPUT_LINE:
            print("entrypoint: dropped an oversized input line", file=sys.stderr)
            buffer.clear()
            dropping = True
    loop.call_soon_threadsafe(inbox.put_nowait, None)


def _parse(line: bytes) -> dict[str, Any] | None:
    try:
        msg = json.loads(line)
    except ValueError:
        print("entrypoint: ignored a non-JSON input line", file=sys.stderr)
        return None
    return msg if isinstance(msg, dict) else None


class Entrypoint:
    """Dispatches host messages; runs at most one turn at a time."""

    def __init__(self, out: Outbox, creds: CredentialDir, memory: BridgeMemory) -> None:
        self.out = out
        self.creds = creds
        self.memory = memory
        self.capabilities = CapabilityBridge(out.send)
        self.deadline: asyncio.Timeout | None = None  # the running turn's wall budget
        self.turn_started = 0.0
        # A wall budget extended while the turn was still setting up (its engine loading):
        # the turn starts with it.
        self.early_wall: float | None = None
        self.turn_task: asyncio.Task[None] | None = None
        self.engine: Any = None  # the running turn's engine (steering goes to it)
        self.socket_path: str | None = None
        # Transcript chunks by session until the last (or the first problem with them).
        self.incoming: dict[str, list[bytes] | str] = {}

    def handle(self, msg: dict[str, Any]) -> bool:
        """Handle one message; False means stop."""
        kind = msg.get("type")
        if kind == "stop":
            return False
        if kind == "credentials":
            self._credentials(msg)
        elif kind == "revoke-credentials":
            lease = str(msg.get("lease", ""))
            self._set_env(self.creds.env(), remove=True)
            self.creds.revoke(lease)
            self._set_env(self.creds.env())
            self.out.send({"type": "credentials-revoked", "lease": lease})
        elif kind == "memory-result":
            self.memory.resolve(msg)
        elif kind == "user-message":
            self._user_message(msg)
        elif kind in ("capability-result", "budget-result"):
            self.capabilities.resolve(msg)
        elif kind == "budget":
            self._budget(msg)
        elif kind == "transcript-put":
            self._transcript_put(msg)
        elif kind == "transcript-get":
            self._transcript_get(msg)
        elif kind == "turn":
            if self.turn_task is not None and not self.turn_task.done():
                self._emit(ErrorEvent(message="a turn is already running", code="protocol"))
            else:
                self.early_wall = None
                self.turn_task = asyncio.create_task(self._run_turn(msg))
        else:
            print(f"entrypoint: ignored message type {kind!r}", file=sys.stderr)
        return True

    def _user_message(self, msg: dict[str, Any]) -> None:
        """Steering: hand ``text`` to the running engine if it takes mid-run input."""
        number, text = str(msg.get("lease", "")), msg.get("text")
        engine = self.engine if self.turn_task is not None and not self.turn_task.done() else None
        steer = getattr(engine, "steer", None)
        if not isinstance(text, str) or not text.strip():
            taken, reason = False, "an empty message"
        elif engine is None:
            taken, reason = False, "no turn is running"
        elif steer is None:
            taken, reason = False, f"the {engine.name} engine takes no message mid-run"
        else:
            taken, reason = steer(text)
        self.out.send({"type": "user-message-taken", "lease": number, "taken": taken,
                       "reason": reason})  # fmt: skip

    def _budget(self, msg: dict[str, Any]) -> None:
        """The host extended the wall budget (an operator approved it): move the deadline."""
        number, wall = str(msg.get("lease", "")), msg.get("wall_seconds")
        taken = False
        if not isinstance(wall, int | float) or wall <= 0:
            pass
        elif self.deadline is not None:
            self.deadline.reschedule(self.turn_started + float(wall))
            taken = True
        elif self.turn_task is not None and not self.turn_task.done():
            # Asked for before the turn's clock started here (a slow engine import): the
            # host's clock already runs, so this one can only start later, never earlier.
            self.early_wall = float(wall)
            taken = True
        self.out.send({"type": "budget-extended", "lease": number, "taken": taken})

    def _transcript_put(self, msg: dict[str, Any]) -> None:
        """A chunk of the session transcript the host kept; after the last, the file (or
        why not: the first problem, answered once, at the last chunk)."""
        lease = str(msg.get("lease", ""))
        taken = self.incoming.setdefault(lease, [])
        try:
            if isinstance(taken, str):
                raise TranscriptError(taken)
            taken.append(decoded(msg.get("data")))
            if sum(map(len, taken)) > MAX_PUT_BYTES:
                raise TranscriptError(f"the transcript is larger than {MAX_PUT_BYTES} bytes")
            if msg.get("last") is not True:
                return
            del self.incoming[lease]
            home = Path.home()
            data = b"".join(taken)
            write_transcript(home, transcript_path(home, msg.get("cwd"), lease), data)
        except TranscriptError as exc:
            if msg.get("last") is not True:
                self.incoming[lease] = str(exc)
                return
            self.incoming.pop(lease, None)
            self.out.send({"type": "transcript-written", "lease": lease, "error": str(exc)})
            return
        self.out.send({"type": "transcript-written", "lease": lease, "bytes": len(data)})

    def _transcript_get(self, msg: dict[str, Any]) -> None:
        """Send the session transcript the CLI wrote, in chunks, then how much it was."""
        lease = str(msg.get("lease", ""))
        most, size = msg.get("max_bytes"), msg.get("chunk_bytes")
        try:
            if not (isinstance(most, int) and isinstance(size, int) and most > 0 and size > 0):
                raise TranscriptError("a transcript request needs max_bytes and chunk_bytes")
            data = read_transcript(transcript_path(Path.home(), msg.get("cwd"), lease), most)
        except TranscriptError as exc:
            self.out.send({"type": "transcript-sent", "lease": lease, "error": str(exc)})
            return
        for chunk in encoded_chunks(data, size):
            self.out.send({"type": "transcript-chunk", "lease": lease, "data": chunk})
        self.out.send({"type": "transcript-sent", "lease": lease, "bytes": len(data)})

    def _credentials(self, msg: dict[str, Any]) -> None:
        lease = str(msg.get("lease", ""))
        files, env = msg.get("files") or {}, msg.get("env") or {}
        try:
            if not isinstance(files, dict) or not isinstance(env, dict):
                raise CredentialPathError("files and env must be objects")
            self._set_env(self.creds.env(), remove=True)
            self.creds.apply(lease, files, env)
            self._set_env(self.creds.env())
        except (CredentialPathError, OSError) as exc:
            self.out.send({"type": "credentials-applied", "lease": lease, "error": str(exc)})
            return
        self.out.send({"type": "credentials-applied", "lease": lease, "files": sorted(files)})

    @staticmethod
    def _set_env(values: dict[str, str], *, remove: bool = False) -> None:
        # Engines like kagura-brain build their child env from os.environ, so lease env
        # lives there for the lifetime of the lease.
        for key, value in values.items():
            if remove:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value

    def _emit(self, event: Any) -> None:
        self.out.send(event_to_json(event))

    async def _run_turn(self, msg: dict[str, Any]) -> None:
        body = {k: v for k, v in msg.items() if k != "type"}
        try:
            turn = Turn.from_json(body)
            brain = select_engine(
                {"engine": turn.engine, **turn.engine_options},
                memory=self.memory,
                dispatch=self.memory,  # the same bridge carries dispatch requests
                capabilities=self.capabilities,
            )
        except KaguraError as exc:
            self._emit(ErrorEvent(message=exc.message, code="setup"))
            return
        self.engine = brain
        env = {**turn.env, **self.creds.env()}
        if self.socket_path:
            env[MEMORY_SOCKET_ENV] = self.socket_path
        turn = dataclasses.replace(turn, env=env)
        finished = False
        try:
            async with asyncio.timeout(turn.budget.wall_seconds) as deadline:
                self.deadline, self.turn_started = deadline, asyncio.get_running_loop().time()
                if self.early_wall is not None:
                    deadline.reschedule(self.turn_started + self.early_wall)
                async for event in brain.run(turn):
                    self._emit(event)
                    if is_terminal(event):
                        finished = True
                        break
        except TimeoutError:
            self._emit(ErrorEvent(message="the turn overran its wall-clock budget", code="timeout"))
            return
        except Exception as exc:  # an engine bug must still end the turn with an event
            self._emit(ErrorEvent(message=f"{type(exc).__name__}: {exc}", code="crash"))
            return
        finally:
            self.deadline = None
        if not finished:
            self._emit(ErrorEvent(message="the engine ended without a result", code="protocol"))


async def serve(stdin_fd: int, stdout: BinaryIO) -> int:
    """Serve the channel until stop or EOF; always wipe credentials on the way out."""
    loop = asyncio.get_running_loop()
    inbox: asyncio.Queue[Any] = asyncio.Queue()
    out = Outbox(stdout)
    memory = BridgeMemory(out.send)
    app = Entrypoint(out, CredentialDir(creds_root()), memory)
    sock_dir = tempfile.mkdtemp(prefix="kagura-mem-")  # mkdtemp makes it 0700
    app.socket_path = str(Path(sock_dir) / "memory.sock")
    server = await serve_socket(app.socket_path, memory)
    threading.Thread(target=_reader, args=(stdin_fd, loop, inbox), daemon=True).start()
    try:
        while (msg := await inbox.get()) is not None and app.handle(msg):
            pass
    finally:
        if app.turn_task is not None and not app.turn_task.done():
            app.turn_task.cancel()
            await asyncio.gather(app.turn_task, return_exceptions=True)
        memory.close()
        app.capabilities.close()
        server.close()
        app.creds.wipe_all()
        Path(app.socket_path).unlink(missing_ok=True)
        os.rmdir(sock_dir)
    return 0


def main() -> int:
    """Process entry: out of the tools' reach first (see guard.py), then keep a private
    handle on the real stdout and serve."""
    if not make_undumpable() and os.getpid() == 1:
        print("entrypoint: cannot make itself non-dumpable; refusing to serve", file=sys.stderr)
        return 70
    if os.getpid() == 1 and (writable := writable_import_paths()):
        print(
            "entrypoint: modules could be planted where it imports from"
            f" ({', '.join(writable)}); start it with python3 -I; refusing to serve",
            file=sys.stderr,
        )
        return 70
    if os.getpid() == 1 and (status := run_as_init()) is not None:
        return status
    real_stdout = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # anything else printing to fd 1 now lands on stderr
    sys.stdout = sys.stderr
    return asyncio.run(serve(sys.stdin.fileno(), real_stdout))


if __name__ == "__main__":
    sys.exit(main())
