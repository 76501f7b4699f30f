"""What a named session spent of its budget, by the host's count.

A session (``spec.session``, ``run --session``) that did not finish is resumed by its
next run; that run is planned from what is *left* (plan/resume.py), never the whole budget
again. ``Spent`` is what the checkpoint keeps for it, summed over every run of the session
since it last finished:

    turns        the larger of the turns the engine reported and the model calls counted
                 at the proxy, plus what finished sub-agents used (apply/midrun/allotment.py)
    cost_usd     the dollars reported, plus what finished sub-agents used
    wall_seconds the host's clock from the brain's start to the checkpoint
    leases       per credential category: the seconds a lease of it was held, and the
                 renewals it used

The figures come from the host (apply/midrun/allotment.run_spent); the checkpoint is the host's
own row, but it is read back defensively: anything that is not a finite, non-negative
number counts as nothing spent *and* is reported, never a crash.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# The most one figure may say (a bound on what is read back; ~31 years of seconds).
MAX_FIGURE = 10**9


@dataclass(frozen=True)
class LeaseSpent:
    """How long a credential category was held, and how many renewals that took."""

    seconds: int = 0
    renewals: int = 0

    def plus(self, other: LeaseSpent) -> LeaseSpent:
        return LeaseSpent(self.seconds + other.seconds, self.renewals + other.renewals)


@dataclass(frozen=True)
class Spent:
    """What a session spent so far (zero: nothing, or it last finished)."""

    turns: int = 0
    cost_usd: float = 0.0
    wall_seconds: int = 0
    leases: Mapping[str, LeaseSpent] = field(default_factory=dict)

    @property
    def nothing(self) -> bool:
        return self == Spent()

    def plus(self, other: Spent) -> Spent:
        """This spending followed by ``other``'s (one more run of the session)."""
        leases = dict(self.leases)
        for category, held in other.leases.items():
            leases[category] = leases.get(category, LeaseSpent()).plus(held)
        return Spent(
            turns=self.turns + other.turns,
            cost_usd=round(self.cost_usd + other.cost_usd, 6),
            wall_seconds=self.wall_seconds + other.wall_seconds,
            leases=leases,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "turns": self.turns,
            "cost_usd": self.cost_usd,
            "wall_seconds": self.wall_seconds,
            "leases": {
                category: {"seconds": held.seconds, "renewals": held.renewals}
                for category, held in sorted(self.leases.items())
            },
        }

    @classmethod
    def from_json(cls, raw: object) -> Spent:
        """Read back what ``to_json`` wrote; a value out of shape counts as nothing."""
        data = raw if isinstance(raw, Mapping) else {}
        leases_raw = data.get("leases")
        leases: dict[str, LeaseSpent] = {}
        if isinstance(leases_raw, Mapping):
            for category, held in list(leases_raw.items())[:1000]:
                if isinstance(category, str) and isinstance(held, Mapping):
                    leases[category] = LeaseSpent(
                        _whole(held.get("seconds")), _whole(held.get("renewals"))
                    )
        return cls(
            turns=_whole(data.get("turns")),
            cost_usd=round(_number(data.get("cost_usd")), 6),
            wall_seconds=_whole(data.get("wall_seconds")),
            leases=leases,
        )


def _number(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0.0
    if not math.isfinite(value) or value < 0:
        return 0.0
    return float(min(value, MAX_FIGURE))


def _whole(value: object) -> int:
    return int(_number(value))
