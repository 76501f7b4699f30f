"""Failure learning: a failed run becomes a memory that keeps what the run was (its
steps, its instruction, the capabilities it was granted). A later success of the same
kind of task is linked as its fix (``fix -prevents-> failure``) only when it differs
from the failed run in one of those recorded ways; the difference is kept on the
``prevents`` edge (and in the fix's details), so the plan can say what changed. A success
that ran exactly what failed (a flaky pass) fixes nothing: the failure stays open.

Planning a similar task recalls both as "known failure modes", with when each last
happened. ``failure_trust`` weighs recent failures more than old ones:

    weight(failure) = 0.5 ** (age / half_life)
    trust = successes / (successes + sum(weight(f) for every failure))

``successes`` counts the verified successes among the task kind's recent runs (the cost
history), ``half_life`` is the Graduation knob ``failure_half_life`` (default 7d). A
failure yesterday weighs ~0.9; a month-old one ~0.05. No runs at all: trust is None.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from kagura_agent.clock import iso
from kagura_agent.memory.model import Edge, Memory, MemoryStore, Source, Trust

FAILURE = "failure"
FIX = "fix"
DEFAULT_HALF_LIFE_SECONDS = 7 * 86400


@dataclass(frozen=True)
class FixResult:
    """What ``record_success`` stored: the fix memory (None when nothing was linked),
    its edges, and the open failures it could not link (nothing recorded differed)."""

    fix: Memory | None
    prevents: list[Edge] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)


def run_shape(
    steps: Sequence[str] | None, instruction: str | None, capabilities: Sequence[str]
) -> dict[str, Any]:
    """What a run was, as failure learning compares runs: its steps, its instruction
    (the prompt) and the capability categories it was granted."""
    return {
        "steps": [str(s) for s in steps or []],
        "instruction": instruction or "",
        "capabilities": sorted(set(capabilities)),
    }


def differences(failed: Mapping[str, Any], fixed: Mapping[str, Any]) -> list[dict[str, str]]:
    """How ``fixed`` differs from ``failed``: ``[{change, op, value}]``, change one of
    ``step``, ``instruction``, ``capability``; op ``+``, ``-`` or ``~``. Empty: the same."""
    found: list[dict[str, str]] = []
    before, after = list(failed.get("steps") or []), list(fixed.get("steps") or [])
    found += [{"change": "step", "op": "+", "value": s} for s in after if s not in before]
    found += [{"change": "step", "op": "-", "value": s} for s in before if s not in after]
    if not found and before != after:
        found.append({"change": "step", "op": "~", "value": "the same steps, reordered"})
    if (failed.get("instruction") or "") != (fixed.get("instruction") or ""):
        found.append({"change": "instruction", "op": "~", "value": str(fixed["instruction"])[:300]})
    had, has = set(failed.get("capabilities") or []), set(fixed.get("capabilities") or [])
    found += [{"change": "capability", "op": "+", "value": c} for c in sorted(has - had)]
    found += [{"change": "capability", "op": "-", "value": c} for c in sorted(had - has)]
    return found


def describe(changes: Sequence[Mapping[str, str]]) -> str:
    """``+ step 'apt-get install libssl-dev'; + capability egress:pypi`` (for people)."""
    words = []
    for change in changes:
        if change["change"] == "instruction":
            words.append(f"new instruction {change['value'][:80]!r}")
        else:
            words.append(f"{change['op']} {change['change']} {change['value'][:80]!r}")
    return "; ".join(words)


def record_failure(
    store: MemoryStore,
    *,
    run_id: str,
    task_kind: str,
    summary: str,
    details: Mapping[str, Any] | None = None,
    trust: Trust = "untrusted",
    run: Mapping[str, Any] | None = None,
) -> Memory:
    """Remember a failed run (``run``: its ``run_shape``). Untrusted unless the caller
    knows every word of ``summary`` and ``details`` came from outside the agent (a verify
    command and its exit code)."""
    return store.remember(
        type=FAILURE,
        summary=summary,
        source=Source("run", run_id),
        details={**(details or {}), **({"run": dict(run)} if run is not None else {})},
        task_kind=task_kind,
        trust=trust,
    )


def open_failures(store: MemoryStore, task_kind: str, *, k: int = 50) -> list[Memory]:
    """Failures of this task kind (either tier) that no fix prevents yet."""
    failures = store.recall(type=FAILURE, task_kind=task_kind, k=k, include_untrusted=True)
    return [f for f in failures if not store.edges(f.id, type="prevents", direction="in")]


def record_success(
    store: MemoryStore,
    *,
    run_id: str,
    task_kind: str,
    summary: str,
    details: Mapping[str, Any] | None = None,
    run: Mapping[str, Any] | None = None,
    trust: Trust = "trusted",
) -> FixResult:
    """After a successful run (``run``: its ``run_shape``): link it as the fix of each
    open failure it differs from in a recorded way, keeping the difference on the edge.
    An ``untrusted`` fix (a run whose task the agent wrote) is never shown as a fix."""
    linkable: list[tuple[Memory, list[dict[str, str]]]] = []
    unchanged: list[str] = []
    for failure in open_failures(store, task_kind):
        failed_run = failure.details.get("run")
        changes = differences(failed_run, run) if failed_run and run is not None else []
        if changes:
            linkable.append((failure, changes))
        else:
            unchanged.append(failure.id)
    if not linkable:
        return FixResult(None, unchanged=unchanged)
    what = describe(linkable[0][1])
    fix = store.remember(
        type=FIX,
        summary=f"{summary[:200]}, changed: {what}"[:300],
        source=Source("run", run_id),
        details={
            **(details or {}),
            "fixes": [f.id for f, _ in linkable],
            "changes": {f.id: changes for f, changes in linkable},
        },
        task_kind=task_kind,
        trust=trust,
    )
    edges = [
        store.create_edge(fix.id, f.id, "prevents", {"run": run_id, "changes": changes})
        for f, changes in linkable
    ]
    return FixResult(fix, edges, unchanged)


def known_failures(
    store: MemoryStore, task_kind: str, *, k: int = 10, now: datetime | None = None
) -> list[dict[str, Any]]:
    """Planner fact: one entry per failure mode (same summary), newest first:
    ``{failure, fix, failure_id, fix_id, trust, last_failed, occurrences, ages_seconds,
    fix_changes}``.

    Failures of both tiers are read: an untrusted one (the agent's own error text) reaches
    the brain only quoted and labelled ``untrusted`` (brain/plan_turn.py). A fix is
    shown only when trusted; ``fix_changes`` is what its run changed (from the edge).
    ``ages_seconds`` (each occurrence's age at ``now``) feeds the recency weighting.
    """
    modes: dict[str, dict[str, Any]] = {}
    for failure in store.recall(type=FAILURE, task_kind=task_kind, k=5 * k, include_untrusted=True):
        mode = modes.get(failure.summary)
        if mode is None:
            if len(modes) >= k:
                continue
            mode = modes[failure.summary] = {
                "failure": failure.summary,
                "fix": None,
                "failure_id": failure.id,
                "fix_id": None,
                "trust": failure.trust,
                "last_failed": iso(failure.created),
                "occurrences": 0,
                "ages_seconds": [],
                "fix_changes": [],
            }
        mode["occurrences"] += 1
        if now is not None:
            mode["ages_seconds"].append(max(0, int((now - failure.created).total_seconds())))
        if mode["fix"] is None:
            for edge in store.edges(failure.id, type="prevents", direction="in"):
                fix = store.get(edge.source_id)
                if fix is not None and not fix.untrusted:
                    mode["fix"], mode["fix_id"] = fix.summary, fix.id
                    mode["fix_changes"] = list(edge.details.get("changes") or [])
                    break
    return list(modes.values())


def failure_trust(
    successes: int, ages_seconds: Sequence[float], half_life_seconds: float
) -> float | None:
    """successes / (successes + sum of 0.5 ** (age / half_life)); None without any run."""
    if half_life_seconds <= 0:
        raise ValueError("half_life must be > 0")
    weighted = sum(float(0.5 ** (max(0.0, age) / half_life_seconds)) for age in ages_seconds)
    if successes + weighted == 0:
        return None
    return round(float(successes / (successes + weighted)), 3)
