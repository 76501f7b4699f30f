"""ToolServer manifests without containers: the plan, the approval gate, the turn, the engines.

The sdk engine is driven through the real Claude Agent SDK against the fake ``claude``
(testing/fake_claude), which connects to the MCP servers the SDK configured exactly as
the CLI would: the stdio fake (testing/fake_mcp.py) as a child process, the http fake
on 127.0.0.1. The container runs (stdio in the agent image, http through the run's
proxy) are tests/test_tool_servers_e2e.py.
"""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from apply_helpers import cli_env, kagura, make_project, manifest_set, write_task
from golden import golden_plan
from tool_server_doc import example, shown_plan_lines

from kagura_agent.brain.dispatch_tool import DISPATCH_SERVER
from kagura_agent.brain.engines.script import ScriptBrain
from kagura_agent.brain.engines.sdk import MEMORY_SERVER, SdkBrain, sdk_tool_servers
from kagura_agent.brain.events import BrainEvent, ErrorEvent, TextEvent, ToolResultEvent
from kagura_agent.brain.plan_turn import turn_from_plan
from kagura_agent.brain.protocol import Turn
from kagura_agent.errors import UsageError
from kagura_agent.manifest.adhoc import AdhocTask, write_adhoc_task
from kagura_agent.manifest.toolservers import RESERVED_NAMES
from kagura_agent.patterns.dispatch import narrowing_violations
from testing.cli_options import option
from testing.fake_claude import FAKE_CLAUDE

REPO = Path(__file__).resolve().parents[1]
FAKE_MCP = REPO / "testing" / "fake_mcp.py"
NOTES = {"transport": "stdio", "command": [sys.executable, str(FAKE_MCP), "stdio"], "env": {}}


def _golden() -> Any:
    return golden_plan("tool-servers")


def _events(brain: Any, turn: Turn) -> list[BrainEvent]:
    async def collect() -> list[BrainEvent]:
        return [event async for event in brain.run(turn)]

    return asyncio.run(collect())


def test_the_plan_shows_each_tool_server_its_image_or_host_and_class() -> None:
    plan = _golden()
    notes, tickets = plan["tool_servers"]
    assert (notes["transport"], notes["image"], notes["command"]) == (
        "stdio",
        "mcp-notes",
        ["python3", "-m", "notes_mcp"],
    )
    # A stdio server runs in its image: the task, naming none, runs there.
    assert plan["image"]["name"] == "mcp-notes"
    assert (tickets["transport"], tickets["host"], tickets["port"]) == (
        "http",
        "tickets.internal.test",
        8000,
    )
    # The http server's endpoint is in the run's allowlist, under its own category.
    [entry] = [e for e in plan["egress"]["allow"] if e["policy"] == "toolserver:tickets"]
    assert (entry["host"], entry["port"], entry["scheme"]) == (
        "tickets.internal.test",
        8000,
        "http",
    )
    assert entry["allow_addresses"] == ["10.0.0.0/8"]
    classes = {a["category"]: a["class"] for a in plan["approvals"]}
    assert classes["toolserver:notes"] == classes["toolserver:tickets"] == "needs-approval"
    assert notes["class"] == "needs-approval" and "2 verified successes" in notes["reason"]


def _tool_world(tmp_path: Path, *, baseline: bool) -> tuple[Path, Path]:
    manifests = manifest_set(
        tmp_path,
        {
            "kind": "ToolServer",
            "metadata": {"name": "notes"},
            "spec": {
                "transport": "stdio",
                "image": "agent",
                "command": "python3",
                "args": ["-m", "notes_mcp"],
                "baseline": baseline,
            },
        },
    )
    project = make_project(tmp_path)
    task = write_task(
        project, "notes-task", {"brain": "claude", "tool_servers": ["notes"], "prompt": "hi"}
    )
    return manifests, task


@pytest.mark.usefixtures("without_docker")
def test_apply_refuses_an_unapproved_tool_server(tmp_path: Path, state_dir: Path) -> None:
    manifests, task = _tool_world(tmp_path, baseline=False)
    env = cli_env(state_dir, ANTHROPIC_API_KEY="sk-ant-unused-" + "x" * 30)
    done = kagura(["apply", "--yes", "--manifests", str(manifests), str(task)], env)
    assert done.returncode == 6, done.stdout + done.stderr
    assert "toolserver:notes" in done.stderr
    assert "approv" in done.stderr.lower()
    # An operator's baseline tool server needs no approval: the plan is applyable as is.
    manifests, task = _tool_world(tmp_path / "b", baseline=True)
    done = kagura(["plan", "--json", "--manifests", str(manifests), str(task)], env)
    plan = json.loads(done.stdout)["plans"][0]["plan"]
    assert plan["tool_servers"][0]["class"] == "baseline", plan["tool_servers"]


@pytest.mark.usefixtures("without_docker")
def test_the_documented_example_plans_as_the_docs_show(tmp_path: Path, state_dir: Path) -> None:
    docs, task = example()
    manifests = manifest_set(
        tmp_path, *({k: v for k, v in d.items() if k != "apiVersion"} for d in docs)
    )
    project = make_project(tmp_path)
    path = write_task(project, task["metadata"]["name"], task["spec"])
    env = cli_env(state_dir, ANTHROPIC_API_KEY="sk-ant-unused-" + "x" * 30)
    done = kagura(["plan", "--manifests", str(manifests), str(path)], env)
    assert done.returncode == 0, done.stderr
    for line in shown_plan_lines():
        assert line + "  (from operator)" in done.stdout.splitlines(), (line, done.stdout)
    # The documented apply line names exactly what the plan asks to approve.
    done = kagura(["apply", "--manifests", str(manifests), str(path)], env)
    assert done.returncode == 6 and "toolserver:notes" in done.stderr, done.stderr


@pytest.mark.usefixtures("without_docker")
def test_a_policy_can_deny_a_tool_server(tmp_path: Path, state_dir: Path) -> None:
    docs, task = example()
    stdio_only = {
        "kind": "Policy",
        "metadata": {"name": "house"},
        "spec": {
            "rules": [
                {
                    "name": "stdio-tools-only",
                    "effect": "deny",
                    "message": "no network tool servers here",
                    "schema": {
                        "properties": {
                            "tool_servers": {
                                "items": {"properties": {"transport": {"const": "stdio"}}}
                            }
                        }
                    },
                }
            ]
        },
    }
    own = [{k: v for k, v in d.items() if k != "apiVersion"} for d in docs]
    manifests = manifest_set(tmp_path, *own, stdio_only)
    project = make_project(tmp_path)
    path = write_task(project, task["metadata"]["name"], task["spec"])
    env = cli_env(state_dir, ANTHROPIC_API_KEY="sk-ant-unused-" + "x" * 30)
    done = kagura(["plan", "--json", "--manifests", str(manifests), str(path)], env)
    plan = json.loads(done.stdout)["plans"][0]["plan"]
    classes = {s["name"]: s["class"] for s in plan["tool_servers"]}
    assert classes == {"notes": "needs-approval", "tickets": "denied"}, classes
    assert not plan["applyable"]
    assert {"code": "capability-denied", "source": "toolserver:tickets"} in [
        {k: r[k] for k in ("code", "source")} for r in plan["refusals"]
    ]


def test_a_child_may_not_add_a_tool_server_its_parent_lacked() -> None:
    plan = _golden()
    parent = {**plan, "tool_servers": plan["tool_servers"][:1]}
    found = narrowing_violations(parent, plan)
    assert found == ["tool server tickets is not one the parent had"], found


def test_the_turn_carries_tool_servers_over_the_wire() -> None:
    turn = turn_from_plan(_golden())
    assert turn.tool_servers == {
        "notes": {"transport": "stdio", "command": ["python3", "-m", "notes_mcp"], "env": {}},
        "tickets": {"transport": "http", "url": "http://tickets.internal.test:8000/mcp"},
    }
    assert Turn.from_json(json.loads(json.dumps(turn.to_json()))) == turn
    wire = turn.to_json()
    wire["tool_servers"] = {"x": {"transport": "stdio", "command": []}}
    with pytest.raises(UsageError, match="non-empty command"):
        Turn.from_json(wire)


def test_the_sdk_gets_the_claude_agent_sdk_shapes() -> None:
    turn = turn_from_plan(_golden())
    assert sdk_tool_servers(turn) == {
        "notes": {"type": "stdio", "command": "python3", "args": ["-m", "notes_mcp"]},
        "tickets": {"type": "http", "url": "http://tickets.internal.test:8000/mcp"},
    }


def test_other_engines_say_they_cannot() -> None:
    turn = Turn(engine="script", steps=("true",), tool_servers={"notes": NOTES})
    [event] = _events(ScriptBrain(), turn)
    assert isinstance(event, ErrorEvent) and event.code == "setup"
    assert "script engine cannot use tool servers (notes)" in event.message


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture()
def http_fake() -> Iterator[str]:
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, str(FAKE_MCP), "http", "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "the http fake never listened"
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_the_sdk_engine_hands_them_to_the_cli_which_calls_them(
    http_fake: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "calls.jsonl"
    monkeypatch.setenv("KAGURA_FAKE_LOG", str(log))
    monkeypatch.delenv("HTTP_PROXY", raising=False)
    monkeypatch.delenv("http_proxy", raising=False)
    prompt = "\n".join(
        [
            'tool: notes echo {"text": "over stdio"}',
            'tool: tickets add {"a": 2, "b": 40}',
            'tool: undeclared echo {"text": "x"}',
        ]
    )
    turn = Turn(
        engine="sdk",
        prompt=prompt,
        permission_mode="acceptEdits",
        cwd=str(tmp_path),
        tool_servers={"notes": NOTES, "tickets": {"transport": "http", "url": http_fake}},
    )
    events = _events(SdkBrain(cli_path=str(FAKE_CLAUDE)), turn)
    results = [e.output for e in events if isinstance(e, ToolResultEvent)]
    assert f"stdio echo from {socket.gethostname()}: over stdio" in results
    assert "42" in results
    # What the SDK did not configure, the CLI has no tool for.
    assert "No such tool available: mcp__undeclared__echo" in results
    assert any(isinstance(e, TextEvent) and "Tool tickets add said: 42" in e.text for e in events)
    [call] = [json.loads(line) for line in log.read_text().splitlines()]
    argv = call["argv"]
    config = json.loads(option(argv, "--mcp-config") or "{}")["mcpServers"]
    assert config["notes"] == {
        "type": "stdio",
        "command": sys.executable,
        "args": [str(FAKE_MCP), "stdio"],
    }
    assert config["tickets"] == {"type": "http", "url": http_fake}
    allowed = (option(argv, "--allowedTools") or "").split(",")
    assert {"mcp__notes", "mcp__tickets"} <= set(allowed), allowed


def test_the_brains_own_server_names_are_reserved() -> None:
    assert set(RESERVED_NAMES) == {MEMORY_SERVER, DISPATCH_SERVER}


@pytest.mark.usefixtures("without_docker")
def test_an_http_tool_server_cannot_reach_loopback_or_metadata(
    tmp_path: Path, state_dir: Path
) -> None:
    manifests = manifest_set(
        tmp_path,
        {
            "kind": "ToolServer",
            "metadata": {"name": "sneaky"},
            "spec": {
                "transport": "http",
                "url": "http://sneaky.test/mcp",
                "allow_addresses": ["127.0.0.0/8", "169.254.169.254/32"],
            },
        },
    )
    project = make_project(tmp_path)
    path = write_task(project, "t", {"brain": "claude", "tool_servers": ["sneaky"], "prompt": "x"})
    env = cli_env(state_dir, ANTHROPIC_API_KEY="sk-ant-unused-" + "x" * 30)
    done = kagura(["plan", "--json", "--manifests", str(manifests), str(path)], env)
    plan = json.loads(done.stdout)["plans"][0]["plan"]
    assert not plan["applyable"]
    floor = " ".join(plan["floor"])
    assert "127.0.0.0/8" in floor and "169.254.169.254/32" in floor, plan["floor"]


@pytest.mark.usefixtures("without_docker")
def test_a_one_off_run_asks_for_tool_servers_by_name(
    tmp_path: Path, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    docs, _ = example()
    manifests = manifest_set(
        tmp_path, *({k: v for k, v in d.items() if k != "apiVersion"} for d in docs)
    )
    env = cli_env(state_dir, ANTHROPIC_API_KEY="sk-ant-unused-" + "x" * 30)
    done = kagura(["run", "hi", "--manifests", str(manifests), "--tool-server", "nope"], env)
    assert done.returncode == 2, done.stderr
    assert "--tool-server nope: no ToolServer of that name" in done.stderr
    assert "notes, tickets" in done.stderr
    monkeypatch.setenv("KAGURA_AGENT_STATE_DIR", str(state_dir))
    project = make_project(tmp_path)
    path = write_adhoc_task(
        AdhocTask("triage", tool_servers=["notes"], project_root=project), manifests=str(manifests)
    )
    done = kagura(["plan", "--json", "--manifests", str(manifests), str(path)], env)
    plan = json.loads(done.stdout)["plans"][0]["plan"]
    assert [s["name"] for s in plan["tool_servers"]] == ["notes"]
    assert plan["image"]["name"] == "mcp-tools"


@pytest.mark.usefixtures("without_docker")
def test_the_graduation_baseline_can_grant_a_tool_server(tmp_path: Path, state_dir: Path) -> None:
    manifests, task = _tool_world(tmp_path, baseline=False)
    (manifests / "zz-baseline.yml").write_text(
        "apiVersion: kagura.dev/v1\nkind: Graduation\nmetadata: {name: house}\n"
        "spec: {baseline: ['toolserver:notes']}\n"
    )
    env = cli_env(state_dir, ANTHROPIC_API_KEY="sk-ant-unused-" + "x" * 30)
    done = kagura(["plan", "--json", "--manifests", str(manifests), str(task)], env)
    assert done.returncode == 0, done.stdout + done.stderr
    [notes] = json.loads(done.stdout)["plans"][0]["plan"]["tool_servers"]
    assert notes["class"] == "baseline", notes
