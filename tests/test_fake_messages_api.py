"""testing/fake_messages_api.py speaks the Messages API as the real one frames it.

On loopback, read back with a plain HTTP client: the streamed events and their order,
tool input reassembled from its JSON pieces, a signed thinking block, errors with
retry-after, the 400s the real API gives for a broken conversation, token counting, a
slow stream, and records that say which key arrived without holding it. The last test
runs the Claude Code CLI that claude-agent-sdk bundles against it, in a container with no
network at all (only its own loopback), so nothing leaves the machine.
"""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from testing.fake_messages_api import FakeMessagesApi, key_marker

KEY = "sk-ant-fake-test-" + "q" * 20
WRITE = {"name": "Write", "input": {"file_path": "/w/a.txt", "content": "line one\n" * 9}}
SCRIPT: dict[str, Any] = {
    "conversations": [
        {
            "match": "TASK-A",
            "turns": [
                {"thinking": "plan the file", "text": "Writing.", "tools": [WRITE]},
                {"text": "It said: {last_tool_result}", "usage": {"output_tokens": 7}},
            ],
        },
        {
            "match": "TASK-FLAKY",
            "turns": [{"text": "at last", "fail": [429, 529], "retry_after": "2"}],
        },
        {"match": "TASK-SLOW", "turns": [{"text": "x" * 96, "delay": 0.1}]},
    ],
    "side": "a side answer",
}
TOOLS = [{"name": "Write", "description": "write", "input_schema": {"type": "object"}}]


@pytest.fixture()
def fake() -> Iterator[FakeMessagesApi]:
    api = FakeMessagesApi(SCRIPT).start()
    yield api
    api.close()


def _post(
    fake: FakeMessagesApi, body: object, path: str = "/v1/messages?beta=true", **headers: str
) -> http.client.HTTPResponse:
    host, port = fake.base_url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    sent = {"content-type": "application/json", "x-api-key": KEY, **headers}
    conn.request("POST", path, body=json.dumps(body), headers=sent)
    return conn.getresponse()


def _body(prompt: str, *more: dict[str, Any], stream: bool = True) -> dict[str, Any]:
    messages = [{"role": "user", "content": prompt}, *more]
    return {
        "model": "m-1",
        "max_tokens": 100,
        "messages": messages,
        "tools": TOOLS,
        "stream": stream,
    }


def _events(response: http.client.HTTPResponse) -> list[tuple[str, dict[str, Any]]]:
    """The SSE stream as (event name, data) pairs; each data's type is its event's name."""
    assert response.status == 200
    assert response.getheader("content-type", "").startswith("text/event-stream")
    events = []
    for frame in response.read().decode().split("\n\n"):
        if not frame.strip():
            continue
        name_line, data_line = frame.split("\n")
        name = name_line.removeprefix("event: ")
        data = json.loads(data_line.removeprefix("data: "))
        assert data["type"] == name
        events.append((name, data))
    return events


def test_a_tool_turn_streams_thinking_text_and_tool_use_in_the_real_order(
    fake: FakeMessagesApi,
) -> None:
    events = _events(_post(fake, _body("do TASK-A")))
    names = [name for name, _ in events]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    assert names.count("ping") == 1 and names.index("ping") == 2  # after the first block starts
    start = events[0][1]["message"]
    assert (start["role"], start["content"], start["stop_reason"]) == ("assistant", [], None)
    assert start["model"] == "m-1" and start["id"].startswith("msg_")
    blocks: dict[int, dict[str, Any]] = {}
    for name, data in events:
        if name == "content_block_start":
            blocks[data["index"]] = {**data["content_block"], "deltas": []}
        elif name == "content_block_delta":
            blocks[data["index"]]["deltas"].append(data["delta"])
        elif name == "content_block_stop":
            blocks[data["index"]]["stopped"] = True
    assert [b["type"] for b in blocks.values()] == ["thinking", "text", "tool_use"]
    assert all(b["stopped"] for b in blocks.values())
    thinking, text, tool = blocks[0], blocks[1], blocks[2]
    assert [d["type"] for d in thinking["deltas"]][-1] == "signature_delta"
    assert "".join(d.get("thinking", "") for d in thinking["deltas"]) == "plan the file"
    assert "".join(d["text"] for d in text["deltas"]) == "Writing."
    assert tool["name"] == "Write" and tool["id"].startswith("toolu_") and tool["input"] == {}
    pieces = [d["partial_json"] for d in tool["deltas"]]
    assert pieces[0] == "" and len(pieces) > 3  # the input arrives in pieces
    assert json.loads("".join(pieces)) == WRITE["input"]
    delta = events[-2][1]
    assert delta["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert delta["usage"]["output_tokens"] == 20 and delta["usage"]["input_tokens"] == 100


def test_the_next_turn_is_read_from_the_history_and_sees_the_tool_result(
    fake: FakeMessagesApi,
) -> None:
    use = {"type": "tool_use", "id": "toolu_1", "name": "Write", "input": {}}
    result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "File created"}
    body = _body(
        "do TASK-A", {"role": "assistant", "content": [use]}, {"role": "user", "content": [result]}
    )
    events = _events(_post(fake, body))
    text = "".join(d["delta"].get("text", "") for n, d in events if n == "content_block_delta")
    assert text == "It said: File created"
    assert events[-2][1]["delta"]["stop_reason"] == "end_turn"
    assert events[-2][1]["usage"]["output_tokens"] == 7
    # The CLI's stand-in answer (a resumed session whose tool call never ran) is no turn.
    interrupted = {**result, "content": "[Tool call interrupted]", "is_error": True}
    standin = {"role": "assistant", "content": [{"type": "text", "text": "No response requested."}]}
    body["messages"][-1] = {"role": "user", "content": [interrupted]}
    body["messages"] += [standin, {"role": "user", "content": "continue"}]
    events = _events(_post(fake, body))
    assert events[-2][1]["usage"]["output_tokens"] == 7  # still turn 1
    # Past the script's last turn: a short answer, never an error.
    body["messages"] += [{"role": "assistant", "content": "x"}, {"role": "user", "content": "more"}]
    assert _post(fake, body).status == 200


def test_a_call_without_tools_is_a_side_call_answered_whole(fake: FakeMessagesApi) -> None:
    body = {**_body("do TASK-A", stream=False), "tools": []}
    response = _post(fake, body)
    assert response.status == 200 and response.getheader("content-type") == "application/json"
    whole = json.loads(response.read())
    assert whole["type"] == "message" and whole["stop_reason"] == "end_turn"
    assert whole["content"] == [{"type": "text", "text": "a side answer"}]
    [record] = fake.records()
    assert record["turn"] == {"conversation": 0, "index": 0, "agent": False}


def test_a_side_call_that_asks_for_a_schema_gets_json(fake: FakeMessagesApi) -> None:
    schema = {"type": "object", "properties": {"title": {"type": "string"}}, "required": ["title"]}
    config = {"format": {"type": "json_schema", "schema": schema}}
    body = {**_body("name it", stream=False), "tools": [], "output_config": config}
    whole = json.loads(_post(fake, body).read())
    assert json.loads(whole["content"][0]["text"]) == {"title": "a side answer"}


def test_rate_limited_then_overloaded_then_answered_with_retry_after(fake: FakeMessagesApi) -> None:
    body = _body("TASK-FLAKY")
    for status, kind in ((429, "rate_limit_error"), (529, "overloaded_error")):
        response = _post(fake, body)
        assert response.status == status and response.getheader("retry-after") == "2"
        error = json.loads(response.read())
        assert error["type"] == "error" and error["error"]["type"] == kind
        assert error["request_id"] == response.getheader("request-id")
    assert _events(_post(fake, body))[-1][0] == "message_stop"


@pytest.mark.parametrize(
    ("body", "why"),
    [
        ({"model": "m", "messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
        ({"model": "m", "max_tokens": 1, "messages": [{"role": "tool", "content": "x"}]}, "role"),
        (
            _body(
                "x",
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "t9", "name": "W", "input": {}}],
                },
            ),
            "t9",
        ),
    ],
)
def test_a_broken_conversation_is_refused_like_the_real_api(
    fake: FakeMessagesApi, body: dict[str, Any], why: str
) -> None:
    response = _post(fake, body)
    error = json.loads(response.read())
    assert response.status == 400 and error["error"]["type"] == "invalid_request_error"
    assert why in error["error"]["message"]


def test_system_messages_are_taken_only_under_the_beta_that_allows_them(
    fake: FakeMessagesApi,
) -> None:
    body = _body("do TASK-A", {"role": "system", "content": "tools changed"})
    assert _post(fake, body).status == 400
    beta = "claude-code-20250219,mid-conversation-tool-changes-2026-07-01"
    assert _post(fake, body, **{"anthropic-beta": beta}).status == 200


def test_token_counting_and_unknown_paths(fake: FakeMessagesApi) -> None:
    response = _post(fake, _body("x"), path="/v1/messages/count_tokens?beta=true")
    assert response.status == 200 and json.loads(response.read())["input_tokens"] > 0
    response = _post(fake, {}, path="/v1/files")
    assert (
        response.status == 404 and json.loads(response.read())["error"]["type"] == "not_found_error"
    )


def test_a_slow_stream_arrives_piece_by_piece_not_buffered(fake: FakeMessagesApi) -> None:
    began = time.monotonic()
    response = _post(fake, _body("TASK-SLOW"))
    first = response.readline()
    first_byte = time.monotonic() - began
    rest = response.read()
    total = time.monotonic() - began
    assert first.startswith(b"event: message_start") and b"message_stop" in rest
    assert first_byte < 0.1 and total > 0.5  # 4 text pieces and 6 more events, 0.1 s apart


def test_records_say_which_key_arrived_and_never_hold_it(fake: FakeMessagesApi) -> None:
    _post(fake, _body("TASK-A"), authorization=f"Bearer {KEY}").read()
    [record] = fake.records()
    assert record["method"] == "POST" and record["path"] == "/v1/messages?beta=true"
    assert record["headers"]["x-api-key"] == key_marker(KEY)
    assert record["headers"]["authorization"] == f"Bearer {key_marker(KEY)}"
    assert record["body"]["messages"][0]["content"] == "TASK-A"
    assert KEY not in json.dumps(fake.records())
    assert record["turn"] == {"conversation": 0, "index": 0, "agent": True}


# --- the real CLI against it ------------------------------------------------------------

CLI_SCRIPT = {
    "conversations": [
        {
            "match": "TASK-CLI",
            "turns": [
                {
                    "thinking": "write, then check",
                    "text": "Writing it.",
                    "tools": [
                        {"name": "Write", "input": {"file_path": "/w/out.txt", "content": "one\n"}}
                    ],
                },
                {
                    "tools": [
                        {"name": "Bash", "input": {"command": "echo two >> out.txt && cat out.txt"}}
                    ],
                    "fail": [529],
                },
                {"text": "Finished: {last_tool_result}"},
            ],
        }
    ]
}


# In the agent image, with no network: the fake, then the bundled CLI (its output to a file,
# as node leaves a shared stdout non-blocking), then what it did and what the fake saw.
CLI_RUN = """
python3 -c "$FAKE" --port 8080 --script "$SCRIPT" &
for i in $(seq 100); do
  python3 -c 'import socket; socket.create_connection(("127.0.0.1", 8080))' 2>/dev/null && break
  sleep 0.1
done
CLI=$(python3 -c 'import claude_agent_sdk, pathlib; print(pathlib.Path(claude_agent_sdk.__file__).parent / "_bundled/claude")')
cd /w && "$CLI" -p 'do TASK-CLI' --output-format stream-json --verbose \
  --permission-mode bypassPermissions > /w/cli.out 2>&1
echo "EXIT=$?" >> /w/cli.out
python3 -c 'import urllib.request as u; print(u.urlopen("http://127.0.0.1:8080/_fake/records").read().decode())' > /w/records.json
cat /w/cli.out; echo; echo "FILE $(cat /w/out.txt | tr '\\n' ' ')"; echo "RECORDS $(cat /w/records.json)"
"""


def test_the_bundled_cli_completes_a_scripted_task_against_it(docker_client: Any) -> None:
    """The real CLI (in the agent image, no network but its own loopback) streams three
    turns, recovers from a 529, really writes and edits a file, and reports the turns."""
    from kagura_agent.membrane import images

    source = Path(__file__).resolve().parents[1] / "testing" / "fake_messages_api.py"
    output = docker_client.containers.run(
        images.image_ref("agent"),
        ["-c", CLI_RUN],
        entrypoint="bash",
        environment={
            "FAKE": source.read_text(),
            "SCRIPT": json.dumps(CLI_SCRIPT),
            "ANTHROPIC_BASE_URL": "http://127.0.0.1:8080",
            "ANTHROPIC_API_KEY": KEY,
            # Anything it sends elsewhere comes to the fake as a CONNECT and is refused.
            "HTTPS_PROXY": "http://127.0.0.1:8080",
            "NO_PROXY": "127.0.0.1",
        },
        network_mode="none",
        tmpfs={"/w": "uid=1000"},
        labels={"dev.kagura.test": "fake-messages-api"},
        remove=True,
    ).decode()
    lines = output.splitlines()
    assert "EXIT=0" in lines, output[-3000:]
    result = json.loads(next(line for line in lines if '"type":"result"' in line))
    assert result["subtype"] == "success" and result["num_turns"] == 3, result
    assert result["result"].startswith("Finished: one\ntwo"), result["result"]
    assert "FILE one two " in lines
    records = json.loads(next(line for line in lines if line.startswith("RECORDS "))[8:])
    turns = [r["turn"]["index"] for r in records if r.get("turn", {}).get("agent")]
    assert turns == [0, 1, 1, 2]  # the 529 was retried with the same history
    posts = [r for r in records if r["method"] == "POST"]
    assert {r["headers"]["x-api-key"] for r in posts} == {key_marker(KEY)}


def test_its_resolver_says_no_such_name_at_once() -> None:
    import socket

    from testing.fake_messages_api import serve_nxdomain

    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    serve_nxdomain(port)
    # A query for api.anthropic.com, type A, recursion desired, id 0x1234.
    name = b"".join(bytes([len(p)]) + p for p in (b"api", b"anthropic", b"com")) + b"\0"
    query = b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00" + name + b"\x00\x01\x00\x01"
    client = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    client.settimeout(5)
    client.sendto(query, ("127.0.0.1", port))
    reply = client.recv(4096)
    assert reply[:2] == b"\x12\x34" and reply[2] & 0x80  # same id, a response
    assert reply[3] & 0x0F == 3 and reply[6:12] == b"\0" * 6  # NXDOMAIN, no answers
    assert reply[12:] == query[12:]  # the question echoed
