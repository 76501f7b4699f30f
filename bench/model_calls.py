"""Model calls through the key-injecting port vs directly to the same fake Messages API.

    python bench/model_calls.py [--calls 400] [--slow 20]

A fake of the Messages API (testing/fake_messages_api.py) runs in a container on its own
network. The direct client is a container on that network; the proxied client has no
network, like a run's agent, and goes the product's way: the in-container forwarder, the
socket volume, socat and nginx with the model-call policy (an ``EgressSession`` with the
key injected). Both send the same request, the size of one the Claude Code CLI sends
(12 tools, a system prompt and a short conversation: ~40 KB), streamed back as SSE, on
one kept-alive connection each; the two paths alternate in batches, so load from other
processes hits both alike.

- ``proxy_added_p50_ms`` / ``proxy_added_p99_ms``: the proxied path's median and 99th
  percentile of a whole call (request sent to the end of the stream) minus the direct
  path's. Target: p99 at most 5 ms.
- ``ttfb_ratio``: with a slow stream (events 50 ms apart), the median time to the first
  streamed byte proxied / direct. A port that buffered the stream would show ~the whole
  stream's time here; one that passes it on shows ~1.

Prints the figures, then:

    RESULT model_calls proxy_added_p50_ms=<ms> proxy_added_p99_ms=<ms> ttfb_ratio=<x> n=<calls>
"""

from __future__ import annotations

import argparse
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
from kagura_agent.membrane.egress.session import EgressSession
from testing.egress_images import ensure_egress_images, start_forwarder
from testing.fake_messages_api import fake_messages_api_container

LABEL = {"dev.kagura.bench": "model_calls"}
HOST = "api.anthropic.test"
KEY = "sk-ant-bench-" + "b" * 40
SLOW_DELAY = 0.05
# The client: ``n`` calls on one kept-alive connection; prints one line per call:
# seconds to the first body byte, seconds to the end of the stream.
CLIENT = r"""
import json, socket, sys, time
host, port, n, path = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
body = open(path, "rb").read() if path != "-" else sys.stdin.buffer.read()
head = ("POST /v1/messages?beta=true HTTP/1.1\r\nHost: %s\r\ncontent-type: application/json\r\n"
        "anthropic-version: 2023-06-01\r\nanthropic-beta: claude-code-20250219\r\n"
        "x-api-key: placeholder\r\nContent-Length: %d\r\n\r\n" % (host, len(body))).encode()
s = socket.create_connection((host if host != "api.anthropic.test" else "127.0.0.1", port))
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
for _ in range(n):
    start = time.perf_counter(); s.sendall(head + body); buf = b""; first = None
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
    print(first, time.perf_counter() - start, flush=True)
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
def world(client: Any) -> Iterator[tuple[Any, Any, Any]]:
    """The fake, a direct client on its network, and a proxied agent behind a real port."""
    refs = ensure_egress_images(client)
    # Past the last scripted turn every call gets ``then``: a fast stream, or (BENCH slow)
    # one whose events come 50 ms apart.
    script = {
        "conversations": [
            {"match": "BENCH slow", "turns": [], "then": {"text": "y" * 240, "delay": SLOW_DELAY}}
        ],
        "default": {"text": "x" * 240},
    }
    with contextlib.ExitStack() as stack:
        fake = stack.enter_context(fake_messages_api_container(client, refs["base"], LABEL, script))
        session = EgressSession.start(
            client,
            {"egress": {"mode": "proxy", "allow": []}, "budget": {"turns": None}},
            f"bench-model-calls-{time.monotonic_ns()}",
            injection=Injection(host=HOST, port=fake.port, tls=False),
            injection_secret=KEY,
            extra_hosts={HOST: fake.address},
            extra_networks=(fake.network,),
        )
        stack.callback(session.close)
        net = session.agent_network_config()
        agent = client.containers.create(
            refs["base"],
            ["sleep", "3600"],
            labels=LABEL,
            user="1000:1000",
            cap_drop=["ALL"],
            read_only=True,
            tmpfs={"/tmp": "rw,size=16m"},
            **net.docker_kwargs(),
        )
        stack.callback(agent.remove, force=True)
        direct = client.containers.create(
            refs["base"], ["sleep", "3600"], labels=LABEL, network=fake.network
        )
        stack.callback(direct.remove, force=True)
        agent.start()
        direct.start()
        start_forwarder(agent, net)
        yield fake, agent, direct


def _put(container: Any, name: str, data: bytes) -> None:
    """Write /tmp/NAME in a running container. Its root is read-only (/tmp a tmpfs), and
    Docker's archive API refuses any path of such a container, so the file goes in
    through sh."""
    import base64

    encoded = base64.b64encode(data).decode()
    done = container.exec_run(["sh", "-c", f'printf %s "$0" | base64 -d > /tmp/{name}', encoded])
    if done.exit_code != 0:
        raise RuntimeError(f"writing /tmp/{name}: {done.output.decode(errors='replace')}")


def run_calls(container: Any, target: tuple[str, int], n: int, body: str) -> list[list[float]]:
    command = ["python3", "-c", CLIENT, target[0], str(target[1]), str(n), f"/tmp/{body}"]
    result = container.exec_run(command)
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
    parser.add_argument("--batch", type=int, default=10 if quick else 50)
    args = parser.parse_args()
    client = docker.from_env()
    with world(client) as (fake, agent, direct):
        for container in (agent, direct):
            _put(container, "fast.json", request_body("fast"))
            _put(container, "slow.json", request_body("slow"))
        paths = {"proxied": (agent, (HOST, 3129)), "direct": (direct, (fake.address, fake.port))}
        totals: dict[str, list[float]] = {"proxied": [], "direct": []}
        firsts: dict[str, list[float]] = {"proxied": [], "direct": []}
        for container, target in paths.values():  # warm both paths
            run_calls(container, target, 10, "fast.json")
        done = 0
        while done < args.calls:
            n = min(args.batch, args.calls - done)
            for name, (container, target) in paths.items():
                totals[name] += [total for _, total in run_calls(container, target, n, "fast.json")]
            done += n
        for _ in range(args.slow):
            for name, (container, target) in paths.items():
                firsts[name] += [first for first, _ in run_calls(container, target, 1, "slow.json")]
    ms = {name: [v * 1000 for v in values] for name, values in totals.items()}
    p50 = {name: statistics.median(values) for name, values in ms.items()}
    p99 = {name: percentile(values, 0.99) for name, values in ms.items()}
    ttfb = {name: statistics.median(values) * 1000 for name, values in firsts.items()}
    stream_ms = SLOW_DELAY * 1000 * 10
    print(f"request body {len(request_body('fast')) // 1024} KiB, {args.calls} calls a path")
    for name in ("direct", "proxied"):
        print(
            f"  {name:8} call p50 {p50[name]:7.2f} ms  p99 {p99[name]:7.2f} ms"
            f"  first byte of a slow stream (~{stream_ms:.0f} ms long) {ttfb[name]:7.2f} ms"
        )
    added50 = p50["proxied"] - p50["direct"]
    added99 = p99["proxied"] - p99["direct"]
    ratio = ttfb["proxied"] / ttfb["direct"]
    print(
        f"RESULT model_calls proxy_added_p50_ms={added50:.2f} proxy_added_p99_ms={added99:.2f}"
        f" ttfb_ratio={ratio:.2f} n={args.calls}"
    )


if __name__ == "__main__":
    main()
