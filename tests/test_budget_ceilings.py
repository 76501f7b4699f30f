"""A task cannot grant itself an unbounded budget: the operator's Policies set ceilings.

Turns, wall time, dollars and disk are limits a task sets for its own run; a task asking
for more than a Policy's ``spec.ceilings`` allows is refused (not trimmed), and only the
operator's folder can raise a ceiling.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kagura_agent.cli.main import main

FACTS = {"image_digests": {"kagura/agent:0.1.0": "sha256:" + "a" * 64}, "graduation": {}}


@pytest.fixture()
def base(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, state_dir: Path) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.delenv("KAGURA_AGENT_MANIFESTS", raising=False)
    (tmp_path / "facts.json").write_text(json.dumps(FACTS), encoding="utf-8")
    (tmp_path / "project").mkdir()
    return tmp_path


def _plan(
    base: Path, budget: str, capsys: pytest.CaptureFixture[str], *, ops: str | None = None
) -> dict[str, Any]:
    (base / "task.yml").write_text(
        "apiVersion: kagura.dev/v1\nkind: Task\nmetadata: {name: greedy}\n"
        f"spec:\n  project_root: project\n  steps: [ls]\n  budget: {budget}\n",
        encoding="utf-8",
    )
    argv = ["plan", "--json", "--facts", "facts.json", "task.yml"]
    if ops is not None:
        (base / "ops").mkdir(exist_ok=True)
        (base / "ops" / "ceilings.yml").write_text(ops, encoding="utf-8")
        argv[1:1] = ["--manifests", "ops"]
    code = main(argv)
    out, err = capsys.readouterr()
    plan: dict[str, Any] = json.loads(out)["plans"][0]["plan"]
    assert code == (0 if plan["applyable"] else 6), err  # plan exits 6 when apply would refuse
    return plan


def _ceiling_refusals(plan: dict[str, Any]) -> list[str]:
    return [r["message"] for r in plan["refusals"] if r["code"] == "budget-ceiling"]


def _policy(name: str, ceilings: str) -> str:
    return (
        f"apiVersion: kagura.dev/v1\nkind: Policy\nmetadata: {{name: {name}}}\n"
        f"spec:\n  ceilings: {ceilings}\n  rules: []\n"
    )


def test_a_task_over_every_packaged_ceiling_is_refused_on_each(
    base: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = _plan(base, "{turns: 5000, wall_time: 3650d, cost_usd: 1000000, disk: 5000g}", capsys)
    assert plan["applyable"] is False
    messages = _ceiling_refusals(plan)
    assert [m.split(" is over")[0] for m in messages] == [
        "budget turns 5000",
        "budget wall_time 3650d",
        "budget cost_usd $1000000",
        "budget disk 5000 GiB",
    ]
    assert all("Policy membrane (packaged)" in m for m in messages)
    assert main(["plan", "--facts", "facts.json", "task.yml"]) == 6
    text = capsys.readouterr().out
    assert "refused: budget disk 5000 GiB is over the ceiling 20g" in text
    assert "applyable    NO" in text


def test_a_budget_within_the_ceilings_is_applyable(
    base: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = _plan(base, "{turns: 1000, wall_time: 24h, cost_usd: 100, disk: 20g}", capsys)
    assert _ceiling_refusals(plan) == [] and plan["applyable"] is True


def test_apply_refuses_a_budget_over_a_ceiling_before_any_side_effect(
    base: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from kagura_agent.apply.run.executor import ApplyOptions, refuse_unapplyable
    from kagura_agent.errors import RefusedError

    plan = _plan(base, "{disk: 900g}", capsys)
    with pytest.raises(RefusedError, match="budget disk 900 GiB is over the ceiling 20g"):
        refuse_unapplyable(plan, ApplyOptions())  # type: ignore[arg-type]  # JSON of a Plan


def test_only_the_operators_folder_raises_a_ceiling(
    base: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    raised = _policy("big-disks", "{disk: 200g}")
    plan = _plan(base, "{disk: 100g, wall_time: 2d}", capsys, ops=raised)
    # disk raised by the operator; wall_time still under the packaged ceiling of 24h.
    assert _ceiling_refusals(plan) == [
        "budget wall_time 2d is over the ceiling 24h"
        " (Policy membrane (packaged); raise it in a Policy of yours: spec.ceilings)"
    ]


def test_within_the_operators_folder_the_lowest_ceiling_wins(
    base: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    two = _policy("loose", "{cost_usd: 500}") + "---\n" + _policy("tight", "{cost_usd: 5}")
    plan = _plan(base, "{cost_usd: 10}", capsys, ops=two)
    [message] = _ceiling_refusals(plan)
    assert "budget cost_usd $10 is over the ceiling 5 (Policy tight (operator)" in message


def test_a_ceiling_below_the_default_budget_refuses_tasks_that_set_none(
    base: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The default disk budget (1g) is a budget too: an operator ceiling of 512m refuses it."""
    plan = _plan(base, "{turns: 3}", capsys, ops=_policy("small", "{disk: 512m}"))
    [message] = _ceiling_refusals(plan)
    assert message.startswith("budget disk 1 GiB is over the ceiling 512m")
