"""Rotating a root secret, as docs/operations.md ("Rotating a key") says, as far as it is
mechanical: the reference stays, so the plan stays the same plan with no value in it; a
run started after the rotation leases with the new key; a run already going keeps the
key it read at its first lease until it ends."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from apply_helpers import make_project, manifest_set, token_provider, write_task

from kagura_agent.clock import FixedClock
from kagura_agent.membrane.leases import Broker, LeaseRequest
from kagura_agent.plan.build import plan_tasks
from kagura_agent.state import open_store

OLD = "rotation-canary-old-0001"
NEW = "rotation-canary-new-0002"
ENTRY: dict[str, Any] = {
    "name": "token",
    "provider": "token",
    "type": "static",
    "scope": "use",
    "scope_spec": {"env": "TEST_TOKEN"},
    "ttl_seconds": 900,
    "renewals": 0,
    "budget_seconds": 900,
    "secret_ref": "env:KAGURA_TEST_TOKEN",
    "standing": True,
    "class": "baseline",
}


@pytest.mark.usefixtures("state_dir", "without_docker")
def test_a_rotated_key_is_the_same_plan_with_neither_value_in_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    manifests = manifest_set(tmp_path, token_provider())
    spec = {"steps": ["true"], "credentials": [{"provider": "token", "scope": "use"}]}
    task = write_task(make_project(tmp_path), "t", spec)
    plans = []
    for value in (OLD, NEW):
        monkeypatch.setenv("KAGURA_TEST_TOKEN", value)
        (plan,) = plan_tasks(str(manifests), [str(task)])
        plans.append(plan)
    assert plans[0]["fingerprint"] == plans[1]["fingerprint"]
    assert [c["secret_ref"] for c in plans[0]["credentials"]] == ["env:KAGURA_TEST_TOKEN"]
    text = json.dumps(plans)
    assert OLD not in text and NEW not in text


def test_runs_after_the_rotation_lease_the_new_key_runs_before_it_keep_the_old(
    state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = FixedClock(datetime.now(UTC))
    store = open_store()
    monkeypatch.setenv("KAGURA_TEST_TOKEN", OLD)
    running = Broker(store, clock=clock)  # a run started before the rotation
    first = running.acquire(LeaseRequest.from_plan(ENTRY))
    assert first.bundle.env["TEST_TOKEN"] == OLD
    monkeypatch.setenv("KAGURA_TEST_TOKEN", NEW)  # step 2: the reference points at the new key
    again = running.acquire(LeaseRequest.from_plan(ENTRY))
    assert again.bundle.env["TEST_TOKEN"] == OLD  # read once per run: step 4 waits for it
    after = Broker(store, clock=clock).acquire(LeaseRequest.from_plan(ENTRY))
    assert after.bundle.env["TEST_TOKEN"] == NEW
    for lease in (first, again, after):
        lease.release()
    rows = store.conn.execute("SELECT * FROM lease_grants").fetchall()
    assert len(rows) == 3 and all(row["closed_at"] for row in rows)
    assert OLD not in json.dumps([dict(r) for r in rows]) and NEW not in json.dumps(
        [dict(r) for r in rows]
    )
    store.close()
