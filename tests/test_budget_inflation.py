"""A tampered engine cannot inflate the next plan's budget (plan/budget.py).

Real runs: ``apply_plan`` in-process, the fake claude CLI in the real agent container,
the run's key injected at the real proxy towards a fake Anthropic API
(testing/fake_anthropic.py). The agent makes a few real model calls through the injecting
port while its engine reports 999 turns, 5M tokens and $99 each run. The plan after three
such runs learns from what the host measured (the calls counted at the proxy, its wall
clock), within one step of the last run's budget, asks for approval above the brain's
default, and keeps the dollar limit, which the host never measured. Before, the engine's
word was history: the same three runs raised 6 turns / $0.50 to the Policy ceilings
(1000 turns, $100), unasked.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from apply_helpers import make_project, manifest_set, write_task

from kagura_agent.apply.run.executor import ApplyOptions, apply_plan
from kagura_agent.errors import RefusedError
from kagura_agent.plan.build import plan_tasks
from testing.agent_test_image import ensure_agent_test_image
from testing.egress_images import ensure_egress_images
from testing.fake_anthropic import FakeAnthropicRuntime, fake_anthropic

pytestmark = pytest.mark.usefixtures("docker_client")

API_KEY = "sk-ant-kagura-inflate-" + "i" * 30
TEST_LABEL = {"dev.kagura.test": "budget-inflation"}
CALLS = 5  # real model calls each run makes through the injecting port
DEFAULT = {"turns": 6, "wall_time": "5m", "cost_usd": 0.5}  # the brain's budget
LEAN = {
    "kind": "Brain",
    "metadata": {"name": "lean"},
    "spec": {
        "engine": "sdk",
        "model": "claude-sonnet-4-5",
        "runtime": "container",
        "auth": {"mode": "api-key", "credential": "anthropic"},
        "budget": DEFAULT,
    },
}


# A turn call as the port counts it: a Messages call with tools (a call without is a side
# call, with caps of its own, and never a turn).
TURN_BODY = (
    "{'model': 'claude-sonnet-4-5', 'max_tokens': 64, 'messages': [{'role': 'user',"
    " 'content': 'go'}], 'tools': [{'name': 'Bash', 'input_schema': {'type': 'object'}}]}"
)


def _posts(calls: int) -> str:
    """Python the agent runs: ``calls`` model turn calls through ANTHROPIC_BASE_URL."""
    return (
        "import json, os, urllib.request as u;"
        " base = os.environ['ANTHROPIC_BASE_URL'];"
        f" body = json.dumps({TURN_BODY}).encode();"
        " post = lambda path: u.urlopen(u.Request(base + path, data=body, method='POST',"
        " headers={'content-type': 'application/json'})).read();"
        f" [post('/v1/messages') for _ in range({calls})]"
    )


@pytest.fixture(scope="module")
def images(docker_client: Any) -> tuple[str, str]:
    return ensure_agent_test_image(docker_client), ensure_egress_images(docker_client)["base"]


def test_an_engine_reporting_999_turns_and_99_dollars_moves_the_budget_one_measured_step(
    docker_client: Any,
    images: tuple[str, str],
    tmp_path: Path,
    state_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", API_KEY)
    agent_image, base_image = images
    image = {
        "kind": "Image",
        "metadata": {"name": "agent-test"},
        "spec": {"recipe": "images/agent", "tag": agent_image, "baseline": True},
    }
    folder = str(manifest_set(tmp_path, image, LEAN))
    project = make_project(tmp_path)
    prompt = f'run: python3 -c "{_posts(CALLS)}"\nusage: 999 4000000 1000000 99'
    spec = {"kind": "inflate", "image": "agent-test", "brain": "lean", "prompt": prompt}
    task = str(write_task(project, "inflate", {**spec, "egress": ["anthropic"]}))

    with fake_anthropic(docker_client, base_image, TEST_LABEL) as fake:
        for _ in range(3):
            (plan,) = plan_tasks(folder, [task])
            assert plan["budget"]["turns"] == 6 and plan["budget"]["cost_usd"] == 0.5
            result = apply_plan(plan, ApplyOptions(as_json=True), FakeAnthropicRuntime(fake))
            # The engine's claim and the host's count, both kept.
            assert (result.turns, result.cost_usd) == (999, 99.0), result
            assert result.model_calls == CALLS, result
        assert len(fake.requests()) == 3 * CALLS

        (plan,) = plan_tasks(folder, [task])
        budget, forecast = plan["budget"], plan["budget"]["forecast"]
        # Turns: p80 of the calls counted + 30%, within one step (x1.5) of the 6 the last
        # run had; not 1000. Dollars: the host measured none, so the brain's $0.50 stays.
        assert (budget["turns"], budget["cost_usd"]) == (math.ceil(CALLS * 1.3), 0.5), budget
        assert budget["turns"] <= math.floor(6 * 1.5) and budget["tokens"] is None
        assert forecast["reported"] == {"turns": 999, "tokens": 5_000_000, "cost_usd": 99.0}
        assert forecast["expected"]["turns"] == CALLS
        assert forecast["previous"]["turns"] == 6 and forecast["over_default"] == ["turns"]
        [asked] = [a for a in plan["approvals"] if a["category"] == "budget:turns"]
        assert asked["class"] == "needs-approval", asked
        assert "over the default 6 turns" in asked["reason"]

        # Above the default, nobody's approval, no run.
        with pytest.raises(RefusedError) as refused:
            apply_plan(plan, ApplyOptions(as_json=True), FakeAnthropicRuntime(fake))
        assert "budget:turns" in refused.value.message
        assert "--approve budget:turns" in (refused.value.hint or "")
        # Approved, it runs at the learnt limit and records it as the next step's base.
        approved = ApplyOptions(as_json=True, approve=("budget:turns",))
        result = apply_plan(plan, approved, FakeAnthropicRuntime(fake))
        assert result.model_calls == CALLS, result
    (plan,) = plan_tasks(folder, [task])
    assert plan["budget"]["forecast"]["previous"]["turns"] == math.ceil(CALLS * 1.3)
