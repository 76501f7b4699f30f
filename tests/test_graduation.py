"""Graduation end to end through the library API, with an injected clock.

The scripted sequence mirrors the design: five verified successes over three distinct
tasks spread over a simulated week earn a proposal; a human approves; one failure demotes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from kagura_agent import approvals
from kagura_agent.clock import FixedClock
from kagura_agent.errors import RefusedError, UsageError
from kagura_agent.graduation import (
    GraduationSnapshot,
    Knobs,
    approve_graduation,
    classify,
    events,
    proposals,
    record_outcome,
    reset,
    snapshot,
)
from kagura_agent.state import Location, StateStore

DNS = "credential:cloudflare/dns-write"
APT = "egress:debian-packages"
PLAN = "sha256:" + "a" * 64
OK = [("dig +short example.test", 0)]
FAILED = [("dig +short example.test", 1)]


@pytest.fixture()
def clock() -> FixedClock:
    return FixedClock(datetime(2025, 3, 1, 9, 0, tzinfo=UTC))


@pytest.fixture()
def store(state_target: Location) -> Iterator[StateStore]:
    with StateStore(state_target) as opened:
        yield opened


def _earn(store: StateStore, clock: FixedClock, category: str = DNS) -> None:
    """Five verified successes over three tasks, two days apart (eight days in all)."""
    for index, task in enumerate(["dns-a", "dns-b", "dns-c", "dns-a", "dns-b"]):
        record_outcome(store, [category], f"{category}-run-{index}", task, PLAN, OK, clock)
        clock.advance(timedelta(days=2))


def _class(store: StateStore, category: str, untrusted: list[str] | None = None) -> str:
    snap = snapshot(store, Knobs())
    return classify(category, baseline=False, state=snap, untrusted_inputs=untrusted or []).class_


def test_scripted_sequence_proposal_approve_demote(store: StateStore, clock: FixedClock) -> None:
    knobs = Knobs()
    for index, task in enumerate(["dns-a", "dns-b", "dns-c", "dns-a"]):
        record_outcome(store, [DNS], f"run-{index}", task, PLAN, OK, clock)
        clock.advance(timedelta(days=2))
    assert proposals(store, knobs) == []
    early = classify(DNS, baseline=False, state=snapshot(store, knobs))
    assert early.class_ == "needs-approval"
    assert early.evidence == 4
    assert early.unmet == ("min_successes 4/5", "cooldown 6d/7d")

    record_outcome(store, [DNS], "run-4", "dns-b", PLAN, OK, clock)
    assert [status.category for status in proposals(store, knobs)] == [DNS]
    # A proposal is not a grant: the plan still asks until a human approves.
    assert _class(store, DNS) == "needs-approval"
    version_before = snapshot(store, knobs).version

    decision = approve_graduation(store, DNS, who="alice", clock=clock, knobs=knobs)
    assert (decision.kind, decision.outcome, decision.who) == ("graduation", "approved", "alice")
    graduated = classify(DNS, baseline=False, state=snapshot(store, knobs))
    assert graduated.class_ == "graduated"
    assert graduated.evidence == 5
    assert snapshot(store, knobs).version > version_before

    clock.advance(timedelta(hours=1))
    outcome = record_outcome(store, [DNS], "run-5", "dns-c", PLAN, FAILED, clock)
    assert not outcome.success
    assert outcome.demoted == (DNS,)
    demoted = classify(DNS, baseline=False, state=snapshot(store, knobs))
    assert demoted.class_ == "needs-approval"
    assert demoted.evidence == 0
    assert "min_successes 0/5" in demoted.unmet
    assert events(store, DNS)[0]["event"] == "demoted"
    assert "exited 1" in str(snapshot(store, knobs).status(DNS).last_reset_reason)


def test_brain_success_with_failed_verify_earns_nothing(
    store: StateStore, clock: FixedClock
) -> None:
    # The API takes only host-side verify exit codes; whatever the brain printed has no
    # way in. A failed verify is a failure, and no verify at all is not a success either.
    failed = record_outcome(store, [DNS], "run-1", "dns-a", PLAN, FAILED, clock)
    unverified = record_outcome(store, [DNS], "run-2", "dns-b", PLAN, [], clock)
    assert not failed.success and not unverified.success
    assert "no verify" in unverified.reason
    assert snapshot(store, Knobs()).status(DNS).successes == 0
    mixed = record_outcome(store, [DNS], "run-3", "dns-c", PLAN, [*OK, ("pytest", 2)], clock)
    assert not mixed.success


def test_untrusted_input_needs_approval_despite_graduation(
    store: StateStore, clock: FixedClock
) -> None:
    _earn(store, clock)
    approve_graduation(store, DNS, who="alice", clock=clock, knobs=Knobs())
    result = classify(
        DNS,
        baseline=False,
        state=snapshot(store, Knobs()),
        untrusted_inputs=["memory:mem-42 (ingested from the web)"],
    )
    assert result.class_ == "needs-approval"
    assert "untrusted" in result.reason and "mem-42" in result.reason


def test_trust_is_per_category(store: StateStore, clock: FixedClock) -> None:
    _earn(store, clock, DNS)
    approve_graduation(store, DNS, who="alice", clock=clock, knobs=Knobs())
    assert _class(store, DNS) == "graduated"
    assert _class(store, APT) == "needs-approval"
    assert snapshot(store, Knobs()).status(APT).successes == 0
    with pytest.raises(RefusedError, match="no graduation proposal"):
        approve_graduation(store, APT, who="alice", clock=clock, knobs=Knobs())
    # A failure in a run that used only APT leaves DNS graduated.
    record_outcome(store, [APT], "apt-run", "install", PLAN, FAILED, clock)
    assert _class(store, DNS) == "graduated"


def test_one_task_repeated_cannot_farm_trust(store: StateStore, clock: FixedClock) -> None:
    for index in range(10):
        record_outcome(store, [DNS], f"run-{index}", "cron", PLAN, OK, clock)
        clock.advance(timedelta(days=1))
    status = snapshot(store, Knobs()).status(DNS)
    assert status.state == "locked"
    assert status.unmet == ("min_distinct_tasks 1/3",)


def test_burst_of_runs_waits_for_cooldown(store: StateStore, clock: FixedClock) -> None:
    for index in range(6):
        record_outcome(store, [DNS], f"run-{index}", f"task-{index % 3}", PLAN, OK, clock)
        clock.advance(timedelta(hours=1))
    assert snapshot(store, Knobs()).status(DNS).unmet == ("cooldown 5h/7d",)
    with pytest.raises(RefusedError, match="cooldown 5h/7d"):
        approve_graduation(store, DNS, who="alice", clock=clock, knobs=Knobs())


def test_same_run_recorded_twice_counts_once(store: StateStore, clock: FixedClock) -> None:
    first = record_outcome(store, [DNS, DNS], "run-1", "dns-a", PLAN, OK, clock)
    again = record_outcome(store, [DNS], "run-1", "dns-a", PLAN, OK, clock)
    assert first.recorded == (DNS,) and again.recorded == ()
    assert snapshot(store, Knobs()).status(DNS).successes == 1


def test_reset_locks_and_restarts_count(store: StateStore, clock: FixedClock) -> None:
    _earn(store, clock)
    approve_graduation(store, DNS, who="alice", clock=clock, knobs=Knobs())
    with pytest.raises(UsageError, match="already graduated"):
        approve_graduation(store, DNS, who="alice", clock=clock, knobs=Knobs())
    version = snapshot(store, Knobs()).version
    reset(store, DNS, who="bob", clock=clock, reason="rotated the zone")
    status = snapshot(store, Knobs()).status(DNS)
    assert (status.state, status.successes, status.last_reset_reason) == (
        "locked",
        0,
        "rotated the zone",
    )
    assert snapshot(store, Knobs()).version == version + 1


def test_evidence_does_not_bump_version_but_transitions_do(
    store: StateStore, clock: FixedClock
) -> None:
    record_outcome(store, [DNS], "run-1", "dns-a", PLAN, OK, clock)
    assert snapshot(store, Knobs()).version == 0
    record_outcome(store, [DNS], "run-2", "dns-a", PLAN, FAILED, clock)
    assert snapshot(store, Knobs()).version == 1


def test_classify_order_denied_baseline_graduated(store: StateStore, clock: FixedClock) -> None:
    snap = snapshot(store, Knobs())
    denied = classify(DNS, baseline=True, state=snap, denied_by_policy="no-dns-write")
    assert (denied.class_, denied.reason) == ("denied", "denied by policy no-dns-write")
    baseline = classify(DNS, baseline=True, state=snap, untrusted_inputs=["memory:x"])
    assert baseline.class_ == "baseline"
    entry = classify(APT, baseline=False, state=snap).to_json()
    assert entry["class"] == "needs-approval"
    assert entry["unmet"] == ["min_successes 0/5", "min_distinct_tasks 0/3", "cooldown 0s/7d"]


def test_custom_knobs_change_the_bar(store: StateStore, clock: FixedClock) -> None:
    knobs = Knobs(min_successes=1, min_distinct_tasks=1, cooldown=timedelta(0))
    record_outcome(store, [DNS], "run-1", "dns-a", PLAN, OK, clock)
    assert [status.category for status in proposals(store, knobs)] == [DNS]
    assert proposals(store, Knobs()) == []


def test_snapshot_round_trips_through_json(store: StateStore, clock: FixedClock) -> None:
    _earn(store, clock)
    approve_graduation(store, DNS, who="alice", clock=clock, knobs=Knobs())
    record_outcome(store, [APT], "apt-1", "install", PLAN, OK, clock)
    snap = snapshot(store, Knobs())
    text = json.dumps(snap.to_json(), sort_keys=True)
    again = GraduationSnapshot.from_json(json.loads(text))
    assert again == snap
    assert classify(DNS, baseline=False, state=again).class_ == "graduated"


def test_state_survives_a_restart(state_target: Location, clock: FixedClock) -> None:
    path = state_target
    first = StateStore(path)
    _earn(first, clock)
    approve_graduation(first, DNS, who="alice", clock=clock, knobs=Knobs())
    approvals.record_decision(
        first,
        approvals.Verdict(
            category=APT, fingerprint=PLAN, outcome="approved", who="alice", via="cli"
        ),
        clock=clock,
    )
    first.close()

    second = StateStore(path)
    assert _class(second, DNS) == "graduated"
    assert approvals.approval_for(second, PLAN, APT) is not None
    second.close()

    script = (
        "import json, sys\n"
        "from kagura_agent.graduation import Knobs, snapshot\n"
        "from kagura_agent.state import open_store\n"
        "snap = snapshot(open_store(), Knobs())\n"
        "print(json.dumps(snap.to_json()))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script, str(path)], capture_output=True, text=True, check=True
    )
    data = json.loads(proc.stdout)
    assert data["categories"][DNS]["state"] == "graduated"
    assert data["categories"][DNS]["graduated_by"] == "alice"


def test_evidence_from_schema_v1_is_kept_by_v2(state_target: Location, clock: FixedClock) -> None:
    from kagura_agent.graduation.ledger import MIGRATIONS

    store = StateStore(state_target)
    store.migrate("graduation", MIGRATIONS[:1])
    with store.transaction() as conn:
        conn.execute(
            "INSERT INTO graduation_evidence (category, run_id, task, fingerprint,"
            " recorded_at, outcome, verify) VALUES (?, 'r1', 't', ?, '2025-03-01T09:00:00Z',"
            " 'success', '[]')",
            (DNS, PLAN),
        )
    assert snapshot(store, Knobs()).status(DNS).successes == 1
