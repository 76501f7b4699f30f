"""When the cost history sets a plan's budget (the planner, through ``plan --facts``).

The cost-history golden case (task sets turns 10, leaves wall time to history; reserve 50%)
with other histories: too few runs show the forecast and keep the budget; a history past
the operator's ceiling is learnt only up to that ceiling, so learning never makes a plan
unapplyable.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from kagura_agent.cli.main import main

CASE = Path(__file__).parent / "plans" / "cost-history"


def _plan(tmp_path: Path, walls: list[float], capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    case = tmp_path / "case"
    shutil.copytree(CASE, case)
    facts = json.loads((case / "facts.json").read_text())
    runs = [
        {"turns": 4, "tokens": 30_000, "wall_seconds": wall, "cost_usd": 0.2, "outcome": "success"}
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


def test_a_learnt_limit_stops_at_the_ceiling(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], state_dir: Path
) -> None:
    day = 86400.0
    plan = _plan(tmp_path, [2 * day, 2.5 * day, 3 * day], capsys)
    budget = plan["budget"]
    assert budget["forecast"]["limits"]["wall_seconds"] > day
    assert budget["wall_seconds"] == day  # the packaged membrane's 24h ceiling
    assert "wall_seconds" in budget["forecast"]["learnt"]
    assert plan["applyable"] and not plan["refusals"]
    # Enough ordinary runs: learnt (p80 * 1.5, tokens too), cost and turns stay the task's.
    plan = _plan(tmp_path / "again", [40.0, 50.0, 60.0], capsys)
    assert plan["budget"]["wall_seconds"] == 90 and plan["budget"]["tokens"] == 45_000
    assert plan["budget"]["turns"] == 10
