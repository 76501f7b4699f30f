"""The plan's memory section: the store a run reads and writes, its untrusted inputs, the
known failures of the task kind with their recency weight, and the failure trust the
graduation gate weighs. Pure, like the rest of the planner."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kagura_agent.facts import Facts
from kagura_agent.graduation.settings import graduation_settings
from kagura_agent.manifest.catalog import Catalog
from kagura_agent.manifest.task import ResolvedTask
from kagura_agent.memory.factory import section_from_manifest
from kagura_agent.patterns.failure_learning import failure_trust
from kagura_agent.plan.model import KnownFailure, MemorySection


def memory_section(task: ResolvedTask, facts: Facts, catalog: Catalog) -> MemorySection:
    memory = task.memory
    section = section_from_manifest(*((memory.name, memory.spec) if memory else (None, None)))
    settings = graduation_settings(catalog)
    half_life = settings.failure_half_life
    runs = (facts.cost_history or {}).get("runs") or []
    successes = sum(1 for run in runs if run.get("outcome") == "success")
    ages = [float(a) for f in facts.known_failures for a in f.get("ages_seconds") or []]
    return {
        "name": section["name"],
        "backend": section["backend"],
        "location": section["location"],
        "token_ref": section["token_ref"],
        "untrusted_inputs": untrusted_inputs(task, facts),
        "known_failures": [_known_failure(f, half_life) for f in facts.known_failures],
        "failure_trust": {
            "score": failure_trust(successes, ages, half_life),
            "successes": successes,
            "weighted_failures": round(sum(float(0.5 ** (age / half_life)) for age in ages), 3),
            "half_life_seconds": half_life,
            "min_trust": settings.min_trust,
        },
    }


def _known_failure(found: Mapping[str, Any], half_life: int) -> KnownFailure:
    """A known failure and its fix, with their memory ids when the store gave them
    (``memory show`` follows them), when it last happened, its recency weight and what
    the fixing run changed."""
    # A failure whose tier is not stated is untrusted: it reaches the brain quoted either way.
    trust = "trusted" if found.get("trust") == "trusted" else "untrusted"
    known: KnownFailure = {
        "failure": str(found["failure"]),
        "fix": found.get("fix"),
        "trust": trust,
    }
    if found.get("failure_id"):
        known["failure_id"] = str(found["failure_id"])
    if "fix_id" in found:
        known["fix_id"] = found["fix_id"]
    if "last_failed" in found:
        ages = [float(a) for a in found.get("ages_seconds") or []]
        known["last_failed"] = found.get("last_failed")
        known["occurrences"] = int(found.get("occurrences") or 1)
        known["weight"] = round(sum(float(0.5 ** (age / half_life)) for age in ages), 3)
        known["fix_changes"] = [
            {"change": str(c["change"]), "op": str(c["op"]), "value": str(c["value"])}
            for c in found.get("fix_changes") or []
        ]
    return known


def untrusted_inputs(task: ResolvedTask, facts: Facts) -> list[str]:
    """The run's untrusted inputs: untrusted context memories, and recall of untrusted ones.

    ``include_untrusted`` lets the brain recall untrusted memories during the run, so it is
    an untrusted input whatever the store holds today.
    """
    found = list(facts.untrusted_inputs)
    if task.context.get("include_untrusted"):
        found.append("context.include_untrusted")
    return found
