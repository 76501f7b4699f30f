#!/usr/bin/env python3
"""A small MCP tool server for tests, built on the ``mcp`` package (a real server).

    python3 fake_mcp.py stdio                 # MCP over stdin/stdout
    python3 fake_mcp.py http --port 8000      # MCP streamable HTTP at /mcp on 0.0.0.0

Tools: ``echo(text)`` answers ``<transport> echo from <hostname>: <text>`` (the hostname
says which container served the call) and ``add(a, b)``. Each call prints one JSON line
``{"called": TOOL, "arguments": {...}}`` on stderr, so a test reads it from the server's
container log (http) or the agent's stderr (stdio).
"""

from __future__ import annotations

import argparse
import json
import socket
import sys

from mcp.server.mcpserver import MCPServer


def build(transport: str) -> MCPServer:
    server: MCPServer = MCPServer("fake-mcp")

    def logged(tool: str, arguments: dict[str, object]) -> None:
        print(json.dumps({"called": tool, "arguments": arguments}), file=sys.stderr, flush=True)

    @server.tool(description="Echo the text back, saying where it was served")
    def echo(text: str) -> str:
        logged("echo", {"text": text})
        return f"{transport} echo from {socket.gethostname()}: {text}"

    @server.tool(description="Add two integers")
    def add(a: int, b: int) -> str:
        logged("add", {"a": a, "b": b})
        return str(a + b)

    return server


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("transport", choices=["stdio", "http"])
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args(argv)
    server = build(args.transport)
    if args.transport == "stdio":
        server.run("stdio")
    else:
        print(f"fake-mcp listening on {args.host}:{args.port}", file=sys.stderr, flush=True)
        server.run("streamable-http", host=args.host, port=args.port, json_response=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
