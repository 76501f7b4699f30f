"""Budget ceilings: the most a task may ask for, granted by the operator's Policies only.

A task sets its own budget (turns, wall time, dollars, disk); those are limits the run
is held to, and a task must not grant itself an unbounded one (a 5000 GiB disk budget
would defeat the bounded-writes guarantee). A Policy's ``spec.ceilings`` caps each
dimension. The packaged ``membrane`` Policy sets defaults; the operator's folder
overrides them key by key (operators are trusted to raise them, in git); within one
layer the lowest value wins. A budget over a ceiling makes the plan not applyable — it
is refused, not silently trimmed, so what the operator reviewed is what runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from kagura_agent.manifest.catalog import Catalog
from kagura_agent.units import format_duration, parse_duration, parse_size

LAYERS = ("packaged", "operator")


@dataclass(frozen=True)
class Ceiling:
    key: str  # turns | wall_time | cost_usd | disk | children | children_total | depth
    limit: float  # in the budget section's unit: turns, seconds, dollars, bytes
    shown: str  # as the manifest wrote it
    source: str  # "Policy membrane (packaged)"


def _value(key: str, raw: object) -> float:
    if key == "wall_time":
        return float(parse_duration(str(raw)))
    if key == "disk":
        return float(parse_size(str(raw)))
    return float(raw)  # type: ignore[arg-type]  # schema: integer / number


def budget_ceilings(catalog: Catalog) -> dict[str, Ceiling]:
    """The ceilings in force, key by key (a higher layer replaces a lower one)."""
    found: dict[str, Ceiling] = {}
    for layer in LAYERS:
        in_layer: dict[str, Ceiling] = {}
        for policy in catalog.of("Policy"):
            if policy.layer != layer:
                continue
            for key, raw in (policy.spec.get("ceilings") or {}).items():
                ceiling = Ceiling(
                    key, _value(key, raw), str(raw), f"Policy {policy.name} ({layer})"
                )
                if key not in in_layer or ceiling.limit < in_layer[key].limit:
                    in_layer[key] = ceiling
        found.update(in_layer)
    return found


def over_ceilings(
    asked: Mapping[str, float | None], ceilings: Mapping[str, Ceiling]
) -> list[tuple[Ceiling, str]]:
    """Each ceiling the budget ``asked`` (same keys and units) exceeds, with a message."""
    found: list[tuple[Ceiling, str]] = []
    for key, value in asked.items():
        ceiling = ceilings.get(key)
        if ceiling is None or value is None or value <= ceiling.limit:
            continue
        found.append(
            (ceiling, f"budget {key} {_shown(key, value)} is over the ceiling {ceiling.shown}")
        )
    return found


def _shown(key: str, value: float) -> str:
    if key == "wall_time":
        return format_duration(int(value))
    if key == "disk":
        return f"{value / 1024**3:g} GiB"
    if key == "cost_usd":
        return "$" + f"{value:.2f}".rstrip("0").rstrip(".")
    return f"{value:g}"
