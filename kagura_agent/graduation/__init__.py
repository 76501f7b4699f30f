"""Capability graduation: trust earned from verified outcomes, granted by a human, lost on
one failure.

    knobs.py     Knobs (min_successes, min_distinct_tasks, cooldown), durations, manifest spec
    model.py     CategoryStatus and GraduationSnapshot: plain, serialisable values
    classify.py  classify(): baseline / graduated / needs-approval / denied (pure)
    ledger.py    the state-store side: record_outcome, proposals, approve_graduation, reset
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kagura_agent.graduation.classify import CapabilityClass, Classification, classify
    from kagura_agent.graduation.knobs import (
        Knobs,
        format_duration,
        knobs_from_spec,
        parse_duration,
    )
    from kagura_agent.graduation.ledger import (
        RecordedOutcome,
        approve_graduation,
        events,
        judge,
        migrate,
        proposals,
        record_outcome,
        reset,
        snapshot,
    )
    from kagura_agent.graduation.model import CategoryStatus, GraduationSnapshot

# Exported names resolve lazily: the planner imports the pure modules (knobs, model,
# classify) on every `plan`, and must not pay for the state-store side (ledger).
_HOME = {
    "CapabilityClass": "classify",
    "Classification": "classify",
    "classify": "classify",
    "Knobs": "knobs",
    "format_duration": "knobs",
    "knobs_from_spec": "knobs",
    "parse_duration": "knobs",
    "CategoryStatus": "model",
    "GraduationSnapshot": "model",
}


def __getattr__(name: str) -> Any:
    module = _HOME.get(name, "ledger" if name in __all__ else None)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"kagura_agent.graduation.{module}"), name)


__all__ = [
    "CapabilityClass",
    "CategoryStatus",
    "Classification",
    "GraduationSnapshot",
    "Knobs",
    "RecordedOutcome",
    "approve_graduation",
    "classify",
    "events",
    "format_duration",
    "judge",
    "knobs_from_spec",
    "migrate",
    "parse_duration",
    "proposals",
    "record_outcome",
    "reset",
    "snapshot",
]
