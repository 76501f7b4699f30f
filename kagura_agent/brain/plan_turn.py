"""Build the brain's Turn from a launch plan (docs/plan-format.md) — data only, no I/O."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kagura_agent.brain.protocol import Budget, Turn, TurnContext
from kagura_agent.ui import quote


def known_failures_text(
    failures: list[Mapping[str, Any]], *, include_untrusted: bool = False
) -> str:
    """The plan's memory.known_failures as quoted, labelled data the model can read.

    Each text is a JSON string literal (quotes, newlines and control characters escaped,
    so it cannot end its line or pose as an instruction) after its trust tier. Untrusted
    failures (an earlier agent's own words) are left out unless the task opted into
    untrusted memory (``context.include_untrusted``, which makes the run untrusted).
    """
    lines = []
    for item in failures:
        tier = "trusted" if item.get("trust") == "trusted" else "untrusted"
        if tier == "untrusted" and not include_untrusted:
            continue
        line = f"- [{tier}] failure: {quote(str(item.get('failure', '')))}"
        fix = item.get("fix")
        if fix:
            line += f"; fix [trusted]: {quote(str(fix))}"
        lines.append(line)
    return "\n".join(lines)


def turn_from_plan(
    plan: Mapping[str, Any],
    *,
    session_id: str | None = None,
    completed_steps: int = 0,
    prompt: str | None = None,
) -> Turn:
    """The Turn ``apply`` sends for ``plan``.

    The working directory is the container workdir, or the project root when the plan
    says ``runtime: host``. ``prompt`` overrides the task's prompt (a repl follow-up);
    ``session_id``/``completed_steps`` resume an engine session or script checkpoint.
    """
    task, brain = plan["task"], plan["brain"]
    memory = plan.get("memory") or {}
    budget = plan.get("budget") or {}
    on_host = brain.get("runtime") == "host"
    steps = task.get("steps")
    use_prompt = prompt if prompt is not None else task.get("prompt")
    parent = task.get("parent") or {}
    # The parent's handoff first, then the task's own context; each id once.
    memory_ids = dict.fromkeys(
        [
            *(parent.get("context_memories") or ()),
            *((task.get("context") or {}).get("memories") or ()),
        ]
    )
    return Turn(
        engine=brain.get("engine", "script"),
        prompt=None if steps is not None and prompt is None else (use_prompt or ""),
        steps=None if steps is None or prompt is not None else tuple(_step(s) for s in steps),
        context=TurnContext(
            known_failures=known_failures_text(
                memory.get("known_failures") or [],
                include_untrusted=bool((task.get("context") or {}).get("include_untrusted")),
            ),
            memory_ids=tuple(memory_ids),
        ),
        budget=Budget(
            turns=budget.get("turns"),
            wall_seconds=budget.get("wall_seconds"),
            cost_usd=budget.get("cost_usd"),
        ),
        session_id=session_id,
        completed_steps=completed_steps,
        permission_mode=brain.get("permission_mode"),
        model=brain.get("model"),
        cwd=task["project_root"] if on_host else plan["hardening"].get("workdir", "/workspace"),
        engine_options={
            key: brain.get(key) for key in ("backend", "local_provider", "endpoint", "cli_path")
        },
    )


def _step(step: object) -> str | tuple[str, ...]:
    if isinstance(step, str):
        return step
    if isinstance(step, list | tuple):
        return tuple(str(part) for part in step)
    raise ValueError(f"plan step {step!r} is neither a string nor an argv list")
