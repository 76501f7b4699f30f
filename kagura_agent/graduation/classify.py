"""Classify one requested capability for the plan: pure, no I/O, no clock.

Order matters and fails closed:

1. ``denied``: a policy denies the category — nothing overrides a deny, not even
   ``baseline: true`` in a manifest.
2. ``baseline``: the manifest lists the category as baseline.
3. ``graduated``: a human graduated it, the run has no untrusted inputs, and the task
   kind's recency-weighted trust score (patterns/failure_learning.failure_trust) is not
   below the Graduation knob ``min_trust`` (no score yet: no runs, nothing held back).
4. ``needs-approval``: everything else — graduated-but-untrusted-inputs (the reason names
   them, so a poisoned memory cannot inherit earned trust), graduated-but-failing lately
   (the reason carries the score and the floor), or locked / proposed (the reason carries
   the evidence count and the knobs still unmet).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kagura_agent.graduation.model import GraduationSnapshot
from kagura_agent.plan.model import Approval, CapabilityClass


@dataclass(frozen=True)
class Classification:
    """How one capability is granted in a plan, and why."""

    category: str
    class_: CapabilityClass
    reason: str
    evidence: int
    unmet: tuple[str, ...] = ()

    @property
    def needs_approval(self) -> bool:
        return self.class_ == "needs-approval"

    def to_json(self) -> Approval:
        """The plan's ``approvals`` entry (docs/plan-format.md)."""
        return {
            "category": self.category,
            "class": self.class_,
            "reason": self.reason,
            "evidence": self.evidence,
            "unmet": list(self.unmet),
        }


def classify(
    category: str,
    *,
    baseline: bool,
    state: GraduationSnapshot,
    untrusted_inputs: Sequence[str] = (),
    denied_by_policy: str | None = None,
    trust: float | None = None,
    min_trust: float = 0.0,
) -> Classification:
    """Classify ``category`` for a plan whose inputs include ``untrusted_inputs``, of a
    task kind whose recency-weighted trust score is ``trust`` (None: no runs yet)."""
    status = state.status(category)
    evidence = status.successes
    if denied_by_policy is not None:
        return Classification(category, "denied", f"denied by policy {denied_by_policy}", evidence)
    if baseline:
        return Classification(category, "baseline", "baseline in manifest", evidence)
    if status.state == "graduated":
        if trust is not None and trust < min_trust:
            return Classification(
                category,
                "needs-approval",
                f"graduated, but this task kind's recent failures bring its trust to {trust}"
                f" (below min_trust {min_trust}); asking instead",
                evidence,
            )
        if not untrusted_inputs:
            by = f" by {status.graduated_by}" if status.graduated_by else ""
            at = f" at {status.graduated_at}" if status.graduated_at else ""
            return Classification(
                category, "graduated", f"graduated{by}{at}; {evidence} verified since", evidence
            )
        names = ", ".join(untrusted_inputs)
        return Classification(
            category,
            "needs-approval",
            f"graduated, but the run has untrusted inputs ({names}); asking instead",
            evidence,
        )
    if status.state == "proposed":
        return Classification(
            category,
            "needs-approval",
            f"locked; {evidence} verified successes, graduation proposed"
            f" (kagura-agent graduation approve {category})",
            evidence,
        )
    return Classification(
        category,
        "needs-approval",
        f"locked; {evidence} verified successes, unmet: {', '.join(status.unmet)}",
        evidence,
        status.unmet,
    )
