"""Capability graduation: trust earned from verified outcomes, granted by a human, lost on
one failure.

    knobs.py     Knobs (min_successes, min_distinct_tasks, cooldown), durations, manifest spec
    model.py     CategoryStatus and GraduationSnapshot: plain, serialisable values
    classify.py  classify(): baseline / graduated / needs-approval / denied (pure)
    ledger.py    the state-store side: record_outcome, proposals, approve_graduation, reset
"""

from __future__ import annotations

# Every submodule is imported here (plan loads the ledger anyway). Importing a submodule
# binds its name on this package, and ``classify`` is both a submodule and a function:
# binding the function here, after the submodule import, is what makes ``from
# kagura_agent.graduation import classify`` the function whichever module imported
# ``graduation.classify`` first.
from kagura_agent.graduation.classify import Classification, classify
from kagura_agent.graduation.knobs import Knobs, format_duration, knobs_from_spec, parse_duration
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
from kagura_agent.plan.model import CapabilityClass

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
