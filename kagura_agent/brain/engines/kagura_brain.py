"""The kagura-brain engine: one headless ``claude -p`` or ``codex exec`` per turn.

kagura-brain is blocking and one-shot (``BrainHandle.invoke`` returns a BrainResult
with the CLI's stdout once it exits), so it runs in a worker thread under the budget's
timeout. It reports no tool calls or cost of its own: we surface the CLI invocation as
one tool call, its output as text, and a cost of one turn with unknown dollars.

kagura-brain builds the child environment from this process's environment (it scrubs
provider credentials so subscription logins win); inside the container that is the
entrypoint's environment, which carries the leased credentials' env.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path

from kagura_agent.brain.engines.loading import load
from kagura_agent.brain.events import (
    MAX_TEXT_CHARS,
    BrainEvent,
    CostEvent,
    DoneEvent,
    ErrorEvent,
    TextEvent,
    ToolCallEvent,
    ToolResultEvent,
)
from kagura_agent.brain.protocol import Turn, tool_servers_refusal

BACKENDS = ("claude", "codex")
DEFAULT_TIMEOUT_SECONDS = 1800
# Extra wait past kagura-brain's own subprocess timeout before we give up on the thread.
_THREAD_GRACE_SECONDS = 5.0


class KaguraBrain:
    """Runs a prompt through ``kagura_brain.select(backend).invoke``."""

    name = "kagura-brain"

    async def run(self, turn: Turn) -> AsyncIterator[BrainEvent]:
        """Invoke the selected CLI once; yield its call, output, cost and outcome."""
        if refused := tool_servers_refusal(self.name, turn):
            yield ErrorEvent(message=refused, code="setup")
            return
        await load("kagura_brain")
        import kagura_brain

        options = turn.engine_options
        backend = options.get("backend") or "claude"
        local_provider = options.get("local_provider")
        endpoint = options.get("endpoint")
        key_env = kagura_brain.BRAIN_API_KEY_ENV
        api_key = (turn.env.get(key_env) or os.environ.get(key_env)) if endpoint else None
        timeout = int(turn.budget.wall_seconds or DEFAULT_TIMEOUT_SECONDS)
        call_id = "kagura-brain-1"
        yield ToolCallEvent(
            id=call_id,
            name=f"{backend} CLI",
            input={"backend": backend, "model": turn.model, "local_provider": local_provider},
        )
        try:
            handle = kagura_brain.select(backend, endpoint=endpoint, api_key=api_key)
            async with asyncio.timeout(timeout + _THREAD_GRACE_SECONDS):
                result = await asyncio.to_thread(
                    handle.invoke,
                    turn.full_prompt(),
                    cwd=Path(turn.cwd) if turn.cwd else None,
                    timeout=timeout,
                    permission_mode=turn.permission_mode,
                    local_provider=local_provider,
                    model=turn.model,
                )
        except ValueError as exc:  # kagura-brain's own argument validation
            yield ToolResultEvent(id=call_id, output=str(exc), is_error=True)
            yield ErrorEvent(message=f"kagura-brain refused the turn: {exc}", code="setup")
            return
        except OSError as exc:  # the CLI is missing or cwd does not exist
            yield ToolResultEvent(id=call_id, output=str(exc), is_error=True)
            yield ErrorEvent(message=f"cannot start the {backend} CLI: {exc}", code="setup")
            return
        except TimeoutError:
            yield ErrorEvent(message=f"{backend} CLI did not return in {timeout}s", code="timeout")
            return
        output = (result.stdout or result.stderr)[-MAX_TEXT_CHARS:]
        yield ToolResultEvent(
            id=call_id, output=output, is_error=not result.ok, exit_code=result.returncode
        )
        if result.stdout.strip():
            yield TextEvent(text=result.stdout.strip()[-MAX_TEXT_CHARS:])
        yield CostEvent(usd=None, turns=1)
        if result.timed_out:
            yield ErrorEvent(message=f"{backend} CLI timed out after {timeout}s", code="timeout")
        elif not result.ok:
            detail = result.detail()[-2000:]
            yield ErrorEvent(message=f"{backend} CLI exited {result.returncode}: {detail}")
        else:
            yield DoneEvent(result=result.stdout.strip()[-MAX_TEXT_CHARS:] or None)
