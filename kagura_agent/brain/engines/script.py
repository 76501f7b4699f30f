"""The script engine: deterministic steps, no LLM. Works offline; most tests use it.

Each step is a shell command (``bash -c``) or an argv list, run in the turn's cwd with
the tool environment. The engine stops at the first failing step, and checkpoints after
each step so a resumed session (``completed_steps``) skips what already ran.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import uuid
from collections.abc import AsyncIterator, Mapping

from kagura_agent.brain.events import (
    MAX_TEXT_CHARS,
    BrainEvent,
    CheckpointEvent,
    CostEvent,
    DoneEvent,
    ErrorEvent,
    TextEvent,
    ToolCallEvent,
    ToolResultEvent,
)
from kagura_agent.brain.protocol import Step, Turn, tool_servers_refusal


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
            try:
                code, output, truncated = await _run_step(argv, turn.cwd, env)
            except OSError as exc:
                yield ToolResultEvent(id=call_id, output=str(exc), is_error=True, exit_code=127)
                yield ErrorEvent(message=f"step {index + 1} could not start: {exc}", code="setup")
                return
            yield ToolResultEvent(
                id=call_id, output=_cap(output, truncated), is_error=code != 0, exit_code=code
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


async def _run_step(argv: list[str], cwd: str | None, env: dict[str, str]) -> tuple[int, str, bool]:
    """Run one step in its own process group; return (exit code, output tail, truncated)."""
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
    try:
        # Read incrementally and keep only the tail, so a step that floods its output
        # cannot grow this process's memory without bound.
        while chunk := await proc.stdout.read(65536):
            tail += chunk
            if len(tail) > 2 * MAX_TEXT_CHARS:
                del tail[: len(tail) - MAX_TEXT_CHARS]
                truncated = True
        code = await proc.wait()
    except asyncio.CancelledError:
        _kill_group(proc.pid)
        await proc.wait()
        raise
    return code, tail.decode(errors="replace"), truncated


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
