"""Policies: JSON Schemas the compiled plan must satisfy (``deny`` or ``warn``).

A rule passes when the plan JSON validates against its schema; each validation error
is a violation at a JSON path of the plan. No new policy language: operators write the
same JSON Schema the manifests use.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kagura_agent.manifest.catalog import Catalog
from kagura_agent.plan.model import PolicyResult, Violation

RuleChecker = Callable[[dict[str, Any], Mapping[str, Any]], list[Violation]]


def check_rule(schema: dict[str, Any], plan: Mapping[str, Any]) -> list[Violation]:
    """The violations of one rule: every place the plan does not satisfy ``schema``."""
    from jsonschema import Draft202012Validator

    violations: list[Violation] = []
    for error in Draft202012Validator(schema).iter_errors(plan):
        path = "$" + "".join(
            f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path
        )
        violations.append({"path": path, "message": error.message})
    violations.sort(key=lambda v: v["path"])
    return violations


def evaluate_policies(
    catalog: Catalog, plan: Mapping[str, Any], check: RuleChecker | None = None
) -> list[PolicyResult]:
    """Evaluate every Policy rule on ``plan``; ``check`` defaults to ``check_rule``."""
    checker = check or check_rule
    results: list[PolicyResult] = []
    for policy in sorted(catalog.of("Policy"), key=lambda m: m.name):
        for rule in policy.spec.get("rules", []):
            violations = checker(rule["schema"], plan)
            results.append(
                {
                    "policy": f"{policy.name}/{rule['name']}",
                    "effect": rule["effect"],
                    "message": rule["message"],
                    "passed": not violations,
                    "violations": violations,
                    "source": policy.file,
                    "layer": "packaged" if policy.layer == "packaged" else "operator",
                }
            )
    return results


_INDEXED = re.compile(r"^\$\.(egress\.allow|credentials|mounts)\[(\d+)\]")


def policy_denials(results: Sequence[PolicyResult]) -> dict[str, str]:
    """Map plan paths of deny violations to ``{placeholder: policy}`` keyed by category.

    The planner fills categories for indexed paths; a violation that names no single
    capability (e.g. hardening) denies the plan as a whole, not a category.
    """
    found: dict[str, str] = {}
    for result in results:
        if result["passed"] or result["effect"] != "deny":
            continue
        for violation in result["violations"]:
            match = _INDEXED.match(violation["path"])
            if match:
                found.setdefault(f"{match.group(1)}[{match.group(2)}]", result["policy"])
    return found
