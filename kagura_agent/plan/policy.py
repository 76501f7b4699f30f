"""Policies: JSON Schemas the compiled plan must satisfy (``deny`` or ``warn``).

A rule passes when the plan JSON validates against its schema; each validation error
is a violation at a JSON path of the plan. No new policy language: operators write the
same JSON Schema the manifests use, plus one keyword for host names:

``deniedDomains: [pastebin.com, ...]`` on a string fails when that host is in the family
of a listed domain — the domain, any subdomain (``www.pastebin.com``), or a wildcard that
reaches it (``*.pastebin.com``, ``*.com``). String matching would let every one of these
through, which is why deny rules on hosts use this keyword and not ``enum``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kagura_agent.manifest.catalog import Catalog
from kagura_agent.manifest.hosts import normalize_host
from kagura_agent.plan.model import PolicyResult, Violation

RuleChecker = Callable[[dict[str, Any], Mapping[str, Any]], list[Violation]]
# Part of every cached pass key (plan/build.py): a change in what the checker means must
# never be answered by a pass remembered from the old meaning.
CHECKER_VERSION = "2-denied-domains"


def _bare(host: str) -> str:
    name, _ = normalize_host(host)
    return (name or host).lower().rstrip(".")


def reaches(entry: str, domain: str) -> bool:
    """True when the egress entry ``entry`` can reach ``domain`` or one of its subdomains."""
    host = _bare(entry)
    target = _bare(domain).removeprefix("*.")
    if host.startswith("*."):
        covered = host[2:]
        # *.pastebin.com / *.www.pastebin.com reach the family; *.com reaches pastebin.com.
        return _within(covered, target) or _within(target, covered)
    return _within(host, target)


def _within(name: str, domain: str) -> bool:
    return name == domain or name.endswith("." + domain)


def _denied_domains(validator: Any, domains: Any, instance: Any, schema: Any) -> Any:
    from jsonschema.exceptions import ValidationError

    if not isinstance(instance, str) or not isinstance(domains, list):
        return
    for domain in domains:
        if isinstance(domain, str) and reaches(instance, domain):
            yield ValidationError(f"{instance!r} reaches the denied domain {domain!r}")
            return


def rule_validator(schema: dict[str, Any]) -> Any:
    from jsonschema import Draft202012Validator, validators

    extended = validators.extend(  # type: ignore[no-untyped-call]
        Draft202012Validator, {"deniedDomains": _denied_domains}
    )
    return extended(schema)


def check_rule(schema: dict[str, Any], plan: Mapping[str, Any]) -> list[Violation]:
    """The violations of one rule: every place the plan does not satisfy ``schema``."""
    violations: list[Violation] = []
    for error in rule_validator(schema).iter_errors(plan):
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


_INDEXED = re.compile(r"^\$\.(egress\.allow|credentials|mounts|tool_servers)\[(\d+)\]")


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
