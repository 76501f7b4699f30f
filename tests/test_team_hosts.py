"""Owners on a shared state store: a pid is judged only on the host that recorded it.

A runner on host B must not revoke the live lease of a run on host A because A's pid
means nothing on B, nor close A's run as crashed (its containers are on A's daemon);
the team reaper, which judges by heartbeat, revokes A's leases when A is gone. Both
backends (the shared store is PostgreSQL; SQLite behaves the same)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from apply_helpers import plan_for_root

from kagura_agent.apply.records.runs import open_run, sweep_dead_runs
from kagura_agent.clock import FixedClock
from kagura_agent.membrane.leases import Broker, LeaseRequest, Ledger, Sweeper
from kagura_agent.processes import owner_alive, this_host
from kagura_agent.state import open_store
from kagura_agent.team.reaper import revoke_run_leases
from testing.fake_cloudflare import ROOT_TOKEN, FakeCloudflare

SCOPE = {
    "permission_groups": ["4755a26eedb94da69e1066d98aa820be"],
    "resources": {"com.cloudflare.api.account.zone.0123456789abcdef": "*"},
    "endpoint_addresses": ["127.0.0.1/32"],
    "max_retries": 0,
}


def request(cloudflare: FakeCloudflare) -> LeaseRequest:
    return LeaseRequest.from_plan(
        {
            "name": "cf-dns",
            "provider": "cloudflare-main",
            "type": "cloudflare",
            "scope": "dns-edit",
            "scope_spec": {**SCOPE, "endpoint": cloudflare.url + "/client/v4"},
            "ttl_seconds": 900,
            "renewals": 0,
            "budget_seconds": 900,
            "secret_ref": "env:KAGURA_TEST_CF_ROOT",
            "standing": False,
            "class": "baseline",
        }
    )


def test_another_hosts_owner_is_not_judged_here(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAGURA_AGENT_HOST_ID", "host-b")
    assert this_host() == "host-b"
    dead = 2**22 + 11
    assert not owner_alive(dead, "gone")
    assert not owner_alive(dead, "gone", "host-b")
    assert owner_alive(dead, "gone", "host-a")


def test_a_lease_of_another_host_survives_its_sweep_until_the_reaper_revokes_it(
    state_target: Path | str, cloudflare: FakeCloudflare, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KAGURA_TEST_CF_ROOT", ROOT_TOKEN)
    clock = FixedClock(datetime.now(UTC).replace(microsecond=0))
    monkeypatch.setenv("KAGURA_AGENT_HOST_ID", "host-a")
    with open_store() as store:
        Broker(store, run_id="run-on-a", clock=clock).acquire(request(cloudflare))
        # Host A's process is gone from host B's point of view: its pid is not B's.
        with store.transaction() as conn:
            conn.execute("UPDATE lease_grants SET owner_start = 'not-a-process-here'")
    monkeypatch.setenv("KAGURA_AGENT_HOST_ID", "host-b")
    with open_store() as store:
        report = Sweeper(store, clock=clock).sweep()
        assert len(report.held) == 1 and report.revoked == []
        [row] = Ledger(store, clock).open_rows()
        assert row.owner_host == "host-a" and row.to_json()["owner_host"] == "host-a"
    assert len(cloudflare.live_tokens()) == 1
    # The team reaper (host A stopped heartbeating) revokes it from here.
    assert revoke_run_leases("run-on-a") == (1, 1)
    assert cloudflare.live_tokens() == []


class ListingRuntime:
    """The two calls sweep_dead_runs makes of a runtime, recorded."""

    def __init__(self) -> None:
        self.removed: list[str] = []

    def list(self, labels: dict[str, str]) -> list[str]:
        return ["c-" + labels["dev.kagura.run"]]

    def remove(self, container_id: str, *, force: bool = False) -> None:
        self.removed.append(container_id)


@pytest.mark.usefixtures("without_docker")
def test_a_run_of_another_host_is_left_to_that_host(
    state_target: Path | str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Its containers and its project root (setuid bits the dead run left) alike."""
    clock = FixedClock(datetime.now(UTC).replace(microsecond=0))
    root = tmp_path / "root"
    root.mkdir()
    plan = plan_for_root(tmp_path, root)
    monkeypatch.setenv("KAGURA_AGENT_HOST_ID", "host-a")
    with open_store() as store:
        open_run(store, plan, "run-a", clock)
        with store.transaction() as conn:
            conn.execute("UPDATE runs SET pid_start = 'not-a-process-here'")
    planted = root / "planted"
    planted.write_bytes(b"")
    planted.chmod(0o4755)
    runtime = ListingRuntime()
    monkeypatch.setenv("KAGURA_AGENT_HOST_ID", "host-b")
    with open_store() as store:
        assert sweep_dead_runs(store, runtime, clock) == []  # type: ignore[arg-type]
    assert runtime.removed == []
    assert planted.stat().st_mode & 0o7777 == 0o4755
    monkeypatch.setenv("KAGURA_AGENT_HOST_ID", "host-a")
    with open_store() as store:
        assert sweep_dead_runs(store, runtime, clock) == ["run-a"]  # type: ignore[arg-type]
    assert runtime.removed == ["c-run-a"]
    assert planted.stat().st_mode & 0o7777 == 0o755
