"""Build the brain's Turn from a launch plan (docs/plan-format.md) — data only, no I/O."""

from __future__ import annotations

from collections.abc import Sequence

from kagura_agent.brain.protocol import Budget, Turn, TurnContext
from kagura_agent.plan.model import KnownFailure, Plan
from kagura_agent.ui import quote


def known_failures_text(
    failures: Sequence[KnownFailure], *, include_untrusted: bool = False
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
        line = f"- [{tier}] failure: {quote(item['failure'])}"
        fix = item["fix"]
        if fix:
            line += f"; fix [trusted]: {quote(str(fix))}"
        lines.append(line)
    return "\n".join(lines)


def turn_from_plan(
    plan: Plan,
    *,
    session_id: str | None = None,
    completed_steps: int = 0,
) -> Turn:
    """The Turn ``apply`` sends for ``plan``.

    The working directory is the container workdir, or the project root when the plan
    says ``runtime: host``. ``session_id``/``completed_steps`` resume an engine session or
    script checkpoint. (A follow-up prompt within one run, for steering from the cockpit,
    would be a new Turn field; the repl instead runs each line as its own task of the same
    brain session.)
    """
    task, brain, budget = plan["task"], plan["brain"], plan["budget"]
    steps = task["steps"]
    parent = task.get("parent")  # only a dispatched child has one
    # The parent's handoff first, then the task's own context; each id once.
    memory_ids = dict.fromkeys(
        [*(parent["context_memories"] if parent else ()), *task["context"]["memories"]]
    )
    return Turn(
        engine=brain["engine"],
        prompt=None if steps is not None else (task["prompt"] or ""),
        steps=None if steps is None else tuple(_step(s) for s in steps),
        context=TurnContext(
            known_failures=known_failures_text(
                plan["memory"]["known_failures"],
                include_untrusted=task["context"]["include_untrusted"],
            ),
            memory_ids=tuple(memory_ids),
        ),
        budget=Budget(
            turns=budget["turns"],
            wall_seconds=budget["wall_seconds"],
            cost_usd=budget["cost_usd"],
        ),
        session_id=session_id,
        completed_steps=completed_steps,
        permission_mode=brain["permission_mode"],
        model=brain["model"],
        cwd=task["project_root"] if brain["runtime"] == "host" else plan["hardening"]["workdir"],
        # The claude CLI's path is the host's or the image's business (KAGURA_CLAUDE_CLI),
        # never the plan's: the planner writes no cli_path.
        engine_options={
            "backend": brain["backend"],
            "local_provider": brain["local_provider"],
            "endpoint": brain["endpoint"],
        },
        tool_servers={
            server["name"]: (
                {"transport": "stdio", "command": server["command"], "env": server["env"]}
                if server["transport"] == "stdio"
                else {"transport": "http", "url": server["url"]}
            )
            for server in plan.get("tool_servers", [])
        },
    )


def _step(step: object) -> str | tuple[str, ...]:
    if isinstance(step, str):
        return step
    if isinstance(step, list | tuple):
        return tuple(str(part) for part in step)
    raise ValueError(f"plan step {step!r} is neither a string nor an argv list")
