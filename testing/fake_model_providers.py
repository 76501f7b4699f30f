"""One scripted model behind the wire protocols the Claude Code CLI speaks to its providers.

testing/fake_messages_api.py plays the model turn by turn (its script, its ``Call``); this
fake answers the same script on each protocol the bundled CLI uses, and checks each
request's credential as the provider does:

- **Anthropic Messages** (a gateway such as LiteLLM, a corporate endpoint, the API with a
  subscription): ``POST {prefix}/v1/messages`` and ``/v1/messages/count_tokens``, answered
  as fake_messages_api answers them. An API key arrives in ``x-api-key`` or as
  ``Authorization: Bearer`` (a gateway's header); a subscription's OAuth token only as
  ``Authorization: Bearer`` with the ``oauth-2025-04-20`` beta, as the API takes it.
- **Amazon Bedrock runtime**: ``POST /model/{modelId}/invoke`` (one JSON message) and
  ``/model/{modelId}/invoke-with-response-stream`` (``application/vnd.amazon.eventstream``:
  each server-sent event's JSON, base64 in the ``bytes`` field of a ``chunk`` event, every
  message framed with its prelude and message CRC32, as AWS's event-stream decoder checks
  them). The body is the Messages API's without ``model`` and ``stream``, with
  ``anthropic_version: bedrock-2023-05-31`` and the betas in ``anthropic_beta``. Every
  request must be signed with AWS Signature Version 4 (service ``bedrock``, the fake's
  region) by a key the STS issued, its session token signed too, its date
  within five minutes: the fake recomputes the signature (canonical URI encoded twice, as
  for every service but S3) and refuses with Bedrock's exceptions otherwise.
- **Google Vertex AI**: ``POST /v1/projects/{project}/locations/{region}/publishers/
  anthropic/models/{model}:streamRawPredict`` (server-sent events), ``:rawPredict`` (JSON)
  and ``.../models/count-tokens:rawPredict``; the body carries ``anthropic_version:
  vertex-2023-10-16`` and no ``model`` (count-tokens: with it). ``Authorization: Bearer``
  must be a token the IAM Credentials API minted, the project and
  region the fake's; Google's error shape otherwise.

Credentials it accepts are given when it starts and, in a container, added from a JSON
file it reads on each request (``FakeProvidersContainer.trust``: the test hands over what
the provider's fake issued, as the real services trust their own token services).
Every request is recorded with its protocol and how its credential checked out (values as
``key_marker``, never themselves): ``records()`` or ``GET /_fake/records``.

Standard library only; in a container it runs as ``python3 -m testing.fake_model_providers``
with this file and fake_messages_api.py copied in (``fake_providers_container``).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import datetime as dt
import hashlib
import hmac
import http.server
import io
import json
import re
import secrets
import sys
import tarfile
import threading
import time
import urllib.parse
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from testing.fake_messages_api import (
    Call,
    error_body,
    invalid,
    key_marker,
    message,
    sse,
    stream_events,
)

PORT = 8080
MAX_BODY = 32 * 1024 * 1024
MAX_RECORDS = 5000
OAUTH_BETA = "oauth-2025-04-20"
BEDROCK_VERSION = "bedrock-2023-05-31"
VERTEX_VERSION = "vertex-2023-10-16"
EVENTSTREAM = "application/vnd.amazon.eventstream"
SIGV4 = "AWS4-HMAC-SHA256"
MAX_SKEW = dt.timedelta(minutes=5)
TRUST_FILE = "/tmp/fake-trust.json"

_BEDROCK_PATH = re.compile(r"^/model/(?P<model>[^/]+)/(?P<op>invoke|invoke-with-response-stream)$")
_VERTEX_PATH = re.compile(
    r"^/v1/projects/(?P<project>[^/]+)/locations/(?P<region>[^/]+)/publishers/anthropic"
    r"/models/(?P<model>[^/:]+):(?P<op>rawPredict|streamRawPredict)$"
)
_MESSAGES_PATHS = ("/v1/messages", "/v1/messages/count_tokens")


# --- trust ------------------------------------------------------------------------------


@dataclass
class Trust:
    """The credentials the fake accepts: API keys, OAuth tokens, bearer tokens (Vertex),
    and AWS keys (access key id -> [secret, session token])."""

    api_keys: list[str] = field(default_factory=list)
    oauth_tokens: list[str] = field(default_factory=list)
    bearer_tokens: list[str] = field(default_factory=list)
    aws: dict[str, list[str]] = field(default_factory=dict)

    @classmethod
    def read(cls, data: dict[str, Any]) -> Trust:
        return cls(
            api_keys=list(data.get("api_keys", [])),
            oauth_tokens=list(data.get("oauth_tokens", [])),
            bearer_tokens=list(data.get("bearer_tokens", [])),
            aws={str(k): list(v) for k, v in dict(data.get("aws", {})).items()},
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "api_keys": self.api_keys,
            "oauth_tokens": self.oauth_tokens,
            "bearer_tokens": self.bearer_tokens,
            "aws": self.aws,
        }


# --- the AWS event stream and SigV4 -----------------------------------------------------


def _header_bytes(headers: dict[str, str]) -> bytes:
    out = b""
    for name, value in headers.items():
        raw_name, raw_value = name.encode(), value.encode()
        out += len(raw_name).to_bytes(1, "big") + raw_name + b"\x07"  # 7: a string value
        out += len(raw_value).to_bytes(2, "big") + raw_value
    return out


def eventstream_message(headers: dict[str, str], payload: bytes) -> bytes:
    """One message of the AWS event stream: prelude (total and headers length, CRC32),
    headers, payload, CRC32 of everything before it."""
    raw_headers = _header_bytes(headers)
    total = 12 + len(raw_headers) + len(payload) + 4
    prelude = total.to_bytes(4, "big") + len(raw_headers).to_bytes(4, "big")
    body = prelude + zlib.crc32(prelude).to_bytes(4, "big") + raw_headers + payload
    return body + zlib.crc32(body).to_bytes(4, "big")


def read_eventstream(data: bytes) -> list[tuple[dict[str, str], bytes]]:
    """The messages of an event stream, each CRC checked (tests read what passed the
    proxy with it); raises ValueError on a damaged frame."""
    out: list[tuple[dict[str, str], bytes]] = []
    pos = 0
    while pos < len(data):
        total = int.from_bytes(data[pos : pos + 4], "big")
        header_len = int.from_bytes(data[pos + 4 : pos + 8], "big")
        frame = data[pos : pos + total]
        if len(frame) != total or total < 16:
            raise ValueError("a truncated event-stream message")
        if zlib.crc32(frame[:8]) != int.from_bytes(frame[8:12], "big"):
            raise ValueError("the prelude CRC does not match")
        if zlib.crc32(frame[:-4]) != int.from_bytes(frame[-4:], "big"):
            raise ValueError("the message CRC does not match")
        headers: dict[str, str] = {}
        raw = frame[12 : 12 + header_len]
        i = 0
        while i < len(raw):
            name_len = raw[i]
            name = raw[i + 1 : i + 1 + name_len].decode()
            i += 1 + name_len + 1  # the value type: strings only here
            value_len = int.from_bytes(raw[i : i + 2], "big")
            headers[name] = raw[i + 2 : i + 2 + value_len].decode()
            i += 2 + value_len
        out.append((headers, frame[12 + header_len : -4]))
        pos += total
    return out


def bedrock_chunk(event: dict[str, Any]) -> bytes:
    """A ``chunk`` event carrying one Messages API stream event, as Bedrock sends it (the
    ``p`` field pads the payload, as Bedrock's does, so sizes say nothing)."""
    data = json.dumps(event, separators=(",", ":")).encode()
    payload = {"bytes": base64.b64encode(data).decode(), "p": "abcdefghijklmnopqrstuvwxyz"[:8]}
    headers = {
        ":event-type": "chunk",
        ":content-type": "application/json",
        ":message-type": "event",
    }
    return eventstream_message(headers, json.dumps(payload).encode())


def _hmac(key: bytes, text: str) -> bytes:
    return hmac.new(key, text.encode(), hashlib.sha256).digest()


def sigv4_signing_key(secret: str, date: str, region: str, service: str) -> bytes:
    key = _hmac(("AWS4" + secret).encode(), date)
    key = _hmac(key, region)
    key = _hmac(key, service)
    return _hmac(key, "aws4_request")


def canonical_uri(raw_path: str) -> str:
    """The path as sent, encoded once more (every service but S3 signs it so)."""
    return urllib.parse.quote(raw_path, safe="/~")


def canonical_query(query: str) -> str:
    pairs = urllib.parse.parse_qsl(query, keep_blank_values=True)
    encoded = sorted(
        (urllib.parse.quote(k, safe="-_.~"), urllib.parse.quote(v, safe="-_.~")) for k, v in pairs
    )
    return "&".join(f"{k}={v}" for k, v in encoded)


def sigv4_problem(
    method: str,
    target: str,
    headers: dict[str, list[str]],
    body: bytes,
    trust: Trust,
    region: str,
    now: dt.datetime,
) -> tuple[str, str] | None:
    """Why Bedrock would refuse this request's signature: (exception, message), or None."""
    auth = (headers.get("authorization") or [""])[0]
    scheme, _, rest = auth.partition(" ")
    if scheme != SIGV4:
        return "MissingAuthenticationTokenException", "Missing Authentication Token"
    parts = dict(p.strip().split("=", 1) for p in rest.split(",") if "=" in p)
    try:
        key_id, date, scope_region, service, terminator = parts["Credential"].split("/")
        signed = parts["SignedHeaders"].split(";")
        signature = parts["Signature"]
    except (KeyError, ValueError):
        return "IncompleteSignatureException", "Authorization header requires Credential"
    if key_id not in trust.aws:
        return (
            "UnrecognizedClientException",
            "The security token included in the request is invalid.",
        )
    secret, token = trust.aws[key_id]
    amz_date = (headers.get("x-amz-date") or [""])[0]
    if (
        service != "bedrock"
        or terminator != "aws4_request"
        or scope_region != region
        or not amz_date.startswith(date)
        or "host" not in signed
        or "x-amz-date" not in signed
    ):
        return "InvalidSignatureException", "Credential should be scoped correctly."
    try:
        when = dt.datetime.strptime(amz_date, "%Y%m%dT%H%M%SZ").replace(tzinfo=dt.UTC)
    except ValueError:
        return "IncompleteSignatureException", "Date must be in ISO-8601 'basic format'."
    if abs(now - when) > MAX_SKEW:
        return "InvalidSignatureException", "Signature expired"
    sent_token = (headers.get("x-amz-security-token") or [""])[0]
    if sent_token != token or "x-amz-security-token" not in signed:
        return (
            "UnrecognizedClientException",
            "The security token included in the request is invalid.",
        )
    payload_hash = hashlib.sha256(body).hexdigest()
    claimed = (headers.get("x-amz-content-sha256") or [payload_hash])[0]
    if claimed != payload_hash:
        return "InvalidSignatureException", "The provided x-amz-content-sha256 does not match."
    raw_path, _, query = target.partition("?")
    lines = []
    for name in signed:
        values = headers.get(name)
        if values is None:
            return "InvalidSignatureException", f"signed header {name} is missing"
        lines.append(f"{name}:{','.join(' '.join(v.split()) for v in values)}\n")
    canonical = "\n".join(
        [
            method,
            canonical_uri(raw_path),
            canonical_query(query),
            "".join(lines),
            ";".join(signed),
            payload_hash,
        ]
    )
    scope = f"{date}/{region}/bedrock/aws4_request"
    to_sign = "\n".join([SIGV4, amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    expected = hmac.new(
        sigv4_signing_key(secret, date, region, "bedrock"), to_sign.encode(), hashlib.sha256
    ).hexdigest()
    if not hmac.compare_digest(expected, signature):
        return (
            "InvalidSignatureException",
            "The request signature we calculated does not match the signature you provided.",
        )
    return None


# --- the server -------------------------------------------------------------------------


class _State:
    def __init__(
        self,
        script: dict[str, Any],
        region: str,
        project: str,
        prefix: str,
        trust_file: Path | None,
    ) -> None:
        self.script = script
        self.region = region
        self.project = project
        self.prefix = prefix.rstrip("/")
        self.trust_file = trust_file
        self.lock = threading.Lock()
        self.records: list[dict[str, Any]] = []
        self.attempts: dict[tuple[int | None, int, str], int] = {}
        self._trust = Trust()

    def trust(self) -> Trust:
        """What it was started with, and what the trust file says now."""
        with self.lock:
            given = self._trust
        if self.trust_file is None:
            return given
        try:
            found = Trust.read(json.loads(self.trust_file.read_text(encoding="utf-8")))
        except (OSError, ValueError):
            return given
        return Trust(
            api_keys=given.api_keys + found.api_keys,
            oauth_tokens=given.oauth_tokens + found.oauth_tokens,
            bearer_tokens=given.bearer_tokens + found.bearer_tokens,
            aws={**given.aws, **found.aws},
        )

    def set_trust(self, trust: Trust) -> None:
        with self.lock:
            self._trust = trust

    def record(self, entry: dict[str, Any]) -> None:
        with self.lock:
            if len(self.records) < MAX_RECORDS:
                self.records.append(entry)

    def attempt(self, call: Call) -> int:
        key = (call.conversation, call.turn, call.first_user)
        with self.lock:
            seen = self.attempts.get(key, 0)
            self.attempts[key] = seen + 1
            return seen


def _marked(value: str) -> str:
    return key_marker(value) if value else "-"


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    # --- plumbing ---

    def _headers(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for name, value in self.headers.items():
            out.setdefault(name.lower(), []).append(value)
        return out

    def _entry(self, protocol: str, raw: bytes) -> dict[str, Any]:
        shown = {}
        for name, values in self._headers().items():
            secret = name in ("x-api-key", "authorization", "x-amz-security-token", "cookie")
            value = ", ".join(values)
            if secret and name == "authorization":
                scheme, _, token = value.partition(" ")
                if scheme == SIGV4:  # the access key id is no secret: keep it
                    value = f"{SIGV4} {token.split('/', 1)[0].removeprefix('Credential=')}"
                else:
                    value = f"{scheme} {_marked(token)}"
            elif secret:
                value = _marked(value)
            shown[name] = value
        try:
            body: object = json.loads(raw) if raw else None
        except ValueError:
            body = raw[:4096].decode(errors="replace")
        return {
            "time": time.time(),
            "protocol": protocol,
            "method": self.command,
            "path": self.path,
            "headers": shown,
            "body": body,
        }

    def _send(self, status: int, data: bytes, content_type: str, extra: dict[str, str]) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        for name, value in extra.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def _json(self, status: int, data: object, extra: dict[str, str] | None = None) -> None:
        self._send(status, json.dumps(data).encode(), "application/json", extra or {})

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _start_stream(self, content_type: str, extra: dict[str, str]) -> None:
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Transfer-Encoding", "chunked")
        for name, value in extra.items():
            self.send_header(name, value)
        self.end_headers()

    def _read(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            raise ValueError("body too large")
        return self.rfile.read(length) if length else b""

    # --- requests ---

    def do_GET(self) -> None:
        if self.path == "/_fake/records":
            with self.server.state.lock:
                records = list(self.server.state.records)
            self._json(200, records)
            return
        self.server.state.record(self._entry("unknown", b""))
        self._json(404, error_body(404, "Not found", "req_fake"))

    def do_CONNECT(self) -> None:
        # Used as a forward proxy (a loopback experiment): say where the client went.
        self.server.state.record(self._entry("connect", b""))
        self.close_connection = True
        with contextlib.suppress(OSError):
            self._json(403, error_body(403, "the fake is no forward proxy", "req_fake"))

    def do_POST(self) -> None:
        try:
            raw = self._read()
        except ValueError:
            self.close_connection = True
            self._json(413, error_body(413, "Request too large", "req_fake"))
            return
        target = self.path
        path = target.split("?", 1)[0]
        state = self.server.state
        if path.startswith(state.prefix + "/v1/messages") and (
            path.removeprefix(state.prefix) in _MESSAGES_PATHS
        ):
            self._anthropic(raw, path.removeprefix(state.prefix))
        elif (found := _BEDROCK_PATH.match(path)) is not None:
            self._bedrock(raw, target, found)
        elif (found := _VERTEX_PATH.match(path)) is not None or path.endswith(
            "/models/count-tokens:rawPredict"
        ):
            self._vertex(raw, path, found)
        else:
            state.record(self._entry("unknown", raw))
            self._json(404, error_body(404, "Not found", "req_fake"))

    # --- Anthropic Messages (gateway, subscription) ---

    def _anthropic(self, raw: bytes, path: str) -> None:
        state, trust = self.server.state, self.server.state.trust()
        entry = self._entry("anthropic", raw)
        headers = self._headers()
        betas = ",".join(headers.get("anthropic-beta", []))
        api_key = (headers.get("x-api-key") or [""])[0]
        scheme, _, bearer = (headers.get("authorization") or [""])[0].partition(" ")
        bearer = bearer if scheme.lower() == "bearer" else ""
        oauth = OAUTH_BETA in [b.strip() for b in betas.split(",")]
        if api_key and api_key in trust.api_keys:
            entry["auth"] = "x-api-key " + key_marker(api_key)
        elif bearer and bearer in trust.api_keys:
            entry["auth"] = "bearer-api-key " + key_marker(bearer)
        elif bearer and bearer in trust.oauth_tokens and oauth:
            entry["auth"] = "oauth " + key_marker(bearer)
        else:
            why = "OAuth authentication requires the oauth beta" if bearer and not oauth else ""
            entry["auth"] = "refused"
            state.record(entry)
            self._json(401, error_body(401, why or "invalid x-api-key", "req_fake"))
            return
        body = entry["body"]
        if path.endswith("/count_tokens"):
            state.record(entry)
            self._json(200, {"input_tokens": max(1, len(raw) // 4)})
            return
        why = invalid(body, betas)
        if why is not None:
            state.record({**entry, "refused": why})
            self._json(400, error_body(400, why, "req_fake"))
            return
        assert isinstance(body, dict)
        self._answer(entry, body, stream=bool(body.get("stream")), framing="sse")

    # --- Bedrock ---

    def _bedrock(self, raw: bytes, target: str, found: re.Match[str]) -> None:
        state = self.server.state
        entry = self._entry("bedrock", raw)
        refusal = sigv4_problem(
            self.command,
            target,
            self._headers(),
            raw,
            state.trust(),
            state.region,
            dt.datetime.now(dt.UTC),
        )
        if refusal is not None:
            entry["auth"] = "refused: " + refusal[0]
            state.record(entry)
            self._bedrock_error(403, *refusal)
            return
        entry["auth"] = "sigv4 " + entry["headers"]["authorization"].split()[1]
        body = entry["body"]
        model_id = urllib.parse.unquote(found["model"])
        entry["model"] = model_id
        problem = self._bedrock_body(body)
        converted: dict[str, Any] = {}
        if problem is None and isinstance(body, dict):
            betas = ",".join(map(str, body.get("anthropic_beta", [])))
            converted = {
                k: v for k, v in body.items() if k not in ("anthropic_version", "anthropic_beta")
            }
            converted["model"] = model_id
            problem = invalid(converted, betas)
        if problem is not None:
            state.record({**entry, "refused": problem})
            self._bedrock_error(400, "ValidationException", problem)
            return
        stream = found["op"] == "invoke-with-response-stream"
        self._answer(entry, converted, stream=stream, framing="eventstream")

    @staticmethod
    def _bedrock_body(body: object) -> str | None:
        if not isinstance(body, dict):
            return "Malformed input request, please reformat your input and try again."
        if body.get("anthropic_version") != BEDROCK_VERSION:
            return "anthropic_version: expected bedrock-2023-05-31"
        for extraneous in ("model", "stream"):
            if extraneous in body:
                return f"#: extraneous key [{extraneous}] is not permitted"
        beta = body.get("anthropic_beta", [])
        if not isinstance(beta, list) or not all(isinstance(b, str) for b in beta):
            return "anthropic_beta: expected a list of strings"
        return None

    def _bedrock_error(self, status: int, kind: str, text: str) -> None:
        extra = {
            "x-amzn-ErrorType": f"{kind}:http://internal.amazon.com/coral/com.amazon.bedrock/",
            "x-amzn-RequestId": secrets.token_hex(16),
        }
        self._json(status, {"message": text}, extra)

    # --- Vertex ---

    def _vertex(self, raw: bytes, path: str, found: re.Match[str] | None) -> None:
        state, trust = self.server.state, self.server.state.trust()
        entry = self._entry("vertex", raw)
        scheme, _, token = (self.headers.get("authorization") or "").partition(" ")
        if scheme.lower() != "bearer" or token not in trust.bearer_tokens:
            entry["auth"] = "refused"
            state.record(entry)
            self._json(
                401,
                {
                    "error": {
                        "code": 401,
                        "message": "Request had invalid authentication credentials. Expected"
                        " OAuth 2 access token, login cookie or other valid authentication"
                        " credential.",
                        "status": "UNAUTHENTICATED",
                    }
                },
            )
            return
        entry["auth"] = "bearer " + key_marker(token)
        where = (
            f"/v1/projects/{state.project}/locations/{state.region}/publishers/anthropic/models/"
        )
        if not path.startswith(where):
            state.record({**entry, "refused": "project or region"})
            self._json(
                403,
                {
                    "error": {
                        "code": 403,
                        "message": "Permission denied on resource project.",
                        "status": "PERMISSION_DENIED",
                    }
                },
            )
            return
        body = entry["body"]
        headers = self._headers()
        betas = ",".join(headers.get("anthropic-beta", []))
        if not isinstance(body, dict) or body.get("anthropic_version") != VERTEX_VERSION:
            state.record({**entry, "refused": "anthropic_version"})
            self._json(400, error_body(400, "anthropic_version: Field required", "req_fake"))
            return
        if found is None or found["model"] == "count-tokens":  # count-tokens:rawPredict
            state.record(entry)
            self._json(200, {"input_tokens": max(1, len(raw) // 4)})
            return
        entry["model"] = found["model"]
        converted = {k: v for k, v in body.items() if k != "anthropic_version"}
        converted["model"] = found["model"]
        problem = invalid(converted, betas)
        if problem is not None:
            state.record({**entry, "refused": problem})
            self._json(400, error_body(400, problem, "req_fake"))
            return
        stream = found["op"] == "streamRawPredict"
        self._answer(entry, converted, stream=stream, framing="sse")

    # --- the answer, in each framing ---

    def _answer(
        self, entry: dict[str, Any], body: dict[str, Any], *, stream: bool, framing: str
    ) -> None:
        state = self.server.state
        call = Call.read(body, state.script)
        turn = call.plan(state.script)
        entry["turn"] = {"conversation": call.conversation, "index": call.turn, "agent": call.agent}
        state.record(entry)
        failures = list(turn.get("fail", []))
        if call.agent and failures and (seen := state.attempt(call)) < len(failures):
            status = int(failures[seen])
            after = {"retry-after": str(turn.get("retry_after", "0"))}
            if framing == "eventstream":
                kind = "ThrottlingException" if status == 429 else "ServiceUnavailableException"
                self._bedrock_error(429 if status == 429 else 503, kind, "Too many requests")
            else:
                self._json(status, error_body(status, "Overloaded", "req_fake"), after)
            return
        time.sleep(float(turn.get("stall", 0)))
        whole = message(body, turn, call)
        delay = float(turn.get("delay", 0))
        if not stream:
            extra = {}
            if framing == "eventstream":
                usage = whole["usage"]
                extra = {
                    "X-Amzn-Bedrock-Input-Token-Count": str(usage["input_tokens"]),
                    "X-Amzn-Bedrock-Output-Token-Count": str(usage["output_tokens"]),
                }
            self._json(200, whole, extra)
            return
        try:
            if framing == "eventstream":
                self._start_stream(EVENTSTREAM, {"x-amzn-bedrock-content-type": "application/json"})
                for _, data in stream_events(whole):
                    if data["type"] == "message_stop":
                        data = {**data, "amazon-bedrock-invocationMetrics": _metrics(whole)}
                    self._chunk(bedrock_chunk(data))
                    time.sleep(delay)
            else:
                self._start_stream(
                    "text/event-stream; charset=utf-8", {"Cache-Control": "no-cache"}
                )
                for event, data in stream_events(whole):
                    self._chunk(sse(event, data))
                    time.sleep(delay)
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True


def _metrics(whole: dict[str, Any]) -> dict[str, int]:
    usage = whole["usage"]
    return {
        "inputTokenCount": int(usage["input_tokens"]),
        "outputTokenCount": int(usage["output_tokens"]),
        "invocationLatency": 10,
        "firstByteLatency": 5,
    }


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    state: _State


class FakeProviders:
    """The fake on a loopback port in this process."""

    def __init__(
        self,
        script: dict[str, Any] | None = None,
        *,
        region: str = "us-east-1",
        project: str = "kagura-test",
        prefix: str = "",
    ) -> None:
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.state = _State(script or {}, region, project, prefix, None)
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def trust(self, trust: Trust) -> None:
        self._server.state.set_trust(trust)

    def start(self) -> FakeProviders:
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
class FakeProvidersContainer:
    """The fake in a container on its own network (``address``:``port`` on ``network``)."""

    container: Any
    network: str
    address: str
    port: int = PORT
    dns: bool = False

    def trust(self, trust: Trust) -> None:
        """Accept these credentials from now on (written atomically to the trust file)."""
        code = (
            "import os, sys; t = sys.argv[1]; p = sys.argv[2];"
            " open(p + '.next', 'w').write(t); os.replace(p + '.next', p)"
        )
        result = self.container.exec_run(
            ["python3", "-c", code, json.dumps(trust.to_json()), TRUST_FILE]
        )
        if result.exit_code != 0:
            raise RuntimeError(f"the fake providers took no trust: {result.output!r}")

    def records(self) -> list[dict[str, Any]]:
        fetch = (
            "import sys, urllib.request as u;"
            f" sys.stdout.write(u.urlopen('http://127.0.0.1:{self.port}/_fake/records').read().decode())"
        )
        result = self.container.exec_run(["python3", "-c", fetch])
        if result.exit_code != 0:
            raise RuntimeError(f"the fake providers gave no records: {result.output!r}")
        records: list[dict[str, Any]] = json.loads(result.output)
        return records


def _sources() -> bytes:
    """testing/{__init__,fake_messages_api,fake_model_providers}.py as a tar archive."""
    here = Path(__file__).resolve().parent
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name in ("__init__.py", "fake_messages_api.py", "fake_model_providers.py"):
            data = (here / name).read_bytes()
            info = tarfile.TarInfo(f"testing/{name}")
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


@contextlib.contextmanager
def fake_providers_container(
    client: Any,
    image: str,
    labels: dict[str, str],
    script: dict[str, Any],
    *,
    region: str = "us-east-1",
    project: str = "kagura-test",
    prefix: str = "",
    trust: Trust | None = None,
) -> Iterator[FakeProvidersContainer]:
    """The fake, running ``script`` in ``image`` (any image with python3) on its own
    internal network, accepting ``trust`` (and what its trust file adds later); removed
    with the network on exit."""
    network = client.networks.create(
        f"kagura-test-providers-{time.monotonic_ns()}", labels=labels, internal=True
    )
    container = None
    try:
        command = ["python3", "-m", "testing.fake_model_providers", "--port", str(PORT)]
        command += ["--region", region, "--project", project, "--prefix", prefix]
        command += ["--trust-file", TRUST_FILE, "--script", json.dumps(script)]
        command += ["--trust", json.dumps((trust or Trust()).to_json())]
        container = client.containers.create(
            image,
            command,
            labels=labels,
            network=network.name,
            working_dir="/opt/fake",
            environment={"PYTHONPATH": "/opt/fake"},
        )
        container.put_archive("/opt/fake", _sources()) or None
        container.start()
        container.reload()
        address = container.attrs["NetworkSettings"]["Networks"][network.name]["IPAddress"]
        deadline = time.monotonic() + 15
        while "ready" not in container.logs().decode(errors="replace"):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the fake providers never said ready: {container.logs()!r}")
            time.sleep(0.05)
        yield FakeProvidersContainer(container, network.name, address)
    finally:
        if container is not None:
            container.remove(force=True)
        network.remove()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="fake Claude providers (gateway, Bedrock, Vertex)")
    parser.add_argument("--port", type=int, default=PORT)
    parser.add_argument("--host", default="")
    parser.add_argument("--region", default="us-east-1")
    parser.add_argument("--project", default="kagura-test")
    parser.add_argument("--prefix", default="")
    parser.add_argument("--trust-file", type=Path)
    parser.add_argument("--script", default="{}")
    parser.add_argument("--trust", default="{}", help="credentials accepted from the start")
    args = parser.parse_args(argv)
    server = _Server((args.host, args.port), _Handler)
    server.state = _State(
        json.loads(args.script), args.region, args.project, args.prefix, args.trust_file
    )
    server.state.set_trust(Trust.read(json.loads(args.trust)))
    print("ready", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main(sys.argv[1:])
