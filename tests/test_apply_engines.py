"""The LLM engines through ``kagura-agent apply``, sealed in the agent image.

kagura/agent-test (testing/agent_test_image.py) is the agent image plus the fake
``claude``/``codex`` executables (testing/fake_claude) on PATH; the Image manifest
``agent-test`` points at it with the agent recipe. The sdk engine drives the fake over
the SDK's stream-json control protocol: a Bash tool call really runs in the container, a
memory tool call is served by the host over the brain channel, and the result carries a
cost. The API key never reaches the container: the run's proxy injects it upstream.
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
    live_leases,
    make_project,
    manifest_set,
    run_ids,
    write_task,
)

from testing.agent_test_image import ensure_agent_test_image
from testing.cli_options import option

pytestmark = pytest.mark.usefixtures("docker_client")

API_KEY = "sk-ant-kagura-canary-" + "k" * 30
COST_USD = 0.0123  # what the fake claude reports


@pytest.fixture(scope="module")
def agent_test_image(docker_client: Any) -> tuple[Any, str]:
    return docker_client, ensure_agent_test_image(docker_client)


def _manifests(tmp_path: Path, image: str) -> Path:
    return manifest_set(
        tmp_path,
        {
            "kind": "Image",
            "metadata": {"name": "agent-test"},
            "spec": {"recipe": "images/agent", "tag": image, "baseline": True},
        },
        {
            "kind": "Brain",
            "metadata": {"name": "kb-claude"},
            "spec": {"engine": "kagura-brain", "backend": "claude", "model": "fake-model"},
        },
    )


def _apply(
    tmp_path: Path, state_dir: Path, image: tuple[Any, str], spec: dict[str, Any]
) -> tuple[int, dict[str, Any], list[dict[str, Any]], str, Path]:
    client, image_ref = image
    manifests = _manifests(tmp_path, image_ref)
    project = make_project(tmp_path)
    task = write_task(project, "engine", {"image": "agent-test", **spec})
    env = cli_env(state_dir, ANTHROPIC_API_KEY=API_KEY)
    done = kagura(["apply", "--yes", "--json", "--manifests", str(manifests), str(task)], env)
    lines = json_lines(done.stderr)
    result = last_json(done.stdout) if done.stdout.strip() else {}
    [run_id] = run_ids(state_dir)
    assert leftovers(client, run_id) == []
    assert live_leases(env) == []
    return done.returncode, result, lines, done.stderr, project


def _brain_events(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [item for item in lines if item.get("kind") == "brain"]


def _fake_calls(project: Path) -> list[dict[str, Any]]:
    log = project / ".fake-calls.jsonl"
    return [json.loads(line) for line in log.read_text().splitlines()]


def test_sdk_engine_end_to_end(
    agent_test_image: tuple[Any, str], tmp_path: Path, state_dir: Path
) -> None:
    prompt = "run: echo sdk-was-here > proof.txt\nremember: the sdk ran inside"
    code, result, lines, err, project = _apply(
        tmp_path,
        state_dir,
        agent_test_image,
        {
            "brain": "claude",
            "prompt": prompt,
            "egress": ["anthropic"],
            "verify": ["grep -q sdk-was-here proof.txt"],
        },
    )
    assert code == 0, err
    events = _brain_events(lines)
    kinds = [e["type"] for e in events]
    calls = [e for e in events if e["type"] == "tool_call"]
    assert [c["name"] for c in calls][:1] == ["Bash"], calls
    assert "echo sdk-was-here" in calls[0]["input"]["command"]
    assert "tool_result" in kinds and kinds[-1] == "done", kinds
    [cost] = [e for e in events if e["type"] == "cost"]
    assert cost["usd"] == pytest.approx(COST_USD)
    assert result["outcome"] == "success" and result["cost_usd"] == pytest.approx(COST_USD)
    assert result["brain_session_id"]
    # The fake saw the plan's model and permission mode, and the leased API key.
    [call] = _fake_calls(project)
    assert call["mode"] == "sdk" and call["cwd"] == "/workspace"
    assert option(call["argv"], "--permission-mode") == "acceptEdits"
    assert option(call["argv"], "--model") == "claude-sonnet-4-5"
    # The API key never entered the container: the CLI got a placeholder and the local
    # port the run's proxy listens on; the proxy adds the real key upstream.
    assert call["env"].get("ANTHROPIC_API_KEY") == "injected-at-the-proxy"
    assert call["env"].get("ANTHROPIC_BASE_URL") == "http://127.0.0.1:3129"
    assert API_KEY not in (project / ".fake-calls.jsonl").read_text()
    assert API_KEY not in err
    # The memory tool reached the host's memory (not a store in the container), where
    # the agent's own words are kept as untrusted: hidden from a default search.
    search = ["memory", "search", "sdk ran inside", "--json"]
    assert "the sdk ran inside" not in kagura(search, cli_env(state_dir)).stdout
    found = kagura([*search, "--untrusted"], cli_env(state_dir))
    assert "the sdk ran inside" in found.stdout, found.stdout + found.stderr


@pytest.mark.parametrize(("brain", "cli"), [("kb-claude", "claude"), ("codex", "codex")])
def test_kagura_brain_engine_end_to_end(
    agent_test_image: tuple[Any, str], tmp_path: Path, state_dir: Path, brain: str, cli: str
) -> None:
    code, result, lines, err, project = _apply(
        tmp_path,
        state_dir,
        agent_test_image,
        {"brain": brain, "prompt": "say hello", "verify": ["test -s .fake-calls.jsonl"]},
    )
    assert code == 0, err
    events = _brain_events(lines)
    assert events[0]["type"] == "tool_call"
    assert events[0]["name"] == f"{cli} CLI"
    assert events[-1]["type"] == "done" and f"fake {cli}" in (events[-1]["result"] or "")
    assert result["outcome"] == "success" and result["turns"] == 1
    [call] = _fake_calls(project)
    assert call["cli"] == cli
