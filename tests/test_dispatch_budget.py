"""A dispatched child is planned from what its parent has left (apply/midrun/allotment.py,
plan/budget.py), never from the brain's defaults, and the parent with its children stays
within the parent's budget.

Unit part: what is left, the even share, what children hold and used, and lease time.
Docker part: a real parent run (script brain, 2 turns and $0.05) dispatches three
children from one step through ``memtool``: each child's saved plan holds at most what
was left when it asked, the third finds nothing left and is refused saying so, and the
parent, whose children used its turns, is stopped at its next step. Before, each child
got the script brain's 50 turns and no dollar limit.
"""

from __future__ import annotations

import json
import shlex
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from apply_helpers import cli_env, kagura, last_json, make_project, manifest_set, write_task
from test_dispatch_runtime import doc_examples

from kagura_agent.apply.midrun.allotment import Allotments, Left, lease_grants, left
from kagura_agent.clock import FixedClock
from kagura_agent.membrane.leases import Broker, LeaseRequest
from kagura_agent.state import open_store
from testing.agent_test_image import ensure_agent_test_image

BUDGET = {"turns": 2, "cost_usd": 0.05, "wall_seconds": 300}
MEMTOOL = "python3 -m kagura_agent.brain.memtool dispatch"


def test_what_is_left_counts_the_larger_of_reported_turns_and_counted_calls() -> None:
    fresh = left(BUDGET, turns=0, usd=0.0, calls=None, held=(0, 0.0), elapsed=20.5)
    assert fresh == Left(turns=2, cost_usd=0.05, wall_seconds=279)
    assert fresh.shortfall() == []
    # The engine says one turn, the proxy counted two calls: nothing is left.
    spent = left(BUDGET, turns=1, usd=0.01, calls=2, held=(0, 0.0), elapsed=1)
    assert spent.turns == 0 and spent.cost_usd == 0.04
    assert spent.shortfall() == [
        "the parent's turn budget is spent (or held by its running sub-agents)"
    ]
    # What children hold is the parent's no more.
    held = left(BUDGET, turns=0, usd=0.0, calls=0, held=(1, 0.05), elapsed=1)
    assert (held.turns, held.cost_usd) == (1, 0.0) and len(held.shortfall()) == 1
    late = left(BUDGET, turns=0, usd=0.0, calls=0, held=(0, 0.0), elapsed=295)
    assert "5s of its wall budget left" in late.shortfall()[0]
    # No limit stays no limit; the wall is shared by nobody (it passes for all at once).
    free = left({"turns": None, "cost_usd": None, "wall_seconds": 60}, turns=9, usd=1.0,
                calls=None, held=(0, 0.0), elapsed=0)  # fmt: skip
    assert free == Left(turns=None, cost_usd=None, wall_seconds=60)
    assert fresh.shared(2) == Left(turns=1, cost_usd=0.025, wall_seconds=279)
    assert Left(1, 0.01, 60).shared(2) == Left(1, 0.005, 60)  # a last turn goes whole
    assert fresh.to_spec() == {"wall_time": "279s", "turns": 2, "cost_usd": 0.05}


def test_a_child_holds_its_share_while_it_runs_and_is_charged_what_it_used() -> None:
    held = Allotments()
    held.reserve(1, 5, 0.5)
    held.reserve(2, 3, None)
    assert held.held == (8, 0.5) and held.holding == 2 and held.used == (0, 0.0)
    # Child 1 says 2 turns but the proxy counted 4 calls: it used 4 (and its $0.10).
    held.settle(1, {"turns": 2, "model_calls": 4, "cost_usd": 0.1})
    assert held.used == (4, 0.1) and held.held == (7, 0.1)
    # Child 2's engine claims 999 turns and $99: never more than it held.
    held.settle(2, {"turns": 999, "model_calls": None, "cost_usd": 99.0})
    assert held.used == (7, 0.1) and held.holding == 0
    held.reserve(3, 9, 9.0)
    held.release(3)  # refused before it ran: it held nothing
    held.settle(3, {"turns": 9})  # (and a result for it changes nothing)
    assert held.held == (7, 0.1)


def test_a_childs_credential_is_held_no_longer_than_the_parents_lease_has_left(
    state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KAGURA_TEST_TOKEN", "tok-" + "t" * 30)
    clock = FixedClock(datetime.now(UTC).replace(microsecond=0))
    request = LeaseRequest.from_plan(
        {
            "name": "token",
            "provider": "token",
            "type": "static",
            "scope": "use",
            "scope_spec": {"env": "TEST_TOKEN"},
            "ttl_seconds": 900,
            "renewals": 1,
            "budget_seconds": 1800,
            "secret_ref": "env:KAGURA_TEST_TOKEN",
            "standing": True,
            "class": "baseline",
            "category": "credential:token/use",
        }
    )
    with open_store() as store:
        broker = Broker(store, run_id="run-parent", clock=clock)
        lease = broker.acquire(request)
        try:
            clock.advance(timedelta(minutes=20))
            asked = [{"provider": "token", "scope": "use"}, {"provider": "other", "scope": "x"}]
            grants = lease_grants(asked, broker.leases, clock.now())
            # 30m budget, 20m gone: 10m left, shorter than one 15m lease (the broker
            # ends the child's lease there); no renewal fits in it.
            assert grants == [
                {"provider": "token", "scope": "use", "ttl": "900s", "renewals": 0,
                 "budget": "600s"},
                {"provider": "other", "scope": "x"},  # not the parent's: the planner refuses
            ]  # fmt: skip
            clock.advance(timedelta(minutes=11))
            with pytest.raises(ValueError, match="lease of token/use has run out"):
                lease_grants(asked[:1], broker.leases, clock.now())
        finally:
            lease.release()


# --- a real parent, its children in real containers ----------------------------------


def _dispatch(name: str) -> str:
    step = shlex.quote(f"echo {name} > {name}.txt")
    return f"{MEMTOOL} {shlex.quote('do ' + name)} --name {name} --step {step} > {name}.json"


def test_children_are_planned_from_what_the_parent_has_left_and_the_family_stays_within_it(
    docker_client: Any, tmp_path: Path, state_dir: Path
) -> None:
    image_ref = ensure_agent_test_image(docker_client)
    image = {
        "kind": "Image",
        "metadata": {"name": "agent-test"},
        "spec": {"recipe": "images/agent", "tag": image_ref, "baseline": True},
    }
    manifests = manifest_set(tmp_path, image)
    project = make_project(tmp_path)
    first = "; ".join(_dispatch(name) for name in ("one", "two", "three")) + "; true"
    task = write_task(
        project,
        "parent",
        {
            "image": "agent-test",
            "brain": "script",
            "budget": {"turns": 2, "cost_usd": 0.05, "wall_time": "5m"},
            "steps": [first, "true"],
        },
    )
    env = cli_env(state_dir)
    done = kagura(["apply", "--yes", "--json", "--manifests", str(manifests), str(task)], env)
    result = last_json(done.stdout)
    parent_run = result["run_id"]
    children = {c["task"]: c for c in result["children"]}
    plans = {
        name: json.loads((state_dir / "dispatch" / parent_run / f"{name}.plan.json").read_text())[
            "budget"
        ]
        for name in ("one", "two")
    }
    for name, budget in plans.items():
        # 2 turns and $0.05 left, two child slots (the packaged Policy): a share each.
        assert (budget["turns"], budget["cost_usd"]) == (1, 0.025), (name, budget)
        assert budget["wall_seconds"] <= 300 and budget["source"] == "parent"
        assert budget["parent"]["bound"] == "remaining"
        assert children[name]["outcome"] == "success", children[name]
    # One and two used a turn each: nothing is left for three.
    three = children["three"]
    assert three["outcome"] == "refused" and three["run"] is None
    assert three["reasons"] == [
        "the parent's turn budget is spent (or held by its running sub-agents)"
    ]
    answer = json.loads((project / "three.json").read_text())
    assert answer == {"outcome": "refused", "task": "three", "reasons": three["reasons"]}
    [shown] = [json.loads(b) for b in doc_examples("json") if '"three"' in b]
    assert shown == answer  # docs/dispatch.md shows this answer
    # The parent's own budget counts what its children used: stopped at its next step.
    assert result["outcome"] == "failed", result
    assert result["brain_error"] == (
        "budget: 2 turns spent of a 2-turn budget (2 by its sub-agents), not extended"
    )
