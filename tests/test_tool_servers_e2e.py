"""Tool servers used by the agent through ``kagura-agent apply``, in real containers.

The manifests are docs/authority.md's example (its ``## Tool servers`` section), with the
Image's tag pointed at kagura/agent-test, which carries the example's server at
/opt/mcp/notes.py (testing/fake_mcp.py, a real ``mcp`` server). The sdk engine drives
the fake ``claude`` CLI, which calls the MCP servers the SDK configured exactly as the
CLI would:

- ``notes`` over stdio: the CLI starts it inside the agent container (the hostname the
  tool answers with is the agent container's);
- ``tickets`` over HTTP: the fake server runs in a container of its own that the test
  attaches, as the url's host, to the run's outbound network once apply creates it; the
  CLI reaches it only through the run's egress proxy (the proxy's audit shows it).
"""

from __future__ import annotations

import json
import re
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from apply_helpers import (
    TEST_LABEL,
    cli_env,
    json_lines,
    kagura,
    last_json,
    leftovers,
    make_project,
    run_ids,
    spawn,
    wait_for_run,
    write_task,
)
from tool_server_doc import example

from kagura_agent.membrane.egress.owner import COMPONENT_OUTBOUND, LABEL_COMPONENT
from kagura_agent.membrane.hardening import LABEL_RUN
from testing.agent_test_image import MCP_SERVER, ensure_agent_test_image
from testing.cli_options import option

pytestmark = pytest.mark.usefixtures("docker_client")

REPO = Path(__file__).resolve().parents[1]
API_KEY = "sk-ant-kagura-canary-" + "t" * 30


@pytest.fixture(scope="module")
def image(docker_client: Any) -> str:
    return ensure_agent_test_image(docker_client)


def _manifests(tmp_path: Path, image_ref: str) -> Path:
    """The packaged set plus the documented example, its image built here for the test."""
    docs, _ = example()
    for doc in docs:
        if doc["kind"] == "Image":
            doc["spec"]["tag"] = image_ref
            doc["spec"]["baseline"] = True
        if doc["kind"] == "ToolServer" and doc["spec"]["transport"] == "stdio":
            assert doc["spec"]["args"][0] == MCP_SERVER  # the test image has it there
    folder = tmp_path / "manifests"
    folder.mkdir()
    (folder / "tools.yml").write_text(yaml.safe_dump_all(docs, sort_keys=False))
    return folder


def _task(project: Path, servers: list[str], prompt: str) -> Path:
    _, task = example()
    spec = {**task["spec"], "tool_servers": servers, "prompt": prompt}
    spec["verify"] = ["test -s proof.txt"]
    return write_task(project, task["metadata"]["name"], spec)


def _brain(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [item for item in lines if item.get("kind") == "brain"]


def test_a_stdio_tool_server_runs_in_the_agent_container(
    docker_client: Any, image: str, tmp_path: Path, state_dir: Path
) -> None:
    manifests = _manifests(tmp_path, image)
    project = make_project(tmp_path)
    prompt = 'run: echo used-notes > proof.txt\ntool: notes echo {"text": "hello over stdio"}'
    task = _task(project, ["notes"], prompt)
    env = cli_env(state_dir, ANTHROPIC_API_KEY=API_KEY)
    plan = json.loads(
        kagura(["plan", "--json", "--manifests", str(manifests), str(task)], env).stdout
    )["plans"][0]["plan"]
    [notes] = plan["tool_servers"]
    assert notes["image"] == "mcp-tools" and plan["image"]["ref"] == image
    assert notes["class"] == "needs-approval"
    args = ["apply", "--yes", "--json", "--manifests", str(manifests), str(task)]
    done = kagura([*args, "--approve", "toolserver:notes"], env)
    assert done.returncode == 0, done.stdout + done.stderr
    events = _brain(json_lines(done.stderr))
    [call] = [e for e in events if e.get("type") == "tool_call" and "notes" in e["name"]]
    assert call["name"] == "mcp__notes__echo" and call["input"] == {"text": "hello over stdio"}
    [answer] = [e for e in events if e.get("type") == "tool_result" and e["id"] == call["id"]]
    said = re.fullmatch(r"stdio echo from (\S+): hello over stdio", answer["output"])
    assert said and not answer["is_error"], answer
    # Served inside the agent container, not on this host.
    assert said[1] != socket.gethostname()
    assert last_json(done.stdout)["outcome"] == "success"
    [run_id] = run_ids(state_dir)
    assert leftovers(docker_client, run_id) == []
    # The verified run is graduation evidence for the tool server, like any capability.
    status = json.loads(kagura(["graduation", "status", "--json"], env).stdout)
    notes_status = status["categories"]["toolserver:notes"]
    assert (notes_status["state"], notes_status["successes"]) == ("locked", 1), notes_status
    # The SDK gave the CLI the documented stdio config, and allowed the server's tools.
    [logged] = [json.loads(x) for x in (project / ".fake-calls.jsonl").read_text().splitlines()]
    argv = logged["argv"]
    config = json.loads(option(argv, "--mcp-config") or "{}")["mcpServers"]
    assert config["notes"] == {"type": "stdio", "command": "python3", "args": [MCP_SERVER, "stdio"]}
    assert "mcp__notes" in (option(argv, "--allowedTools") or "").split(",")


@pytest.fixture()
def tickets_server(docker_client: Any, image: str) -> Iterator[Any]:
    """The http fake in its own container on a private test network (moved later)."""
    network = docker_client.networks.create(
        f"kagura-mcp-{uuid.uuid4().hex[:8]}", driver="bridge", internal=True, labels=TEST_LABEL
    )
    server = None
    try:
        server = docker_client.containers.run(
            image,
            ["python3", MCP_SERVER, "http", "--port", "8000"],
            entrypoint=[],
            detach=True,
            labels=TEST_LABEL,
            network=network.name,
            user="1000:1000",
        )
        deadline = time.monotonic() + 60
        while b"listening" not in server.logs():
            assert time.monotonic() < deadline, server.logs().decode()
            time.sleep(0.1)
        yield server
    finally:
        if server is not None:
            server.remove(force=True)
        network.remove()


def _attach_when_outbound_exists(
    client: Any, server: Any, host: str, state_dir: Path, proc: Any
) -> None:
    run_id = wait_for_run(state_dir, proc)
    labels = [f"{LABEL_RUN}={run_id}", f"{LABEL_COMPONENT}={COMPONENT_OUTBOUND}"]
    deadline = time.monotonic() + 120
    while not (nets := client.networks.list(filters={"label": labels})):
        assert proc.poll() is None, proc.stdout.read()
        assert time.monotonic() < deadline, "apply never created its outbound network"
        time.sleep(0.05)
    nets[0].connect(server, aliases=[host])


def test_an_http_tool_server_is_reached_through_the_proxy(
    docker_client: Any, image: str, tmp_path: Path, state_dir: Path, tickets_server: Any
) -> None:
    manifests = _manifests(tmp_path, image)
    project = make_project(tmp_path)
    prompt = "\n".join(
        [
            "wait: .tickets-up",
            "run: echo used-tickets > proof.txt",
            'tool: tickets add {"a": 20, "b": 22}',
            'tool: tickets echo {"text": "hello over http"}',
        ]
    )
    task = _task(project, ["tickets"], prompt)
    env = cli_env(state_dir, ANTHROPIC_API_KEY=API_KEY)
    plan = json.loads(
        kagura(["plan", "--json", "--manifests", str(manifests), str(task)], env).stdout
    )["plans"][0]["plan"]
    [tickets] = plan["tool_servers"]
    host, port = tickets["host"], tickets["port"]
    assert (host, port) == ("tickets.internal", 8000)
    assert any(e["policy"] == "toolserver:tickets" for e in plan["egress"]["allow"])
    args = ["apply", "--yes", "--json", "--manifests", str(manifests), str(task)]
    proc = spawn([*args, "--approve", "toolserver:tickets"], env)
    try:
        _attach_when_outbound_exists(docker_client, tickets_server, host, state_dir, proc)
        (project / ".tickets-up").write_text("go\n")
        output, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, output
    lines = json_lines(output)
    results = {e["id"]: e for e in _brain(lines) if e.get("type") == "tool_result"}
    calls = [e for e in _brain(lines) if e.get("type") == "tool_call" and "tickets" in e["name"]]
    assert [c["name"] for c in calls] == ["mcp__tickets__add", "mcp__tickets__echo"]
    answers = [results[c["id"]]["output"] for c in calls]
    assert answers[0] == "42", answers
    served_by = tickets_server.attrs["Config"]["Hostname"]
    assert answers[1] == f"http echo from {served_by}: hello over http", answers
    # The only way there was the run's proxy, which allowed exactly that host and port.
    egress = [item for item in lines if item.get("kind") == "egress"]
    assert any(
        e.get("decision") == "allow" and e.get("host") == host and e.get("port") == port
        for e in egress
    ), egress
    logged = [
        json.loads(line)
        for line in tickets_server.logs().decode().splitlines()
        if line.startswith('{"called"')
    ]
    assert [entry["called"] for entry in logged] == ["add", "echo"]
    [run_id] = run_ids(state_dir)
    assert leftovers(docker_client, run_id) == []
