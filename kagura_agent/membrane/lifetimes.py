"""How long a provider's credentials live, and whether a plan's lease can ever be minted.

The broker mints a lease for ``min(ttl clamped to 15m..1h, budget left)`` seconds and
refuses (budget exhausted, exit 6) when that is shorter than the provider can mint: a
GitHub App installation token always lives one hour (membrane/providers/traits.py), so a
20-minute budget can never hold one. That is known from the plan alone, so ``plan`` refuses it (plan/admission.py)
instead of ``apply`` failing after the container and proxy started. Pure; no SDK import.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kagura_agent.membrane.providers.traits import traits_of
from kagura_agent.plan.model import Refusal
from kagura_agent.units import format_duration

LEASE_MIN_SECONDS = 15 * 60
LEASE_MAX_SECONDS = 60 * 60

_WHY = {
    "aws-sts": "AWS STS mints no session shorter than 15m",
    "github-app": "GitHub installation tokens always live 1h",
}


def first_lease_seconds(ttl_seconds: int, budget_seconds: int) -> int:
    """What the broker asks the provider for at the start of the budget."""
    wanted = max(LEASE_MIN_SECONDS, min(LEASE_MAX_SECONDS, ttl_seconds))
    return min(wanted, budget_seconds)


def lifetime_problem(credential: Mapping[str, Any]) -> str:
    """Why a plan's ``credentials`` entry can never be minted ("" when it can)."""
    kind = str(credential.get("type", ""))
    traits = traits_of(kind)
    if traits is None:
        return ""
    shortest = traits.min_ttl
    try:
        ttl, budget = int(credential["ttl_seconds"]), int(credential["budget_seconds"])
    except (KeyError, TypeError, ValueError):
        return ""
    lease = first_lease_seconds(ttl, budget)
    if lease >= shortest:
        return ""
    why = _WHY.get(kind, f"a {kind} credential lives at least {format_duration(shortest)}")
    name = f"{credential.get('provider')}/{credential.get('scope')}"
    need = (
        "ttl and budget"
        if max(LEASE_MIN_SECONDS, min(LEASE_MAX_SECONDS, ttl)) < shortest
        else "budget"
    )
    return (
        f"credential {name} ({kind}) could never be minted: its first lease would be"
        f" {format_duration(lease)} (ttl {format_duration(ttl)}, budget"
        f" {format_duration(budget)}) and {why}; give it a {need} of at least"
        f" {format_duration(shortest)}"
    )


def lifetime_refusals(credentials: list[Mapping[str, Any]]) -> list[Refusal]:
    """A ``lease-lifetime`` refusal for every credential the broker could never mint."""
    found: list[Refusal] = []
    for index, credential in enumerate(credentials):
        problem = lifetime_problem(credential)
        if problem:
            found.append(
                {
                    "code": "lease-lifetime",
                    "message": problem,
                    "source": str(credential.get("source") or f"$.credentials[{index}]"),
                }
            )
    return found
