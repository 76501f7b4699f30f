"""Compiled plans from the golden cases (tests/plans/<case>/expected.json), for tests
that need a real plan without compiling one: never build a plan by hand."""

from __future__ import annotations

import json
from pathlib import Path
from typing import cast

from kagura_agent.plan.model import Plan, check_shape

PLANS = Path(__file__).parent / "plans"


def golden_plan(case: str) -> Plan:
    """The expected plan of ``case``, shape-checked (its fingerprint is normalised)."""
    data = json.loads((PLANS / case / "expected.json").read_text())
    check_shape(data, Plan)
    return cast(Plan, data)
