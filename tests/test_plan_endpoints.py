"""A Brain's model endpoint in the plan (manifest/endpoint.py, plan/endpoint.py): where the
calls go, how the credential travels, its approval class, its lease, and every view of
the plan saying so. Plans come from the golden cases (tests/plans/sdk-*) or the planner
with a facts file: never built by hand."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import yaml
from golden import PLANS, golden_plan

from kagura_agent.plan.build import plan_tasks
from kagura_agent.plan.diff import diff_plans
from kagura_agent.plan.render import render_markdown


def test_each_endpoint_is_the_ports_upstream_with_its_own_paths() -> None:
    calls = {case: golden_plan(case)["egress"]["model_calls"] for case in ENDPOINTS}
    assert {case: c["upstream"] for case, c in calls.items()} == {
        "sdk-api-key": "https://api.anthropic.com:443",
        "sdk-gateway": "https://llm-gateway.corp.example:4000/anthropic",
        "sdk-subscription": "https://api.anthropic.com:443",
        "sdk-bedrock": "https://bedrock-runtime.us-east-1.amazonaws.com:443",
        "sdk-vertex": "https://us-east5-aiplatform.googleapis.com:443",
    }
    assert calls["sdk-bedrock"]["paths"][:2] == [
        "POST /model/{model}/invoke",
        "POST /model/{model}/invoke-with-response-stream",
    ]
    assert calls["sdk-vertex"]["paths"][1] == "POST .../models/{model}:streamRawPredict"
    # What the CLI sends as a subscriber is allowed there, and only there.
    assert {"oauth", "extended-cache-ttl"} <= set(calls["sdk-subscription"]["betas"])
    assert not {"oauth", "extended-cache-ttl"} & set(calls["sdk-api-key"]["betas"])
    # No forward-port entry for any of them: the port is the calls' only way.
    for case in ENDPOINTS:
        plan = golden_plan(case)
        assert plan["egress"]["mode"] == "proxy" and plan["egress"]["allow"] == []
        assert plan["egress"]["pool"] is False  # configured with the credential at start


ENDPOINTS = ("sdk-api-key", "sdk-gateway", "sdk-subscription", "sdk-bedrock", "sdk-vertex")


def test_each_endpoint_says_how_its_credential_travels_and_its_class() -> None:
    found = {case: golden_plan(case)["brain"]["model_endpoint"] for case in ENDPOINTS}
    assert {case: (e["api"], e["auth"]) for case, e in found.items()} == {
        "sdk-api-key": ("anthropic", "x-api-key"),
        "sdk-gateway": ("anthropic", "bearer"),
        "sdk-subscription": ("anthropic", "oauth"),
        "sdk-bedrock": ("bedrock", "sigv4"),
        "sdk-vertex": ("vertex", "bearer"),
    }
    # The default API and an endpoint the Brain marks baseline need no approval; a new
    # endpoint does (its runs' prompts and code go there).
    assert {case: e["class"] for case, e in found.items()} == {
        "sdk-api-key": "baseline",
        "sdk-gateway": "needs-approval",
        "sdk-subscription": "baseline",
        "sdk-bedrock": "baseline",
        "sdk-vertex": "needs-approval",
    }
    approvals = {a["category"]: a["class"] for a in golden_plan("sdk-gateway")["approvals"]}
    assert approvals["model-endpoint:llm-gateway.corp.example"] == "needs-approval"


def test_a_cloud_credential_is_leased_to_cover_the_wall_time() -> None:
    (bedrock,) = golden_plan("sdk-bedrock")["credentials"]  # 40 minutes of wall time
    assert (bedrock["ttl_seconds"], bedrock["renewals"], bedrock["budget_seconds"]) == (
        900,
        2,
        2700,
    )
    assert bedrock["scope"] == "bedrock" and bedrock["standing"] is False
    (static,) = golden_plan("sdk-subscription")["credentials"]
    assert (static["ttl_seconds"], static["renewals"]) == (3600, 0)


def test_every_view_names_the_endpoint() -> None:
    bedrock = golden_plan("sdk-bedrock")
    text = (PLANS / "sdk-bedrock" / "expected.txt").read_text()
    assert "endpoint     https://bedrock-runtime.us-east-1.amazonaws.com (Amazon Bedrock" in text
    assert "the proxy signs each call (AWS SigV4, service bedrock)" in text
    markdown = render_markdown(bedrock)
    assert "| model endpoint | https://bedrock-runtime.us-east-1.amazonaws.com" in markdown
    changes = [c.render() for c in diff_plans(golden_plan("sdk-api-key"), bedrock)]
    assert (
        "+ model endpoint https://bedrock-runtime.us-east-1.amazonaws.com"
        " (api bedrock us-east-1, auth sigv4 aws/bedrock)  (widens)"
    ) in changes
    assert (
        "- model endpoint https://api.anthropic.com (api anthropic, auth x-api-key anthropic/api)"
        in changes
    )


def _case(tmp_path: Path, case: str, task: dict[str, Any]) -> Any:
    """The golden case's manifests and facts with another task spec."""
    folder = tmp_path / case
    shutil.copytree(PLANS / case, folder)
    document = yaml.safe_load((folder / "task.yml").read_text())
    document["spec"] = {**document["spec"], **task}
    (folder / "task.yml").write_text(yaml.safe_dump(document))
    (plan,) = plan_tasks(
        str(folder / "manifests"),
        [str(folder / "task.yml")],
        facts_file=str(folder / "facts.json"),
    )
    return plan


def test_an_endpoint_brain_run_on_the_host_is_refused(tmp_path: Path) -> None:
    plan = _case(tmp_path, "sdk-gateway", {"runtime": "host"})
    assert "model_endpoint" not in plan["brain"]
    codes = [r["code"] for r in plan["refusals"]]
    assert "endpoint-needs-container" in codes and plan["applyable"] is False
