"""May this plan be applied? Decided from what the plan says it will do, never from the
verdict it carries.

``admit`` is the one check ``apply`` refuses on and every view of a plan shows (``show``,
``plan`` and its markdown, ``review``, the cockpit, the diff's applyable line). A saved
plan is a file: edited to ``privileged: true``, a forbidden capability or a writable
docker.sock mount, with its fingerprints recomputed so that it loads, it still says
``"applyable": true`` and ``"floor": []``. So:

1. the membrane floor (membrane/floor.py) is recomputed from the plan's hardening, mounts
   and egress — the plan's own ``floor`` list is only what the planner found — and so is
   whether each credential's lease can be minted at all (membrane/lifetimes.py: a budget
   shorter than the provider's shortest credential is exhausted before it starts);
2. the refusals the planner recorded (policy denials, denied capabilities, tenancy, an
   unwritable root, ceilings) are kept: they need the manifests to recompute, and an edit
   can only remove them — ``apply`` of a saved plan re-plans it from its inputs first
   (apply/run/freshness.py), which is where such an edit is caught;
3. a plan that says it is not applyable stays refused, whatever its lists say.

``edited`` says the recorded floor differs from the recomputed one: the file was changed
after it was planned, so its recorded policy results are not to be believed either.
Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kagura_agent.membrane.floor import floor_violations
from kagura_agent.membrane.lifetimes import lifetime_refusals
from kagura_agent.plan.model import Refusal

FLOOR_SOURCE = "membrane floor"
# Refusals admit recomputes from the plan itself (a recorded one is replaced, not kept).
RECOMPUTED = ("floor", "lease-lifetime")


@dataclass(frozen=True)
class Admission:
    """The verdict on one plan: ``refusals`` empty means apply may run it."""

    floor: tuple[str, ...]
    refusals: tuple[Refusal, ...]
    edited: bool

    @property
    def applyable(self) -> bool:
        return not self.refusals


def admit(plan: Mapping[str, Any]) -> Admission:
    """The floor recomputed, plus what the plan itself records as refusing it."""
    floor = tuple(floor_violations(plan))
    refusals: list[Refusal] = [
        {"code": "floor", "message": f"membrane floor: {broken}", "source": FLOOR_SOURCE}
        for broken in floor
    ]
    refusals += lifetime_refusals(list(plan.get("credentials") or []))
    recorded = [r for r in plan.get("refusals") or [] if r.get("code") not in RECOMPUTED]
    refusals += [
        {
            "code": str(r.get("code", "")),
            "message": str(r.get("message", "")),
            "source": str(r.get("source", "")),
        }
        for r in recorded
    ]
    if plan.get("applyable") is not True and not refusals:
        refusals.append(
            {
                "code": "not-applyable",
                "message": "the plan says it is not applyable",
                "source": "$.applyable",
            }
        )
    edited = list(plan.get("floor") or []) != list(floor)
    return Admission(floor, tuple(refusals), edited)
