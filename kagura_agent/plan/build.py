"""From paths on disk to compiled plans: load, validate, gather facts, compile."""

from __future__ import annotations

from typing import Any

from kagura_agent.errors import UsageError


def plan_tasks(
    manifests: str | None,
    paths: list[str],
    *,
    facts_file: str | None = None,
    base_rev: str | None = None,
) -> list[dict[str, Any]]:
    from kagura_agent.facts import Facts, gather_facts
    from kagura_agent.manifest.workspace import load_workspace
    from kagura_agent.plan.planner import compile_plan

    workspace = load_workspace(manifests, paths, base_rev=base_rev)
    if not workspace.tasks:
        raise UsageError("no Task documents found in " + ", ".join(paths))
    fixed = None
    if facts_file is not None:
        from kagura_agent.cli.plan import load_facts_file

        fixed = Facts.from_json(load_facts_file(facts_file))
    plans = []
    for task in workspace.tasks:
        facts = fixed if fixed is not None else gather_facts(workspace.catalog, task)
        plans.append(compile_plan(workspace.catalog, task, facts))
    return plans
