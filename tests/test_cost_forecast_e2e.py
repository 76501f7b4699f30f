"""Budgets that learn, end to end: the fake claude CLI drives the SDK engine in the real
agent container; the run records its turns, tokens, dollars, wall time and the API
retries the CLI reported, and the model calls the host counted at the proxy; the next
plan of the same task kind forecasts from that run, shows its basis and what the engine
claimed, learns its limits from what the host measured only, and the plan diff says the
budget moved and why. (The fake CLI makes no model call of its own: the proxy counts 0.)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from apply_helpers import (
    cli_env,
    json_lines,
    kagura,
    last_json,
    leftovers,
    make_project,
    manifest_set,
    run_ids,
    write_task,
)

from testing.agent_test_image import ensure_agent_test_image

pytestmark = pytest.mark.usefixtures("docker_client")

API_KEY = "sk-ant-kagura-forecast-" + "k" * 30


@pytest.fixture(scope="module")
def agent_test_image(docker_client: Any) -> tuple[Any, str]:
    return docker_client, ensure_agent_test_image(docker_client)


def test_a_run_records_its_cost_and_the_next_plan_forecasts_from_it(
    agent_test_image: tuple[Any, str], tmp_path: Path, state_dir: Path
) -> None:
    client, image_ref = agent_test_image
    manifests = manifest_set(
        tmp_path,
        {
            "kind": "Image",
            "metadata": {"name": "agent-test"},
            "spec": {"recipe": "images/agent", "tag": image_ref, "baseline": True},
        },
    )
    project = make_project(tmp_path)
    spec = {
        "kind": "nightly-report",
        "image": "agent-test",
        "brain": "claude",
        "prompt": "run: echo report > report.txt\nusage: 7 1200 300 0.0456\nretries: 2",
        "egress": ["anthropic"],
        "verify": ["grep -q report report.txt"],
    }
    task = write_task(project, "forecast", spec)
    env = cli_env(state_dir, ANTHROPIC_API_KEY=API_KEY)
    plan_args = ["plan", "--json", "--manifests", str(manifests), str(task)]
    before = json.loads(kagura(plan_args, env).stdout)["plans"][0]["plan"]["budget"]
    assert before["forecast"] is None and before["source"] == "brain"

    done = kagura(["apply", "--yes", "--json", "--manifests", str(manifests), str(task)], env)
    assert done.returncode == 0, done.stderr
    result = last_json(done.stdout)
    [run_id] = run_ids(state_dir)
    assert leftovers(client, run_id) == []  # (the later runs' teardown is the same path)
    # What the run recorded came from the CLI's result message and its api_retry messages.
    assert result["turns"] == 7
    assert (result["input_tokens"], result["output_tokens"]) == (1200, 300)
    assert result["cost_usd"] == pytest.approx(0.0456)
    assert result["retries"] == 2
    assert result["model_calls"] == 0  # counted at the proxy: the fake CLI calls no model
    [cost] = [
        e for e in json_lines(done.stderr) if e.get("kind") == "brain" and e["type"] == "cost"
    ]
    assert cost["retries"] == 2
    shown = kagura(["memory", "search", "nightly-report", "--json"], cli_env(state_dir))
    assert "0 model calls counted, 1500 tokens, 2 retries" in shown.stdout, shown.stdout

    # One run: the plan forecasts from it, but one run is too few to set the budget.
    planned = kagura(plan_args, env)
    assert planned.returncode == 0, planned.stderr
    entry = json.loads(planned.stdout)["plans"][0]
    budget = entry["plan"]["budget"]
    forecast = budget["forecast"]
    assert forecast["basis"] == "p80 of 1 run + 30%, host-measured"
    assert forecast["reported"]["turns"] == 7 and forecast["reported"]["tokens"] == 1500
    assert forecast["reported"]["cost_usd"] == pytest.approx(0.0456)
    assert forecast["expected"]["turns"] == 0 and forecast["expected"]["cost_usd"] is None
    assert forecast["retries"] == 2
    assert forecast["learnt"] == [] and budget["source"] == "brain" and budget["turns"] == 30
    assert not [c for c in entry["changes"] if c["section"] == "budget"]
    text = kagura(["plan", "--manifests", str(manifests), str(task)], env).stdout
    assert "forecast 0 model calls, " in text, text
    assert "engines reported 7 turns, 1,500 tokens, $0.0456 (not learnt)" in text, text
    assert "the budget is learnt from 3 runs on" in text, text

    # Two more runs of the same kind (another prompt, other costs): now it is learnt.
    for usage in ("9 1500 400 0.05", "8 1400 350 0.048"):
        prompt = f"run: echo report > report.txt\nusage: {usage}"
        write_task(project, "forecast", {**spec, "prompt": prompt})
        done = kagura(["apply", "--yes", "--json", "--manifests", str(manifests), str(task)], env)
        assert done.returncode == 0, done.stderr
        assert last_json(done.stdout)["retries"] == 0
    entry = json.loads(kagura(plan_args, env).stdout)["plans"][0]
    budget = entry["plan"]["budget"]
    forecast = budget["forecast"]
    basis = "p80 of 3 runs + 30%, host-measured"
    assert forecast["basis"] == basis
    assert forecast["reported"]["turns"] == 8 and forecast["reported"]["tokens"] == 1750
    # Learnt under the brain's defaults (30 turns, 30m, $2) from what the host measured,
    # floors holding: 0 calls counted -> the 5-turn floor; the wall clock. Tokens and
    # dollars were the engine's word only: not learnt (the brain's $2 stays).
    assert budget["source"] == "history"
    assert budget["turns"] == 5 and budget["tokens"] is None
    assert budget["wall_seconds"] >= 30 and budget["cost_usd"] == 2
    assert forecast["learnt"] == ["turns", "wall_seconds"]
    assert forecast["over_default"] == []  # less than the defaults: nothing to approve
    # The diff against the applied plan says the budget moved, and on what basis.
    moved = [c["text"] for c in entry["changes"] if c["section"] == "budget"]
    assert f"turns 30 → 5 (learnt: {basis})" in moved, moved
    text = kagura(["plan", "--manifests", str(manifests), str(task)], env).stdout
    assert "engines reported 8 turns, 1,750 tokens" in text, text
    assert f"learnt turns, wall from {basis}" in text, text
    assert f"~ budget turns 30 → 5 (learnt: {basis})" in text, text
