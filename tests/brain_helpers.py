"""Shared helpers for the brain tests: an entrypoint subprocess attached by a channel."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from kagura_agent.brain.channel import BrainChannel, ChannelLimits, Dispatcher, MemoryServer
from kagura_agent.brain.events import BrainEvent
from kagura_agent.brain.protocol import Turn
from kagura_agent.brain.streams import ProcessStream


class DictMemory:
    """A MemoryServer over a dict, recording every call (tests only)."""

    def __init__(self) -> None:
        self.items: dict[str, dict[str, Any]] = {}
        self.calls: list[tuple[str, object]] = []

    async def recall(self, query: str, limit: int) -> list[dict[str, Any]]:
        self.calls.append(("recall", query))
        hits = [m for m in self.items.values() if query in m["text"]]
        return hits[:limit]

    async def remember(self, text: str, tags: list[str]) -> str:
        self.calls.append(("remember", text))
        memory_id = f"mem-{len(self.items) + 1}"
        self.items[memory_id] = {"id": memory_id, "text": text, "tags": tags}
        return memory_id

    async def get(self, memory_id: str) -> dict[str, Any] | None:
        self.calls.append(("get", memory_id))
        return self.items.get(memory_id)


class Recorder:
    """on_stop / on_kill callbacks that signal a local process and record the order."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.calls: list[str] = []

    def on_stop(self) -> None:
        self.calls.append("on_stop")
        if self.proc.returncode is None:
            self.proc.terminate()

    def on_kill(self) -> None:
        self.calls.append("on_kill")
        if self.proc.returncode is None:
            self.proc.kill()


@asynccontextmanager
async def attached(
    argv: list[str] | None = None,
    *,
    env: dict[str, str] | None = None,
    memory: MemoryServer | None = None,
    limits: ChannelLimits | None = None,
    dispatcher: Dispatcher | None = None,
) -> AsyncIterator[tuple[BrainChannel, Recorder]]:
    """Run ``argv`` (default: the entrypoint) and attach a channel to its pipes."""
    proc = await asyncio.create_subprocess_exec(
        *(argv or [sys.executable, "-m", "kagura_agent.brain.entrypoint"]),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        env={**os.environ, **(env or {})},
    )
    recorder = Recorder(proc)
    channel = BrainChannel(
        ProcessStream(proc),
        memory=memory,
        limits=limits,
        on_stop=recorder.on_stop,
        on_kill=recorder.on_kill,
        dispatcher=dispatcher,
    )
    try:
        async with channel:
            yield channel, recorder
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()


async def collect(channel: BrainChannel, turn: Turn) -> list[BrainEvent]:
    """Every event of one turn."""
    return [event async for event in channel.run_turn(turn)]


def mode(path: Path) -> int:
    return path.stat().st_mode & 0o777
