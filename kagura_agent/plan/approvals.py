"""The plan's approvals: each requested capability classified — baseline, graduated,
needs-approval or denied (by a policy, whose violations at indexed plan paths name the
categories they deny). Pure, like the rest of the planner."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kagura_agent.facts import Facts
from kagura_agent.graduation.classify import classify
from kagura_agent.graduation.settings import graduation_settings
from kagura_agent.manifest.catalog import Catalog
from kagura_agent.manifest.scopes import is_full_access
from kagura_agent.manifest.task import ResolvedTask
from kagura_agent.plan.budget import budget_approvals
from kagura_agent.plan.endpoint import endpoint_baseline
from kagura_agent.plan.memory import untrusted_inputs
from kagura_agent.plan.model import Approval
from kagura_agent.plan.toolservers import category, rule_category


def denied_categories(plan: Mapping[str, Any], by_path: dict[str, str]) -> dict[str, str]:
    """Turn policy violations at indexed plan paths into denied capability categories."""
    denied: dict[str, str] = {}
    for path, policy in by_path.items():
        section, _, index = path.rstrip("]").partition("[")
        if section == "egress.allow":
            entry = plan["egress"]["allow"][int(index)]
            denied.setdefault(rule_category(entry["policy"]), policy)
        elif section == "tool_servers":
            denied.setdefault(plan["tool_servers"][int(index)]["category"], policy)
        elif section == "credentials":
            denied.setdefault(plan["credentials"][int(index)]["category"], policy)
        elif section == "mounts" and "category" in plan["mounts"][int(index)]:
            denied.setdefault(plan["mounts"][int(index)]["category"], policy)
    return denied


def classify_all(
    catalog: Catalog,
    task: ResolvedTask,
    draft: Mapping[str, Any],
    facts: Facts,
    denials: dict[str, str],
) -> list[Approval]:
    """Every capability the draft plan asks for, classified (graduation/classify.py):
    the image, egress policies, credentials, extra mounts, the model endpoint, tool
    servers, then a learnt budget above the default."""
    settings = graduation_settings(catalog)
    graduation_baseline = settings.baseline
    # The graduation gate weighs this task kind's recent failures (memory.failure_trust).
    trust = draft["memory"]["failure_trust"]["score"]
    requested: list[tuple[str, bool]] = [
        (draft["image"]["category"], bool(task.image.spec.get("baseline", False)))
    ]
    for policy in task.egress:
        requested.append((f"egress:{policy.name}", bool(policy.spec.get("baseline", False))))
    for cred in draft["credentials"]:
        provider = catalog.get("CredentialProvider", cred["provider"])
        base = provider is not None and cred["scope"] in provider.spec.get("baseline_scopes", [])
        requested.append((cred["category"], base))
    for mount in draft["mounts"][1:]:
        if mount["kind"] == "extra":
            requested.append((mount["category"], False))
    if "model_endpoint" in draft["brain"]:
        requested.append(
            (draft["brain"]["model_endpoint"]["category"], endpoint_baseline(task.brain))
        )
    for server in task.tool_servers:
        requested.append((category(server.name), bool(server.spec.get("baseline", False))))
    untrusted = untrusted_inputs(task, facts)
    full = {c["category"] for c in draft["credentials"] if is_full_access(c["scope_spec"])}
    approvals = []
    for asked, baseline in requested:
        approval = classify(
            asked,
            baseline=baseline or asked in graduation_baseline,
            state=facts.graduation,
            untrusted_inputs=untrusted,
            denied_by_policy=denials.get(asked),
            trust=trust,
            min_trust=settings.min_trust,
        ).to_json()
        if asked in full:
            # Whoever approves (or reads why it needs no approval) sees the whole power.
            approval["reason"] += "; FULL ACCESS: the scope narrows nothing (full_access: true)"
        approvals.append(approval)
    # A learnt budget above the default is more than the operator's manifests gave.
    for asked, why in budget_approvals(draft["budget"]):
        approval = classify(
            asked,
            baseline=asked in graduation_baseline,
            state=facts.graduation,
            untrusted_inputs=untrusted,
            denied_by_policy=denials.get(asked),
            trust=trust,
            min_trust=settings.min_trust,
        ).to_json()
        approval["reason"] = f"{why}; {approval['reason']}"
        approvals.append(approval)
    return approvals
