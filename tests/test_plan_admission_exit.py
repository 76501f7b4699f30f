"""A plan that says ``applyable yes`` is one apply runs; one apply refuses, plan refuses too.

- a credential whose budget is shorter than anything its provider mints (a GitHub App
  installation token always lives one hour) is refused by ``plan`` (exit 6), by ``show``
  and by ``apply`` before anything starts — not "budget exhausted" at apply;
- a mint that never reached the provider closes its ledger row (nothing can lapse);
- ``plan`` exits 6 for a plan that is not applyable (``--allow-unapplyable``: 0);
- ``apply`` refuses such a plan before it asks to confirm, and never blames ``--yes``.
"""

from __future__ import annotations

import json
import os
import pty
import socket
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from apply_helpers import REPO, cli_env, kagura, make_project, manifest_set, write_task

from kagura_agent.clock import FixedClock
from kagura_agent.errors import SetupError
from kagura_agent.membrane.leases import Broker, LeaseRequest, Ledger, sweep
from kagura_agent.membrane.lifetimes import lifetime_problem
from kagura_agent.plan.admission import admit
from kagura_agent.state import open_store
from testing.keys import rsa_pair

# Plans here need no image facts, and every refusal comes before Docker is reached.
pytestmark = pytest.mark.usefixtures("without_docker")

GITHUB = {
    "kind": "CredentialProvider",
    "metadata": {"name": "gh"},
    "spec": {
        "type": "github-app",
        "secret": "env:KAGURA_TEST_GH_KEY",
        "github": {"app_id": "4242", "installation_id": "77"},
        "baseline_scopes": ["site"],
        "scopes": {
            "site": {
                "description": "read one repository",
                "repositories": ["site"],
                "permissions": {"contents": "read"},
            }
        },
    },
}


def _task(tmp_path: Path, ttl: str, budget: str) -> tuple[Path, Path]:
    manifests = manifest_set(tmp_path, GITHUB)
    project = make_project(tmp_path)
    task = write_task(
        project,
        "gh-task",
        {
            "steps": ["true"],
            "credentials": [{"provider": "gh", "scope": "site", "ttl": ttl, "budget": budget}],
        },
    )
    return manifests, task


def _plan(manifests: Path, task: Path, env: dict[str, str], *extra: str) -> Any:
    return kagura(["plan", "--manifests", str(manifests), str(task), *extra], env)


def test_a_budget_shorter_than_the_providers_credentials_is_a_plan_refusal(
    tmp_path: Path, state_dir: Path
) -> None:
    manifests, task = _task(tmp_path, "20m", "20m")
    env = cli_env(state_dir)
    done = _plan(manifests, task, env, "--json")
    assert done.returncode == 6, done.stderr
    [result] = json.loads(done.stdout)["plans"]  # one JSON document, the refusal in it
    refusals = result["admission"]["refusals"]
    assert [r["code"] for r in refusals] == ["lease-lifetime"]
    assert "GitHub installation tokens always live 1h" in refusals[0]["message"]
    assert "ttl and budget of at least 1h" in refusals[0]["message"]
    assert result["plan"]["applyable"] is False
    # The text view says so, and apply refuses before any lease, proxy or container.
    text = _plan(manifests, task, env)
    assert "applyable    NO" in text.stdout and text.returncode == 6
    applied = kagura(["apply", "--yes", "--manifests", str(manifests), str(task)], env)
    assert applied.returncode == 6, applied.stderr
    assert "could never be minted" in applied.stderr
    assert "budget exhausted" not in applied.stderr
    assert not (state_dir / "state.db").exists() or not Ledger(open_store()).rows()


def test_an_hour_of_budget_plans_and_the_check_agrees_with_the_broker(
    tmp_path: Path, state_dir: Path
) -> None:
    manifests, task = _task(tmp_path, "1h", "1h")
    done = _plan(manifests, task, cli_env(state_dir), "--json")
    [result] = json.loads(done.stdout)["plans"]
    assert result["admission"]["refusals"] == [], result["admission"]
    # The one rule, for every provider type the broker knows.
    entry = {"provider": "p", "scope": "s", "ttl_seconds": 900, "budget_seconds": 900}
    assert lifetime_problem({**entry, "type": "aws-sts"}) == ""
    assert lifetime_problem({**entry, "type": "github-app"}) != ""
    assert lifetime_problem({**entry, "type": "cloudflare", "budget_seconds": 120}) == ""
    assert lifetime_problem({**entry, "type": "aws-sts", "budget_seconds": 600}) != ""


def test_admit_recomputes_the_lifetime_check_from_the_plan_itself(
    tmp_path: Path, state_dir: Path
) -> None:
    manifests, task = _task(tmp_path, "1h", "1h")
    saved = tmp_path / "plan.json"
    env = cli_env(state_dir)
    assert _plan(manifests, task, env, "-o", str(saved)).returncode == 0
    plan = json.loads(saved.read_text())
    assert admit(plan).applyable
    # Edited after it was planned (its recorded refusals say nothing): still refused.
    plan["credentials"][0]["budget_seconds"] = 1200
    verdict = admit(plan)
    assert not verdict.applyable
    assert [r["code"] for r in verdict.refusals] == ["lease-lifetime"]


def test_a_mint_that_never_reached_the_provider_leaves_nothing_lapsing(
    state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as probe:  # a loopback port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv("KAGURA_TEST_GH_KEY", rsa_pair("github")[0])
    clock = FixedClock(datetime.now(UTC))
    entry = {
        "name": "gh-site",
        "provider": "gh",
        "type": "github-app",
        "scope": "site",
        "scope_spec": {
            "endpoint": f"http://127.0.0.1:{port}",
            "endpoint_addresses": ["127.0.0.1/32"],
            "app_id": "4242",
            "installation_id": 77,
            "repositories": ["site"],
            "permissions": {"contents": "read"},
        },
        "ttl_seconds": 3600,
        "renewals": 0,
        "budget_seconds": 3600,
        "secret_ref": "env:KAGURA_TEST_GH_KEY",
        "standing": False,
        "class": "baseline",
    }
    with open_store() as store:
        with pytest.raises(SetupError, match="ConnectError"):
            Broker(store, clock=clock).acquire(LeaseRequest.from_plan(entry))
        [row] = Ledger(store, clock).rows()
        assert row.state == "failed" and row.closed_at is not None
        report = sweep(store, clock=clock, sleep=lambda _: None)
        assert report.lapsing == []


def _not_applyable(tmp_path: Path) -> Path:
    """A task a policy denies: a paste site in its egress."""
    manifests = manifest_set(
        tmp_path,
        {
            "kind": "EgressPolicy",
            "metadata": {"name": "paste"},
            "spec": {"baseline": True, "allow": [{"host": "pastebin.com"}]},
        },
    )
    project = make_project(tmp_path)
    write_task(project, "denied", {"steps": ["true"], "egress": ["paste"]})
    return manifests


def test_plan_exits_6_for_a_plan_apply_would_refuse(tmp_path: Path, state_dir: Path) -> None:
    manifests = _not_applyable(tmp_path)
    task = tmp_path / "project" / "task.yml"
    env = cli_env(state_dir)
    done = _plan(manifests, task, env)
    assert done.returncode == 6, done.stdout + done.stderr
    assert "applyable    NO" in done.stdout
    assert "error: not applyable: denied" in done.stderr
    assert "--allow-unapplyable" in done.stderr
    kept = _plan(manifests, task, env, "--allow-unapplyable")
    assert kept.returncode == 0 and "applyable    NO" in kept.stdout
    changed = _plan(manifests, task, env, "--allow-unapplyable", "--detailed-exitcode")
    assert changed.returncode == 5
    # Refused outranks changed.
    assert _plan(manifests, task, env, "--detailed-exitcode").returncode == 6


def test_apply_refuses_before_asking_and_without_blaming_yes(
    tmp_path: Path, state_dir: Path
) -> None:
    manifests = _not_applyable(tmp_path)
    task = tmp_path / "project" / "task.yml"
    env = cli_env(state_dir)
    piped = kagura(["apply", "--manifests", str(manifests), str(task)], env)
    assert piped.returncode == 6
    assert "--yes" not in piped.stderr and "not confirmed" not in piped.stderr
    assert "plan is not applyable: policy membrane/no-paste-sites" in piped.stderr
    # On a terminal: refused, never asked.
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "kagura_agent", "apply", "--manifests", str(manifests), str(task)],
        stdin=follower,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=REPO,
        text=True,
    )
    os.close(follower)
    try:
        out, _ = proc.communicate(timeout=60)
    finally:
        os.close(leader)
    assert proc.returncode == 6, out
    assert "Apply this plan?" not in out
    assert "plan is not applyable" in out
