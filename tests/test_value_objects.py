"""The values that travel through the layers of a run, built once where their facts exist."""

from __future__ import annotations

import dataclasses
from typing import Any

from kagura_agent.approvals import ApprovalRequest
from kagura_agent.membrane.egress.modelport import Injection
from kagura_agent.membrane.egress.request import EgressRequest

SECRET = "sk-ant-canary-" + "q" * 24


def _plan(pool: bool) -> Any:
    return {
        "egress": {"mode": "proxy", "allow": [], "pool": pool},
        "tripwires": {"egress_log_bytes": 4096},
        "budget": {"turns": 3},
    }


def test_applys_egress_request_reads_the_plan_and_never_shows_its_secret() -> None:
    request = EgressRequest.for_run(
        _plan(pool=True), "run-1", injection=Injection(host="api.test"), injection_secret=SECRET
    )
    assert (request.from_pool, request.log_ceiling, request.sweep) == (True, 4096, False)
    assert request.cold_only  # an injection never takes a pooled session
    assert SECRET not in repr(request) and SECRET not in str(request)
    plain = EgressRequest.for_run(_plan(pool=False), "run-2")
    assert not plain.from_pool and not plain.cold_only
    assert dataclasses.replace(plain, extra_networks=("side",)).cold_only


def test_an_approval_request_is_the_plans_needs_approval_capabilities_bound_to_its_intent() -> None:
    plan: Any = {
        "intent": "sha256:intent",
        "approvals": [
            {"category": "egress:dns", "class": "needs-approval", "reason": "locked"},
            {"category": "image:base", "class": "graduated", "reason": "granted"},
        ],
    }
    request = ApprovalRequest.for_plan(plan, who="ops", timeout=30)
    assert (request.fingerprint, list(request.categories)) == ("sha256:intent", ["egress:dns"])
    assert request.question("egress:dns").endswith("(locked)")
