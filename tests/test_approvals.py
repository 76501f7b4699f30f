"""The approval log: decisions bound to one plan fingerprint; a timeout is a deny."""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import TextIO

import pytest

from kagura_agent import approvals
from kagura_agent.clock import FixedClock
from kagura_agent.errors import RefusedError, UsageError
from kagura_agent.state import Location, StateStore

DNS = "credential:cloudflare/dns-write"
APT = "egress:debian-packages"
PLAN_A = "sha256:" + "a" * 64
PLAN_B = "sha256:" + "b" * 64


@pytest.fixture()
def clock() -> FixedClock:
    return FixedClock(datetime(2025, 3, 1, 9, 0, tzinfo=UTC))


@pytest.fixture()
def store(state_target: Location) -> Iterator[StateStore]:
    with StateStore(state_target) as opened:
        yield opened


def _approve(store: StateStore, clock: FixedClock, plan: str, category: str = DNS) -> None:
    approvals.record_decision(
        store,
        approvals.Verdict(
            category=category, fingerprint=plan, outcome="approved", who="alice", via="slack"
        ),
        clock=clock,
    )


def test_approval_is_bound_to_the_plan_fingerprint(store: StateStore, clock: FixedClock) -> None:
    _approve(store, clock, PLAN_A)
    decision = approvals.approval_for(store, PLAN_A, DNS)
    assert decision is not None
    assert (decision.who, decision.via, decision.fingerprint) == ("alice", "slack", PLAN_A)
    assert approvals.approval_for(store, PLAN_B, DNS) is None
    assert approvals.approval_for(store, PLAN_A, APT) is None
    with pytest.raises(RefusedError, match="another plan") as caught:
        approvals.require_approvals(store, PLAN_B, [DNS])
    assert DNS in caught.value.message
    assert [d.category for d in approvals.require_approvals(store, PLAN_A, [DNS])] == [DNS]


def test_later_deny_revokes_an_approval(store: StateStore, clock: FixedClock) -> None:
    _approve(store, clock, PLAN_A)
    approvals.record_decision(
        store,
        approvals.Verdict(category=DNS, fingerprint=PLAN_A, outcome="denied", who="bob", via="cli"),
        clock=clock,
    )
    assert approvals.approval_for(store, PLAN_A, DNS) is None


def test_capability_decision_needs_a_fingerprint(store: StateStore, clock: FixedClock) -> None:
    with pytest.raises(UsageError, match="fingerprint"):
        approvals.record_decision(
            store,
            approvals.Verdict(
                category=DNS, fingerprint=None, outcome="approved", who="a", via="cli"
            ),
            clock=clock,
        )


def test_ask_records_each_answer_and_timeout_is_deny(store: StateStore, clock: FixedClock) -> None:
    answers: Iterator[bool | None] = iter([True, None])
    asked: list[tuple[str, float]] = []

    def prompt(question: str, timeout: float) -> bool | None:
        asked.append((question, timeout))
        return next(answers)

    decisions = approvals.ask(
        store,
        approvals.ApprovalRequest(
            PLAN_A,
            [DNS, APT, "image:python-root"],
            who="alice",
            timeout=30,
            reasons={DNS: "locked; 2 verified successes"},
        ),
        prompt_fn=prompt,
        clock=clock,
    )
    assert [(d.category, d.outcome) for d in decisions] == [(DNS, "approved"), (APT, "timeout")]
    assert len(asked) == 2  # stops at the first non-approval
    assert "locked; 2 verified successes" in asked[0][0]
    assert approvals.approval_for(store, PLAN_A, APT) is None
    logged = approvals.history(store)
    assert [(d.category, d.outcome) for d in logged] == [(APT, "timeout"), (DNS, "approved")]
    assert "30s" in logged[0].reason


def test_ask_denied(store: StateStore, clock: FixedClock) -> None:
    decisions = approvals.ask(
        store,
        approvals.ApprovalRequest(PLAN_A, [DNS], who="a", timeout=5),
        prompt_fn=lambda _q, _t: False,
        clock=clock,
    )
    assert [d.outcome for d in decisions] == ["denied"]


def test_preapprove_records_operator_decisions(store: StateStore, clock: FixedClock) -> None:
    decisions = approvals.preapprove(store, [DNS, DNS], [DNS, APT], PLAN_A, who="ops", clock=clock)
    assert [(d.category, d.via, d.who) for d in decisions] == [(DNS, "cli-flag", "ops")]
    assert approvals.approval_for(store, PLAN_A, DNS) is not None
    with pytest.raises(UsageError, match="credential:cloudflare/dns-wrte"):
        approvals.preapprove(
            store, ["credential:cloudflare/dns-wrte"], [DNS], PLAN_A, who="ops", clock=clock
        )


def _pipe() -> tuple[TextIO, int]:
    read_fd, write_fd = os.pipe()
    return os.fdopen(read_fd, "r"), write_fd


@pytest.mark.parametrize(("typed", "expected"), [(b"y\n", True), (b"yes\n", True), (b"n\n", False)])
def test_tty_prompt_answers(typed: bytes, expected: bool) -> None:
    reader, write_fd = _pipe()
    os.write(write_fd, typed)
    out = io.StringIO()
    with reader:
        assert approvals.tty_prompt("Grant?", 5, stdin=reader, out=out) is expected
    os.close(write_fd)
    assert "[y/N]" in out.getvalue()


def test_tty_prompt_reads_piped_answers_one_line_at_a_time() -> None:
    reader, write_fd = _pipe()
    os.write(write_fd, b"y\nn\n")
    out = io.StringIO()
    with reader:
        assert approvals.tty_prompt("First?", 1, stdin=reader, out=out) is True
        assert approvals.tty_prompt("Second?", 1, stdin=reader, out=out) is False
    os.close(write_fd)


def test_tty_prompt_times_out_and_eof_denies() -> None:
    reader, write_fd = _pipe()
    out = io.StringIO()
    with reader:
        assert approvals.tty_prompt("Grant?", 0.05, stdin=reader, out=out) is None
        os.close(write_fd)
        assert approvals.tty_prompt("Grant?", 5, stdin=reader, out=out) is False
    assert "timed out" in out.getvalue()


def test_operator_name_is_not_empty() -> None:
    assert approvals.operator_name()


def test_obtain_with_flags_needs_no_prompt(store: StateStore, clock: FixedClock) -> None:
    decisions = approvals.obtain_approvals(
        store,
        approvals.ApprovalRequest(PLAN_A, [DNS, APT], who="ops", timeout=30),
        approve=[DNS, APT],
        prompt_fn=None,
        clock=clock,
    )
    assert [(d.category, d.via) for d in decisions] == [(DNS, "cli-flag"), (APT, "cli-flag")]


def test_obtain_refuses_when_nobody_can_be_asked(store: StateStore, clock: FixedClock) -> None:
    with pytest.raises(RefusedError, match="no approval for this plan"):
        approvals.obtain_approvals(
            store,
            approvals.ApprovalRequest(PLAN_A, [DNS, APT], who="ops", timeout=30),
            approve=[DNS],
            prompt_fn=None,
            clock=clock,
        )


def test_obtain_asks_and_a_timeout_refuses(store: StateStore, clock: FixedClock) -> None:
    with pytest.raises(RefusedError, match="timeout"):
        approvals.obtain_approvals(
            store,
            approvals.ApprovalRequest(PLAN_A, [DNS], who="ops", timeout=1),
            prompt_fn=lambda _q, _t: None,
            clock=clock,
        )
    assert [d.outcome for d in approvals.history(store)] == ["timeout"]
    approved = approvals.obtain_approvals(
        store,
        approvals.ApprovalRequest(PLAN_A, [DNS], who="ops", timeout=1),
        prompt_fn=lambda _q, _t: True,
        clock=clock,
    )
    assert [(d.category, d.via, d.outcome) for d in approved] == [(DNS, "cli", "approved")]


def test_obtain_does_not_reuse_yesterdays_approval(store: StateStore, clock: FixedClock) -> None:
    _approve(store, clock, PLAN_A)
    clock.advance(timedelta(days=1))
    with pytest.raises(RefusedError):
        approvals.obtain_approvals(
            store,
            approvals.ApprovalRequest(PLAN_A, [DNS], who="ops", timeout=1),
            prompt_fn=None,
            clock=clock,
        )


def test_obtain_accepts_a_chat_approval_for_this_plan(store: StateStore, clock: FixedClock) -> None:
    posted = clock.now()
    clock.advance(timedelta(seconds=20))
    _approve(store, clock, PLAN_A)  # the ✅ button in the thread
    _approve(store, clock, PLAN_B, APT)  # another plan's approval does not count
    decisions = approvals.obtain_approvals(
        store,
        approvals.ApprovalRequest(PLAN_A, [DNS], who="ops", timeout=1),
        prompt_fn=None,
        clock=clock,
        accept_since=posted,
    )
    assert [d.via for d in decisions] == ["slack"]
    with pytest.raises(RefusedError, match="another plan"):
        approvals.obtain_approvals(
            store,
            approvals.ApprovalRequest(PLAN_A, [APT], who="ops", timeout=1),
            prompt_fn=None,
            clock=clock,
            accept_since=posted,
        )
