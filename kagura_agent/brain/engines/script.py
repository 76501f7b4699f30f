"""The script engine: deterministic steps, no LLM. Works offline; most tests use it.

Each step is a shell command (``bash -c``) or an argv list, run in the turn's cwd with
the tool environment; its output streams as tool_output events, line by line, while it
runs. The engine stops at the first failing step, and checkpoints after each step so a
resumed session (``completed_steps``) skips what already ran.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass

from kagura_agent.brain.events import (
    MAX_TEXT_CHARS,
    BrainEvent,
    CheckpointEvent,
    CostEvent,
    DoneEvent,
    ErrorEvent,
    TextEvent,
    ToolCallEvent,
    ToolOutputEvent,
    ToolResultEvent,
)
from kagura_agent.brain.protocol import Step, Turn, tool_servers_refusal

# A step's output shown live, at most this much (the result keeps the tail in any case).
STREAM_CHARS = MAX_TEXT_CHARS
STREAM_STOPPED = "[… the rest of this step's output comes with its result]\n"


def tool_env(extra: Mapping[str, str]) -> dict[str, str]:
    """The process environment with the turn's tool env layered on top."""
    return {**os.environ, **extra}


def _argv(step: Step) -> list[str]:
    return ["bash", "-c", step] if isinstance(step, str) else list(step)


def _cap(text: str, truncated: bool) -> str:
    if len(text) <= MAX_TEXT_CHARS and not truncated:
        return text
    # Keep the tail: the end of a failing command's output is where the error is.
    return "[… truncated …]\n" + text[-MAX_TEXT_CHARS:]


class ScriptBrain:
    """Runs ``turn.steps`` one after another."""

    name = "script"

    def __init__(self, *, default_env: Mapping[str, str] | None = None) -> None:
        self._default_env = dict(default_env or {})

    async def run(self, turn: Turn) -> AsyncIterator[BrainEvent]:
        """Run the steps; yield tool_call/tool_result/checkpoint per step, then done."""
        if refused := tool_servers_refusal(self.name, turn):
            yield ErrorEvent(message=refused, code="setup")
            return
        steps = list(turn.steps or ())
        session = turn.session_id or f"script-{uuid.uuid4().hex[:12]}"
        env = tool_env({**self._default_env, **turn.env})
        start = min(turn.completed_steps, len(steps))
        if start:
            yield TextEvent(text=f"resuming session {session}: skipping {start} done step(s)")
        for index in range(start, len(steps)):
            argv = _argv(steps[index])
            call_id = f"step-{index + 1}"
            yield ToolCallEvent(id=call_id, name="bash", input={"argv": argv})
            finished: _Finished | None = None
            try:
                async for item in _run_step(argv, turn.cwd, env):
                    if isinstance(item, _Finished):
                        finished = item
                    else:  # the step's output as it comes, line by line
                        yield ToolOutputEvent(id=call_id, text=item)
            except OSError as exc:
                yield ToolResultEvent(id=call_id, output=str(exc), is_error=True, exit_code=127)
                yield ErrorEvent(message=f"step {index + 1} could not start: {exc}", code="setup")
                return
            assert finished is not None
            code = finished.code
            yield ToolResultEvent(
                id=call_id,
                output=_cap(finished.output, finished.truncated),
                is_error=code != 0,
                exit_code=code,
            )
            if code != 0:
                yield CostEvent(usd=0.0, turns=index + 1 - start)
                yield ErrorEvent(
                    message=f"step {index + 1} failed with exit code {code}", code="step-failed"
                )
                return
            yield CheckpointEvent(
                step=index + 1, pending=len(steps) - index - 1, session_id=session
            )
        yield CostEvent(usd=0.0, turns=len(steps) - start)
        yield DoneEvent(result=f"{len(steps) - start} step(s) completed", session_id=session)


@dataclass(frozen=True)
class _Finished:
    """A step's end: its exit code and the tail of its output."""

    code: int
    output: str
    truncated: bool


async def _run_step(
    argv: list[str], cwd: str | None, env: dict[str, str]
) -> AsyncIterator[str | _Finished]:
    """Run one step in its own process group: yield its output's whole lines as they
    come (at most STREAM_CHARS of them, then a word that the rest comes with the
    result), then its _Finished (exit code, output tail)."""
    proc = await asyncio.create_subprocess_exec(
        *argv,
        cwd=cwd,
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        # Own session: on cancel we kill the whole group, not just the shell, so no
        # grandchild survives a budget overrun or a stop.
        start_new_session=True,
    )
    assert proc.stdout is not None
    tail = bytearray()
    truncated = False
    pending = bytearray()  # streamed output not yet ending in a newline
    streamed = 0
    try:
        # Read incrementally and keep only the tail, so a step that floods its output
        # cannot grow this process's memory without bound.
        while chunk := await proc.stdout.read(65536):
            tail += chunk
            if len(tail) > 2 * MAX_TEXT_CHARS:
                del tail[: len(tail) - MAX_TEXT_CHARS]
                truncated = True
            if streamed >= STREAM_CHARS:
                continue
            pending += chunk
            cut = pending.rfind(b"\n")
            if cut >= 0:
                lines = bytes(pending[: cut + 1])
                del pending[: cut + 1]
                text = lines.decode(errors="replace")[: STREAM_CHARS - streamed]
                streamed += len(text)
                yield text if streamed < STREAM_CHARS else text + STREAM_STOPPED
        if pending and streamed < STREAM_CHARS:
            yield bytes(pending).decode(errors="replace")[: STREAM_CHARS - streamed] + "\n"
        code = await proc.wait()
    finally:
        if proc.returncode is None:  # cancelled, or the consumer stopped reading
            _kill_group(proc.pid)
            await proc.wait()
    yield _Finished(code, tail.decode(errors="replace"), truncated)


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
