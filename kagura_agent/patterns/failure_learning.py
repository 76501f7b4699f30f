"""Failure learning: a failed run becomes a memory; the next success of the same kind of
task is linked to it as its fix (``fix -prevents-> failure``), and planning a similar
task recalls both as "known failure modes"."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kagura_agent.memory.model import Edge, Memory, MemoryStore, Source, Trust

FAILURE = "failure"
FIX = "fix"


@dataclass(frozen=True)
class FixResult:
    """What ``record_success`` stored: the fix memory (None when nothing was open)."""

    fix: Memory | None
    prevents: list[Edge] = field(default_factory=list)


def record_failure(
    store: MemoryStore,
    *,
    run_id: str,
    task_kind: str,
    summary: str,
    details: Mapping[str, Any] | None = None,
    trust: Trust = "untrusted",
) -> Memory:
    """Remember a failed run. Untrusted unless the caller knows every word of ``summary``
    and ``details`` came from outside the agent (a verify command and its exit code)."""
    return store.remember(
        type=FAILURE,
        summary=summary,
        source=Source("run", run_id),
        details=details,
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
) -> FixResult:
    """After a successful run: if failures of this kind are open, store the fix and link it."""
    failures = open_failures(store, task_kind)
    if not failures:
        return FixResult(None)
    fix = store.remember(
        type=FIX,
        summary=summary,
        source=Source("run", run_id),
        details={**(details or {}), "fixes": [f.id for f in failures]},
        task_kind=task_kind,
    )
    return FixResult(fix, [store.create_edge(fix.id, f.id, "prevents") for f in failures])


def known_failures(store: MemoryStore, task_kind: str, *, k: int = 10) -> list[dict[str, Any]]:
    """Planner fact: ``[{failure, fix, failure_id, fix_id, trust}]`` newest first.

    Failures of both tiers are read: an untrusted one (the agent's own error text) reaches
    the brain only quoted and labelled ``untrusted`` (brain/plan_turn.py). A fix is
    shown only when trusted.
    """
    found = []
    for failure in store.recall(type=FAILURE, task_kind=task_kind, k=k, include_untrusted=True):
        fixes = [
            store.get(e.source_id) for e in store.edges(failure.id, type="prevents", direction="in")
        ]
        fix = next((m for m in fixes if m is not None and not m.untrusted), None)
        found.append(
            {
                "failure": failure.summary,
                "fix": fix.summary if fix else None,
                "failure_id": failure.id,
                "fix_id": fix.id if fix else None,
                "trust": failure.trust,
            }
        )
    return found
