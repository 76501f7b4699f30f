"""Asking a human: interactive prompts with a deny-on-timeout, and ``--approve`` flags.

``obtain_approvals`` is the one call ``apply`` (or the cockpit) makes before acquiring
anything: it records ``--approve`` flags, asks about the rest through an injected
``prompt_fn`` (``tty_prompt`` on a terminal, a chat button elsewhere), and refuses unless
every capability that needs approval was approved for exactly this plan.
"""

from __future__ import annotations

import getpass
import os
import select
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import TextIO

from kagura_agent.approvals.log import (
    Decision,
    Outcome,
    Verdict,
    approval_for,
    record_decision,
    require_approvals,
)
from kagura_agent.clock import Clock
from kagura_agent.errors import RefusedError, UsageError
from kagura_agent.plan.model import Plan
from kagura_agent.state import StateStore

# prompt_fn(question, timeout_seconds) -> True (yes), False (no) or None (timed out).
PromptFn = Callable[[str, float], "bool | None"]


def preapprove(
    store: StateStore,
    approve: Sequence[str],
    needed: Sequence[str],
    fingerprint: str,
    *,
    who: str,
    clock: Clock,
    via: str = "cli-flag",
) -> list[Decision]:
    """Record ``--approve CATEGORY`` flags as the operator's decisions for this plan.

    A flag naming a category the plan does not ask about is a usage error: a mistyped
    category must never pass silently while the real one is left unapproved.
    """
    stray = [category for category in approve if category not in needed]
    if stray:
        raise UsageError(
            "--approve names categories this plan does not ask for: " + ", ".join(stray),
            hint="needs approval: " + (", ".join(needed) or "nothing"),
        )
    return [
        record_decision(
            store,
            Verdict(
                category=category,
                fingerprint=fingerprint,
                outcome="approved",
                who=who,
                via=via,
                reason="approved on the command line",
            ),
            clock=clock,
        )
        for category in dict.fromkeys(approve)
    ]


@dataclass(frozen=True)
class ApprovalRequest:
    """What a human is asked to approve before anything is acquired: ``categories`` (the
    plan's capabilities that need approval, each with the planner's reason in
    ``reasons``), bound to one plan (``fingerprint``), asked of ``who`` through ``via``;
    silence past ``timeout`` seconds is a deny. Built once from the plan
    (:meth:`for_plan`) and passed whole to :func:`obtain_approvals` and :func:`ask`."""

    fingerprint: str
    categories: Sequence[str]
    who: str
    timeout: float
    via: str = "cli"
    reasons: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def for_plan(cls, plan: Plan, *, who: str, timeout: float) -> ApprovalRequest:
        """The plan's needs-approval capabilities, bound to its intent: approvals bind to
        what the operator approves, not to host facts."""
        return cls(
            plan["intent"],
            [a["category"] for a in plan["approvals"] if a["class"] == "needs-approval"],
            who,
            timeout,
            reasons={a["category"]: a["reason"] for a in plan["approvals"]},
        )

    def question(self, category: str) -> str:
        """What the human reads about ``category``."""
        why = self.reasons.get(category, "")
        return f"Grant {category} to plan {self.fingerprint[:19]}…?" + (f" ({why})" if why else "")


def ask(
    store: StateStore, request: ApprovalRequest, *, prompt_fn: PromptFn, clock: Clock
) -> list[Decision]:
    """Ask a human about each of the request's categories in turn and record every answer.

    Stops at the first deny or timeout (the run is refused anyway); check the result with
    ``all(d.approved for d in decisions) and len(decisions) == len(request.categories)``.
    """
    decisions: list[Decision] = []
    for category in request.categories:
        answer = prompt_fn(request.question(category), request.timeout)
        outcome: Outcome = "timeout" if answer is None else "approved" if answer else "denied"
        silence = f"no answer within {request.timeout:g}s" if answer is None else ""
        verdict = Verdict(
            category, request.fingerprint, outcome, request.who, request.via, reason=silence
        )
        decisions.append(record_decision(store, verdict, clock=clock))
        if outcome != "approved":
            break
    return decisions


def tty_prompt(
    question: str, timeout: float, *, stdin: TextIO | None = None, out: TextIO | None = None
) -> bool | None:
    """Ask on a terminal: "y"/"yes" approves, anything else or EOF denies, silence times out.

    The timeout covers the whole answer line. Bytes are read straight from the file
    descriptor so that no answer sits unseen in a Python buffer while select() waits.
    """
    fd = (stdin if stdin is not None else sys.stdin).fileno()
    sink = out if out is not None else sys.stderr
    sink.write(f"{question} [y/N] (deny in {timeout:g}s) ")
    sink.flush()
    deadline = time.monotonic() + timeout
    answer = b""
    while not answer.endswith(b"\n"):
        left = deadline - time.monotonic()
        ready, _, _ = select.select([fd], [], [], max(0.0, left))
        if not ready:
            sink.write("\ntimed out: denied\n")
            return None
        chunk = os.read(fd, 1)
        if not chunk:  # EOF: nobody will answer
            break
        answer += chunk
    return answer.decode(errors="replace").strip().lower() in ("y", "yes")


def operator_name() -> str:
    """Who is deciding at this terminal (recorded in the approval log)."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return os.environ.get("USER", "unknown")


def obtain_approvals(
    store: StateStore,
    request: ApprovalRequest,
    *,
    prompt_fn: PromptFn | None,
    clock: Clock,
    approve: Sequence[str] = (),
    accept_since: datetime | None = None,
) -> list[Decision]:
    """Approve every category of ``request`` for its plan, or raise RefusedError.

    ``approve`` are ``--approve`` flags (recorded as the operator's decisions). Decisions
    already in the log for this fingerprint count only when made at or after
    ``accept_since`` (a cockpit passes the moment it posted its request); by default
    every apply asks afresh. With no ``prompt_fn`` (non-interactive) anything left is
    refused. A deny or a timeout refuses the run.
    """
    needed, fingerprint = request.categories, request.fingerprint
    # The log keeps whole seconds; compare at that precision so this call's own
    # decisions are never older than its start.
    since = (accept_since or clock.now()).replace(microsecond=0)
    preapprove(store, approve, needed, fingerprint, who=request.who, clock=clock)
    remaining = [
        category
        for category in needed
        if approval_for(store, fingerprint, category, since=since) is None
    ]
    if remaining and prompt_fn is None:
        # Nobody can be asked: refuse, naming any approval that was for another plan.
        require_approvals(store, fingerprint, remaining, since=since)
    if remaining and prompt_fn is not None:
        decisions = ask(
            store, replace(request, categories=remaining), prompt_fn=prompt_fn, clock=clock
        )
        refused = [decision for decision in decisions if not decision.approved]
        if refused:
            first = refused[0]
            raise RefusedError(
                f"{first.category} was not approved ({first.outcome}, {first.who} via {first.via})"
            )
    return require_approvals(store, fingerprint, needed, since=since)
