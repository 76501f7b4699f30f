"""The demo's model endpoint: a scripted Anthropic Messages API, and no model.

``kagura-agent demo`` runs this file in a container (``python3 -c SOURCE``: standard
library only, so any image with python3 runs it) on an internal Docker network that only
the run's proxy joins; the real Claude Code CLI in the agent's container reaches it
through the proxy's key-injecting port, as it would reach the Anthropic API. Every answer
says that it comes from a scripted demo endpoint.

It speaks what the CLI uses: ``POST /v1/messages`` streamed as server-sent events in the
API's framing (``message_start``; per content block ``content_block_start``, its
``text_delta`` or ``input_json_delta`` pieces and ``content_block_stop``; ``message_delta``
with the stop reason and usage; ``message_stop``), or as one JSON message when the call
does not ask to stream; ``POST /v1/messages/count_tokens``; anything else is a 404 in the
API's error shape. A call without tools (the CLI's title and summary calls) gets a short
text, or a JSON object of it when the call asks for structured output.

The script (``SCRIPT``) is stateless: a call with tools gets the turn whose index is the
number of assistant messages already in it, so a retried call gets the same turn. The
turns make the CLI write a file, edit another, ask the operator for access
(``request_access``, the membrane's mid-run request), and then write down what the
operator answered and said (a steering message arrives with that tool's result).
"""

from __future__ import annotations

import argparse
import http.server
import json
import re
import secrets
import sys
from collections.abc import Iterator
from typing import Any

PORT = 8080
MAX_BODY = 16 * 1024 * 1024
CHUNK = 24  # characters per delta
SAYS = "[kagura demo endpoint: scripted replies, not a model]"
REQUEST_ACCESS = "mcp__kagura-membrane__request_access"
# What the CLI puts in a conversation as the assistant's without a model call.
SYNTHETIC = ("No response requested.",)

SCRIPT: list[dict[str, Any]] = [
    {
        "text": f"{SAYS} First a tool call: I write a small program into the project.",
        "tools": [
            {
                "name": "Write",
                "input": {
                    "file_path": "/workspace/hello.py",
                    "content": 'print("hello from the kagura-agent demo")\n',
                },
            }
        ],
    },
    {
        "text": f"{SAYS} Next I read the README, to edit it.",
        "tools": [{"name": "Read", "input": {"file_path": "/workspace/README.md"}}],
    },
    {
        "text": f"{SAYS} Now I edit the README to say how to run it.",
        "tools": [
            {
                "name": "Edit",
                "input": {
                    "file_path": "/workspace/README.md",
                    "old_string": "TODO: say how to run it.",
                    "new_string": "Run `python3 hello.py`.",
                },
            }
        ],
    },
    {
        "text": (
            f"{SAYS} Now I ask the operator for access I was not given: egress to PyPI"
            " (nothing is fetched; the demo shows the question)."
        ),
        "tools": [
            {
                "name": REQUEST_ACCESS,
                "input": {
                    "kind": "egress",
                    "name": "pypi",
                    "reason": "the demo asks, to show the operator's approval prompt",
                },
            }
        ],
    },
    {
        "text": f"{SAYS} The operator answered: {{result}}. I note it, with their messages.",
        "tools": [
            {
                "name": "Write",
                "input": {
                    "file_path": "/workspace/NOTES.md",
                    "content": (
                        "# Notes of the demo run\n\nrequest_access answered: {result}\n\n"
                        "Messages from the operator while I worked:\n{steering}\n"
                    ),
                },
            }
        ],
    },
    {"text": f"{SAYS} Done: hello.py written, README.md edited, NOTES.md says what you said."},
]


def _id(prefix: str) -> str:
    return prefix + secrets.token_hex(12)


def _blocks(message: dict[str, Any]) -> list[dict[str, Any]]:
    content = message.get("content")
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [b for b in content or [] if isinstance(b, dict)]


def _text(blocks: list[dict[str, Any]]) -> str:
    out: list[str] = []
    for block in blocks:
        if block.get("type") == "text":
            out.append(str(block.get("text", "")))
        elif block.get("type") == "tool_result":
            out.append(_text(_blocks(block)))
    return "\n".join(out)


# How the CLI hands the model a message the user sent while a tool ran: inside that
# tool's result (a system reminder), or as a text block of its own.
STEERED = re.compile(r"sent a new message while you were working:\s*\n(.*?)(?:\n\s*\n|$)", re.S)
REMINDER = re.compile(r"\s*<system-reminder>.*?</system-reminder>\s*", re.S)


def _steering(text: str) -> list[str]:
    """The operator's messages in ``text`` (a tool's result, or the user's blocks)."""
    return [found.strip() for found in STEERED.findall(text) if found.strip()]


def read_call(body: dict[str, Any]) -> tuple[int, str, str]:
    """(turn index, the tool results and the operator's messages since the last turn)."""
    messages = [m for m in body.get("messages") or [] if isinstance(m, dict)]
    turn = sum(
        1
        for m in messages
        if m.get("role") == "assistant" and _text(_blocks(m)).strip() not in SYNTHETIC
    )
    since: list[dict[str, Any]] = []
    for m in reversed(messages):
        if m.get("role") == "assistant":
            break
        since = _blocks(m) + since
    result = _text([b for b in since if b.get("type") == "tool_result"])
    said = _text([b for b in since if b.get("type") == "text"])
    steering = _steering(result) + _steering(said)
    if not steering and REMINDER.sub("", said).strip():  # a message of its own
        steering = [REMINDER.sub("\n", said).strip()]
    return turn, REMINDER.sub("\n", result).split("\n\n")[0].strip(), "\n".join(steering)


def _fill(value: Any, result: str, steering: str) -> Any:
    if isinstance(value, str):
        return value.replace("{result}", result).replace("{steering}", steering or "(none)")
    if isinstance(value, dict):
        return {k: _fill(v, result, steering) for k, v in value.items()}
    return value


def content(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The assistant message's content blocks for this call."""
    if not body.get("tools"):
        return [{"type": "text", "text": _side_text(body)}]
    turn, result, steering = read_call(body)
    step = SCRIPT[min(turn, len(SCRIPT) - 1)]
    blocks: list[dict[str, Any]] = [{"type": "text", "text": _fill(step["text"], result, steering)}]
    for tool in step.get("tools", []):
        tool_input = _fill(tool["input"], result, steering)
        blocks.append(
            {"type": "tool_use", "id": _id("toolu_"), "name": tool["name"], "input": tool_input}
        )
    return blocks


def _side_text(body: dict[str, Any]) -> str:
    """A call without tools: a short text, or every string field of the JSON schema the
    call asks for (the CLI's session title)."""
    config = body.get("output_config")
    form = config.get("format") if isinstance(config, dict) else None
    schema = form.get("schema") if isinstance(form, dict) else None
    properties = schema.get("properties") if isinstance(schema, dict) else None
    if not isinstance(properties, dict):
        return "kagura demo"
    filled: dict[str, object] = {}
    for name, spec in properties.items():
        kind = spec.get("type") if isinstance(spec, dict) else None
        defaults: dict[str, object] = {"boolean": False, "integer": 0, "number": 0}
        filled[name] = defaults.get(str(kind), [] if kind == "array" else "kagura demo")
    return json.dumps(filled)


def message(body: dict[str, Any]) -> dict[str, Any]:
    blocks = content(body)
    stop = "tool_use" if any(b["type"] == "tool_use" for b in blocks) else "end_turn"
    return {
        "id": _id("msg_"),
        "type": "message",
        "role": "assistant",
        "model": str(body.get("model", "demo")),
        "content": blocks,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": {"input_tokens": 10, "output_tokens": 10},
    }


def events(whole: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """The server-sent events of ``whole``, in the API's order."""
    start = {**whole, "content": [], "stop_reason": None}
    yield "message_start", {"type": "message_start", "message": start}
    for index, block in enumerate(whole["content"]):
        if block["type"] == "text":
            opening: dict[str, Any] = {"type": "text", "text": ""}
            raw, kind, key = block["text"], "text_delta", "text"
        else:
            opening = {**block, "input": {}}
            raw = json.dumps(block["input"], separators=(",", ":"))
            kind, key = "input_json_delta", "partial_json"
        yield (
            "content_block_start",
            {
                "type": "content_block_start",
                "index": index,
                "content_block": opening,
            },
        )
        for i in range(0, max(len(raw), 1), CHUNK):
            delta = {"type": kind, key: raw[i : i + CHUNK]}
            yield (
                "content_block_delta",
                {"type": "content_block_delta", "index": index, "delta": delta},
            )
        yield "content_block_stop", {"type": "content_block_stop", "index": index}
    delta = {"stop_reason": whole["stop_reason"], "stop_sequence": None}
    yield "message_delta", {"type": "message_delta", "delta": delta, "usage": whole["usage"]}
    yield "message_stop", {"type": "message_stop"}


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _json(self, status: int, data: object) -> None:
        out = json.dumps(data).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def _error(self, status: int, kind: str, text: str) -> None:
        error = {"type": kind, "message": f"{SAYS} {text}"}
        self._json(status, {"type": "error", "error": error, "request_id": _id("req_")})

    def do_GET(self) -> None:
        self._error(404, "not_found_error", "Not found")

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            self.close_connection = True
            self._error(413, "request_too_large", "Request too large")
            return
        raw = self.rfile.read(length) if length else b""
        path = self.path.split("?", 1)[0]
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        if path not in ("/v1/messages", "/v1/messages/count_tokens"):
            self._error(404, "not_found_error", "Not found")
            return
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            self._error(400, "invalid_request_error", "messages: Field required")
            return
        if path.endswith("/count_tokens"):
            self._json(200, {"input_tokens": max(1, len(raw) // 4)})
            return
        whole = message(body)
        print(
            json.dumps({"turn": read_call(body)[0], "tools": bool(body.get("tools"))}), flush=True
        )
        if not body.get("stream"):
            self._json(200, whole)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            for event, data in events(whole):
                chunk = f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"
                encoded = chunk.encode()
                self.wfile.write(b"%x\r\n%s\r\n" % (len(encoded), encoded))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description="the kagura-agent demo's scripted endpoint")
    parser.add_argument("--port", type=int, default=PORT)
    args = parser.parse_args(argv)
    server = Server(("", args.port), Handler)
    print("ready", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main(sys.argv[1:])
