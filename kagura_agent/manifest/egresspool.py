"""The warm egress pool's knobs (Policy ``spec.egress_pool``), granted by Policies only.

Key by key, a higher layer (the operator's folder) replaces a lower one (the packaged
defaults); within one layer the smaller value wins. Read by the planner (whether a run
may claim a pooled session: ``egress.pool``) and by the pool's keeper (how many to hold).
"""

from __future__ import annotations

from dataclasses import dataclass

from kagura_agent.manifest.catalog import Catalog
from kagura_agent.manifest.ceilings import LAYERS
from kagura_agent.units import parse_duration

DEFAULT_SIZE = 0
DEFAULT_IDLE_EXPIRY = 600


@dataclass(frozen=True)
class EgressPoolKnobs:
    size: int = DEFAULT_SIZE
    idle_expiry_seconds: int = DEFAULT_IDLE_EXPIRY


def egress_pool_knobs(catalog: Catalog) -> EgressPoolKnobs:
    found: dict[str, int] = {}
    for layer in LAYERS:
        in_layer: dict[str, int] = {}
        for policy in catalog.of("Policy"):
            if policy.layer != layer:
                continue
            raw = policy.spec.get("egress_pool") or {}
            values = {}
            if "size" in raw:
                values["size"] = int(raw["size"])
            if "idle_expiry" in raw:
                values["idle_expiry_seconds"] = int(parse_duration(str(raw["idle_expiry"])))
            for key, value in values.items():
                in_layer[key] = min(value, in_layer.get(key, value))
        found.update(in_layer)
    return EgressPoolKnobs(**found)
