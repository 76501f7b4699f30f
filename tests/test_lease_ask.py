"""A lease's budget is put to the operator before it ends, through ``kagura-agent apply`` in
a real container with a real short lease at the Cloudflare fake.

The task holds a Cloudflare token for a 60-second budget; its step needs it 55 seconds
in. apply runs as ``serve`` runs it (``--steer-stdin``): the test is the cockpit, answering
each ``ask`` by recording a decision in the approval log and nudging apply's stdin.
Approved, the budget grows (the plan's again, one more renewal), the short credential is
renewed at the fake inside it and the step finds its token; denied, the lease fails
closed at its end and the run stops. Before, the only credential of a budget under five
minutes was due for renewal at once and the first tick exhausted it — and a lease asked
about once was never asked about again.
"""

from __future__ import annotations

import subprocess
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from apply_helpers import REPO, cli_env, make_project, manifest_set, run_ids, write_task
from test_midrun_apply import Operator, finish
from test_team_runners import cloudflare_provider

from kagura_agent.apply.midrun.grants import amendments
from kagura_agent.state import StateStore
from testing.fake_cloudflare import ROOT_TOKEN

pytestmark = pytest.mark.docker

CATEGORY = "budget:credential:cf/dns-read"
STEPS = ["sleep 55", "test -s /run/kagura/creds/cloudflare/token"]


def _apply(tmp_path: Path, state_dir: Path, cloudflare: Any, answer: str) -> dict[str, Any]:
    folder = manifest_set(tmp_path, cloudflare_provider(cloudflare))
    project = make_project(tmp_path)
    task = write_task(
        project,
        "short-lease",
        {
            "brain": "script",
            "steps": STEPS,
            "budget": {"wall_time": "5m"},
            "credentials": [{"provider": "cf", "scope": "dns-read", "budget": "60s"}],
        },
    )
    argv = [sys.executable, "-m", "kagura_agent", "apply", "--yes", "--json", "--steer-stdin"]
    argv += ["--approval-timeout", "60", "--manifests", str(folder), str(task)]
    proc = subprocess.Popen(
        argv,
        env=cli_env(state_dir, KAGURA_TEST_CF_ROOT=ROOT_TOKEN),
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    operator = Operator(proc, state_dir, lambda ask: answer)
    result = finish(proc, operator, timeout=300)
    [run_id] = run_ids(state_dir)
    with StateStore(state_dir / "state.db") as store:
        recorded = amendments(store, run_id)
    return {
        "result": result,
        "code": proc.returncode,
        "asks": operator.asks,
        "notes": operator.notes(),
        "recorded": recorded,
        "raw": "".join(operator.raw),
    }


def _expiry(mint: dict[str, Any]) -> datetime:
    return datetime.fromisoformat(str(mint["expires_on"]).replace("Z", "+00:00"))


def test_an_approved_lease_budget_is_renewed_at_the_provider_and_the_run_goes_on(
    docker_client: Any, cloudflare: Any, tmp_path: Path, state_dir: Path
) -> None:
    run = _apply(tmp_path, state_dir, cloudflare, "approve")
    assert (run["code"], run["result"].get("outcome")) == (0, "success"), run["raw"]
    first = run["asks"][0]
    assert first["category"] == CATEGORY, first
    assert "runs out in" in first["text"] and "budget 1m → 2m" in first["text"], first["text"]
    granted = [r for r in run["recorded"] if r["outcome"] == "granted"]
    assert granted and granted[0]["category"] == CATEGORY
    assert granted[0]["who"] == "test:operator"
    assert "extended to 120s, 1 renewals" in granted[0]["detail"]
    # The short credential was renewed at the provider inside the grown budget: a second
    # token, dated past the first budget's end; every token is revoked by the end.
    mints = cloudflare.ops("mint")
    assert len(mints) >= 2, mints
    assert _expiry(mints[1]) > _expiry(mints[0])
    assert cloudflare.live_tokens() == []
    assert ROOT_TOKEN not in run["raw"]


def test_a_denied_lease_budget_fails_closed_at_its_end_and_the_run_stops(
    docker_client: Any, cloudflare: Any, tmp_path: Path, state_dir: Path
) -> None:
    run = _apply(tmp_path, state_dir, cloudflare, "deny")
    assert run["code"] != 0 and run["result"].get("outcome") == "failed", run["raw"]
    [ask] = run["asks"]
    assert ask["category"] == CATEGORY
    [row] = run["recorded"]
    assert (row["category"], row["outcome"], row["who"]) == (CATEGORY, "denied", "test:operator")
    assert any("budget exhausted" in note for note in run["notes"]), run["notes"]
    # One token, held to its budget's end, then revoked; the step that needed it past the
    # end never passed.
    [mint] = cloudflare.ops("mint")
    assert [r["id"] for r in cloudflare.ops("revoke")] == [mint["id"]]
    assert cloudflare.live_tokens() == []
