"""From paths on disk to compiled plans: load, validate, gather facts, compile."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kagura_agent.errors import UsageError
from kagura_agent.facts import Facts, ImagePin, gather_facts
from kagura_agent.manifest.cache import PassCache, key
from kagura_agent.manifest.catalog import Catalog, layer_paths
from kagura_agent.manifest.task import ResolvedTask
from kagura_agent.manifest.workspace import load_workspace
from kagura_agent.plan.model import Plan, Violation
from kagura_agent.plan.planner import compile_plan
from kagura_agent.plan.policy import CHECKER_VERSION, check_rule
from kagura_agent.state import refuse_written, state_location


@dataclass(frozen=True)
class Compiled:
    """A plan with what it was compiled from (apply amends it mid-run from these)."""

    catalog: Catalog
    task: ResolvedTask
    facts: Facts
    plan: Plan


def plan_tasks(
    manifests: str | None,
    paths: list[str],
    *,
    facts_file: str | None = None,
    base_rev: str | None = None,
    pin: ImagePin | None = None,
) -> list[Plan]:
    """Compile every task in ``paths``; ``pin`` is a saved plan's image (apply re-plans
    with it, so the pinned image is the fact when this host has it)."""
    found = compile_tasks(manifests, paths, facts_file=facts_file, base_rev=base_rev, pin=pin)
    return [c.plan for c in found]


def compile_tasks(
    manifests: str | None,
    paths: list[str],
    *,
    facts_file: str | None = None,
    base_rev: str | None = None,
    pin: ImagePin | None = None,
    proxy_pin: ImagePin | None = None,
) -> list[Compiled]:
    """Every task in ``paths``, compiled, with its catalog, resolved task and facts;
    ``pin`` and ``proxy_pin`` are a saved plan's agent and egress proxy images."""
    workspace = load_workspace(manifests, paths, base_rev=base_rev)
    if not workspace.tasks:
        raise UsageError("no Task documents found in " + ", ".join(paths))
    fixed = None
    if facts_file is not None:
        fixed = Facts.load(facts_file)
    elif base_rev is None:
        # The manifests grant and the task files request as the operator: none of them
        # may be what a run's agent wrote (./manifests below a run's root, a task file
        # beside the run's own). At a git revision, git holds them.
        refuse_written(
            "the manifest set or task file",
            layer_paths(workspace.catalog) + [task.path for task in workspace.tasks],
            state_location(),
        )
    plans = []
    checker = CachedRuleChecker()
    for task in workspace.tasks:
        facts = (
            fixed if fixed is not None else gather_facts(workspace.catalog, task, pin, proxy_pin)
        )
        plan = compile_plan(workspace.catalog, task, facts, check_rule=checker)
        _refuse_undecodable(plan)
        plans.append(Compiled(workspace.catalog, task, facts, plan))
    checker.passed.save()
    return plans


def _refuse_undecodable(value: Any, path: str = "$") -> None:
    """A plan is UTF-8 JSON, stored and shown as text: a name that is not UTF-8 (a project
    folder or file whose name has other bytes; Python carries them as lone surrogates)
    cannot be in one. Refused here, once for every field, instead of failing where the
    plan is written, stored or printed."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            shown = value.encode("utf-8", "surrogateescape").decode("ascii", "backslashreplace")
            raise UsageError(
                f"the plan's {path} is not UTF-8 text: {shown}",
                hint="kagura-agent reads file and folder names as UTF-8; rename it",
            ) from None
    elif isinstance(value, Mapping):
        for name, item in value.items():
            _refuse_undecodable(name, path)
            _refuse_undecodable(item, f"{path}.{name}")
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            _refuse_undecodable(item, f"{path}[{index}]")


# Top-level schema keywords that constrain nothing outside ``properties`` (for an object).
_NEUTRAL = frozenset({"properties", "description", "title", "$comment", "$defs", "$schema", "$id"})


def _read_by(schema: dict[str, Any], plan: Mapping[str, Any]) -> Any:
    """The part of ``plan`` whose value decides ``schema`` (all of it unless the schema only
    has ``properties``: then those keys, absent ones marked absent)."""
    names = schema.get("properties")
    shape_only = set(schema) - _NEUTRAL <= {"type"} and schema.get("type", "object") == "object"
    if not isinstance(names, dict) or not shape_only:
        return plan
    return {"<only>": {name: [plan[name]] if name in plan else [] for name in sorted(names)}}


class CachedRuleChecker:
    """``policy.check_rule``, remembering on disk what each (rule, plan) pair gave.

    Passing is a pure function of the rule schema and the plan JSON, so the key is their
    canonical JSON; a failing pair is stored with its violations, in full. A rule
    that only constrains named top-level keys (``properties``, the usual shape) reads
    nothing else of the plan, so only those keys go into its key: a plan that differs in
    facts no rule looks at (cost history, graduation version) still hits the cache, and
    apply does not import jsonschema (~100 ms) to re-check an unchanged plan.
    """

    def __init__(self) -> None:
        self.passed = PassCache("policy-pass")

    def __call__(self, schema: dict[str, Any], plan: Mapping[str, Any]) -> list[Violation]:
        digest = key(
            "policy",
            CHECKER_VERSION,
            json.dumps(schema, sort_keys=True, separators=(",", ":")),
            json.dumps(_read_by(schema, plan), sort_keys=True, separators=(",", ":"), default=str),
        )
        known = self.passed.read(digest)
        if known is not None:
            with contextlib.suppress(ValueError):
                return list(json.loads(known)) if known else []
        violations = check_rule(schema, plan)
        # A rule's violations are as pure as its passing: a warn rule that fails on every
        # plan (a standing secret) is not re-checked with jsonschema each time either.
        self.passed.add(digest, json.dumps(violations) if violations else "")
        return violations
