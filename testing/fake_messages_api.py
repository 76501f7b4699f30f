"""A protocol-faithful fake of the Anthropic Messages API, scripted turn by turn.

It speaks what the Claude Code CLI uses: ``POST /v1/messages`` (with or without a query
such as ``?beta=true``) streamed as server-sent events framed as the real API frames them
(``message_start``; per content block ``content_block_start``, its deltas —
``text_delta``, ``input_json_delta`` for ``tool_use``, ``thinking_delta`` then
``signature_delta`` for ``thinking`` — and ``content_block_stop``; a ``ping`` after the
first block starts; ``message_delta`` with ``stop_reason`` and usage; ``message_stop``),
or answered as one JSON message when the request does not ask to stream (side calls);
``POST /v1/messages/count_tokens``; errors as the API sends them (``{"type": "error",
"error": {...}, "request_id": ...}``, 429 ``rate_limit_error`` and 529
``overloaded_error`` with ``retry-after``); everything else is a 404 ``not_found_error``.
Like the real API it refuses a malformed conversation (400 ``invalid_request_error``):
no model, max_tokens or messages, a role other than user/assistant, or a ``tool_use``
whose ``tool_result`` is not in the next user message.

The script (JSON) says what the "model" does:

    {"conversations": [{"match": "TASK-7", "turns": [TURN, ...], "then": TURN}],
     "default": TURN, "side": "text for tool-less calls"}

A request with tools is an agent turn of the first conversation whose ``match`` occurs in
its first user message; its index is the number of assistant messages already in the
request (not counting the CLI's own stand-ins, SYNTHETIC_ANSWERS), so the script needs no
state of its own: a retried request gets the same turn, a
resumed session (``--resume``) carries on where it stopped, and a second process (a
dispatched child, another run) is its own conversation. Past the last turn, ``then`` (by
default a short end_turn answer). A request without tools is a side call: answered with
``side`` and never consumes a turn. A TURN:

    {"thinking": "...",                       # a thinking block first (signed)
     "text": "... {last_user} {last_tool_result} {turn} ...",  # (without the CLI's
                                              #  <system-reminder> blocks)
     "tools": [{"name": "Write", "input": {...}}, ...],   # stop_reason tool_use
     "usage": {"input_tokens": 100, "output_tokens": 20},
     "fail": [429, 529], "retry_after": "0",   # the first attempts of this turn fail so
     "stall": 0.0,                             # seconds before the response starts
     "delay": 0.0,                             # seconds between events (a slow stream)
     "hold": 0.0,                              # seconds after the last block, before
                                               # message_delta (the answer is all there)
     "hang": false}                            # message_start, then pings until the
                                               # client goes away

Every request is recorded (method, path, headers with credential values replaced by
``key_marker(value)`` — a digest that says which key arrived and is no key — and the body
as JSON): ``records()`` in-process, ``GET /_fake/records`` over HTTP, and one JSON line per
request in ``--record FILE``. The injecting proxy forwards only POSTs to the model-call
paths, so an agent never reaches ``/_fake/``.

Standard library only: ``python3 fake_messages_api.py --port 8080 --script JSON`` runs it
in a container (``fake_messages_api_container``, which also answers DNS there: NXDOMAIN
for every name, the resolver of the sealed proxies of testing.fake_anthropic), and
``FakeMessagesApi(script).start()`` on loopback in-process.

With ``--tls-port N --tls-pem B64`` it also answers over TLS on port N (the same script and
records), presenting the certificate chain and key given (PEM, base64: testing/tls.py
makes them), and prints ``SNI <name>`` for each handshake: the key-injecting port's TLS
hop to the model's host, tested without reaching the real one.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import hashlib
import http.server
import json
import re
import secrets
import socket
import ssl
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PORT = 8080
TLS_PORT = 8443
CREDENTIAL_HEADERS = ("x-api-key", "authorization", "proxy-authorization", "cookie")
MAX_BODY = 32 * 1024 * 1024
MAX_RECORDS = 5000
DEFAULT_USAGE = {"input_tokens": 100, "output_tokens": 20}
DEFAULT_END = {"text": "Done."}
CHUNK = 24  # characters per text / JSON delta
_ERRORS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}


def key_marker(value: str) -> str:
    """What the records hold instead of a credential: which one, never its value."""
    return "key:" + hashlib.sha256(value.encode()).hexdigest()[:16]


def _redacted(name: str, value: str) -> str:
    if name.lower() not in CREDENTIAL_HEADERS:
        return value
    scheme, _, token = value.partition(" ")
    if name.lower() in ("authorization", "proxy-authorization") and token:
        return f"{scheme} {key_marker(token)}"
    return key_marker(value)


def _id(prefix: str) -> str:
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
    return prefix + "".join(secrets.choice(alphabet) for _ in range(24))


# --- reading a request ------------------------------------------------------------------


def _blocks(message: dict[str, Any]) -> list[dict[str, Any]]:
    content = message.get("content")
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [b for b in content or [] if isinstance(b, dict)]


def _text_of(blocks: list[dict[str, Any]]) -> str:
    parts: list[str] = []
    for block in blocks:
        if block.get("type") == "text":
            parts.append(str(block.get("text", "")))
        elif block.get("type") == "tool_result":
            parts.append(_text_of(_blocks(block)))
    return "\n".join(parts)


# Betas under which a conversation may carry ``system`` messages between the turns (the
# CLI sends them; without the beta header it sends none, and the API refuses them).
SYSTEM_MESSAGE_BETAS = ("mid-conversation-tool-changes-", "per-turn-control-")


def invalid(body: object, betas: str = "") -> str | None:
    """Why the real API would refuse this request body with a 400 (None: it would not);
    ``betas`` is the request's anthropic-beta header."""
    roles: tuple[str, ...] = ("user", "assistant")
    if any(beta.strip().startswith(SYSTEM_MESSAGE_BETAS) for beta in betas.split(",")):
        roles += ("system",)
    if not isinstance(body, dict):
        return "the body is not a JSON object"
    for field in ("model", "max_tokens", "messages"):
        if field not in body:
            return f"{field}: Field required"
    messages = body["messages"]
    if not isinstance(messages, list) or not messages:
        return "messages: at least one message is required"
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in roles:
            return f"messages.{i}.role: Input should be {' or '.join(map(repr, roles))}"
    for i, message in enumerate(messages):
        uses = [b.get("id") for b in _blocks(message) if b.get("type") == "tool_use"]
        if message["role"] != "assistant" or not uses:
            continue
        # The next message that is not a system one (those may sit between, under a beta).
        after = next((m for m in messages[i + 1 :] if m["role"] != "system"), None)
        answered = {
            b.get("tool_use_id")
            for b in (_blocks(after) if after and after["role"] == "user" else [])
            if b.get("type") == "tool_result"
        }
        missing = [u for u in uses if u not in answered]
        if missing:
            return (
                f"messages.{i + 1}: `tool_use` ids were found without `tool_result` blocks"
                f" immediately after: {', '.join(map(str, missing))}"
            )
    return None


# What the CLI puts in a conversation as the assistant's without asking the model (after a
# query stopped with a tool call pending, resumed): not one of the model's turns.
SYNTHETIC_ANSWERS = ("No response requested.",)


def _synthetic(message: dict[str, Any]) -> bool:
    blocks = _blocks(message)
    return len(blocks) == 1 and blocks[0].get("text") in SYNTHETIC_ANSWERS


def _side_text(body: dict[str, Any], text: str) -> str:
    """A side call's answer: ``text``, or a JSON object of it when the call asks for
    structured output (``output_config.format`` json_schema: every string field is ``text``,
    as the CLI's session-title call wants ``{"title": ...}``)."""
    config = body.get("output_config")
    form = config.get("format") if isinstance(config, dict) else None
    if not isinstance(form, dict) or form.get("type") != "json_schema":
        return text
    schema = form.get("schema")
    properties = schema.get("properties") if isinstance(schema, dict) else None
    if not isinstance(properties, dict):
        return text
    filled: dict[str, object] = {}
    for name, spec in properties.items():
        kind = spec.get("type") if isinstance(spec, dict) else None
        filled[name] = {"boolean": False, "integer": 0, "number": 0, "array": [], "object": {}}.get(
            str(kind), text
        )
    return json.dumps(filled)


@dataclass(frozen=True)
class Call:
    """What one model call asks for, as the script sees it."""

    conversation: int | None  # index into script["conversations"], None: default
    turn: int  # assistant messages already in the request
    agent: bool  # it offers tools (a side call does not)
    first_user: str
    last_user: str
    last_tool_result: str

    side_text: str = "OK"  # a side call's answer (JSON when the call asks for a schema)

    @classmethod
    def read(cls, body: dict[str, Any], script: dict[str, Any]) -> Call:
        messages = body["messages"]
        first = _text_of(_blocks(messages[0]))
        users = [m for m in messages if m["role"] == "user"]
        last = _blocks(users[-1]) if users and messages[-1]["role"] != "assistant" else []
        results = [b for b in last if b.get("type") == "tool_result"]
        conversation = None
        for i, entry in enumerate(script.get("conversations", [])):
            if str(entry.get("match", "")) in first:
                conversation = i
                break
        return cls(
            conversation=conversation,
            turn=sum(1 for m in messages if m["role"] == "assistant" and not _synthetic(m)),
            agent=bool(body.get("tools")),
            first_user=first,
            last_user=_text_of([b for b in last if b.get("type") == "text"]),
            last_tool_result=_text_of(results),
            side_text=_side_text(body, str(script.get("side", "OK"))),
        )

    def plan(self, script: dict[str, Any]) -> dict[str, Any]:
        """The TURN this call gets."""
        if not self.agent:
            return {"text": self.side_text, "usage": {"input_tokens": 10}}
        if self.conversation is None:
            return dict(script.get("default") or DEFAULT_END)
        entry = script["conversations"][self.conversation]
        turns = entry.get("turns", [])
        if self.turn < len(turns):
            return dict(turns[self.turn])
        return dict(entry.get("then") or DEFAULT_END)

    def fill(self, text: str) -> str:
        return (
            text.replace("{last_user}", _unreminded(self.last_user))
            .replace("{last_tool_result}", _unreminded(self.last_tool_result))
            .replace("{turn}", str(self.turn))
        )


def _unreminded(text: str) -> str:
    """``text`` without the CLI's ``<system-reminder>`` blocks (budgets left, files changed)."""
    return re.sub(r"\s*<system-reminder>.*?</system-reminder>\s*", "\n", text, flags=re.S).strip()


# --- writing a response -----------------------------------------------------------------


def content_blocks(turn: dict[str, Any], call: Call) -> list[dict[str, Any]]:
    """The assistant message's content for ``turn`` (as a non-streamed message has it)."""
    blocks: list[dict[str, Any]] = []
    if turn.get("thinking"):
        signature = "sig_" + hashlib.sha256(str(turn["thinking"]).encode()).hexdigest()
        blocks.append({"type": "thinking", "thinking": turn["thinking"], "signature": signature})
    if turn.get("text"):
        blocks.append({"type": "text", "text": call.fill(str(turn["text"]))})
    for tool in turn.get("tools", []):
        tool_input = json.loads(call.fill(json.dumps(tool.get("input", {}))))
        blocks.append(
            {"type": "tool_use", "id": _id("toolu_01"), "name": tool["name"], "input": tool_input}
        )
    if not blocks:
        blocks.append({"type": "text", "text": ""})
    return blocks


def _usage(turn: dict[str, Any]) -> dict[str, int]:
    usage = {**DEFAULT_USAGE, **turn.get("usage", {})}
    return {
        "input_tokens": int(usage["input_tokens"]),
        "cache_creation_input_tokens": int(usage.get("cache_creation_input_tokens", 0)),
        "cache_read_input_tokens": int(usage.get("cache_read_input_tokens", 0)),
        "output_tokens": int(usage["output_tokens"]),
    }


def message(body: dict[str, Any], turn: dict[str, Any], call: Call) -> dict[str, Any]:
    """A whole (non-streamed) Message."""
    blocks = content_blocks(turn, call)
    stop = "tool_use" if any(b["type"] == "tool_use" for b in blocks) else "end_turn"
    return {
        "id": _id("msg_01"),
        "type": "message",
        "role": "assistant",
        "model": body["model"],
        "content": blocks,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": {**_usage(turn), "service_tier": "standard"},
    }


def _pieces(text: str) -> list[str]:
    return [text[i : i + CHUNK] for i in range(0, len(text), CHUNK)] or [""]


def stream_events(whole: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """The server-sent events of ``whole`` (a Message), in the real API's order."""
    usage = whole["usage"]
    start = {**whole, "content": [], "stop_reason": None}
    start["usage"] = {**usage, "output_tokens": 1}
    yield "message_start", {"type": "message_start", "message": start}
    for index, block in enumerate(whole["content"]):
        kind = block["type"]
        if kind == "text":
            opening: dict[str, Any] = {"type": "text", "text": ""}
            deltas = [{"type": "text_delta", "text": p} for p in _pieces(block["text"])]
        elif kind == "thinking":
            opening = {"type": "thinking", "thinking": "", "signature": ""}
            deltas = [{"type": "thinking_delta", "thinking": p} for p in _pieces(block["thinking"])]
            deltas.append({"type": "signature_delta", "signature": block["signature"]})
        else:  # tool_use: the input arrives as JSON text in pieces, starting empty
            opening = {**block, "input": {}}
            raw = json.dumps(block["input"], separators=(",", ":"))
            deltas = [{"type": "input_json_delta", "partial_json": ""}]
            deltas += [{"type": "input_json_delta", "partial_json": p} for p in _pieces(raw)]
        yield (
            "content_block_start",
            {"type": "content_block_start", "index": index, "content_block": opening},
        )
        if index == 0:
            yield "ping", {"type": "ping"}
        for delta in deltas:
            yield (
                "content_block_delta",
                {"type": "content_block_delta", "index": index, "delta": delta},
            )
        yield "content_block_stop", {"type": "content_block_stop", "index": index}
    stop = {"stop_reason": whole["stop_reason"], "stop_sequence": None}
    final = {k: v for k, v in usage.items() if k != "service_tier"}
    yield "message_delta", {"type": "message_delta", "delta": stop, "usage": final}
    yield "message_stop", {"type": "message_stop"}


def sse(event: str, data: dict[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


def error_body(status: int, text: str, request_id: str) -> dict[str, Any]:
    kind = _ERRORS.get(status, "api_error")
    return {"type": "error", "error": {"type": kind, "message": text}, "request_id": request_id}


# --- the server -------------------------------------------------------------------------


class _State:
    def __init__(self, script: dict[str, Any], record_file: Path | None) -> None:
        self.script = script
        self.record_file = record_file
        self.lock = threading.Lock()
        self.records: list[dict[str, Any]] = []
        self.attempts: dict[tuple[int | None, int, str], int] = {}

    def record(self, entry: dict[str, Any]) -> None:
        with self.lock:
            if len(self.records) < MAX_RECORDS:
                self.records.append(entry)
            if self.record_file is not None:
                with self.record_file.open("a", encoding="utf-8") as handle:
                    handle.write(json.dumps(entry) + "\n")

    def attempt(self, call: Call) -> int:
        """How many times this turn was asked for before (a retry's count)."""
        key = (call.conversation, call.turn, call.first_user)
        with self.lock:
            seen = self.attempts.get(key, 0)
            self.attempts[key] = seen + 1
            return seen


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Each SSE event goes out when written, as from the real API: with Nagle's algorithm
    # a small event waited for the peer's delayed ACK (~40 ms), which is the fake's, not
    # the code's under test (bench/model_calls measured it on every call).
    disable_nagle_algorithm = True
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _entry(self, body: bytes) -> dict[str, Any]:
        headers = {k.lower(): _redacted(k, v) for k, v in self.headers.items()}
        try:
            parsed: object = json.loads(body) if body else None
        except ValueError:
            parsed = body[:4096].decode(errors="replace")
        return {
            "time": time.time(),
            "method": self.command,
            "path": self.path,
            "headers": headers,
            "body": parsed,
        }

    def _read(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            raise ValueError("body too large")
        return self.rfile.read(length) if length else b""

    def _json(self, status: int, data: object, extra: dict[str, str] | None = None) -> None:
        out = json.dumps(data).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.send_header("request-id", self._request_id)
        for name, value in (extra or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(out)

    def _error(self, status: int, text: str, extra: dict[str, str] | None = None) -> None:
        self._json(status, error_body(status, text, self._request_id), extra)

    def do_GET(self) -> None:
        self._request_id = _id("req_01")
        if self.path == "/_fake/records":
            with self.server.state.lock:
                records = list(self.server.state.records)
            self._json(200, records)
            return
        self.server.state.record(self._entry(b""))
        self._error(404, "Not found")

    def do_HEAD(self) -> None:
        self._request_id = _id("req_01")
        self.server.state.record(self._entry(b""))
        self.send_response(404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_CONNECT(self) -> None:
        # Used as a forward proxy (a loopback experiment): say where the client went.
        self._request_id = _id("req_01")
        self.server.state.record(self._entry(b""))
        self.close_connection = True
        with contextlib.suppress(OSError):  # the client may hang up first
            self._error(403, "the fake is no forward proxy")

    def do_PUT(self) -> None:
        self.do_POST()

    def do_DELETE(self) -> None:
        self.do_POST()

    def do_POST(self) -> None:
        self._request_id = _id("req_01")
        try:
            raw = self._read()
        except ValueError:
            self.server.state.record(self._entry(b""))
            self._error(413, "Request exceeds the maximum allowed number of bytes.")
            self.close_connection = True
            return
        entry = self._entry(raw)
        path = self.path.split("?", 1)[0]
        body = entry["body"]
        if self.command != "POST" or path not in ("/v1/messages", "/v1/messages/count_tokens"):
            self.server.state.record(entry)
            self._error(404, "Not found")
            return
        if path == "/v1/messages/count_tokens":
            self.server.state.record(entry)
            if not isinstance(body, dict) or "messages" not in body:
                self._error(400, "messages: Field required")
                return
            self._json(200, {"input_tokens": max(1, len(raw) // 4)})
            return
        why = invalid(body, self.headers.get("anthropic-beta", ""))
        if why is not None:
            self.server.state.record({**entry, "refused": why})
            self._error(400, why)
            return
        assert isinstance(body, dict)
        script = self.server.state.script
        call = Call.read(body, script)
        turn = call.plan(script)
        entry["turn"] = {"conversation": call.conversation, "index": call.turn, "agent": call.agent}
        self.server.state.record(entry)
        failures = list(turn.get("fail", []))
        if call.agent and failures:
            seen = self.server.state.attempt(call)
            if seen < len(failures):
                status = int(failures[seen])
                after = str(turn.get("retry_after", "0"))
                text = (
                    "Overloaded"
                    if status == 529
                    else "Number of request tokens has exceeded your rate limit."
                )
                self._error(status, text, {"retry-after": after, "x-should-retry": "true"})
                return
        time.sleep(float(turn.get("stall", 0)))
        whole = message(body, turn, call)
        if not body.get("stream"):
            self._json(200, whole)
            return
        self._stream(
            whole, float(turn.get("delay", 0)), bool(turn.get("hang")), float(turn.get("hold", 0))
        )

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _stream(self, whole: dict[str, Any], delay: float, hang: bool, hold: float) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("request-id", self._request_id)
        self.end_headers()
        try:
            for event, data in stream_events(whole):
                if event == "message_delta" and hold:
                    time.sleep(hold)
                self._chunk(sse(event, data))
                if hang:  # message_start sent: hold the stream open until the client leaves
                    while True:
                        time.sleep(1.0)
                        self._chunk(sse("ping", {"type": "ping"}))
                if delay:
                    time.sleep(delay)
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    state: _State


class FakeMessagesApi:
    """The fake on a loopback port, in this process (for tests that need no container)."""

    def __init__(self, script: dict[str, Any] | None = None, host: str = "127.0.0.1") -> None:
        self._server = _Server((host, 0), _Handler)
        self._server.state = _State(script or {}, None)
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> FakeMessagesApi:
        self._thread.start()
        return self

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def records(self) -> list[dict[str, Any]]:
        with self._server.state.lock:
            return list(self._server.state.records)


# --- in a container ---------------------------------------------------------------------


@dataclass(frozen=True)
class FakeMessagesApiContainer:
    """The fake in a container on its own network (``address``:``port`` on ``network``;
    over TLS on ``tls_port`` too when it was given an identity)."""

    container: Any
    network: str
    address: str
    port: int = PORT
    dns: bool = True  # it answers DNS (NXDOMAIN): a sealed proxy's resolver
    tls_port: int | None = None

    def records(self) -> list[dict[str, Any]]:
        """Every request it received, in order (read over its own loopback)."""
        fetch = (
            "import sys, urllib.request as u;"
            f" sys.stdout.write(u.urlopen('http://127.0.0.1:{self.port}/_fake/records').read().decode())"
        )
        result = self.container.exec_run(["python3", "-c", fetch])
        if result.exit_code != 0:
            raise RuntimeError(f"the fake Messages API gave no records: {result.output!r}")
        records: list[dict[str, Any]] = json.loads(result.output)
        return records

    def server_names(self) -> list[str]:
        """The server name (SNI) of each TLS handshake, in order ("" for none)."""
        text = self.container.logs().decode(errors="replace")
        return [line[4:] for line in text.splitlines() if line.startswith("SNI ")]


@contextlib.contextmanager
def fake_messages_api_container(
    client: Any,
    image: str,
    labels: dict[str, str],
    script: dict[str, Any],
    *,
    tls_pem: bytes | None = None,
) -> Iterator[FakeMessagesApiContainer]:
    """The fake, running ``script`` in ``image`` (any image with python3) on its own network
    (over TLS too with ``tls_pem``: a certificate chain and its key); removed with the
    network on exit."""
    # Internal: the fake and the proxies that join its network have no way off the machine.
    network = client.networks.create(
        f"kagura-test-messages-{time.monotonic_ns()}", labels=labels, internal=True
    )
    container = None
    try:
        source = Path(__file__).read_text(encoding="utf-8")
        command = ["python3", "-c", source, "--port", str(PORT), "--dns"]
        command += ["--script", json.dumps(script)]
        if tls_pem is not None:
            command += [
                "--tls-port",
                str(TLS_PORT),
                "--tls-pem",
                base64.b64encode(tls_pem).decode(),
            ]
        container = client.containers.run(
            image, command, detach=True, labels=labels, network=network.name
        )
        container.reload()
        address = container.attrs["NetworkSettings"]["Networks"][network.name]["IPAddress"]
        deadline = time.monotonic() + 15
        while "ready" not in container.logs().decode(errors="replace"):
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"the fake Messages API never printed ready: {container.logs()[-2000:]!r}"
                )
            time.sleep(0.05)
        tls_port = TLS_PORT if tls_pem is not None else None
        yield FakeMessagesApiContainer(container, network.name, address, tls_port=tls_port)
    finally:
        if container is not None:
            container.remove(force=True)
        network.remove()


def answer_nxdomain(query: bytes) -> bytes | None:
    """The DNS reply "no such name" to ``query`` (its id and question kept), or None."""
    if len(query) < 12:
        return None
    flags = 0x8000 | (query[2] & 0x79) << 8 | 0x0080 | 3  # QR, opcode and RD kept, RA, NXDOMAIN
    counts = query[4:6] + b"\0\0\0\0\0\0"  # the question; no answer, authority or extra
    return query[:2] + flags.to_bytes(2, "big") + counts + query[12:]


def serve_nxdomain(port: int = 53) -> threading.Thread:
    """Answer every DNS query on UDP ``port`` with NXDOMAIN, from a daemon thread: the
    resolver of a sealed proxy (testing.fake_anthropic), so a name no test serves fails at
    once, as where it does not resolve, instead of waiting out a resolver that never answers
    (Docker's on an internal network)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("", port))

    def answer() -> None:
        while True:
            query, peer = sock.recvfrom(4096)
            reply = answer_nxdomain(query)
            if reply is not None:
                sock.sendto(reply, peer)

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    return thread


def serve_tls(state: _State, port: int, pem: bytes) -> None:
    """The same fake over TLS on ``port`` (in a thread), presenting ``pem`` (a chain and its
    key); prints ``SNI <name>`` at each handshake."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    with tempfile.NamedTemporaryFile("wb", suffix=".pem") as identity:
        identity.write(pem)
        identity.flush()
        context.load_cert_chain(identity.name)

    def named(sock: ssl.SSLObject | ssl.SSLSocket, name: str | None, ctx: ssl.SSLContext) -> None:
        print("SNI", name or "", flush=True)

    context.sni_callback = named
    server = _Server(("", port), _Handler)
    server.state = state
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="a fake Anthropic Messages API")
    parser.add_argument("--host", default="")
    parser.add_argument("--port", type=int, default=PORT)
    parser.add_argument("--script", default="{}", help="the script, as JSON")
    parser.add_argument("--record", type=Path, help="append each request here (JSON lines)")
    parser.add_argument("--dns", action="store_true", help="answer NXDOMAIN on UDP 53")
    parser.add_argument("--tls-port", type=int, help="answer over TLS on this port too")
    parser.add_argument("--tls-pem", help="its certificate chain and key (PEM, base64)")
    args = parser.parse_args(argv)
    if args.dns:
        serve_nxdomain()
    server = _Server((args.host, args.port), _Handler)
    server.state = _State(json.loads(args.script), args.record)
    if args.tls_port is not None:
        serve_tls(server.state, args.tls_port, base64.b64decode(args.tls_pem or ""))
    print("ready", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main(sys.argv[1:])
