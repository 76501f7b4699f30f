"""The Graduation kind, read once: every knob typed, from one merge of the manifest set.

One reader, one rule (docs/manifests.md, "Layers and singleton kinds"). A manifest set
holds at most one Graduation document of its own: the packaged defaults hold one
(``default``), and the operator's folder may hold one more, under any name. They merge **key by key**: a key
the operator's document sets replaces the packaged one's, a key it does not set keeps
the packaged value, and a knob neither sets has the default written here. An operator
document that is an identical copy of a packaged one is the packaged one (as everywhere
in the catalog: a copy replaces nothing). Two documents of the operator's own are a
located error (manifest/checks.py), never silently merged in file order.

Every reader of the kind — the planner (baseline, tripwires, failure half-life and the trust gate), the
budget forecast, the graduation facts, ``graduation`` on the command line, the cockpit
and the web console — takes :class:`GraduationSettings` from :func:`graduation_settings`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kagura_agent.graduation.knobs import Knobs, knobs_from_spec
from kagura_agent.manifest.catalog import Catalog, Manifest
from kagura_agent.membrane.egress.audit import LOG_CEILING
from kagura_agent.patterns.cost_history import DEFAULT_MIN_RUNS, DEFAULT_QUANTILE, DEFAULT_RESERVE
from kagura_agent.patterns.failure_learning import DEFAULT_HALF_LIFE_SECONDS
from kagura_agent.plan.model import Tripwires
from kagura_agent.units import parse_duration, parse_size

KIND = "Graduation"
# Most a learnt limit grows in one run (``budget_step``): x1.5 of the limit the newest
# recorded run was held to, so a run that spends to its limit teaches the next plan at
# most half as much again, never the ceiling at once (plan/budget.py).
DEFAULT_STEP = 1.5
# The decoy credentials file apply plants in the agent's home (a tmpfs in the container).
CANARY_PATH = "/home/agent/.git-credentials"
DEFAULT_DENIED_EGRESS = 5
DEFAULT_WINDOW = "60s"
# The graduation gate's trust floor (``min_trust``): graduated capabilities are asked for
# again while the task kind's recency-weighted failures outweigh its successes.
DEFAULT_MIN_TRUST = 0.5
KNOB_KEYS = ("min_successes", "min_distinct_tasks", "cooldown", "failure_window")


@dataclass(frozen=True)
class BudgetKnobs:
    """How the budget forecast learns limits from past runs (plan/budget.py)."""

    reserve: float = DEFAULT_RESERVE
    quantile: float = DEFAULT_QUANTILE
    floors: Mapping[str, float] = field(default_factory=dict)
    min_runs: int = DEFAULT_MIN_RUNS
    step: float = DEFAULT_STEP


@dataclass(frozen=True)
class GraduationSettings:
    """Everything the manifest set's Graduation says, merged (module docstring)."""

    knobs: Knobs = field(default_factory=Knobs)
    baseline: frozenset[str] = frozenset()
    budget: BudgetKnobs = field(default_factory=BudgetKnobs)
    failure_half_life: int = DEFAULT_HALF_LIFE_SECONDS  # seconds
    min_trust: float = DEFAULT_MIN_TRUST  # the gate on failure_trust (0: off)
    tripwires: Tripwires = field(default_factory=lambda: default_tripwires())


def default_tripwires() -> Tripwires:
    return {
        "denied_egress": DEFAULT_DENIED_EGRESS,
        "window_seconds": parse_duration(DEFAULT_WINDOW),
        "canary_file": CANARY_PATH,
        "creds_after_wipe": True,
        "egress_log_bytes": LOG_CEILING,
        "source": "default",
    }


def documents(catalog: Catalog) -> list[Manifest]:
    """The kind's documents in merge order: the packaged layer's (identical copies of
    it included), then the operator's own."""
    found = catalog.of(KIND)
    copies = set(catalog.copies)

    def layer(manifest: Manifest) -> int:
        packaged = manifest.layer == "packaged" or f"{KIND}/{manifest.name}" in copies
        return 0 if packaged else 1

    return sorted(found, key=layer)


def merged_spec(catalog: Catalog) -> tuple[dict[str, Any], dict[str, str]]:
    """The merged spec, and for each key the name of the document it came from."""
    spec: dict[str, Any] = {}
    source: dict[str, str] = {}
    for manifest in documents(catalog):
        for key, value in manifest.spec.items():
            spec[key] = value
            source[key] = manifest.name
    return spec, source


def graduation_settings(catalog: Catalog) -> GraduationSettings:
    """The manifest set's Graduation settings (UsageError for knobs that do not parse)."""
    spec, source = merged_spec(catalog)
    return GraduationSettings(
        knobs=knobs_from_spec({k: v for k, v in spec.items() if k in KNOB_KEYS}),
        baseline=frozenset(str(category) for category in spec.get("baseline") or []),
        budget=_budget(spec),
        failure_half_life=(
            parse_duration(str(spec["failure_half_life"]))
            if "failure_half_life" in spec
            else DEFAULT_HALF_LIFE_SECONDS
        ),
        min_trust=float(spec.get("min_trust", DEFAULT_MIN_TRUST)),
        tripwires=_tripwires(spec.get("tripwires"), source.get("tripwires", "default")),
    )


def _budget(spec: Mapping[str, Any]) -> BudgetKnobs:
    floors = dict(spec.get("budget_floors") or {})
    if "wall" in floors:
        floors["wall_seconds"] = parse_duration(str(floors.pop("wall")))
    return BudgetKnobs(
        reserve=float(spec.get("reserve", DEFAULT_RESERVE)),
        quantile=float(spec.get("budget_quantile", DEFAULT_QUANTILE)),
        floors=floors,
        min_runs=int(spec.get("budget_min_runs", DEFAULT_MIN_RUNS)),
        step=float(spec.get("budget_step", DEFAULT_STEP)),
    )


def _tripwires(knobs: Mapping[str, Any] | None, source: str) -> Tripwires:
    """The hijack tripwire knobs; ``source`` names the document they came from."""
    if not knobs:
        return default_tripwires()
    return {
        "denied_egress": int(knobs.get("denied_egress", DEFAULT_DENIED_EGRESS)),
        "window_seconds": parse_duration(str(knobs.get("window", DEFAULT_WINDOW))),
        "canary_file": CANARY_PATH if knobs.get("canary_file", True) else None,
        "creds_after_wipe": bool(knobs.get("creds_after_wipe", True)),
        "egress_log_bytes": (
            parse_size(str(knobs["egress_log"])) if "egress_log" in knobs else LOG_CEILING
        ),
        "source": source,
    }
