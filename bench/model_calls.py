"""Model calls through the key-injecting port vs directly to the same fake Messages API.

    python bench/model_calls.py [--calls 400] [--slow 20]

A fake of the Messages API (testing/fake_messages_api.py) runs in a container on its own
network. One client container reaches it both ways: directly on that network, and the
product's way, as a run's agent does: the in-container forwarder, the socket volume,
socat and nginx with the model-call policy (an ``EgressSession`` with the key injected).
Both send the same request, the size of one the Claude Code CLI sends (12 tools, a
system prompt and a short conversation: ~48 KiB), streamed back as SSE, on one
kept-alive connection each; the paths alternate call by call, so load from other
processes hits both alike.

- ``proxy_added_p50_ms`` / ``proxy_added_p99_ms``: each proxied call (request sent to
  the end of the stream) is paired with a direct one made right after it by the same
  client; the median and 99th percentile of the difference. Target: p99 at most 5 ms.
- ``ttfb_ratio``: with a slow stream (it starts after 200 ms, then events 50 ms apart,
  ~0.7 s in all), the median time to the first streamed byte proxied / direct. A port
  that buffered the stream would show ~3.5 here; one that passes it on shows ~1.

Prints the figures, then:

    RESULT model_calls proxy_added_p50_ms=<ms> proxy_added_p99_ms=<ms> ttfb_ratio=<x> n=<calls>
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kagura_agent.membrane.egress.modelport import Injection
from kagura_agent.membrane.egress.session import EgressRequest, EgressSession
from testing.egress_images import ensure_egress_images, start_forwarder
from testing.fake_messages_api import fake_messages_api_container

LABEL = {"dev.kagura.bench": "model_calls"}
HOST = "api.anthropic.test"
KEY = "sk-ant-bench-" + "b" * 40
SLOW_DELAY = 0.05
SLOW_STALL = 0.2  # the model "thinks" before its answer starts, as the real one does
# The client: ``n`` calls on one kept-alive connection; prints one line per call:
# seconds to the first body byte, seconds to the end of the stream.
CLIENT = r"""
import base64, socket, sys, time
n, host, direct_host, direct_port = int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
body = base64.b64decode(sys.argv[5])
def connect(address, port):
    s = socket.create_connection((address, port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    head = ("POST /v1/messages?beta=true HTTP/1.1\r\nHost: %s\r\ncontent-type: application/json\r\n"
            "anthropic-version: 2023-06-01\r\nanthropic-beta: claude-code-20250219\r\n"
            "x-api-key: placeholder\r\nContent-Length: %d\r\n\r\n" % (host, len(body))).encode()
    return s, head + body
def call(s, request):
    start = time.perf_counter(); s.sendall(request); buf = b""; first = None
    while True:
        chunk = s.recv(65536)
        if not chunk:
            raise SystemExit("connection closed")
        buf += chunk
        if first is None:
            end = buf.find(b"\r\n\r\n")
            if end >= 0 and len(buf) > end + 4:
                first = time.perf_counter() - start
        if buf.endswith(b"\r\n0\r\n\r\n"):
            break
    if b" 200 " not in buf[:16]:
        raise SystemExit(buf[:300].decode(errors="replace"))
    return first, time.perf_counter() - start
proxied, direct = connect("127.0.0.1", 3129), connect(direct_host, direct_port)
for _ in range(n):
    # Each proxied call is paired with a direct one right after it, on the same client.
    (pf, pt), (df, dt) = call(*proxied), call(*direct)
    print(pf, pt, df, dt, flush=True)
"""


def request_body(text: str) -> bytes:
    """A request the size and shape of one the Claude Code CLI sends mid-session."""
    schema = {
        "type": "object",
        "properties": {f"arg{i}": {"type": "string", "description": "x" * 120} for i in range(8)},
        "required": ["arg0"],
    }
    tools = [
        {"name": f"Tool{i}", "description": "d" * 1500, "input_schema": schema} for i in range(12)
    ]
    messages: list[dict[str, Any]] = [{"role": "user", "content": f"BENCH {text}"}]
    for i in range(6):
        messages.append(
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": f"t{i}", "name": "Tool1", "input": {}}],
            }
        )
        messages.append(
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": f"t{i}", "content": "r" * 800}],
            }
        )
    body = {
        "model": "claude-sonnet-4-5",
        "max_tokens": 1024,
        "stream": True,
        "system": [{"type": "text", "text": "s" * 8000}],
        "tools": tools,
        "messages": messages,
    }
    return json.dumps(body).encode()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@contextlib.contextmanager
def world(client: Any) -> Iterator[tuple[Any, Any]]:
    """The fake, and a client that reaches it both ways: directly on the fake's network,
    and through a run's key-injecting port by the agent's own path (the forwarder on the
    socket volume, socat and nginx in the proxy)."""
    refs = ensure_egress_images(client)
    # Past the last scripted turn every call gets ``then``: a fast stream, or (BENCH slow)
    # one that starts after 200 ms and whose events come 50 ms apart.
    script = {
        "conversations": [
            {
                "match": "BENCH slow",
                "turns": [],
                "then": {"text": "y" * 240, "stall": SLOW_STALL, "delay": SLOW_DELAY},
            }
        ],
        "default": {"text": "x" * 240},
    }
    with contextlib.ExitStack() as stack:
        fake = stack.enter_context(fake_messages_api_container(client, refs["base"], LABEL, script))
        request = EgressRequest(
            {"egress": {"mode": "proxy", "allow": []}, "budget": {"turns": None}},
            f"bench-model-calls-{time.monotonic_ns()}",
            injection=Injection(host=HOST, port=fake.port, tls=False),
            injection_secret=KEY,
            extra_hosts={HOST: fake.address},
            extra_networks=(fake.network,),
        )
        session = EgressSession.start(client, request)
        stack.callback(session.close)
        net = session.agent_network_config()
        # Unlike a run's agent it also has a network (the fake's), for the direct calls;
        # its proxied calls take exactly the agent's way.
        agent = client.containers.create(
            refs["base"],
            ["sleep", "3600"],
            labels=LABEL,
            user="1000:1000",
            cap_drop=["ALL"],
            read_only=True,
            tmpfs={"/tmp": "rw,size=16m"},
            network=fake.network,
            mounts=net.mounts(),
        )
        stack.callback(agent.remove, force=True)
        agent.start()
        start_forwarder(agent, net)
        yield fake, agent


def run_calls(agent: Any, fake: Any, n: int, body: bytes) -> list[list[float]]:
    """``n`` pairs: (proxied first byte, proxied total, direct first byte, direct total)."""
    encoded = base64.b64encode(body).decode()
    command = ["python3", "-c", CLIENT, str(n), HOST, fake.address, str(fake.port), encoded]
    result = agent.exec_run(command)
    if result.exit_code != 0:
        raise SystemExit(f"client failed: {result.output.decode(errors='replace')[-500:]}")
    return [[float(x) for x in line.split()] for line in result.output.decode().splitlines()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    quick = os.environ.get("KAGURA_BENCH_QUICK") == "1"  # CI: once, small (tests/test_benches.py)
    parser.add_argument(
        "--calls", type=int, default=20 if quick else 400, help="fast calls on each path"
    )
    parser.add_argument(
        "--slow", type=int, default=2 if quick else 20, help="slow-stream calls on each path"
    )
    args = parser.parse_args()
    client = docker.from_env()
    fast, slow = request_body("fast"), request_body("slow")
    with world(client) as (fake, agent):
        run_calls(agent, fake, 10, fast)  # warm both paths
        pairs = run_calls(agent, fake, args.calls, fast)
        slow_pairs = run_calls(agent, fake, args.slow, slow)
    proxied = [p[1] * 1000 for p in pairs]
    direct = [p[3] * 1000 for p in pairs]
    added = [p - d for p, d in zip(proxied, direct, strict=True)]
    ttfb = {
        "proxied": statistics.median(p[0] * 1000 for p in slow_pairs),
        "direct": statistics.median(p[2] * 1000 for p in slow_pairs),
    }
    stream_ms = (SLOW_STALL + SLOW_DELAY * 10) * 1000
    print(f"request body {len(fast) // 1024} KiB, {args.calls} calls a path, each proxied call")
    print("paired with a direct one right after it on the same client")
    for name, values in (("direct", direct), ("proxied", proxied)):
        print(
            f"  {name:8} call p50 {statistics.median(values):7.2f} ms"
            f"  p99 {percentile(values, 0.99):7.2f} ms"
            f"  first byte of a slow stream (~{stream_ms:.0f} ms long) {ttfb[name]:7.2f} ms"
        )
    print(
        f"  added    call p50 {statistics.median(added):7.2f} ms"
        f"  p99 {percentile(added, 0.99):7.2f} ms (per pair)"
    )
    ratio = ttfb["proxied"] / ttfb["direct"]
    print(
        f"RESULT model_calls proxy_added_p50_ms={statistics.median(added):.2f}"
        f" proxy_added_p99_ms={percentile(added, 0.99):.2f} ttfb_ratio={ratio:.2f} n={args.calls}"
    )


if __name__ == "__main__":
    main()
