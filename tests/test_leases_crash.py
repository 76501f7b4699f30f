"""Crash safety: a process holding a Cloudflare lease dies at each step; the next start's
sweep revokes whatever it left (the fake records the revocation) and closes the rows."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from kagura_agent.cli.main import main
from kagura_agent.clock import SystemClock
from kagura_agent.membrane.leases import Ledger, sweep
from kagura_agent.processes import owner_alive
from kagura_agent.state import open_store
from testing.fake_cloudflare import ROOT_TOKEN, FakeCloudflare

# Every test here runs against both state backends (SQLite, PostgreSQL).
pytestmark = pytest.mark.usefixtures("state_target")

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture()
def root_env(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("KAGURA_TEST_CF_ROOT", ROOT_TOKEN)
    return ROOT_TOKEN


def _child(endpoint: str, crash: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "testing.lease_child", "--endpoint", endpoint, "--crash", crash],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


def _rows(state_dir: Path) -> list[dict[str, object]]:
    store = open_store()
    try:
        return [row.to_json() for row in Ledger(store, SystemClock()).rows()]
    finally:
        store.close()


def test_kill_9_with_live_lease_is_revoked_by_next_start(
    state_dir: Path, cloudflare: FakeCloudflare, root_env: str, capsys: pytest.CaptureFixture[str]
) -> None:
    child = _child(cloudflare.url + "/client/v4", "hold")
    assert child.stdout is not None
    line = child.stdout.readline()
    assert line.startswith("LIVE "), child.stderr.read() if child.stderr else line
    [minted] = cloudflare.ops("mint")
    assert cloudflare.live_tokens() and not cloudflare.ops("revoke")
    [row] = _rows(state_dir)
    assert row["state"] == "live" and row["minted_id"] == minted["id"]
    assert owner_alive(int(str(row["owner_pid"])), None)
    # The root secret reached the child by reference only: not on its command line.
    cmdline = Path(f"/proc/{child.pid}/cmdline").read_bytes()
    assert root_env.encode() not in cmdline

    child.send_signal(signal.SIGKILL)
    child.wait(timeout=10)

    # The next start sweeps: here through the CLI, as `kagura-agent leases sweep` does.
    assert main(["leases", "sweep"]) == 0
    out = capsys.readouterr().out
    assert "1 revoked" in out
    assert [e["id"] for e in cloudflare.ops("revoke")] == [minted["id"]]
    assert cloudflare.live_tokens() == []
    [row] = _rows(state_dir)
    assert row["state"] == "revoked" and row["closed_at"]


@pytest.mark.parametrize(
    ("crash", "state", "minted", "revoked", "closed_as"),
    [
        # Nothing minted: the row closes, nothing to revoke.
        ("after-intent", "intent", 0, 0, "failed"),
        # Minted but unrecorded: found by its name at the provider, revoked.
        ("after-mint", "intent", 1, 1, "revoked"),
        # Revoked but not closed: the second revoke finds it gone and closes the row.
        ("after-revoke", "live", 1, 1, "revoked"),
    ],
)
def test_crash_between_ledger_steps_leaves_a_row_the_sweeper_resolves(
    state_dir: Path,
    cloudflare: FakeCloudflare,
    root_env: str,
    crash: str,
    state: str,
    minted: int,
    revoked: int,
    closed_as: str,
) -> None:
    child = _child(cloudflare.url + "/client/v4", crash)
    assert child.wait(timeout=60) == 137
    assert len(cloudflare.ops("mint")) == minted
    [row] = _rows(state_dir)
    assert row["state"] == state and not row["closed_at"]

    store = open_store()
    report = sweep(store)
    store.close()

    assert len(cloudflare.ops("revoke")) == revoked
    assert cloudflare.live_tokens() == []
    [row] = _rows(state_dir)
    assert row["state"] == closed_as and row["closed_at"]
    assert report.held == [] and report.poison == []


def test_crash_during_renewal_revokes_both_credentials(
    state_dir: Path, cloudflare: FakeCloudflare, root_env: str
) -> None:
    child = _child(cloudflare.url + "/client/v4", "after-renew")
    assert child.wait(timeout=60) == 137
    assert len(cloudflare.ops("mint")) == 2
    assert {r["state"] for r in _rows(state_dir)} == {"live"}

    store = open_store()
    report = sweep(store)
    store.close()

    assert len(report.revoked) == 2
    assert sorted(e["id"] for e in cloudflare.ops("revoke")) == sorted(
        e["id"] for e in cloudflare.ops("mint")
    )
    assert {r["state"] for r in _rows(state_dir)} == {"revoked"}
