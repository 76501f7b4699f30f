"""Memory tools for shell steps inside the container (stdlib only).

    python3 -m kagura_agent.brain.memtool recall "query" [--limit N]
    python3 -m kagura_agent.brain.memtool remember "text" [--tag T ...]
    python3 -m kagura_agent.brain.memtool get ID
    python3 -m kagura_agent.brain.memtool explore ID [--limit N]
    python3 -m kagura_agent.brain.memtool link SOURCE TARGET [--type related_to|derived_from]
    python3 -m kagura_agent.brain.memtool dispatch PROMPT [--name N] [--egress POLICY ...]
        [--context ID ...] [--note TEXT ...] [--workdir DIR] [--verify CMD ...]
        [--step CMD ...]

Talks to the entrypoint's Unix socket (``KAGURA_MEMORY_SOCKET``), which forwards the
request to the host. Prints the JSON result; exits 1 when the host refused. ``dispatch``
runs a sub-agent (brain/dispatch_tool.py) and waits for it: exit 0 only when the child
succeeded (its result, or the reason it was refused, is printed either way).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys


def _parse(argv: list[str]) -> dict[str, object]:
    parser = argparse.ArgumentParser(prog="memtool")
    sub = parser.add_subparsers(dest="op", required=True)
    recall = sub.add_parser("recall")
    recall.add_argument("query")
    recall.add_argument("--limit", type=int, default=5)
    remember = sub.add_parser("remember")
    remember.add_argument("text")
    remember.add_argument("--tag", action="append", default=[], dest="tags")
    get = sub.add_parser("get")
    get.add_argument("id")
    explore = sub.add_parser("explore")
    explore.add_argument("id")
    explore.add_argument("--limit", type=int, default=10)
    link = sub.add_parser("link")
    link.add_argument("source")
    link.add_argument("target")
    link.add_argument("--type", default="related_to", dest="edge_type")
    dispatch = sub.add_parser("dispatch")
    dispatch.add_argument("prompt")
    dispatch.add_argument("--name")
    dispatch.add_argument("--egress", action="append")
    dispatch.add_argument("--context", action="append", default=[])
    dispatch.add_argument("--note", action="append", default=[], dest="notes")
    dispatch.add_argument("--workdir")
    dispatch.add_argument("--verify", action="append", default=[])
    dispatch.add_argument("--step", action="append", dest="steps")
    parsed = vars(parser.parse_args(argv))
    if parsed["op"] == "dispatch":
        child = {k: v for k, v in parsed.items() if k != "op" and v is not None}
        return {"op": "dispatch", "child": child}
    return parsed


def main(argv: list[str] | None = None) -> int:
    """Send one request and print the result."""
    request = _parse(sys.argv[1:] if argv is None else argv)
    path = os.environ.get("KAGURA_MEMORY_SOCKET")
    if not path:
        print("memtool: KAGURA_MEMORY_SOCKET is not set (not inside a brain turn)", file=sys.stderr)
        return 2
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(path)
        sock.sendall((json.dumps(request) + "\n").encode())
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    reply = json.loads(data)
    if not reply.get("ok"):
        print(f"memtool: {reply.get('error')}", file=sys.stderr)
        return 1
    result = reply.get("result")
    print(json.dumps(result))
    if request["op"] == "dispatch" and isinstance(result, dict):
        return 0 if result.get("outcome") == "success" else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
