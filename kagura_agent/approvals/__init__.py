"""Approvals: every human decision on a capability, bound to one plan fingerprint.

log.py     the approval log in the state store: record_decision, approval_for,
           require_approvals, history (Decision values)
asking.py  obtain_approvals (the call apply makes), ask, preapprove (--approve flags),
           tty_prompt (a terminal prompt whose timeout means deny), operator_name
"""

from __future__ import annotations

from kagura_agent.approvals.asking import (
    ApprovalRequest,
    PromptFn,
    ask,
    obtain_approvals,
    operator_name,
    preapprove,
    tty_prompt,
)
from kagura_agent.approvals.log import (
    MIGRATIONS,
    Decision,
    Kind,
    Outcome,
    Verdict,
    approval_for,
    history,
    insert_decision,
    migrate,
    record_decision,
    require_approvals,
)

__all__ = [
    "MIGRATIONS",
    "ApprovalRequest",
    "Decision",
    "Kind",
    "Outcome",
    "PromptFn",
    "Verdict",
    "approval_for",
    "ask",
    "history",
    "insert_decision",
    "migrate",
    "obtain_approvals",
    "operator_name",
    "preapprove",
    "record_decision",
    "require_approvals",
    "tty_prompt",
]
