"""Brain conformance on the real Claude Code CLI: the tools the host gives the brain.

Mirrors test_tool_servers_e2e (an operator's MCP tool servers, stdio in the agent
container and http through the run's proxy), test_midrun_apply (``request_access``: an
egress grant mid-run, the proxy reloaded) and test_dispatch_runtime (``dispatch``: a child
run of its own) with the CLI claude-agent-sdk bundles (tests/conformance.py). The model's
calls of these tools are the CLI's own MCP calls: to a stdio server it starts, an http
server it reaches through HTTP_PROXY, and the SDK's in-process servers.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
from apply_helpers import (
    REPO,
    json_lines,
    last_json,
    leftovers,
    make_project,
    manifest_set,
    run_ids,
    run_row,
    write_task,
)
from conformance import (
    API_KEY,
    BYPASS,
    agent_calls,
    apply,
    apply_argv,
    bash,
    brain,
    brain_events,
    dump,
    env,
    launch,
    model,
    task,
)
from test_midrun_apply import (
    WAIT_UPSTREAM,
    Operator,
    attach_upstream,
    fetch,
    finish,
    policy,
    upstream,
)
from test_tool_servers_e2e import _attach_when_outbound_exists, tickets_server
from tool_server_doc import example

from kagura_agent.apply.midrun.grants import amendments
from kagura_agent.state import StateStore
from testing.agent_test_image import ensure_agent_test_image
from testing.egress_images import ensure_egress_images
from testing.fake_messages_api import key_marker

pytestmark = [pytest.mark.usefixtures("docker_client"), pytest.mark.conformance]
__all__ = ["tickets_server", "upstream"]  # fixtures this module uses


@pytest.fixture(scope="module")
def images(docker_client: Any) -> tuple[str, str]:
    real = ensure_agent_test_image(docker_client, real_cli=True)
    return real, ensure_egress_images(docker_client)["base"]


@pytest.fixture(scope="module")
def image(images: tuple[str, str]) -> str:
    """The image the tickets server runs in (test_tool_servers_e2e's fixture's name)."""
    return images[0]


def _use(tool: str, **tool_input: Any) -> dict[str, Any]:
    return {"name": tool, "input": tool_input}


TOOLS_SCRIPT = {
    "conversations": [
        {
            "match": "TASK-TOOLS",
            "turns": [
                bash(
                    f"{WAIT_UPSTREAM.replace('.upstream-ready', '.tickets-up')}; echo used > proof.txt"
                ),
                {"tools": [_use("mcp__notes__echo", text="hello over stdio")]},
                {
                    "tools": [
                        _use("mcp__tickets__add", a=20, b=22),
                        _use("mcp__tickets__echo", text="hello over http"),
                    ]
                },
                {"text": "tools answered"},
            ],
        }
    ]
}


def test_tool_servers_over_stdio_and_http_are_called_by_the_cli(
    docker_client: Any,
    images: tuple[str, str],
    tmp_path: Path,
    state_dir: Path,
    tickets_server: Any,
) -> None:
    """test_tool_servers_e2e on the real CLI: it starts the stdio server in the agent
    container and reaches the http one through the run's proxy; two calls in one turn."""
    real, base = images
    docs, example_task = example()
    for doc in docs:
        if doc["kind"] == "Image":
            doc["spec"] |= {"tag": real, "baseline": True}
    folder = manifest_set(tmp_path, *docs, brain("bypassPermissions"))
    project = make_project(tmp_path)
    spec = {**example_task["spec"], "prompt": "TASK-TOOLS", "verify": ["test -s proof.txt"]}
    spec["brain"] = BYPASS
    task_file = write_task(project, example_task["metadata"]["name"], spec)
    approve = ("--approve", "toolserver:notes", "--approve", "toolserver:tickets")
    with model(docker_client, base, TOOLS_SCRIPT) as fake:
        proc = subprocess.Popen(
            apply_argv(folder, task_file, *approve),
            env=env(state_dir, fake),
            cwd=REPO,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            _attach_when_outbound_exists(
                docker_client, tickets_server, "tickets.internal", state_dir, proc
            )
            (project / ".tickets-up").write_text("go\n")
            out, err = proc.communicate(timeout=300)
        finally:
            if proc.poll() is None:
                proc.kill()
        calls = agent_calls(fake)
    assert proc.returncode == 0, err[-5000:]
    lines = json_lines(err)
    events = brain_events(lines)
    results = {e["id"]: e for e in events if e["type"] == "tool_result"}
    used = [(e["name"], results[e["id"]]) for e in events if e["type"] == "tool_call"]
    assert [name for name, _ in used] == [
        "Bash",
        "mcp__notes__echo",
        "mcp__tickets__add",
        "mcp__tickets__echo",
    ], dump(events)
    assert not any(answer["is_error"] for _, answer in used), dump(events)
    stdio = json.loads(used[1][1]["output"])["result"]
    assert re.fullmatch(r"stdio echo from (\S+): hello over stdio", stdio), used[1]
    served_by = tickets_server.attrs["Config"]["Hostname"]
    # The CLI hands the model a tool's structured result as JSON.
    assert json.loads(used[2][1]["output"]) == {"result": "42"}
    answer = json.loads(used[3][1]["output"])["result"]
    assert answer == f"http echo from {served_by}: hello over http"
    # The CLI told the model of the servers' tools by the names it calls them (as deferred
    # tools: listed for its ToolSearch, their schemas not in ``tools``).
    asked = json.dumps(calls[1]["body"])
    for name in ("mcp__notes__echo", "mcp__tickets__add", "mcp__tickets__echo"):
        assert name in asked, name
    # The http server was reached through the proxy, which allowed that host and port.
    assert any(
        e.get("decision") == "allow"
        and (e.get("host"), e.get("port")) == ("tickets.internal", 8000)
        for e in lines
        if e.get("kind") == "egress"
    ), summary_of(lines)
    result = last_json(out)
    assert result["outcome"] == "success"
    assert leftovers(docker_client, result["run_id"]) == []


def summary_of(lines: list[dict[str, Any]]) -> list[str]:
    return [
        f"{e.get('method')} {e.get('host')}:{e.get('port')} {e.get('decision')} {e.get('reason')}"
        for e in lines
        if e.get("kind") == "egress" and e.get("type") == "egress.decision"
    ]


ACCESS = "mcp__kagura-membrane__request_access"
ACCESS_SCRIPT = {
    "conversations": [
        {
            "match": "TASK-ACCESS",
            "turns": [
                bash(f"{WAIT_UPSTREAM}; {fetch('second.test')}"),
                {"tools": [_use(ACCESS, kind="egress", name="second.test", reason="the data")]},
                {"tools": [_use(ACCESS, kind="egress", name="elsewhere.test", reason="no")]},
                bash(fetch("second.test")),
                {"text": "fetched it"},
            ],
        }
    ]
}


def test_request_access_grants_egress_mid_run_and_the_cli_reaches_the_host(
    docker_client: Any,
    images: tuple[str, str],
    upstream: Any,
    tmp_path: Path,
    state_dir: Path,
) -> None:
    """test_midrun_apply's egress grant on the real CLI: the model calls request_access
    (the SDK's in-process kagura-membrane server); the operator approves, the run's proxy
    is reloaded and the next command reaches the host; a host no manifest allows is
    refused without asking anyone."""
    real, base = images
    extra = (policy("second", "second.test"), brain("bypassPermissions"))
    with model(docker_client, base, ACCESS_SCRIPT) as fake:
        spec = {"prompt": "TASK-ACCESS", "brain": BYPASS}
        folder, task_file, project = task(tmp_path, real, spec, *extra)
        proc = launch(folder, task_file, env(state_dir, fake))
        operator = Operator(proc, state_dir, lambda ask: "approve")
        try:
            attach_upstream(docker_client, upstream, state_dir, proc, project)
            result = finish(proc, operator)
        finally:
            if proc.poll() is None:
                proc.kill()
    err = "".join(operator.raw)
    assert result.get("outcome") == "success", err[-5000:]
    before, granted, refused, after = operator.outputs()
    assert "403" in before and "hello from second.test" in after, (before, after)
    assert granted.startswith("granted: egress:second approved by test:operator"), granted
    assert "nobody was asked, the operator's manifests do not allow it" in refused, refused
    assert [a["category"] for a in operator.asks] == ["egress:second"]
    assert any("egress proxy reloaded" in n for n in operator.notes()), operator.notes()
    [run_id] = run_ids(state_dir)
    with StateStore(state_dir / "state.db") as store:
        rows = amendments(store, run_id)
    assert [(r["category"], r["outcome"]) for r in rows] == [
        ("egress:second", "granted"),
        ("", "refused"),
    ]
    assert leftovers(docker_client, run_id) == []


DISPATCH = "mcp__kagura-dispatch__dispatch"
CHILD = {
    "name": "writer",
    "prompt": "TASK-CHILD: write out.txt",
    "verify": ["grep -q written out.txt"],
}
DISPATCH_SCRIPT = {
    "conversations": [
        {
            "match": "TASK-PARENT",
            "turns": [
                {"tools": [_use(DISPATCH, **CHILD)]},
                {"text": "the child said {last_tool_result}"},
            ],
        },
        {
            "match": "TASK-CHILD",
            "turns": [
                {"tools": [_use("Write", file_path="/workspace/out.txt", content="written\n")]},
                {"text": "child wrote it"},
            ],
        },
    ]
}


def test_dispatch_runs_a_child_on_the_real_cli_and_answers_the_parent(
    docker_client: Any, images: tuple[str, str], tmp_path: Path, state_dir: Path
) -> None:
    """test_dispatch_runtime on the real CLI: the parent's model calls dispatch (the SDK's
    in-process kagura-dispatch server); the host plans and runs the child (its own apply,
    container, proxy and real CLI, its model calls routed to the same fake with the key
    injected there too), and the child's result is the tool's answer."""
    real, base = images
    with model(docker_client, base, DISPATCH_SCRIPT) as fake:
        spec = {"prompt": "TASK-PARENT", "verify": ["grep -q written writer/out.txt"]}
        folder, task_file, project = task(tmp_path, real, spec)
        code, result, lines, err = apply(apply_argv(folder, task_file), env(state_dir, fake))
        parent_calls = agent_calls(fake, 0)
        child_calls = agent_calls(fake, 1)
        records = fake.records()
    assert code == 0, err[-5000:]
    [child] = result["children"]
    assert child["task"] == "writer" and child["outcome"] == "success", child
    assert (project / "writer" / "out.txt").read_text() == "written\n"
    assert run_row(state_dir, child["run"])["outcome"] == "success"
    assert leftovers(docker_client, child["run"]) == []
    answer = json.loads(brain_events(lines)[-1]["result"].removeprefix("the child said "))
    assert answer["outcome"] == "success" and answer["answer"] == "child wrote it", answer
    assert answer["output_memory"] == child["output_memory"]
    assert [c["turn"]["index"] for c in parent_calls] == [0, 1]
    assert [c["turn"]["index"] for c in child_calls] == [0, 1]
    posts = {r["headers"].get("x-api-key") for r in records if r["method"] == "POST"}
    assert posts == {key_marker(API_KEY)}
