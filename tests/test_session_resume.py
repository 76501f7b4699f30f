"""A resumed session runs within what it has left, through ``kagura-agent apply`` in a real
container.

The first run of session ``work`` completes one step (holding a leased credential and
spending wall time), then fails; its checkpoint keeps what it spent, by the host's count.
The next plan of the task shows the remainder (``budget.resumed``): each limit is the
task's less what was spent, the lease budget too, and apply mints the lease for the lease
time left only. Before, the checkpoint stored the plan's full budget, nothing read it back,
and the resumed run got its whole budget and a full-length lease again.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from apply_helpers import (
    all_leases,
    cli_env,
    kagura,
    last_json,
    make_project,
    manifest_set,
    run_ids,
    token_provider,
    write_task,
)

from kagura_agent.patterns.checkpoint import load_checkpoint
from kagura_agent.state import StateStore
from kagura_agent.units import format_duration

pytestmark = pytest.mark.usefixtures("docker_client")

TOKEN = "kagura-resume-canary-" + "r" * 24
LEASE = "credential:token/use"
STEP_SECONDS = 4


def _task(project: Path) -> Path:
    return write_task(
        project,
        "resumable",
        {
            "brain": "script",
            "session": "work",
            # Step 1 holds the lease a while; step 2 fails until the operator's file exists.
            "steps": [f"sleep {STEP_SECONDS}", "test -f go"],
            "budget": {"turns": 6, "wall_time": "10m"},
            "credentials": [{"provider": "token", "scope": "use", "ttl": "15m", "budget": "15m"}],
        },
    )


def _plan(folder: Path, task: Path, env: dict[str, str]) -> dict[str, Any]:
    done = kagura(["plan", "--json", "--manifests", str(folder), str(task)], env)
    assert done.returncode == 0, done.stderr
    [result] = json.loads(done.stdout)["plans"]
    return dict(result["plan"])


def test_a_resumed_session_is_planned_and_leased_from_what_it_has_left(
    docker_client: Any, tmp_path: Path, state_dir: Path
) -> None:
    folder = manifest_set(tmp_path, token_provider())
    project = make_project(tmp_path)
    task = _task(project)
    env = cli_env(state_dir, KAGURA_TEST_TOKEN=TOKEN)

    first = kagura(["apply", "--yes", "--json", "--manifests", str(folder), str(task)], env)
    assert first.returncode != 0, first.stdout + first.stderr
    assert last_json(first.stdout)["outcome"] == "failed"
    with StateStore(state_dir / "state.db") as store:
        checkpoint = load_checkpoint(store, "work")
    assert checkpoint is not None and checkpoint.step == 1
    spent = checkpoint.spent
    # The host's count: the step done, its wall time, the lease held meanwhile.
    assert spent.turns >= 1 and spent.wall_seconds >= STEP_SECONDS, spent
    held = spent.leases[LEASE]
    assert held.seconds >= STEP_SECONDS and held.renewals == 0, spent
    # What was left at the checkpoint is the budget less what was spent, not the budget.
    assert checkpoint.budget_left["wall_seconds"] == 600 - spent.wall_seconds
    assert checkpoint.budget_left["turns"] == 6 - spent.turns

    plan = _plan(folder, task, env)
    budget = plan["budget"]
    assert budget["source"] == "session"
    assert (budget["turns"], budget["wall_seconds"]) == (6 - spent.turns, 600 - spent.wall_seconds)
    resumed = budget["resumed"]
    assert (resumed["session"], resumed["step"]) == ("work", 1)
    assert resumed["spent"] == {
        "turns": spent.turns,
        "wall_seconds": spent.wall_seconds,
        "cost_usd": 0.0,
    }
    [lease] = resumed["leases"]
    assert lease == {
        "category": LEASE,
        "spent_seconds": held.seconds,
        "spent_renewals": 0,
        "budget_seconds": 900 - held.seconds,
        "renewals": 0,
    }
    shown = kagura(["plan", "--manifests", str(folder), str(task)], env)
    assert "resumed session 'work' at step 1: spent" in shown.stdout, shown.stdout
    left = format_duration(900 - held.seconds)
    assert f"(the session has {left} and 0 renewals left)" in shown.stdout

    (project / "go").write_text("")
    if os.geteuid() == 0:
        os.chown(project / "go", 1000, 1000)
    second = kagura(["apply", "--yes", "--json", "--manifests", str(folder), str(task)], env)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "resuming session 'work' from step 2" in second.stdout + second.stderr
    first_run, second_run = run_ids(state_dir)
    minted = {row["run_id"]: row for row in all_leases(env)}
    # The first run's lease was minted for the whole 15m; the resumed one's only for
    # what the session had left of it.
    assert minted[first_run]["ttl_seconds"] == 900, minted
    assert minted[second_run]["ttl_seconds"] <= 900 - held.seconds, minted
    with StateStore(state_dir / "state.db") as store:
        assert load_checkpoint(store, "work") is None  # finished: nothing left to resume
    assert TOKEN not in first.stdout + first.stderr + second.stdout + second.stderr
