"""A resumed session's plan, through ``plan --facts`` on the resumed-session golden case.

The checkpoint fact says what the session spent; each limit and each lease budget of the
plan is what is left, nothing left refuses the plan, and a saved plan applied once the
session has more left is stale. Unit checks of the spent record read back from a
checkpoint row (anything out of shape counts as nothing spent, never a crash).
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import pytest

from kagura_agent.cli.main import main
from kagura_agent.patterns.spent import LeaseSpent, Spent
from kagura_agent.plan.intent import fact_changes

CASE = Path(__file__).parent / "plans" / "resumed-session"
LEASE = "credential:cloudflare/dns-read"


def _plan(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], spent: dict[str, Any] | None
) -> dict[str, Any]:
    case = tmp_path / "case"
    if not case.exists():
        shutil.copytree(CASE, case)
    facts = json.loads((case / "facts.json").read_text())
    checkpoint = json.loads((CASE / "facts.json").read_text())["checkpoint"]
    facts["checkpoint"] = None if spent is None else {**checkpoint, "spent": spent}
    (case / "facts.json").write_text(json.dumps(facts))
    argv = ["plan", str(case / "task.yml"), "--manifests", str(case / "manifests")]
    main([*argv, "--facts", str(case / "facts.json"), "--json"])
    plan: dict[str, Any] = json.loads(capsys.readouterr().out)["plans"][0]["plan"]
    return plan


def test_each_limit_and_lease_is_what_the_session_has_left(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], state_dir: Path
) -> None:
    fresh = _plan(tmp_path, capsys, None)
    assert (fresh["budget"]["turns"], fresh["budget"]["wall_seconds"]) == (10, 1800)
    assert "resumed" not in fresh["budget"] and fresh["budget"]["source"] == "task"
    spent = {
        "turns": 3,
        "wall_seconds": 720,
        "leases": {LEASE: {"seconds": 3000, "renewals": 1}},
    }
    plan = _plan(tmp_path, capsys, spent)
    budget = plan["budget"]
    assert (budget["turns"], budget["wall_seconds"], budget["source"]) == (7, 1080, "session")
    [lease] = budget["resumed"]["leases"]
    assert (lease["budget_seconds"], lease["renewals"]) == (5400 - 3000, 2 - 1)
    # What the operator approves is the same task: the intent does not move with spending.
    assert plan["intent"] == fresh["intent"] and plan["applyable"]


@pytest.mark.parametrize(
    ("spent", "says"),
    [
        ({"turns": 10}, "session 'nightly' has spent its turn budget (10 turns spent"),
        ({"wall_seconds": 1800}, "session 'nightly' has spent its wall-time budget (30m wall"),
        (
            {"leases": {LEASE: {"seconds": 5370}}},
            f"session 'nightly' has 30s of its {LEASE} lease budget left, under the shortest"
            " lease its provider mints (1m)",
        ),
    ],
)
def test_nothing_left_refuses_the_plan(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], state_dir: Path, spent: Any, says: str
) -> None:
    plan = _plan(tmp_path, capsys, spent)
    assert not plan["applyable"]
    [refusal] = plan["refusals"]
    assert refusal["code"] == "session-spent" and says in refusal["message"], refusal


def test_a_saved_plan_with_less_lease_time_left_than_here_is_stale(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], state_dir: Path
) -> None:
    """Planned while the session had spent much, applied after a run finished it: here the
    lease would be minted longer than the saved plan shows (a capability)."""
    saved = _plan(tmp_path, capsys, {"leases": {LEASE: {"seconds": 5000}}})
    here = _plan(tmp_path, capsys, None)
    [change] = [c for c in fact_changes(saved, here) if c.what.startswith("lease budget")]
    assert change.capability and (change.saved, change.here) == (400, None)
    shorter = _plan(tmp_path, capsys, {"leases": {LEASE: {"seconds": 5100}}})
    [change] = [c for c in fact_changes(saved, shorter) if c.what.startswith("lease budget")]
    assert not change.capability


@pytest.mark.parametrize(
    "raw",
    [
        None,
        "spent",
        {"turns": -5, "cost_usd": math.inf, "wall_seconds": "60"},
        {"turns": True, "leases": {"x": "y", "credential:a/b": {"seconds": -1}}},
        {"leases": [1, 2]},
    ],
)
def test_a_spent_record_out_of_shape_counts_nothing(raw: Any) -> None:
    spent = Spent.from_json(raw)
    assert spent.turns == 0 and spent.cost_usd == 0.0 and spent.wall_seconds == 0
    assert all(held == LeaseSpent() for held in spent.leases.values())


def test_spending_adds_up_over_runs_and_reads_back() -> None:
    one = Spent(2, 0.25, 30, {LEASE: LeaseSpent(30, 0)})
    two = Spent(1, 0.5, 10, {LEASE: LeaseSpent(12, 1), "credential:x/y": LeaseSpent(5, 0)})
    both = one.plus(two)
    assert (both.turns, both.cost_usd, both.wall_seconds) == (3, 0.75, 40)
    assert both.leases == {LEASE: LeaseSpent(42, 1), "credential:x/y": LeaseSpent(5, 0)}
    assert Spent.from_json(both.to_json()) == both


def test_the_operations_page_shows_the_golden_resumed_plan() -> None:
    """docs/operations.md shows the resumed-session golden case's lines as planned."""
    page = (CASE.parents[2] / "docs" / "operations.md").read_text(encoding="utf-8")
    expected = (CASE / "expected.txt").read_text(encoding="utf-8").splitlines()
    for start in ("  credentials", "  budget"):
        [line] = [line for line in expected if line.startswith(start)]
        assert line in page, line
