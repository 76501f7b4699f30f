"""Brain conformance on the real Claude Code CLI (the one claude-agent-sdk bundles).

Each test mirrors a fake-CLI test of the suite (named in its docstring) with the real CLI
in the packaged agent image, through ``kagura-agent apply``, behind the run's proxy with
the operator's key injected, the model played by testing/fake_messages_api.py
(tests/conformance.py). ``pytest -m conformance`` runs them alone (scripts/upgrade-deps).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conformance import (
    API_KEY,
    agent_calls,
    apply,
    apply_argv,
    brain,
    brain_events,
    dump,
    egress_decisions,
    env,
    model,
    summary,
    task,
)

from testing.agent_test_image import ensure_agent_test_image
from testing.egress_images import ensure_egress_images
from testing.fake_messages_api import key_marker

pytestmark = [pytest.mark.usefixtures("docker_client"), pytest.mark.conformance]


@pytest.fixture(scope="module")
def images(docker_client: Any) -> tuple[str, str]:
    """(the real-CLI agent image, the image the fake model runs in)."""
    real = ensure_agent_test_image(docker_client, real_cli=True)
    return real, ensure_egress_images(docker_client)["base"]


def _tool(name: str, **tool_input: Any) -> dict[str, Any]:
    return {"name": name, "input": tool_input}


EDIT_SCRIPT = {
    "conversations": [
        {
            "match": "TASK-EDIT",
            "turns": [
                {
                    "thinking": "Write the notes, fix one line, check with the shell.",
                    "text": "Writing the notes.",
                    "tools": [
                        _tool("Write", file_path="/workspace/notes.txt", content="alpha\nbeta\n")
                    ],
                },
                {
                    "tools": [
                        _tool(
                            "Edit",
                            file_path="/workspace/notes.txt",
                            old_string="beta",
                            new_string="gamma",
                        )
                    ]
                },
                {
                    "tools": [
                        _tool(
                            "Bash",
                            command="sed -n 2p notes.txt; echo ran > bash.txt",
                            description="check",
                        )
                    ]
                },
                {"text": "Done, line two is {last_tool_result}"},
            ],
        }
    ]
}


def test_multi_turn_tool_use_edits_files_in_the_project_root(
    docker_client: Any, images: tuple[str, str], tmp_path: Path, state_dir: Path
) -> None:
    """test_apply_engines::test_sdk_engine_end_to_end on the real CLI: Write, Edit and Bash
    calls really change the project root, verify passes, the key only at the proxy."""
    real, base = images
    with model(docker_client, base, EDIT_SCRIPT) as fake:
        folder, task_file, project = task(
            tmp_path,
            real,
            {
                "prompt": "TASK-EDIT: keep notes",
                "verify": ["grep -qx gamma notes.txt", "test -s bash.txt"],
            },
        )
        code, result, lines, err = apply(apply_argv(folder, task_file), env(state_dir, fake))
        calls = agent_calls(fake)
        records = fake.records()
    decisions = egress_decisions(state_dir, result.get("run_id", ""))
    assert code == 0, err[-5000:]
    events = brain_events(lines)
    tools = [e["name"] for e in events if e["type"] == "tool_call"]
    assert tools == ["Write", "Edit", "Bash"], dump(events)
    results = [e for e in events if e["type"] == "tool_result"]
    assert not any(r["is_error"] for r in results), dump(results)
    assert events[-1]["type"] == "done" and "line two is gamma" in events[-1]["result"]
    assert (project / "notes.txt").read_text() == "alpha\ngamma\n"
    assert result["outcome"] == "success" and result["turns"] == 4
    assert [c["turn"]["index"] for c in calls] == [0, 1, 2, 3]
    # The plan's model went to the API; the operator's key arrived, the agent never held it.
    assert {c["body"]["model"] for c in calls} == {"claude-sonnet-4-5"}
    posts = [r for r in records if r["method"] == "POST"]
    assert {r["headers"].get("x-api-key") for r in posts} == {key_marker(API_KEY)}
    assert API_KEY not in err
    assert result["model_calls"] == len(posts), summary(decisions)
    # Nothing but the model calls went through the proxy, all by the injecting port. (The
    # CLI also opens tunnels of its own to api.anthropic.com on the forward port; with no
    # route off this machine they end not-forwarded. ``-s`` prints every decision.)
    print("\n".join(summary(decisions)))
    forwarded = {(d["inport"], d["reason"]) for d in decisions if d["decision"] == "allow"}
    assert forwarded == {(3129, "injected")}, summary(decisions)


RETRY_SCRIPT = {
    "conversations": [
        {
            "match": "TASK-RETRY",
            "turns": [
                {"text": "slow " * 40, "fail": [529, 429], "retry_after": "0", "delay": 0.05},
                {"text": "unreachable"},
            ],
        }
    ]
}


def test_overloaded_and_rate_limited_calls_are_retried_and_a_slow_stream_is_read_whole(
    docker_client: Any, images: tuple[str, str], tmp_path: Path, state_dir: Path
) -> None:
    """test_cost_forecast_e2e's retries on the real CLI: a 529 then a 429 (retry-after 0)
    are retried by the CLI itself, which says so (system api_retry messages, counted in the
    cost event); the answer then streams slowly (some 1.5 s) through the proxy, whole."""
    real, base = images
    with model(docker_client, base, RETRY_SCRIPT) as fake:
        folder, task_file, _ = task(tmp_path, real, {"prompt": "TASK-RETRY"})
        code, result, lines, err = apply(apply_argv(folder, task_file), env(state_dir, fake))
        calls = agent_calls(fake)
    assert code == 0, err[-5000:]
    events = brain_events(lines)
    retried = [e["text"] for e in events if e["type"] == "text" and "retried" in e["text"]]
    assert retried == [
        "[the API call is retried (attempt 1, status 529)]\n\n",
        "[the API call is retried (attempt 2, status 429)]\n\n",
    ], dump(events)
    [cost] = [e for e in events if e["type"] == "cost"]
    assert cost["retries"] == 2 and result["retries"] == 2
    assert events[-1]["result"] == "slow " * 40
    assert [c["turn"]["index"] for c in calls] == [0, 0, 0]


MODE_SCRIPT = {
    "conversations": [
        {
            "match": "TASK-MODE",
            "turns": [
                {"tools": [_tool("Write", file_path="/workspace/written.txt", content="w\n")]},
                {
                    "tools": [
                        _tool("Bash", command="python3 -c \"open('by-python', 'w').write('p')\"")
                    ]
                },
                {"text": "modes done"},
            ],
        }
    ]
}


# Each mode the Brain schema offers: may the agent write a file, may it run a program?
# ``auto`` (a classifier model decides) is not offered to this CLI with an API key and no
# feature flags (it never asks the model): it denies as ``default`` does. A CLI that starts
# deciding fails here, and whoever bumps it decides what the plan should say.
MODES = {
    "default": (False, False),
    "acceptEdits": (True, False),
    "plan": (False, False),
    "bypassPermissions": (True, True),
    "dontAsk": (False, False),
    "auto": (False, False),
}


def test_the_schema_offers_exactly_these_permission_modes() -> None:
    import json

    schema = json.loads((Path(__file__).parents[1] / "schemas" / "brain.json").read_text())
    assert schema["properties"]["spec"]["properties"]["permission_mode"]["enum"] == list(MODES)


@pytest.mark.parametrize("mode", list(MODES))
def test_each_permission_mode_holds_the_tools_as_the_cli_defines_it(
    docker_client: Any, images: tuple[str, str], tmp_path: Path, state_dir: Path, mode: str
) -> None:
    """test_brain_engines' permission-mode flag on the real CLI: what each mode lets the
    agent do without anyone to ask (an sdk run has no permission prompt)."""
    real, base = images
    may_write, may_run = MODES[mode]
    with model(docker_client, base, MODE_SCRIPT) as fake:
        folder, task_file, project = task(
            tmp_path, real, {"prompt": "TASK-MODE", "brain": f"claude-{mode.lower()}"}, brain(mode)
        )
        code, result, lines, err = apply(apply_argv(folder, task_file), env(state_dir, fake))
        calls = agent_calls(fake)
    assert code == 0 and result["outcome"] == "success", err[-5000:]
    events = brain_events(lines)
    results = {e["id"]: e for e in events if e["type"] == "tool_result"}
    outcome = {
        e["name"]: not results[e["id"]]["is_error"] for e in events if e["type"] == "tool_call"
    }
    assert outcome == {"Write": may_write, "Bash": may_run}, dump(events)
    assert (project / "written.txt").exists() == may_write
    assert (project / "by-python").exists() == may_run
    # Denied or not, each call was one turn: no classifier or retry call in between.
    assert [c["turn"]["index"] for c in calls] == [0, 1, 2]
