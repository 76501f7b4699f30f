"""When the cost history sets a plan's budget (the planner, through ``plan --facts``).

The cost-history golden case (task sets turns 10, leaves wall time to history; reserve 50%)
with other histories: too few runs show the forecast and keep the budget; a limit grows by
at most one step (x1.5) of the newest run's a run, needs approval above the default, and
stops at the operator's ceiling, so learning never makes a plan unapplyable.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from kagura_agent.cli.main import main

CASE = Path(__file__).parent / "plans" / "cost-history"


def _plan(
    tmp_path: Path,
    walls: list[float],
    capsys: pytest.CaptureFixture[str],
    held: dict[str, Any] | None = None,
) -> dict[str, Any]:
    case = tmp_path / "case"
    shutil.copytree(CASE, case)
    facts = json.loads((case / "facts.json").read_text())
    runs = [
        {
            "turns": 4,
            "tokens": 30_000,
            "wall_seconds": wall,
            "cost_usd": 0.2,
            "outcome": "success",
            "budget": held,
        }
        for wall in walls
    ]
    facts["cost_history"] = {"count": len(runs), "runs": runs}
    (case / "facts.json").write_text(json.dumps(facts))
    argv = ["plan", str(case / "task.yml"), "--manifests", str(case / "manifests")]
    assert main([*argv, "--facts", str(case / "facts.json"), "--json"]) == 0
    plan: dict[str, Any] = json.loads(capsys.readouterr().out)["plans"][0]["plan"]
    assert main([*argv, "--facts", str(case / "facts.json")]) == 0
    plan["_text"] = capsys.readouterr().out
    return plan


def test_too_few_runs_show_the_forecast_and_keep_the_budget(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], state_dir: Path
) -> None:
    plan = _plan(tmp_path, [40.0, 50.0], capsys)
    budget = plan["budget"]
    assert budget["forecast"]["expected"]["wall_seconds"] == 45
    assert budget["forecast"]["learnt"] == [] and budget["forecast"]["min_runs"] == 3
    assert budget["wall_seconds"] == 600 and budget["tokens"] is None  # the brain's default
    assert budget["source"] == "task"
    assert "the budget is learnt from 3 runs on" in plan["_text"]


def test_a_learnt_limit_grows_one_step_a_run_with_approval_and_stops_at_the_ceiling(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], state_dir: Path
) -> None:
    day = 86400.0
    # Runs of 2 to 3 days, newest held to the default 10m: the next plan may take x1.5 of
    # that (15m), not the 3.9 days the history alone would teach, and asks for it.
    plan = _plan(tmp_path, [2 * day, 2.5 * day, 3 * day], capsys)
    budget = plan["budget"]
    assert budget["forecast"]["limits"]["wall_seconds"] > 3 * day
    assert budget["wall_seconds"] == 900 and budget["forecast"]["step"] == 1.5
    assert budget["forecast"]["over_default"] == ["wall_seconds"]
    [asked] = [a for a in plan["approvals"] if a["category"] == "budget:wall_seconds"]
    assert asked["class"] == "needs-approval"
    assert asked["reason"].startswith("learnt 15m wall from p80 of 3 runs + 50%, host-measured,")
    assert "over the default 10m wall (at most x1.5 a run)" in asked["reason"]
    assert "over the default, approval: budget:wall_seconds" in plan["_text"]
    # The newest run was held to 20h (approved before): x1.5 is past the 24h ceiling of
    # the packaged membrane Policy, so the plan stops at the ceiling, still applyable.
    held = {"turns": 10, "tokens": None, "wall_seconds": 20 * 3600, "cost_usd": None}
    plan = _plan(tmp_path / "held", [2 * day, 2.5 * day, 3 * day], capsys, held)
    assert plan["budget"]["wall_seconds"] == day
    assert plan["budget"]["forecast"]["previous"]["wall_seconds"] == 20 * 3600
    assert plan["applyable"] and not plan["refusals"]
    # Enough ordinary runs: learnt (p80 * 1.5) under the default, so nobody is asked;
    # tokens and dollars are the engine's word only (never learnt), turns the task's.
    plan = _plan(tmp_path / "again", [40.0, 50.0, 60.0], capsys)
    assert plan["budget"]["wall_seconds"] == 90 and plan["budget"]["tokens"] is None
    assert plan["budget"]["turns"] == 10 and plan["budget"]["cost_usd"] is None
    assert plan["budget"]["forecast"]["reported"]["tokens"] == 30_000
    assert not [a for a in plan["approvals"] if a["category"].startswith("budget:")]


def test_the_operations_page_quotes_the_learnt_budget_case_as_it_renders() -> None:
    """docs/operations.md shows the learnt-budget golden case's forecast line."""
    page = (CASE.parents[2] / "docs" / "operations.md").read_text(encoding="utf-8")
    quoted = re.search(r"— `(forecast 26 model calls.*?)` \(the golden", page, re.S)
    assert quoted is not None
    rendered = (CASE.parent / "learnt-budget" / "expected.txt").read_text(encoding="utf-8")
    assert " ".join(quoted.group(1).split()) in rendered
