"""The model-call policy in the plan (plan/modelcalls.py): what an EgressPolicy's
``model_calls`` grants shows as the egress it is, and the model host is reached through
the key-injecting port only."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from apply_helpers import make_project, manifest_set, write_task

from kagura_agent.membrane.egress.modelport import Injection, ModelCallPolicy
from kagura_agent.plan.build import plan_tasks
from kagura_agent.plan.diff import diff_plans
from kagura_agent.plan.render import render_text
from kagura_agent.ui import Style

SEARCH = {
    "kind": "EgressPolicy",
    "metadata": {"name": "web-search"},
    "spec": {"model_calls": {"server_tools": ["web_search"], "concurrency": 8}},
}
CONNECTOR = {
    "kind": "EgressPolicy",
    "metadata": {"name": "docs-mcp"},
    "spec": {"baseline": True, "model_calls": {"mcp_servers": ["MCP.Example.com"]}},
}
OLD_STYLE = {
    "kind": "EgressPolicy",
    "metadata": {"name": "anthropic-host"},
    "spec": {"baseline": True, "allow": [{"host": "api.anthropic.com"}]},
}
TUNNEL = {
    "kind": "EgressPolicy",
    "metadata": {"name": "tunnel"},
    "spec": {"model_calls": {"tunnel": True}},
}


def _plan(tmp_path: Path, egress: list[str], *documents: dict[str, Any]) -> Any:
    folder = manifest_set(tmp_path, *documents)
    project = make_project(tmp_path)
    spec = {"brain": "claude", "prompt": "hello", "egress": egress}
    (plan,) = plan_tasks(str(folder), [str(write_task(project, "t", spec))])
    return plan


@pytest.mark.usefixtures("without_docker")
def test_the_packaged_policy_reaches_the_model_through_the_port_and_nothing_more(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, state_dir: Path
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-plan-" + "p" * 30)
    plan = _plan(tmp_path, ["anthropic"])
    egress = plan["egress"]
    # No tunnel to the model host on the forward port; the proxy is there for the port.
    assert (egress["mode"], egress["allow"]) == ("proxy", [])
    calls = egress["model_calls"]
    assert calls["upstream"] == "https://api.anthropic.com:443"
    assert (calls["server_tools"], calls["mcp_servers"], calls["url_sources"]) == ([], [], False)
    assert calls["files"] is False and calls["tunnel"] == [] and calls["concurrency"] == 4
    assert "claude-code" in calls["betas"] and "web-search" not in calls["betas"]
    assert plan["brain"]["cli_environment"]["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1"
    text = render_text(plan, Style(False))
    assert "the provider reaches nothing for the agent" in text
    assert "30 turn calls (the turn budget), 30 side calls, 120 token counts; 4 at once" in text


@pytest.mark.usefixtures("without_docker")
def test_a_policy_that_lets_the_provider_reach_out_is_egress_the_plan_shows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, state_dir: Path
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-plan-" + "p" * 30)
    before = _plan(tmp_path / "a", ["anthropic"], SEARCH, CONNECTOR)
    plan = _plan(tmp_path / "b", ["anthropic", "web-search", "docs-mcp"], SEARCH, CONNECTOR)
    calls = plan["egress"]["model_calls"]
    assert calls["server_tools"] == ["web_search"] and calls["mcp_servers"] == ["mcp.example.com"]
    assert {"web-search", "mcp-client"} <= set(calls["betas"]) and calls["concurrency"] == 8
    # Asked for like any egress: not baseline unless the policy says so.
    classes = {a["category"]: a["class"] for a in plan["approvals"]}
    assert classes["egress:web-search"] == "needs-approval"
    assert classes["egress:docs-mcp"] == "baseline"
    text = render_text(plan, Style(False))
    assert "web_search, 8 calls at once (policy web-search)" in text
    assert "MCP server mcp.example.com (policy docs-mcp)" in text
    changes = [c.render() for c in diff_plans(before, plan)]
    assert "+ provider egress web_search (policy web-search)  (widens)" in changes
    assert "+ provider egress MCP server mcp.example.com (policy docs-mcp)  (widens)" in changes
    # What the port gets is what the plan says.
    config = json.loads(ModelCallPolicy.from_plan(calls).lua_config(Injection("api.anthropic.com")))
    assert config["server_tools"] == ["web_search"] and config["mcp_servers"] == ["mcp.example.com"]
    assert "web-search" in config["beta_families"]


@pytest.mark.usefixtures("without_docker")
def test_a_tunnel_to_the_model_host_is_left_out_unless_a_policy_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, state_dir: Path
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-plan-" + "p" * 30)
    plan = _plan(tmp_path / "a", ["anthropic", "anthropic-host"], OLD_STYLE, TUNNEL)
    assert plan["egress"]["allow"] == []
    assert any("is the model host: it is reached only through" in w for w in plan["warnings"])
    kept = _plan(tmp_path / "b", ["anthropic-host", "tunnel"], OLD_STYLE, TUNNEL)
    assert [e["host"] for e in kept["egress"]["allow"]] == ["api.anthropic.com"]
    assert kept["egress"]["model_calls"]["tunnel"] == ["tunnel"]
    assert any("neither checked nor counted" in w for w in kept["warnings"])
