"""After a run: remember everything about it (its outcome was decided before).

Memory gets the cost and, for failures, the failure (a later success of the same task
kind is linked to it as its fix). Whatever carries text the agent controls — the brain's
error text, verify output tails — is stored ``untrusted``; only an operator raises it
(``kagura-agent memory trust``); graduation gets evidence from the verify exit codes
only; the state store keeps the plan as the last applied one for the next diff.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from kagura_agent.apply.records.live import LiveView
from kagura_agent.apply.records.progress import (
    FailuresLinked,
    GraduationDemoted,
    GraduationNoEvidence,
    OutputMemory,
    RunFinished,
    TokensOverBudget,
)
from kagura_agent.apply.run.context import RunContext, RunResult
from kagura_agent.clock import iso
from kagura_agent.graduation.ledger import record_outcome as graduation_evidence
from kagura_agent.memory.factory import open_memory
from kagura_agent.memory.model import MemoryStore, Trust
from kagura_agent.patterns.checkpoint import clear_checkpoint, finish_spending
from kagura_agent.patterns.cost_history import RunCost, record_run
from kagura_agent.patterns.dispatch import record_output
from kagura_agent.patterns.failure_learning import record_failure, record_success, run_shape
from kagura_agent.plan.history import record_applied
from kagura_agent.plan.model import Plan


def record_result(ctx: RunContext, result: RunResult) -> str | None:
    """Store ``result`` (its outcome already decided); the child output memory's id, if any."""
    store, plan, run_id, clock, live = ctx.store, ctx.plan, ctx.run_id, ctx.clock, ctx.live
    # What the brain said (its answer, its error) is stored in memory, which outlives the
    # run's leases: none of the run's secrets goes with it.
    result = dataclasses.replace(
        result,
        answer=live.redactor.scrub(result.answer) if result.answer else result.answer,
        brain_error=live.redactor.scrub(result.brain_error) if result.brain_error else None,
    )
    success = result.success
    task_kind = plan["task"]["kind"]
    # A dispatched child's task — its name, prompt, steps and verify commands — is its
    # parent agent's writing: whatever its run records stays the agent's (untrusted), and
    # its success proves nothing (``verify: [true]`` passes), so it earns no evidence.
    agents = bool(plan["task"].get("parent"))
    trust: Trust = "untrusted" if agents else "trusted"
    # Graduation evidence goes first, so no later failure (a memory backend down, say) can
    # skip it. It comes only from the host-side verify exit codes; a brain error counts
    # against the run (fail closed), a brain's claim of success counts for nothing.
    evidence = [(c, code) for c, code, _ in result.verify]
    stopped = ("tripwire:", "disk:", "aftercare:")
    if result.brain_error is not None and result.brain_error.startswith(stopped):
        # The host stopped or failed the run (a tripwire, the disk budget, a root the
        # aftercare could not check): that, not the verify, is the reason.
        evidence.insert(0, (f"host stopped the run ({result.brain_error})"[:300], 1))
    elif result.brain_error is not None:
        evidence.append(("brain finished without error", 1))
    categories = [a["category"] for a in plan["approvals"] if a["class"] != "baseline"]
    if categories and agents and success:
        live.emit(GraduationNoEvidence())
    elif categories:
        recorded = graduation_evidence(
            store, categories, run_id, plan["task"]["name"], plan["intent"], evidence, clock
        )
        for category in recorded.demoted:
            # Say why: a run that "succeeded" but had no verify commands still counts here.
            live.emit(GraduationDemoted(category, recorded.reason))
    output_memory = None
    memory = open_memory(plan["memory"], clock=clock)
    try:
        record_run(
            memory,
            RunCost(
                run_id=run_id,
                task_kind=task_kind,
                turns=result.turns,
                wall_seconds=result.wall_seconds,
                cost_usd=result.cost_usd,
                retries=result.retries,
                outcome="success" if success else "failure",
                input_tokens=result.input_tokens,
                output_tokens=result.output_tokens,
                model_calls=result.model_calls,
                budget=_limits(plan),
            ),
            trust=trust,
        )
        _note_overruns(plan, result, live)
        if success:
            fixed = record_success(
                memory,
                run_id=run_id,
                task_kind=task_kind,
                summary=f"{plan['task']['name']} succeeded",
                details={"verify": [c for c, _, _ in result.verify]},
                run=_run_shape(plan),
                trust=trust,
            )
            if fixed.fix is not None:
                live.emit(FailuresLinked(len(fixed.prevents), fixed.fix.summary))
            if fixed.unchanged:
                live.emit(FailuresLinked(0, open=len(fixed.unchanged)))
        else:
            # The brain's error text is the agent's own words: untrusted. A verify failure
            # is the task's command and the host's exit code: trusted, unless the agent
            # wrote the task.
            record_failure(
                memory,
                run_id=run_id,
                task_kind=task_kind,
                summary=_failure_summary(result),
                details={"verify": [[c, code] for c, code, _ in result.verify]},
                trust="untrusted" if result.brain_error else trust,
                run=_run_shape(plan),
            )
        if plan["task"].get("parent"):
            output_memory = _record_child_output(memory, plan, run_id, result)
    finally:
        close = getattr(memory, "close", None)
        if close is not None:
            close()
    session = plan["task"]["session"]
    if success and session:
        # The session's work is done: nothing of its budget stays spent. The script brain
        # has nothing to continue; another engine keeps its brain conversation.
        if plan["brain"]["engine"] == "script":
            clear_checkpoint(store, session)
        else:
            finish_spending(store, session, clock=clock)
    record_applied(store, plan, iso(clock.now()))
    live.emit(RunFinished(run_id, success, result.wall_seconds, result.cost_usd))
    if output_memory:
        live.emit(OutputMemory(output_memory))
    return output_memory


def _limits(plan: Plan) -> dict[str, float | None]:
    """The limits the run was held to: the next learnt budget grows from these."""
    budget = plan["budget"]
    return {
        "turns": budget["turns"],
        "tokens": budget["tokens"],
        "wall_seconds": budget["wall_seconds"],
        "cost_usd": budget["cost_usd"],
    }


def _note_overruns(plan: Plan, result: RunResult, live: LiveView) -> None:
    """A learnt token limit no engine enforces: say when the run went past it."""
    limit = plan["budget"]["tokens"]
    used = (result.input_tokens or 0) + (result.output_tokens or 0)
    if limit and used > limit:
        live.emit(TokensOverBudget(used, limit))


def _record_child_output(memory: MemoryStore, plan: Plan, run_id: str, result: RunResult) -> str:
    """A dispatched child's result, citing the context memories its parent handed over."""
    success = result.success
    outcome = "succeeded" if success else "failed"
    output = record_output(
        memory,
        child_run=run_id,
        parent=plan["task"]["parent"],
        summary=f"{plan['task']['name']} {outcome}: " + _what_ran(plan),
        details={
            "outcome": "success" if success else "failure",
            "verify": [[c, code, out[-500:]] for c, code, out in result.verify],
            **({"answer": result.answer} if result.answer else {}),
        },
    )
    return str(output.id)


def _run_shape(plan: Plan) -> dict[str, Any]:
    """What failure learning compares between a failed run and a later success."""
    granted = [a["category"] for a in plan["approvals"] if a["class"] != "denied"]
    return run_shape(plan["task"]["steps"], plan["task"]["prompt"], granted)


def _what_ran(plan: Plan) -> str:
    steps = plan["task"]["steps"]
    if steps:
        return "; ".join(steps)[:300]
    return (plan["task"]["prompt"] or "")[:300]


def _failure_summary(result: RunResult) -> str:
    if result.brain_error:
        return f"brain error {result.brain_error}"[:300]
    failed = [(c, code) for c, code, _ in result.verify if code != 0]
    if failed:
        command, code = failed[0]
        return f"verify {command!r} exited {code}"[:300]
    return "run failed"
