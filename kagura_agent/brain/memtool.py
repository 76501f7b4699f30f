"""Memory tools for shell steps inside the container (stdlib only).

    python3 -m kagura_agent.brain.memtool recall "query" [--limit N]
    python3 -m kagura_agent.brain.memtool remember "text" [--tag T ...]
    python3 -m kagura_agent.brain.memtool get ID
    python3 -m kagura_agent.brain.memtool explore ID [--limit N]
    python3 -m kagura_agent.brain.memtool link SOURCE TARGET [--type related_to|derived_from]

Talks to the entrypoint's Unix socket (``KAGURA_MEMORY_SOCKET``), which forwards the
request to the host. Prints the JSON result; exits 1 when the host refused.
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
    return vars(parser.parse_args(argv))


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
    print(json.dumps(reply.get("result")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
