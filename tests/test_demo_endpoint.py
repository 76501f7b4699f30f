"""The demo's scripted endpoint (kagura_agent/demo/endpoint.py) on loopback, in-process:
the Messages API framing the CLI reads, the script by turn, the operator's answer and
steering message written back, and every answer saying it is no model."""

from __future__ import annotations

import http.client
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from kagura_agent.demo import endpoint


@pytest.fixture
def server() -> Iterator[int]:
    srv = endpoint.Server(("127.0.0.1", 0), endpoint.Handler)
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield int(srv.server_address[1])
    finally:
        srv.shutdown()
        srv.server_close()
        thread.join()


def post(port: int, path: str, body: object) -> tuple[int, str, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    response = conn.getresponse()
    data = response.read()
    conn.close()
    return response.status, response.getheader("Content-Type") or "", data


def sse(data: bytes) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for frame in data.decode().split("\n\n"):
        if not frame.strip():
            continue
        event, payload = frame.split("\n", 1)
        out.append((event.removeprefix("event: "), json.loads(payload.removeprefix("data: "))))
    return out


TOOLS = [{"name": "Write", "input_schema": {"type": "object"}}]


def conversation(turns: int, last: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "the demo's task"}]
    for i in range(turns):
        use = {"type": "tool_use", "id": f"t{i}", "name": "Write", "input": {}}
        messages.append({"role": "assistant", "content": [use]})
        result = {"type": "tool_result", "tool_use_id": f"t{i}", "content": f"done {i}"}
        messages.append({"role": "user", "content": [result]})
    if last is not None:
        messages[-1] = {"role": "user", "content": last}
    return messages


def test_a_streamed_turn_is_framed_as_the_api_frames_it(server: int) -> None:
    body = {"model": "m", "max_tokens": 100, "stream": True, "tools": TOOLS}
    status, kind, data = post(
        server, "/v1/messages?beta=true", {**body, "messages": conversation(0)}
    )
    assert status == 200 and kind.startswith("text/event-stream")
    events = sse(data)
    names = [name for name, _ in events]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    assert events[-2][1]["delta"]["stop_reason"] == "tool_use"
    text = "".join(d["delta"].get("text", "") for n, d in events if n == "content_block_delta")
    assert text.startswith(endpoint.SAYS)
    raw = "".join(
        d["delta"].get("partial_json", "") for n, d in events if n == "content_block_delta"
    )
    assert json.loads(raw)["file_path"] == "/workspace/hello.py"


def test_the_script_goes_by_turn_and_writes_back_the_answer_and_the_steering(
    server: int,
) -> None:
    base = {"model": "m", "max_tokens": 100, "tools": TOOLS}
    names = []
    for turn in range(len(endpoint.SCRIPT)):
        status, _, data = post(server, "/v1/messages", {**base, "messages": conversation(turn)})
        whole = json.loads(data)
        assert status == 200 and whole["content"][0]["text"].startswith(endpoint.SAYS)
        names += [b["name"] for b in whole["content"] if b["type"] == "tool_use"]
    assert names == ["Write", "Read", "Edit", endpoint.REQUEST_ACCESS, "Write"]
    assert whole["stop_reason"] == "end_turn"
    # The turn after request_access: its result and the operator's message, written down,
    # as the CLI hands it over (inside the tool's result) or as a message of its own.
    reminder = (
        "<system-reminder>\nThe user sent a new message while you were working:\n"
        "also say hi\n\nThis is how Claude Code surfaces messages.\n</system-reminder>"
    )
    answer = {
        "type": "tool_result",
        "tool_use_id": "t3",
        "content": f"granted: egress:pypi\n\n{reminder}",
    }
    alone = {"type": "text", "text": "also say hi"}
    plain = {"type": "tool_result", "tool_use_id": "t3", "content": "granted: egress:pypi"}
    for last in ([answer], [plain, alone]):
        messages = conversation(4, last)
        _, _, data = post(server, "/v1/messages", {**base, "messages": messages})
        [write] = [b for b in json.loads(data)["content"] if b["type"] == "tool_use"]
        notes = write["input"]["content"]
        assert "request_access answered: granted: egress:pypi\n" in notes, notes
        assert "while I worked:\nalso say hi\n" in notes, notes
        assert "This is how" not in notes
    # A retried call gets the same turn.
    again = post(server, "/v1/messages", {**base, "messages": messages})[2]
    assert [b["name"] for b in json.loads(again)["content"] if b["type"] == "tool_use"] == ["Write"]


def test_side_calls_token_counts_and_other_paths(server: int) -> None:
    schema = {"type": "json_schema", "schema": {"properties": {"title": {"type": "string"}}}}
    body = {"model": "m", "max_tokens": 10, "messages": conversation(0)}
    whole = json.loads(
        post(server, "/v1/messages", {**body, "output_config": {"format": schema}})[2]
    )
    assert json.loads(whole["content"][0]["text"]) == {"title": "kagura demo"}
    assert json.loads(post(server, "/v1/messages/count_tokens", body)[2])["input_tokens"] > 0
    status, _, data = post(server, "/v1/complete", body)
    assert status == 404 and json.loads(data)["error"]["type"] == "not_found_error"
    status, _, data = post(server, "/v1/messages", {"model": "m"})
    assert status == 400 and endpoint.SAYS in json.loads(data)["error"]["message"]
