"""The host side of the brain channel: JSON lines over the container's stdin/stdout.

The host sends turns and credential bundles, yields the container's events, and serves
its memory requests through a ``MemoryServer`` (which applies trust-tier filters) and its
sub-agent requests (``op`` dispatch) through a ``Dispatcher``. Every
line from the container is untrusted: its size is capped before it is parsed, its shape
is validated, and anything off-contract ends the turn with an error event. Idle time,
the wall-clock budget and oversize lines all take the same path: an error event, then
``stop()`` — a polite ``stop`` line, then ``on_stop()``, then ``on_kill()``.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from kagura_agent.brain.events import (
    BrainEvent,
    ErrorEvent,
    EventShapeError,
    event_from_json,
    is_terminal,
)
from kagura_agent.brain.protocol import Turn
from kagura_agent.brain.streams import DuplexStream, StreamClosed
from kagura_agent.brain.transcript import (
    PUT_CHUNK_BYTES,
    TranscriptError,
    chunk_bytes_for,
    decoded,
    encoded_chunks,
)
from kagura_agent.errors import SetupError

Callback = Callable[[], Awaitable[None] | None]
_ACKS = (
    "credentials-applied",
    "credentials-revoked",
    "user-message-taken",
    "budget-extended",
    "transcript-written",
    "transcript-sent",
)


class TranscriptRefused(Exception):
    """The session transcript did not cross the channel (the message says why)."""


class MemoryRefused(Exception):
    """A memory request the run may not make (its message goes back to the brain)."""


class MemoryServer(Protocol):
    """Host memory as offered to the container. Implementations apply the trust-tier
    filters of the run; results must be JSON-serialisable. ``explore`` and ``link`` raise
    MemoryRefused for a memory the run may not read (as if it did not exist)."""

    async def recall(self, query: str, limit: int) -> list[dict[str, Any]]: ...

    async def remember(self, text: str, tags: list[str]) -> str: ...

    async def get(self, memory_id: str) -> dict[str, Any] | None: ...

    async def explore(self, memory_id: str, limit: int) -> dict[str, Any]: ...

    async def link(self, source_id: str, target_id: str, edge_type: str) -> dict[str, Any]: ...


class Dispatcher(Protocol):
    """Sub-agents run by the host for the brain (apply/midrun/dispatch.py). ``dispatch`` answers
    when the child has finished, with its result or the reason it was refused."""

    async def dispatch(self, request: Mapping[str, Any]) -> dict[str, Any]: ...


class CapabilityServer(Protocol):
    """The host's side of mid-run capability requests (apply/midrun/grants.py): decides, asks an
    operator when the manifests allow it, applies a grant; returns (granted, message)."""

    async def request(self, kind: str, name: str, reason: str) -> tuple[bool, str]: ...

    async def extend_budget(
        self, limit: str, turns: int, cost_usd: float, reason: str
    ) -> dict[str, Any]:
        """A turn or dollar budget the brain ran out of: ``granted``, ``message`` and, when
        granted, what is left of each budget by the host's count (``turns``, ``cost_usd``)."""
        ...


@dataclass(frozen=True)
class ChannelLimits:
    """Bounds the host enforces on the container, whatever the brain does."""

    max_line_bytes: int = 1024 * 1024
    idle_seconds: float = 300.0
    # Extra host-side time past the turn's wall budget: the entrypoint enforces the
    # budget itself and reports it cleanly; the host only steps in when it does not.
    wall_grace_seconds: float = 2.0
    stop_grace_seconds: float = 5.0
    kill_grace_seconds: float = 5.0
    ack_timeout_seconds: float = 10.0
    # How long a session transcript may take to cross, either way (16 MiB takes ~1 s; the
    # first message also waits for the entrypoint to start, slow on a busy machine).
    transcript_seconds: float = 120.0
    max_memory_requests: int = 4
    max_memory_text: int = 64 * 1024
    # What one run may store in the host's memory (remember and link), in all: each write
    # lands in the operator's memory store on the host and stays there after the run, in
    # no disk budget of the run's.
    max_memory_writes: int = 500
    max_memory_write_bytes: int = 4 * 1024 * 1024


@dataclass(frozen=True)
class _Violation:
    code: str
    message: str


class BrainChannel:
    """One attached container (or local entrypoint process). Use as an async context
    manager, or call ``start()`` and ``stop()`` yourself."""

    def __init__(
        self,
        stream: DuplexStream,
        *,
        memory: MemoryServer | None = None,
        limits: ChannelLimits | None = None,
        on_stop: Callback | None = None,
        on_kill: Callback | None = None,
        dispatcher: Dispatcher | None = None,
        capabilities: CapabilityServer | None = None,
    ) -> None:
        self.stream = stream
        self.memory = memory
        self.dispatcher = dispatcher
        self._dispatching = 0  # sub-agents running: the parent waits, it is not idle
        self.capabilities = capabilities
        self._deadline: float | None = None  # the running turn's host-side wall deadline
        # Set once the turn is sent: a wall budget is extended only after (before, the
        # container has no turn whose deadline it could move).
        self.turn_sent = asyncio.Event()
        self._holds = 0  # capability requests waiting for an operator: not idle time
        self.limits = limits or ChannelLimits()
        self._on_stop = on_stop
        self._on_kill = on_kill
        # None marks the end of the container's output.
        self._events: asyncio.Queue[BrainEvent | _Violation | None] = asyncio.Queue()
        self._acks: dict[tuple[str, str], asyncio.Future[dict[str, Any]]] = {}
        self._write_lock = asyncio.Lock()
        self._memory_slots = asyncio.Semaphore(self.limits.max_memory_requests)
        self._memory_writes = 0
        self._memory_write_bytes = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._transcripts: dict[str, _Incoming] = {}  # transcripts being fetched, by session
        self._reader: asyncio.Task[None] | None = None
        self._eof = asyncio.Event()
        self._stopping: asyncio.Task[str] | None = None
        self._turn_started: float | None = None
        self._wall: float | None = None
        self._last_activity = 0.0
        self.escalation: str | None = None  # "stop-line" | "on_stop" | "on_kill" once stopped

    async def __aenter__(self) -> BrainChannel:
        self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def start(self) -> None:
        """Start reading the container's output."""
        if self._reader is None:
            self._last_activity = asyncio.get_running_loop().time()
            self._reader = asyncio.create_task(self._read_loop())

    @property
    def closed(self) -> bool:
        """True once the container's output reached end of stream."""
        return self._eof.is_set()

    @property
    def stopped(self) -> bool:
        """True once the container's side is being stopped, or its output ended."""
        return self._stopping is not None or self.closed

    async def send_credentials(self, lease: str, bundle: Mapping[str, Any]) -> None:
        """Deliver (or renew) a lease bundle ``{"files": {...}, "env": {...}}`` and wait
        until the entrypoint has written it. Raises SetupError when it could not."""
        msg = {"type": "credentials", "lease": lease, **_bundle(bundle)}
        ack = await self._request_ack("credentials-applied", lease, msg)
        if ack.get("error"):
            raise SetupError(f"lease {lease}: the container refused the bundle: {ack['error']}")

    async def revoke_credentials(self, lease: str) -> None:
        """Wipe a lease's files and env inside the container and wait for the ack."""
        msg = {"type": "revoke-credentials", "lease": lease}
        await self._request_ack("credentials-revoked", lease, msg)

    async def send_user_message(self, number: int, text: str) -> tuple[bool, str]:
        """Steering: ``text`` as the running turn's next user message. Returns whether the
        engine took it, and why not (an engine that takes no mid-run input says so)."""
        msg = {"type": "user-message", "lease": str(number), "text": text}
        try:
            ack = await self._request_ack("user-message-taken", str(number), msg)
        except SetupError:
            return False, "the brain did not answer"
        return bool(ack.get("taken")), str(ack.get("reason") or "")

    async def extend_wall(self, number: int, wall_seconds: float) -> tuple[bool, str]:
        """Move the running turn's wall budget to ``wall_seconds`` from its start, in the
        container (which enforces it) and here. Returns whether the container took it, and
        why not. Its answer is awaited until the turn's deadline here (10 s at least): on
        a busy machine the answer is late, and the turn ends at that deadline anyway."""
        msg = {"type": "budget", "lease": str(number), "wall_seconds": wall_seconds}
        wait = self.limits.ack_timeout_seconds
        if self._deadline is not None:
            wait = max(wait, self._deadline - asyncio.get_running_loop().time())
        try:
            ack = await self._request_ack("budget-extended", str(number), msg, timeout=wait)
        except SetupError:
            return False, f"the container did not answer within {wait:.0f}s"
        if not ack.get("taken"):
            return False, "the container had no turn running to extend"
        if self._deadline is not None and self._turn_started is not None:
            self._deadline = self._turn_started + wall_seconds + self.limits.wall_grace_seconds
            self._wall = wall_seconds
        return True, ""

    async def send_transcript(self, session_id: str, cwd: str, data: bytes) -> None:
        """Hand the container the CLI's transcript of ``session_id`` (run in ``cwd``), in
        chunks, and wait until the entrypoint has written it; TranscriptRefused when not."""
        *chunks, last = encoded_chunks(data, PUT_CHUNK_BYTES)
        base = {"type": "transcript-put", "lease": session_id, "cwd": cwd}
        try:
            for chunk in chunks:
                await self._send({**base, "data": chunk, "last": False})
            ack = await self._request_ack(
                "transcript-written",
                session_id,
                {**base, "data": last, "last": True},
                timeout=self.limits.transcript_seconds,
            )
        except (SetupError, StreamClosed, OSError) as exc:
            raise TranscriptRefused(f"the brain channel did not take it: {exc}") from None
        if ack.get("error") or ack.get("bytes") != len(data):
            raise TranscriptRefused(f"the container did not write it: {ack.get('error')}")

    async def fetch_transcript(self, session_id: str, cwd: str, max_bytes: int) -> bytes:
        """The CLI's transcript of ``session_id`` as the container has it after the turn,
        never more than ``max_bytes``; TranscriptRefused when it cannot be had."""
        incoming = self._transcripts[session_id] = _Incoming(max_bytes)
        msg = {
            "type": "transcript-get",
            "lease": session_id,
            "cwd": cwd,
            "max_bytes": max_bytes,
            "chunk_bytes": chunk_bytes_for(self.limits.max_line_bytes),
        }
        try:
            ack = await self._request_ack(
                "transcript-sent", session_id, msg, timeout=self.limits.transcript_seconds
            )
        except SetupError as exc:
            raise TranscriptRefused(f"the brain channel did not send it: {exc}") from None
        finally:
            self._transcripts.pop(session_id, None)
        if ack.get("error"):
            raise TranscriptRefused(str(ack["error"])[:500])
        if incoming.problem:
            raise TranscriptRefused(incoming.problem)
        data = b"".join(incoming.parts)
        if ack.get("bytes") != len(data):
            raise TranscriptRefused("the container sent another size than it said")
        return data

    async def run_turn(self, turn: Turn) -> AsyncIterator[BrainEvent]:
        """Send one turn and yield its events; the last is always done or error.

        A host-side violation (idle, wall budget, oversize or malformed line, the
        container vanishing) yields an ErrorEvent and then stops the container.
        """
        self.start()
        loop = asyncio.get_running_loop()
        wall = turn.budget.wall_seconds
        self._turn_started, self._wall = loop.time(), wall
        self._deadline = (
            None if wall is None else loop.time() + wall + self.limits.wall_grace_seconds
        )
        self._last_activity = loop.time()
        try:
            await self._send({"type": "turn", **turn.to_json()})
        except StreamClosed as exc:
            yield ErrorEvent(message=f"the brain channel is closed: {exc}", code="crash")
            await self.stop()
            return
        self.turn_sent.set()
        while True:
            now = loop.time()
            if self._holds:  # waiting for an operator is not the brain being idle
                self._last_activity = now
            deadline = self._deadline
            wait = min(self._last_activity + self.limits.idle_seconds - now, 1.0)
            if deadline is not None:
                wait = min(wait, deadline - now)
            try:
                # asyncio.timeout, not wait_for: on 3.11 wait_for drops a cancellation of
                # this task when the event arrives in the same pass (a Ctrl-C lost).
                async with asyncio.timeout(max(wait, 0.0)):
                    item = await self._events.get()
            except TimeoutError:
                now = loop.time()
                if deadline is not None and now >= deadline:
                    item = _Violation(
                        "timeout", f"the brain overran its {self._wall or 0:g}s wall budget"
                    )
                elif self._dispatching:
                    self._last_activity = now  # silent while its sub-agents work
                    continue
                elif now >= self._last_activity + self.limits.idle_seconds and not self._holds:
                    idle = self.limits.idle_seconds
                    item = _Violation("idle", f"the brain was silent for {idle:g}s")
                else:
                    continue
            if item is None:
                item = _Violation("crash", "the brain exited without finishing the turn")
            if isinstance(item, _Violation):
                yield ErrorEvent(message=item.message, code=item.code)
                await self.stop()
                return
            yield item
            if is_terminal(item):
                return

    async def stop(self) -> str:
        """Stop the container side, escalating stop line → on_stop() → on_kill().

        Returns the step that ended it. Idempotent: concurrent callers share one run.
        """
        if self._stopping is None:
            self._stopping = asyncio.create_task(self._escalate())
        return await asyncio.shield(self._stopping)

    async def _escalate(self) -> str:
        with contextlib.suppress(StreamClosed, OSError):
            await self._send({"type": "stop"})
        steps: list[tuple[str, Callback | None, float]] = [
            ("stop-line", None, self.limits.stop_grace_seconds),
            ("on_stop", self._on_stop, self.limits.kill_grace_seconds),
            ("on_kill", self._on_kill, self.limits.kill_grace_seconds),
        ]
        result = "unresponsive"
        for name, callback, grace in steps:
            if callback is not None:
                outcome = callback()
                if inspect.isawaitable(outcome):
                    await outcome
            if self._reader is None:
                result = name
                break
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(grace):
                    await self._eof.wait()
                result = name
                break
        self.escalation = result
        for task in list(self._tasks):
            task.cancel()
        await self.stream.close()
        if self._reader is not None:
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)
        return result

    async def _send(self, obj: dict[str, Any]) -> None:
        data = (json.dumps(obj, separators=(",", ":")) + "\n").encode()
        async with self._write_lock:
            await self.stream.write(data)

    async def _request_ack(
        self, kind: str, lease: str, msg: dict[str, Any], *, timeout: float | None = None
    ) -> dict[str, Any]:
        self.start()
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._acks[(kind, lease)] = future
        try:
            await self._send(msg)
            async with asyncio.timeout(timeout or self.limits.ack_timeout_seconds):
                return await future
        except (TimeoutError, StreamClosed) as exc:
            raise SetupError(f"lease {lease}: the brain channel did not confirm {kind}") from exc
        finally:
            self._acks.pop((kind, lease), None)

    async def _read_loop(self) -> None:
        buffer = bytearray()
        cap = self.limits.max_line_bytes
        loop = asyncio.get_running_loop()
        # After a violation keep draining (and dropping) output, so a container that is
        # blocked writing to a full pipe can still read our stop line and exit.
        violated = False
        try:
            while chunk := await self.stream.read():
                if violated:
                    continue
                buffer += chunk
                while not violated and (newline := buffer.find(b"\n")) >= 0:
                    line = bytes(buffer[:newline])
                    del buffer[: newline + 1]
                    self._last_activity = loop.time()
                    if len(line) > cap:
                        violated = self._violation("oversize", f"a brain line exceeded {cap} bytes")
                    else:
                        violated = not self._dispatch(line)
                if not violated and len(buffer) > cap:
                    violated = self._violation("oversize", f"a brain line exceeded {cap} bytes")
                if violated:
                    buffer.clear()
        finally:
            self._eof.set()
            self._events.put_nowait(None)

    def _violation(self, code: str, message: str) -> bool:
        self._events.put_nowait(_Violation(code, message))
        return True

    def _dispatch(self, line: bytes) -> bool:
        """Route one complete line; False when it broke the contract."""
        if not line.strip():
            return True
        try:
            obj = json.loads(line)
        except ValueError:
            return not self._violation("protocol", "a brain line is not JSON")
        kind = obj.get("type") if isinstance(obj, dict) else None
        if kind in _ACKS:
            future = self._acks.get((str(kind), str(obj.get("lease"))))
            if future is not None and not future.done():
                future.set_result(obj)
            return True
        if kind == "transcript-chunk":
            incoming = self._transcripts.get(str(obj.get("lease")))
            if incoming is not None:  # none asked for: dropped
                incoming.take(obj.get("data"))
            return True
        if kind == "memory-request":
            serve = self._serve_dispatch if obj.get("op") == "dispatch" else self._serve_memory
            task = asyncio.create_task(serve(obj))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            return True
        if kind in ("capability-request", "budget-request"):
            serving = self._serve_capability if kind == "capability-request" else self._serve_budget
            task = asyncio.create_task(serving(obj))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            return True
        try:
            self._events.put_nowait(event_from_json(obj))
        except EventShapeError as exc:
            return not self._violation("protocol", f"malformed brain event: {exc}")
        return True

    async def _serve_memory(self, req: dict[str, Any]) -> None:
        number = req.get("request")
        if not isinstance(number, int) or isinstance(number, bool):
            return
        async with self._memory_slots:
            try:
                reply = {"ok": True, "result": await self._memory_call(req)}
            except (_Refused, MemoryRefused) as exc:
                reply = {"ok": False, "error": str(exc)}
            except Exception as exc:  # a memory backend failure must not kill the channel
                reply = {"ok": False, "error": f"memory backend error: {type(exc).__name__}"}
        with contextlib.suppress(StreamClosed, OSError):
            await self._send({"type": "memory-result", "request": number, **reply})

    async def _serve_dispatch(self, req: dict[str, Any]) -> None:
        """A sub-agent for the brain: not in the memory slots (it runs for minutes); the
        answer is the child's result or why it was refused. Stopping the channel cancels
        this task, which stops the child (the dispatcher's job)."""
        number = req.get("request")
        if not isinstance(number, int) or isinstance(number, bool):
            return
        child = req.get("child")
        if self.dispatcher is None:
            reply = {"ok": False, "error": "this run cannot dispatch sub-agents"}
        elif not isinstance(child, dict):
            reply = {"ok": False, "error": "dispatch needs a child object"}
        else:
            self._dispatching += 1
            try:
                reply = {"ok": True, "result": await self.dispatcher.dispatch(child)}
            except Exception as exc:  # a dispatcher bug must not kill the channel
                reply = {"ok": False, "error": f"dispatch failed: {type(exc).__name__}: {exc}"}
            finally:
                self._dispatching -= 1
                self._last_activity = asyncio.get_running_loop().time()
        with contextlib.suppress(StreamClosed, OSError):
            await self._send({"type": "memory-result", "request": number, **reply})

    async def _serve_capability(self, req: dict[str, Any]) -> None:
        """One mid-run request: the host's CapabilityServer decides; the answer goes back."""
        kind, name, reason = (req.get(k) for k in ("kind", "name", "reason"))
        if not (isinstance(kind, str) and isinstance(name, str) and isinstance(reason, str)):
            await self._answer_host(
                req, "capability-result", "a request needs kind, name and reason strings"
            )
            return

        async def decide(server: CapabilityServer) -> dict[str, Any]:
            granted, message = await server.request(kind, name[:512], reason[:512])
            return {"granted": granted, "message": message}

        await self._answer_host(req, "capability-result", decide)

    async def _serve_budget(self, req: dict[str, Any]) -> None:
        """The brain ran out of its turn or dollar budget: the host decides (its own count,
        the ceilings, an operator); the answer goes back."""
        limit, turns, usd, reason = (req.get(k) for k in ("limit", "turns", "cost_usd", "reason"))
        if not (
            isinstance(limit, str)
            and isinstance(turns, int)
            and isinstance(usd, int | float)
            and isinstance(reason, str)
        ):
            await self._answer_host(
                req, "budget-result", "a budget request needs limit, turns, cost_usd"
            )
            return

        async def decide(server: CapabilityServer) -> dict[str, Any]:
            return await server.extend_budget(limit[:32], int(turns), float(usd), reason[:512])

        await self._answer_host(req, "budget-result", decide)

    async def _answer_host(
        self,
        req: dict[str, Any],
        result_type: str,
        decide: Callable[[CapabilityServer], Awaitable[dict[str, Any]]] | str,
    ) -> None:
        """Answer one numbered request the host's CapabilityServer decides (``decide``), or
        refuse it (``decide`` is why it is malformed, or the run takes no requests); the
        host's failure is a refusal, never a crash."""
        number = req.get("request")
        if not isinstance(number, int) or isinstance(number, bool):
            return
        if self.capabilities is None:
            reply: dict[str, Any] = {
                "granted": False,
                "message": "this run takes no mid-run requests",
            }
        elif isinstance(decide, str):
            reply = {"granted": False, "message": decide}
        else:
            self._holds += 1
            try:
                reply = await decide(self.capabilities)
            except Exception as exc:
                why = f"the host could not decide: {type(exc).__name__}: {exc}"
                reply = {"granted": False, "message": why}
            finally:
                self._holds -= 1
                self._last_activity = asyncio.get_running_loop().time()
        with contextlib.suppress(StreamClosed, OSError):
            await self._send({"type": result_type, "request": number, **reply})

    async def _memory_call(self, req: dict[str, Any]) -> Any:
        if self.memory is None:
            raise _Refused("this run has no memory")
        op, cap = req.get("op"), self.limits.max_memory_text
        if op == "recall":
            query, limit = req.get("query"), req.get("limit", 5)
            if not isinstance(query, str) or len(query) > cap:
                raise _Refused("recall needs a query string")
            if not isinstance(limit, int) or not 1 <= limit <= 50:
                raise _Refused("recall limit must be 1..50")
            return await self.memory.recall(query, limit)
        if op == "remember":
            text, tags = req.get("text"), req.get("tags", [])
            if not isinstance(text, str) or not text or len(text) > cap:
                raise _Refused(f"remember needs text of 1..{cap} characters")
            if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
                raise _Refused("remember tags must be a list of strings")
            tags = tags[:16]
            self._count_write(len(text.encode()) + sum(len(t.encode()) for t in tags))
            return await self.memory.remember(text, tags)
        if op == "get":
            memory_id = req.get("id")
            if not isinstance(memory_id, str) or not memory_id or len(memory_id) > 256:
                raise _Refused("get needs a memory id")
            return await self.memory.get(memory_id)
        if op == "explore":
            memory_id, limit = req.get("id"), req.get("limit", 10)
            if not isinstance(memory_id, str) or not memory_id or len(memory_id) > 256:
                raise _Refused("explore needs a memory id")
            if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= 50:
                raise _Refused("explore limit must be 1..50")
            return await self.memory.explore(memory_id, limit)
        if op == "link":
            source, target, kind = req.get("source"), req.get("target"), req.get("edge_type")
            for value in (source, target):
                if not isinstance(value, str) or not value or len(value) > 256:
                    raise _Refused("link needs a source and a target memory id")
            if not isinstance(kind, str) or len(kind) > 64:
                raise _Refused("link needs an edge type")
            self._count_write(len(str(source)) + len(str(target)) + len(kind))
            return await self.memory.link(str(source), str(target), kind)
        raise _Refused(f"unknown memory op {op!r}")

    def _count_write(self, size: int) -> None:
        """Count one memory write against the run's limits, or refuse it."""
        limits = self.limits
        if (
            self._memory_writes + 1 > limits.max_memory_writes
            or self._memory_write_bytes + size > limits.max_memory_write_bytes
        ):
            raise _Refused(
                f"this run has stored what it may in memory ({limits.max_memory_writes}"
                f" writes, {limits.max_memory_write_bytes // 1024} KiB)"
            )
        self._memory_writes += 1
        self._memory_write_bytes += size


class _Refused(Exception):
    pass


class _Incoming:
    """One transcript arriving in chunks: kept up to ``most`` bytes, then refused whole."""

    def __init__(self, most: int) -> None:
        self.most = most
        self.parts: list[bytes] = []
        self.size = 0
        self.problem: str | None = None

    def take(self, chunk: object) -> None:
        if self.problem is not None:
            return
        try:
            data = decoded(chunk)
        except TranscriptError as exc:
            self.problem, self.parts = str(exc), []
            return
        self.size += len(data)
        if self.size > self.most:
            self.problem, self.parts = f"the transcript is larger than {self.most} bytes", []
            return
        self.parts.append(data)


def _bundle(bundle: Mapping[str, Any]) -> dict[str, Any]:
    files, env = bundle.get("files") or {}, bundle.get("env") or {}
    return {
        "files": {str(k): str(v) for k, v in dict(files).items()},
        "env": {str(k): str(v) for k, v in dict(env).items()},
    }
