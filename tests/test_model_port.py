"""The key-injecting port from the outside: a run's real proxy, an agent container, raw HTTP.

Each test starts a run's proxy with the key injected (EgressSession, as apply does)
towards a fake Messages API (testing/fake_messages_api.py) or an upstream that misbehaves,
and speaks to the injecting port from inside an unprivileged agent container the way an
attacker would: raw bytes through the agent's forwarder, so nothing on the way tidies a
request up. What must hold (membrane/egress/modelport.py, kagura_model_port.lua):

- only the model-call paths, as sent, reach the model, with the operator's key and none
  of the agent's credentials;
- nothing a call asks the provider to reach (server-side tools, MCP connectors, URL
  sources, file references, their betas) passes unless the policy allows it, however the
  body is dressed (duplicate keys, escapes, nesting, smuggled or pipelined requests);
- calls are counted when they start: no more reach the model than the budget allows,
  and no more at once than the concurrency cap;
- the key never comes back, whatever the upstream echoes; a stream is never buffered;
- every decision lands in the run's egress log with its reason.
"""

from __future__ import annotations

import base64
import contextlib
import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from kagura_agent.apply.guards.modelcalls import ModelCalls
from kagura_agent.membrane.egress.modelport import LOCAL_BETAS, Injection
from kagura_agent.membrane.egress.session import EgressRequest, EgressSession
from testing.egress_images import ensure_egress_images, start_forwarder
from testing.fake_messages_api import fake_messages_api_container, key_marker

pytestmark = pytest.mark.usefixtures("docker_client")

CANARY = "sk-ant-canary-port-" + "Z9" * 20
ATTACKER = "sk-ant-attacker-" + "A1" * 20
TEST_LABEL = {"dev.kagura.test": "model-port"}
HOST = "api.anthropic.test"
# A raw HTTP client run inside the agent: the bytes as given, on one connection, to the
# injecting port; prints what came back (base64) and when its first byte came (seconds).
# Several requests (base64, comma-separated) go on a connection each, one after another.
RAW = """
import base64, socket, sys, time
wait = float(sys.argv[2])
for data in sys.argv[1].split(","):
    s = socket.create_connection(("127.0.0.1", 3129)); start = time.monotonic()
    s.sendall(base64.b64decode(data)); s.settimeout(wait); out = b""; first = None
    try:
        while True:
            c = s.recv(65536)
            if not c:
                break
            first = time.monotonic() - start if first is None else first
            out += c
    except socket.timeout:
        pass
    s.close()
    print(base64.b64encode(out).decode(), first, time.monotonic() - start, flush=True)
"""
TOOLS = [{"name": "Write", "description": "write a file", "input_schema": {"type": "object"}}]
CALL = {
    "model": "claude-sonnet-4-5",
    "max_tokens": 64,
    "stream": True,
    "tools": TOOLS,
    "messages": [{"role": "user", "content": "hello"}],
}


def request(
    body: dict[str, Any] | bytes | None = None,
    *,
    method: str = "POST",
    target: str = "/v1/messages?beta=true",
    headers: dict[str, str] | None = None,
    close: bool = True,
) -> bytes:
    """One HTTP/1.1 request as bytes (Content-Length from the body)."""
    raw = body if isinstance(body, bytes) else json.dumps(body or CALL).encode()
    lines = [f"{method} {target} HTTP/1.1", f"Host: {HOST}"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    if body is not None or method == "POST":
        lines.append(f"Content-Length: {len(raw)}")
    if close:
        lines.append("Connection: close")
    return "\r\n".join(lines).encode() + b"\r\n\r\n" + (raw if method == "POST" else b"")


@dataclass
class Reply:
    raw: bytes
    first_byte: float | None
    total: float

    @property
    def statuses(self) -> list[int]:
        return [
            int(line.split()[1]) for line in self.text.splitlines() if line.startswith("HTTP/1.")
        ]

    @property
    def text(self) -> str:
        return self.raw.decode(errors="replace")

    @property
    def body(self) -> str:
        """The body of the (last) response, its chunked framing undone."""
        head, _, rest = self.raw.rpartition(b"HTTP/1.1 ")[2].partition(b"\r\n\r\n")
        if b"chunked" not in head.lower():
            return rest.decode(errors="replace")
        out = b""
        while rest:
            size, _, rest = rest.partition(b"\r\n")
            n = int(size, 16)
            if n == 0:
                break
            out, rest = out + rest[:n], rest[n + 2 :]
        return out.decode(errors="replace")


@dataclass
class Port:
    client: Any
    session: EgressSession
    agent: Any
    fake: Any
    events: list[dict[str, Any]] = field(default_factory=list)

    def send(self, data: bytes, wait: float = 5.0) -> Reply:
        (reply,) = self.send_each([data], wait)
        return reply

    def send_each(self, requests: list[bytes], wait: float = 5.0) -> list[Reply]:
        """Each request on a connection of its own, in order (one exec for all)."""
        encoded = ",".join(base64.b64encode(data).decode() for data in requests)
        result = self.agent.exec_run(["python3", "-c", RAW, encoded, str(wait)])
        assert result.exit_code == 0, result.output
        replies = []
        for line in result.output.decode().splitlines():
            out, first, total = line.split()
            first_byte = None if first == "None" else float(first)
            replies.append(Reply(base64.b64decode(out), first_byte, float(total)))
        assert len(replies) == len(requests)
        return replies

    def records(self) -> list[dict[str, Any]]:
        return [r for r in self.fake.records() if not r["path"].startswith("/_fake/")]

    def decisions(self) -> list[dict[str, Any]]:
        self.session.drain()
        return [e for e in self.events if e.get("type") == "egress.decision"]


@pytest.fixture(scope="module")
def images(docker_client: Any) -> dict[str, str]:
    return ensure_egress_images(docker_client)


@contextlib.contextmanager
def open_port(
    client: Any,
    images: dict[str, str],
    *,
    turns: int | None = 3,
    model_calls: dict[str, Any] | None = None,
    script: dict[str, Any] | None = None,
    upstream: Any = None,
    injection: Injection | None = None,
) -> Iterator[Port]:
    """A run's proxy injecting CANARY towards the fake (or ``upstream``: a container and
    network of one's own; ``injection``: how the port reaches it, plain HTTP to HOST by
    default), and an agent container whose forwarder reaches it."""
    run_id = f"test-port-{time.monotonic_ns()}"
    plan: dict[str, Any] = {
        "egress": {"mode": "proxy", "allow": [{"host": "allowed.test", "port": 8443}]},
        "budget": {"turns": turns},
    }
    if model_calls is not None:
        plan["egress"]["model_calls"] = model_calls
    with contextlib.ExitStack() as stack:
        if upstream is None:
            upstream = stack.enter_context(
                fake_messages_api_container(client, images["base"], TEST_LABEL, script or {})
            )
        events: list[dict[str, Any]] = []
        injection = injection or Injection(host=HOST, port=upstream.port, tls=False)
        request = EgressRequest(
            plan,
            run_id,
            injection=injection,
            injection_secret=CANARY,
            extra_hosts={injection.host: upstream.address},
            extra_networks=(upstream.network,),
            scrub=lambda text: text.replace(CANARY, "(canary)"),
        )
        session = EgressSession.start(client, request, events.append)
        stack.callback(session.close)
        net = session.agent_network_config()
        agent = client.containers.create(
            images["base"],
            ["sleep", "600"],
            labels=TEST_LABEL,
            user="1000:1000",
            cap_drop=["ALL"],
            security_opt=["no-new-privileges:true"],
            read_only=True,
            tmpfs={"/tmp": "rw,size=16m"},
            **net.docker_kwargs(),
        )
        stack.callback(agent.remove, force=True)
        agent.start()
        start_forwarder(agent, net)
        yield Port(client, session, agent, upstream, events)


def _reasons(port: Port, count: int = 0) -> list[str]:
    """The reasons of the port's refusals, once ``count`` of them are in its log: nginx
    logs a request after its answer has gone, so the last one may be on its way."""
    deadline = time.monotonic() + 10
    while True:
        found = [e["reason"] for e in port.decisions() if e["decision"] == "deny"]
        if len(found) >= count or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def test_a_model_call_goes_with_the_operators_key_and_none_of_the_agents(
    docker_client: Any, images: dict[str, str]
) -> None:
    with open_port(docker_client, images) as port:
        agent_headers = {
            "x-api-key": ATTACKER,
            "Authorization": f"Bearer {ATTACKER}",
            "Cookie": f"session={ATTACKER}",
            "Proxy-Authorization": f"Basic {ATTACKER}",
            "X-Forwarded-For": "10.0.0.1",
            "anthropic-version": "2023-06-01",
            "anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14",
        }
        reply = port.send(request(headers=agent_headers))
        assert reply.statuses == [200] and "message_stop" in reply.text, reply.text
        (seen,) = port.records()
        headers = seen["headers"]
        assert headers["x-api-key"] == key_marker(CANARY)
        gone = ("authorization", "cookie", "proxy-authorization", "x-forwarded-for")
        assert not set(gone) & set(headers), headers
        assert headers["host"] == HOST and headers["anthropic-version"] == "2023-06-01"
        assert seen["path"] == "/v1/messages?beta=true"
        (decision,) = port.decisions()
        assert (decision["decision"], decision["reason"], decision["squid_status"]) == (
            "allow",
            "injected",
            "MODEL_TURN",
        )
        assert decision["inport"] == 3129 and decision["path"] == "/v1/messages"


REFUSED_TARGETS = [
    ("POST", "/v1/messages%3F/../messages/batches"),
    ("POST", "/v1/messages/batches"),
    ("POST", "/v1/messages/%2e%2e/files"),
    ("POST", "/v1/messages/../files"),
    ("POST", "/v1/./messages"),
    ("POST", "//v1/messages"),
    ("POST", "/v1//messages"),
    ("POST", "/v1/messages/"),
    ("POST", "/V1/messages"),
    ("POST", "/v1/messages%2F"),
    ("POST", "/v1/messages;count_tokens"),
    ("POST", "/v1/messages%00"),
    ("POST", "/v1/m%65ssages"),
    ("POST", "/v1/files"),
    ("POST", "/api/event_logging/batch"),
    ("POST", "/v1/messages?beta=true&x=1"),
    ("POST", "/v1/messages?beta=true#frag"),
    ("POST", f"http://{HOST}:8080/v1/messages"),
    ("POST", "http://evil.test/v1/messages"),
    ("GET", "/v1/messages"),
    ("GET", "/v1/models"),
    ("PUT", "/v1/messages"),
    ("DELETE", "/v1/files/file_abc"),
    ("OPTIONS", "*"),
    ("CONNECT", f"{HOST}:8080"),
    ("TRACE", "/v1/messages"),
]


def test_only_the_model_call_paths_as_sent_reach_the_model(
    docker_client: Any, images: dict[str, str]
) -> None:
    with open_port(docker_client, images) as port:
        replies = port.send_each([request(method=m, target=t) for m, t in REFUSED_TARGETS])
        for target, reply in zip(REFUSED_TARGETS, replies, strict=True):
            assert reply.statuses and reply.statuses[0] in (400, 403, 405), (target, reply.text)
        assert port.records() == []
        reasons = _reasons(port, len(REFUSED_TARGETS) - 3)
        # Each refusal is in the log; what nginx refused before the policy ran (a
        # malformed request line) says not-model-call too.
        assert len(reasons) >= len(REFUSED_TARGETS) - 3, reasons
        assert set(reasons) == {"not-model-call"}, reasons
        # The same port still passes a model call.
        assert port.send(request()).statuses == [200]
        assert len(port.records()) == 1


def _call(**changes: Any) -> dict[str, Any]:
    return {**CALL, **changes}


def _user(*blocks: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"role": "user", "content": list(blocks)}]


URL_IMAGE = {"type": "image", "source": {"type": "url", "url": "https://evil.test/x.png"}}
FILE_DOC = {"type": "document", "source": {"type": "file", "file_id": "file_011abc"}}
REFUSED_BODIES: list[tuple[str, bytes, dict[str, str], str]] = [
    (
        "web_fetch",
        json.dumps(_call(tools=[*TOOLS, {"type": "web_fetch_20250910", "name": "f"}])).encode(),
        {},
        "server-tool",
    ),
    (
        "web_search",
        json.dumps(_call(tools=[{"type": "web_search_20250305", "name": "s"}])).encode(),
        {},
        "server-tool",
    ),
    (
        "code_execution",
        json.dumps(_call(tools=[{"type": "code_execution_20250825", "name": "c"}])).encode(),
        {},
        "server-tool",
    ),
    (
        "a tool type nobody knows",
        json.dumps(_call(tools=[{"type": "teleport_20270101", "name": "t"}])).encode(),
        {},
        "server-tool",
    ),
    (
        "mcp_servers",
        json.dumps(
            _call(mcp_servers=[{"type": "url", "url": "https://mcp.evil.test/sse", "name": "m"}])
        ).encode(),
        {},
        "mcp",
    ),
    (
        "mcp_toolset",
        json.dumps(_call(tools=[{"type": "mcp_toolset", "mcp_server_name": "m"}])).encode(),
        {},
        "mcp",
    ),
    ("an image by URL", json.dumps(_call(messages=_user(URL_IMAGE))).encode(), {}, "url-source"),
    (
        "a document by URL inside a tool result",
        json.dumps(
            _call(
                messages=[
                    {"role": "user", "content": "go"},
                    {
                        "role": "assistant",
                        "content": [{"type": "tool_use", "id": "t1", "name": "Write", "input": {}}],
                    },
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "tool_result",
                                "tool_use_id": "t1",
                                "content": [
                                    {
                                        "type": "document",
                                        "source": {"type": "url", "url": "https://evil.test/d"},
                                    }
                                ],
                            }
                        ],
                    },
                ]
            )
        ).encode(),
        {},
        "url-source",
    ),
    (
        "a file reference",
        json.dumps(_call(messages=_user(FILE_DOC))).encode(),
        {},
        "file-reference",
    ),
    (
        "a container upload",
        json.dumps(_call(messages=_user({"type": "container_upload", "file_id": "f"}))).encode(),
        {},
        "file-reference",
    ),
    ("a container", json.dumps(_call(container="cntr_01")).encode(), {}, "server-tool"),
    ("a field the policy does not know", json.dumps(_call(betas=["x"])).encode(), {}, "body"),
    (
        "tools twice (the first with web_fetch)",
        json.dumps(_call(tools=[{"type": "web_fetch_20250910", "name": "f"}]))[:-1].encode()
        + b', "tools": []}',
        {},
        "body",
    ),
    (
        "tools twice, the second escaped",
        b'{"model": "m", "max_tokens": 1, "messages": [], "tools": [{"type": '
        b'"web_search_20250305", "name": "s"}], "\\u0074ools": []}',
        {},
        "body",
    ),
    (
        "a duplicate key deep inside",
        b'{"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": '
        b'[{"type": "image", "source": {"type": "url", "type": "base64", "url": "https://e.test"}}]}]}',
        {},
        "body",
    ),
    ("NaN", b'{"model": "m", "max_tokens": 1, "messages": [], "temperature": NaN}', {}, "body"),
    ("a list", b"[]", {}, "body"),
    ("not JSON", b"model=m", {}, "body"),
    ("nested past any need", b'{"metadata": ' + b"[" * 200 + b"]" * 200 + b"}", {}, "body"),
    (
        "a gzip body",
        json.dumps(CALL).encode(),
        {"Content-Encoding": "gzip"},
        "body",
    ),
    (
        "the MCP beta",
        json.dumps(CALL).encode(),
        {"anthropic-beta": "mcp-client-2025-11-20"},
        "beta",
    ),
    (
        "the Files beta",
        json.dumps(CALL).encode(),
        {"anthropic-beta": "files-api-2025-04-14"},
        "beta",
    ),
    (
        "an unknown beta among known ones",
        json.dumps(CALL).encode(),
        {"anthropic-beta": "claude-code-20250219, web-fetch-2025-09-10 ,effort-2025-11-24"},
        "beta",
    ),
    ("an upgrade", json.dumps(CALL).encode(), {"Upgrade": "websocket"}, "upgrade"),
]


def test_nothing_a_call_asks_the_provider_to_reach_passes_unless_allowed(
    docker_client: Any, images: dict[str, str]
) -> None:
    with open_port(docker_client, images) as port:
        replies = port.send_each(
            [request(body, headers=headers) for _, body, headers, _ in REFUSED_BODIES]
        )
        for (what, *_), reply in zip(REFUSED_BODIES, replies, strict=True):
            assert reply.statuses and reply.statuses[0] in (400, 403), (what, reply.text)
            assert "kagura model-call policy" in reply.text, (what, reply.text)
        # A second anthropic-beta header is read as well as the first.
        two = b"anthropic-beta: claude-code-20250219\r\nanthropic-beta: code-execution-2025-08-25"
        raw = request(headers={"X-Pad": "1"}).replace(b"X-Pad: 1", two)
        assert port.send(raw).statuses == [403]
        assert port.records() == []
        assert _reasons(port, len(REFUSED_BODIES) + 1) == [
            reason for *_, reason in REFUSED_BODIES
        ] + ["beta"]


def test_what_a_policy_allows_passes_and_nothing_more(
    docker_client: Any, images: dict[str, str]
) -> None:
    policy = {
        "server_tools": ["web_search"],
        "mcp_servers": ["mcp.example.test"],
        "url_sources": False,
        "files": False,
        "betas": ["claude-code", "web-search", "mcp-client"],
        "concurrency": 4,
    }
    search = {"type": "web_search_20250305", "name": "web_search"}
    connector = {"type": "url", "url": "https://mcp.example.test/sse", "name": "docs"}
    with open_port(docker_client, images, model_calls=policy, turns=10) as port:
        allowed = _call(tools=[*TOOLS, search], mcp_servers=[connector])
        beta = {"anthropic-beta": "web-search-2025-03-05,mcp-client-2025-04-04"}
        assert port.send(request(allowed, headers=beta)).statuses == [200]
        fetch = _call(tools=[{"type": "web_fetch_20250910", "name": "f"}])
        other = _call(mcp_servers=[{**connector, "url": "https://mcp.evil.test/sse"}])
        for body in (fetch, other, _call(messages=_user(URL_IMAGE))):
            assert port.send(request(body)).statuses == [403]
        assert len(port.records()) == 1


def test_smuggled_and_pipelined_requests_are_each_checked(
    docker_client: Any, images: dict[str, str]
) -> None:
    bad = json.dumps(_call(tools=[{"type": "web_fetch_20250910", "name": "f"}])).encode()
    with open_port(docker_client, images) as port:
        # Content-Length and Transfer-Encoding at once, a request hidden in the body.
        hidden = request(bad)
        chunked = b"0\r\n\r\n" + hidden
        smuggle = (
            f"POST /v1/messages HTTP/1.1\r\nHost: {HOST}\r\nContent-Length: {len(chunked)}\r\n"
            "Transfer-Encoding: chunked\r\n\r\n"
        ).encode() + chunked
        assert port.send(smuggle).statuses[0] == 400
        # Two Content-Lengths that disagree.
        body = json.dumps(CALL).encode()
        twice = request(body).replace(
            b"Content-Length:", b"Content-Length: 5\r\nContent-Length:", 1
        )
        assert port.send(twice).statuses[0] == 400
        # A chunked body is read whole and checked like any other.
        pieces = (
            b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in (bad[:10], bad[10:])) + b"0\r\n\r\n"
        )
        chunky = (
            f"POST /v1/messages HTTP/1.1\r\nHost: {HOST}\r\nTransfer-Encoding: chunked\r\n"
            "Connection: close\r\n\r\n"
        ).encode() + pieces
        assert port.send(chunky).statuses == [403]
        # Pipelined on one connection: the good one passes, the one behind it does not.
        pipelined = request(close=False) + request(bad)
        assert port.send(pipelined).statuses == [200, 403]
        # A Host of the agent's choosing goes nowhere: the upstream is the operator's.
        assert port.send(request(headers={"X-Forwarded-Host": "evil.test"})).statuses == [200]
        records = port.records()
        assert len(records) == 2 and {r["headers"]["host"] for r in records} == {HOST}
        assert all("x-forwarded-host" not in r["headers"] for r in records)


ECHO = """
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        key = self.headers.get("x-api-key", "")
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("x-api-key", key)
        self.send_header("x-echo", "key=" + key)
        self.send_header("Set-Cookie", "k=" + key)
        self.end_headers()
        half = len(key) // 2
        for piece in ("event: a\\ndata: " + key + "\\n\\n", "data: " + key[:half], key[half:] + "\\n\\n",
                      "data: " + key[:3], "xyz\\n\\n", "data: " + key[:-1]):
            data = piece.encode()
            self.wfile.write(b"%x\\r\\n%s\\r\\n" % (len(data), data)); self.wfile.flush()
            import time; time.sleep(0.05)
        self.wfile.write(b"0\\r\\n\\r\\n"); self.wfile.flush()
    def log_message(self, *args): pass
print("ready", flush=True)
http.server.ThreadingHTTPServer(("", 8080), H).serve_forever()
"""


@dataclass(frozen=True)
class Echo:
    container: Any
    network: str
    address: str
    port: int = 8080

    def records(self) -> list[dict[str, Any]]:
        return []


@contextlib.contextmanager
def echo_upstream(client: Any, image: str) -> Iterator[Echo]:
    network = client.networks.create(f"kagura-test-echo-{time.monotonic_ns()}", labels=TEST_LABEL)
    container = None
    try:
        container = client.containers.run(
            image, ["python3", "-c", ECHO], detach=True, labels=TEST_LABEL, network=network.name
        )
        container.reload()
        address = container.attrs["NetworkSettings"]["Networks"][network.name]["IPAddress"]
        deadline = time.monotonic() + 15
        while "ready" not in container.logs().decode():
            assert time.monotonic() < deadline, container.logs()
            time.sleep(0.05)
        yield Echo(container, network.name, address)
    finally:
        if container is not None:
            container.remove(force=True)
        network.remove()


def test_an_upstream_that_echoes_the_key_hands_it_to_nobody(
    docker_client: Any, images: dict[str, str]
) -> None:
    with (
        echo_upstream(docker_client, images["base"]) as echo,
        open_port(docker_client, images, upstream=echo) as port,
    ):
        reply = port.send(request())
        assert reply.statuses == [200], reply.text
        # The key went upstream (the echo shows where it was) but never came back whole,
        # in a header, in one chunk or split across two; a prefix that never completes
        # the key is passed on at the end.
        body = reply.body
        assert CANARY not in reply.text and CANARY not in body
        assert "x-echo" not in reply.text.lower() and "set-cookie" not in reply.text.lower()
        assert body.count("(redacted by kagura)") == 2, body
        assert "data: " + CANARY[:3] + "xyz" in body
        assert body.endswith("data: " + CANARY[:-1])


def test_a_stream_is_passed_on_as_it_comes(docker_client: Any, images: dict[str, str]) -> None:
    slow = {"default": {"text": "x" * 240, "delay": 0.25}}
    with open_port(docker_client, images, script=slow) as port:
        reply = port.send(request(), wait=10)
        assert reply.statuses == [200] and "message_stop" in reply.text
        assert reply.first_byte is not None
        # ~14 events 0.25 s apart: the first bytes came long before the end.
        assert reply.total > 2.5 and reply.first_byte < 1.0, (reply.first_byte, reply.total)


PARALLEL = """
import json, socket, sys, threading
body = json.dumps(json.loads(sys.argv[1])).encode()
head = ("POST /v1/messages HTTP/1.1\\r\\nHost: h\\r\\nConnection: close\\r\\nContent-Length: %d\\r\\n\\r\\n"
        % len(body)).encode()
statuses = []
def one():
    s = socket.create_connection(("127.0.0.1", 3129)); s.sendall(head + body)
    first = s.recv(64).split(b" ")[1].decode(); statuses.append(first)
    while s.recv(65536): pass
threads = [threading.Thread(target=one) for _ in range(int(sys.argv[2]))]
[t.start() for t in threads]; [t.join() for t in threads]
print(json.dumps(sorted(statuses)))
"""


def _parallel(port: Port, body: dict[str, Any], n: int) -> list[str]:
    out = port.agent.exec_run(["python3", "-c", PARALLEL, json.dumps(body), str(n)]).output
    statuses: list[str] = json.loads(out)
    return statuses


def test_no_more_calls_reach_the_model_than_the_budget_allows(
    docker_client: Any, images: dict[str, str]
) -> None:
    with open_port(docker_client, images, turns=3) as port:
        # 24 turn calls at once on a 3-turn budget: exactly 3 reach the model.
        statuses = _parallel(port, CALL, 24)
        turns = [r for r in port.records() if r["body"].get("tools")]
        assert len(turns) == 3 and statuses.count("200") == 3, statuses
        assert set(statuses) <= {"200", "403", "429"}
        # Side calls (no tools) are counted apart: as many as turns, no more.
        side = {**CALL, "tools": [], "stream": False}
        assert [port.send(request(side)).statuses[0] for _ in range(4)] == [200, 200, 200, 403]
        # The turn budget extended mid-run: the cap follows it, the count so far stays.
        port.session.limit_model_calls(5)
        assert [port.send(request()).statuses[0] for _ in range(3)] == [200, 200, 403]
        assert len([r for r in port.records() if r["body"].get("tools")]) == 5
        # The host's count, from the same log, agrees: 5 turns, 3 side calls.
        calls = ModelCalls()
        for event in port.decisions():
            calls.feed(event)
        assert (calls.count, calls.of("side")) == (5, 3)
        assert "budget" in _reasons(port)


def test_a_model_call_policy_granted_mid_run_is_in_force_before_it_is_said_to_be(
    docker_client: Any, images: dict[str, str]
) -> None:
    """A mid-run grant (an amended plan's egress, EgressSession.reload) reaches the
    injecting port too, not only squid: once reload returns, what it allows passes; the
    calls counted before it stay counted."""
    search = {"type": "web_search_20250305", "name": "web_search"}
    beta = {"anthropic-beta": "web-search-2025-03-05"}
    asked = request(_call(tools=[*TOOLS, search]), headers=beta)
    with open_port(docker_client, images, turns=3) as port:
        assert port.send(asked).statuses == [403]
        assert port.send(request()).statuses == [200]
        granted = {
            "mode": "proxy",
            "allow": [{"host": "allowed.test", "port": 8443}],
            "model_calls": {
                "server_tools": ["web_search"],
                "mcp_servers": [],
                "url_sources": False,
                "files": False,
                "betas": [*LOCAL_BETAS, "web-search"],
                "concurrency": 2,
            },
        }
        port.session.reload(granted)
        assert port.send(asked).statuses == [200]
        assert port.send(request()).statuses == [200]
        # Three turn calls on a 3-turn budget, across the reload: the fourth is refused.
        assert port.send(request()).statuses == [403]
        assert len([r for r in port.records() if r["body"].get("tools")]) == 3
        assert _reasons(port).count("budget") == 1


def test_no_more_calls_are_under_way_at_once_than_the_cap(
    docker_client: Any, images: dict[str, str]
) -> None:
    hang = {"default": {"text": "x", "hang": True}}
    policy = {
        "server_tools": [],
        "mcp_servers": [],
        "url_sources": False,
        "files": False,
        "betas": ["claude-code"],
        "concurrency": 2,
    }
    with open_port(docker_client, images, turns=50, script=hang, model_calls=policy) as port:
        # Two streams held open by the upstream (each ends when its client gives up).
        held = [
            port.agent.exec_run(
                ["python3", "-c", RAW, base64.b64encode(request()).decode(), "8"], detach=True
            )
            for _ in range(2)
        ]
        assert held
        deadline = time.monotonic() + 5
        while len(port.records()) < 2:
            assert time.monotonic() < deadline, port.records()
            time.sleep(0.1)
        reply = port.send(request(), wait=3)
        assert reply.statuses == [429] and "retry-after: 1" in reply.text.lower(), reply.text
        assert len(port.records()) == 2
        assert "concurrency" in _reasons(port)


DOC = Path(__file__).resolve().parents[1] / "docs" / "egress.md"
DOC_ROW = re.compile(
    r"^\| `(?P<method>[A-Z]+) (?P<target>\S+)`(?: with (?P<header>header )?`(?P<extra>[^`]+)`)?"
    r" \| (?P<status>\d+) \| `(?P<reason>[a-z-]+)` \|$",
    re.M,
)


def _documented() -> list[tuple[bytes, int, str]]:
    """docs/egress.md's table of refusals, as requests."""
    rows = []
    for row in DOC_ROW.finditer(DOC.read_text(encoding="utf-8")):
        headers, body = {}, dict(CALL)
        if row["extra"] and row["header"]:
            name, _, value = row["extra"].partition(": ")
            headers[name] = value
        elif row["extra"]:
            body |= json.loads(row["extra"])
        raw = request(body, method=row["method"], target=row["target"], headers=headers)
        rows.append((raw, int(row["status"]), row["reason"]))
    return rows


def test_the_documented_refusals_hold(docker_client: Any, images: dict[str, str]) -> None:
    rows = _documented()
    assert len(rows) >= 10
    with open_port(docker_client, images) as port:
        replies = port.send_each([raw for raw, _, _ in rows])
        assert [r.statuses[0] for r in replies] == [status for _, status, _ in rows]
        assert _reasons(port, len(rows)) == [reason for _, _, reason in rows]
        assert port.records() == []


def test_files_pass_only_where_a_policy_allows_them(
    docker_client: Any, images: dict[str, str]
) -> None:
    policy = {
        "server_tools": [],
        "mcp_servers": [],
        "url_sources": False,
        "files": True,
        "betas": ["claude-code", "files-api"],
        "concurrency": 4,
    }
    beta = {"anthropic-beta": "files-api-2025-04-14"}
    with open_port(docker_client, images, model_calls=policy) as port:
        passed = [
            request(method="GET", target="/v1/files", headers=beta),
            request(method="GET", target="/v1/files/file_011abc/content", headers=beta),
            request(method="DELETE", target="/v1/files/file_011abc", headers=beta),
            request(_call(messages=_user(FILE_DOC)), headers=beta),
        ]
        refused = [
            request(method="GET", target="/v1/files/../messages/batches", headers=beta),
            request(method="PUT", target="/v1/files/file_011abc", headers=beta),
            request(method="POST", target="/v1/messages/batches", headers=beta),
            request(_call(messages=_user(URL_IMAGE)), headers=beta),
        ]
        replies = port.send_each(passed + refused)
        # The fake answers the Files API with 404: what matters is that it got them.
        assert [r.statuses[0] for r in replies[4:]] == [403, 403, 403, 403]
        paths = [r["path"] for r in port.records()]
        assert paths == [
            "/v1/files",
            "/v1/files/file_011abc/content",
            "/v1/files/file_011abc",
            "/v1/messages?beta=true",
        ]
