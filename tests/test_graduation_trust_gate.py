"""The graduation gate uses the recency-weighted trust score the plan shows: a graduated
capability of a task kind whose recent failures outweigh its successes (trust below the
Graduation knob ``min_trust``, default 0.5) needs approval again; old failures, no runs,
or ``min_trust: 0`` leave it graduated."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from kagura_agent.plan.build import plan_tasks
from kagura_agent.plan.render import render_text
from kagura_agent.ui import Style

CASE = Path(__file__).resolve().parent / "plans" / "graduated"
GRADUATED = ("credential:cloudflare/dns-write", "egress:cloudflare-api")
DAY = 86400.0


def _run(outcome: str) -> dict[str, Any]:
    return {"turns": 3, "wall_seconds": 50.0, "cost_usd": None, "retries": 0, "outcome": outcome}


def _plan(tmp_path: Path, failed_ago: list[float], successes: int, gate: str = "") -> Any:
    case = tmp_path / "case"
    shutil.copytree(CASE, case)
    facts = json.loads((case / "facts.json").read_text())
    facts["cost_history"] = {
        "count": successes + len(failed_ago),
        "runs": [_run("success")] * successes + [_run("failure")] * len(failed_ago),
    }
    facts["known_failures"] = (
        [
            {
                "failure": "dns record conflict",
                "fix": None,
                "trust": "trusted",
                "failure_id": "m-0001",
                "fix_id": None,
                "last_failed": "2026-12-01T00:00:00Z",
                "occurrences": len(failed_ago),
                "ages_seconds": failed_ago,
                "fix_changes": [],
            }
        ]
        if failed_ago
        else []
    )
    (case / "facts.json").write_text(json.dumps(facts))
    if gate:
        (case / "manifests" / "graduation.yml").write_text(
            "apiVersion: kagura.dev/v1\nkind: Graduation\nmetadata: {name: mine}\n"
            f"spec:\n  {gate}\n"
        )
    (plan,) = plan_tasks(
        str(case / "manifests"), [str(case / "task.yml")], facts_file=str(case / "facts.json")
    )
    return plan


def _classes(plan: Any) -> dict[str, tuple[str, str]]:
    return {
        a["category"]: (a["class"], a["reason"])
        for a in plan["approvals"]
        if a["category"] in GRADUATED
    }


@pytest.mark.usefixtures("state_dir", "without_docker")
def test_recent_failures_below_min_trust_make_a_graduated_capability_ask_again(
    tmp_path: Path,
) -> None:
    plan = _plan(tmp_path, failed_ago=[3600.0, 2 * 3600.0], successes=1)
    trust = plan["memory"]["failure_trust"]
    assert trust["min_trust"] == 0.5 and trust["score"] is not None and trust["score"] < 0.5
    for klass, reason in _classes(plan).values():
        assert klass == "needs-approval"
        assert f"trust to {trust['score']} (below min_trust 0.5)" in reason
    text = render_text(plan, Style(False))
    assert "below min_trust 0.5: graduated capabilities are asked for again" in text


@pytest.mark.usefixtures("state_dir", "without_docker")
@pytest.mark.parametrize(
    ("failed_ago", "successes", "gate"),
    [
        ([30 * DAY, 40 * DAY], 1, ""),  # the same failures, a month old: they weigh little
        ([], 0, ""),  # no runs: no score, nothing held back
        ([3600.0, 2 * 3600.0], 1, "min_trust: 0"),  # the gate off
    ],
    ids=["old-failures", "no-runs", "gate-off"],
)
def test_old_failures_no_runs_or_the_gate_off_keep_it_graduated(
    tmp_path: Path, failed_ago: list[float], successes: int, gate: str
) -> None:
    plan = _plan(tmp_path, failed_ago, successes, gate)
    classes = _classes(plan)
    assert set(classes) == set(GRADUATED)
    assert {klass for klass, _ in classes.values()} == {"graduated"}, classes
