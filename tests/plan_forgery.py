"""Hand-edited saved plans, as an attacker with write access to a plan file makes them:
the content changed, then the intent and fingerprint recomputed so that it still loads."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kagura_agent.plan.intent import intent_fingerprint
from kagura_agent.plan.planner import fingerprint


def forge(saved: Path, edit: Callable[[dict[str, Any]], None], out: Path | None = None) -> Path:
    """Apply ``edit`` to the plan saved at ``saved``, re-sign it and write it to ``out``
    (default: over ``saved``). The forged plan keeps saying ``applyable: true`` and
    ``floor: []``, as the planner wrote them for the honest plan."""
    plan = json.loads(saved.read_text(encoding="utf-8"))
    edit(plan)
    plan["intent"] = intent_fingerprint(plan)
    plan["fingerprint"] = fingerprint(plan)
    target = out or saved
    target.write_text(json.dumps(plan, indent=2), encoding="utf-8")
    return target
