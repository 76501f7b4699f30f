"""Amended plans for a running run, compiled from the operator's manifests only.

A mid-run request names something (an EgressPolicy or a host one allows; a credential
``provider/scope``); a budget extension names a limit. :class:`Amender` turns either into
the plan the run would then be running: the same catalog, resolved task and facts the
running plan was compiled from, the task widened by exactly the request, compiled by the
planner (so Policies, classes, the floor and the ceilings all apply), plus the budget
limits extended so far. What the manifests do not allow is refused with the reason and
never reaches an operator: an unknown policy or provider, a host no EgressPolicy allows, a
capability a Policy denies, a plan that would not be applyable, a limit past its ceiling.

Nothing here has a side effect; ``apply/midrun/grants.py`` asks and applies.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kagura_agent.manifest.catalog import Catalog, Manifest
from kagura_agent.manifest.ceilings import budget_ceilings
from kagura_agent.manifest.hosts import normalize_host
from kagura_agent.manifest.task import MAX_TTL, MIN_TTL, CredentialRequest, ResolvedTask
from kagura_agent.plan.build import Compiled
from kagura_agent.plan.diff import Change, diff_plans
from kagura_agent.plan.model import Plan
from kagura_agent.plan.planner import compile_plan, fingerprint
from kagura_agent.units import format_duration, parse_duration

# Budget limits an operator may extend mid-run: the plan's key and its ceiling's key.
EXTENDABLE = {"wall_seconds": "wall_time", "turns": "turns", "cost_usd": "cost_usd"}
MAX_RENEWALS = 100  # the Task schema's maximum


class Refused(Exception):
    """What the manifests do not allow (the message says why); nobody is asked."""


@dataclass(frozen=True)
class Amendment:
    """A plan the run may move to: its category (what the operator approves), the plan
    and what changed from the running one."""

    category: str
    plan: Plan
    changes: tuple[Change, ...]
    task: ResolvedTask

    def diff_text(self) -> str:
        return "\n".join(change.render() for change in self.changes)


class Amender:
    """Amendments of one run's plan. ``compiled`` is what the plan was compiled from; when
    it does not reproduce ``plan`` exactly, nothing can be amended (``problem`` says why)."""

    def __init__(self, compiled: Compiled | None, plan: Plan) -> None:
        self.plan = plan
        self._compiled = compiled
        self._task = compiled.task if compiled is not None else None
        self._budget: dict[str, Any] = {}
        # Lease budgets extended so far: credential category -> (budget_seconds, renewals).
        self._leases: dict[str, tuple[int, int]] = {}
        self.problem = ""
        if compiled is None:
            self.problem = "this run was started without its manifests at hand"
        elif compiled.plan["fingerprint"] != plan["fingerprint"]:
            self.problem = "this run's plan is not what its manifests compile to now"

    @property
    def catalog(self) -> Catalog:
        if self._compiled is None:
            raise Refused(self.problem)
        return self._compiled.catalog

    def accept(self, amendment: Amendment) -> None:
        """The operator approved ``amendment`` and it is in force: it is the plan now."""
        self.plan = amendment.plan
        self._task = amendment.task

    # --- capabilities ------------------------------------------------------------------

    def capability(self, kind: str, name: str) -> Amendment:
        """The plan with one more egress policy or credential scope; Refused otherwise."""
        if self.problem or self._task is None:
            raise Refused(self.problem)
        task = self._task
        if kind == "egress":
            policy = self._egress_policy(name)
            if any(p.name == policy.name for p in task.egress):
                raise Refused(f"egress policy {policy.name} is already in this run's plan")
            amended = dataclasses.replace(task, egress=[*task.egress, policy])
            category = f"egress:{policy.name}"
        elif kind == "credential":
            request = self._credential(name)
            held = {(r.provider.name, r.scope) for r in task.credentials}
            if (request.provider.name, request.scope) in held:
                raise Refused(f"credential {name} is already in this run's plan")
            amended = dataclasses.replace(task, credentials=[*task.credentials, request])
            category = f"credential:{request.provider.name}/{request.scope}"
        else:
            raise Refused(f"unknown kind {kind!r}: egress or credential")
        return self._amendment(category, amended)

    def _egress_policy(self, name: str) -> Manifest:
        catalog = self.catalog
        found = catalog.get("EgressPolicy", name)
        if found is not None:
            return found
        host, _ = normalize_host(name)
        if host is None:
            raise Refused(f"no EgressPolicy named {name!r} in the operator's manifests")
        allowing = [
            policy
            for policy in catalog.of("EgressPolicy")
            if any(_host_allows(entry["host"], host) for entry in policy.spec.get("allow", []))
        ]
        if not allowing:
            raise Refused(
                f"no EgressPolicy in the operator's manifests allows {host}; an operator must"
                " add one (in git) before any run can reach it"
            )
        # The narrowest grant that gives the host: a policy naming it before a wildcard
        # one, then the one allowing fewest entries (then by name, for a stable answer).
        return min(allowing, key=lambda policy: _breadth(policy, host))

    def _credential(self, name: str) -> CredentialRequest:
        provider_name, _, scope_name = name.partition("/")
        provider = self.catalog.get("CredentialProvider", provider_name)
        if provider is None:
            raise Refused(f"no CredentialProvider {provider_name!r} in the operator's manifests")
        scope = provider.spec["scopes"].get(scope_name)
        if scope is None:
            known = ", ".join(sorted(provider.spec["scopes"])) or "none"
            raise Refused(f"provider {provider_name} has no scope {scope_name!r} (known: {known})")
        ttl = parse_duration(provider.spec.get("ttl") or "15m")
        cap = min(MAX_TTL, parse_duration(scope["max_ttl"])) if "max_ttl" in scope else MAX_TTL
        ttl = max(MIN_TTL, min(ttl, cap))
        return CredentialRequest(provider, scope_name, ttl, 0, ttl)

    # --- budgets -----------------------------------------------------------------------

    def budget(self, key: str, wanted: float) -> Amendment:
        """The plan with budget ``key`` raised to ``wanted``, cut to the manifests' ceiling;
        Refused when it is at the ceiling already."""
        if self.problem or self._task is None:
            raise Refused(self.problem)
        if key not in EXTENDABLE:
            raise Refused(f"budget {key} cannot be extended mid-run")
        limits: Mapping[str, Any] = self.plan["budget"]
        current = float(limits[key] or 0)
        # A sub-agent never grows past what its parent left it (plan/budget.py).
        parent = (limits["parent"] or {}).get(key)
        if parent is not None and wanted > parent:
            wanted = float(parent)
            if wanted <= current:
                raise Refused(f"budget {key} is at what its parent left it, {_shown(key, wanted)}")
        ceiling = budget_ceilings(self.catalog).get(EXTENDABLE[key])
        if ceiling is not None:
            wanted = min(wanted, ceiling.limit)
        if wanted <= current:
            where = f" ({ceiling.source})" if ceiling is not None else ""
            shown = ceiling.shown if ceiling is not None else _shown(key, current)
            raise Refused(f"budget {key} is at its ceiling {shown}{where}")
        saved = dict(self._budget)
        self._budget[key] = round(wanted, 6) if key == "cost_usd" else int(wanted)
        try:
            return self._amendment(f"budget:{key}", self._task)
        finally:
            self._budget = saved

    def accept_budget(self, amendment: Amendment) -> None:
        limits: Mapping[str, Any] = amendment.plan["budget"]
        self._budget.update({k: limits[k] for k in EXTENDABLE})
        self.accept(amendment)

    def lease_budget(self, category: str, seconds: int, renewals: int) -> Amendment:
        """The plan with credential ``category`` held up to ``seconds`` with ``renewals``,
        the seconds cut to the wall-time ceiling (no lease outlives the longest run) and
        the renewals to 100 (the schema's); Refused when nothing would grow."""
        if self.problem or self._task is None:
            raise Refused(self.problem)
        found = [c for c in self.plan["credentials"] if c["category"] == category]
        if not found:
            raise Refused(f"{category} is not in this run's plan")
        entry = found[0]
        ceiling = budget_ceilings(self.catalog).get("wall_time")
        if ceiling is not None:
            seconds = min(seconds, int(ceiling.limit))
        renewals = min(renewals, MAX_RENEWALS)
        if seconds <= entry["budget_seconds"] and renewals <= entry["renewals"]:
            where = f" ({ceiling.source})" if ceiling is not None else ""
            raise Refused(f"the lease budget of {category} is at its ceiling{where}")
        saved = dict(self._leases)
        self._leases[category] = (seconds, renewals)
        try:
            return self._amendment(f"budget:{category}", self._task)
        finally:
            self._leases = saved

    def accept_lease_budget(self, amendment: Amendment, category: str) -> None:
        [entry] = [c for c in amendment.plan["credentials"] if c["category"] == category]
        self._leases[category] = (entry["budget_seconds"], entry["renewals"])
        self.accept(amendment)

    # --- compile -----------------------------------------------------------------------

    def _amendment(self, category: str, task: ResolvedTask) -> Amendment:
        assert self._compiled is not None
        plan: Plan = compile_plan(self.catalog, task, self._compiled.facts)
        if self._budget or self._leases:
            plan = copy.deepcopy(plan)
            plan["budget"].update(self._budget)  # type: ignore[typeddict-item]
            for entry in plan["credentials"]:
                if entry["category"] in self._leases:
                    entry["budget_seconds"], entry["renewals"] = self._leases[entry["category"]]
            plan["fingerprint"] = ""
            plan["fingerprint"] = fingerprint(plan)
        if not plan["applyable"]:
            reasons = "; ".join(r["message"] for r in plan["refusals"]) or "see the plan"
            raise Refused(f"the amended plan would not be applyable: {reasons}")
        denied = [
            a for a in plan["approvals"] if a["category"] == category and a["class"] == "denied"
        ]
        if denied:
            raise Refused(f"{category} is denied: {denied[0]['reason']}")
        changes = tuple(diff_plans(self.plan, plan))
        return Amendment(category, plan, changes, task)


def _breadth(policy: Manifest, host: str) -> tuple[bool, int, str]:
    entries = policy.spec.get("allow", [])
    exact = any(normalize_host(entry["host"])[0] == host for entry in entries)
    return (not exact, len(entries), policy.name)


def _host_allows(pattern: str, host: str) -> bool:
    normal, _ = normalize_host(pattern)
    if normal is None:
        return False
    if normal.startswith("*."):
        return host.endswith(normal[1:]) and len(host) > len(normal) - 1
    return normal == host


def _shown(key: str, value: float) -> str:
    if key == "cost_usd":
        return f"${value:g}"
    return format_duration(int(value)) if key == "wall_seconds" else f"{value:g}"
