"""A local fake of Kagura Memory Cloud's MCP-over-HTTP endpoint, on 127.0.0.1 only.

It speaks what the ``kagura-memory`` client sends: JSON-RPC 2.0 ``initialize`` (answered
with an ``mcp-session-id`` header) and ``tools/call`` on ``POST /mcp``, tool results as
``{"content": [{"type": "text", "text": "<json>"}]}`` and domain errors as
``{"status": "error", "error": <code>, "message": …}``; plus the REST
``GET /api/v1/memory/list``. Every request needs ``Authorization: Bearer <token>``
(401 otherwise). Search is a plain word match — enough to exercise the adapter.

    with FakeMemoryCloud(token="t", contexts={"ctx"}) as cloud:
        cloud.mcp_url  # http://127.0.0.1:<port>/mcp
"""

from __future__ import annotations

import json
import re
import threading
import uuid
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

VALID_EDGE_TYPES = {
    "neural_association",
    "related_to",
    "depends_on",
    "learned_from",
    "semantic_similarity",
    "declared_link",
    "tag_cooccurrence",
}


def _now() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def _error(code: str, message: str) -> dict[str, Any]:
    return {"status": "error", "error": code, "message": message}


class FakeMemoryCloud:
    """The fake server; state is plain dicts guarded by one lock."""

    def __init__(self, token: str = "test-token", contexts: set[str] | None = None) -> None:
        self.token = token
        self.contexts = set(contexts or {"kagura-agent"})
        self.memories: dict[str, dict[str, Any]] = {}
        self.edges: dict[tuple[str, str], dict[str, Any]] = {}
        self.sessions: set[str] = set()
        self.calls: list[str] = []
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def mcp_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/mcp"

    def __enter__(self) -> FakeMemoryCloud:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    # -- tools -----------------------------------------------------------------

    def call_tool(self, name: str, args: dict[str, Any]) -> dict[str, Any]:
        self.calls.append(name)
        if args.get("context_id") not in self.contexts:
            return _error("context_not_found", f"context {args.get('context_id')} not found")
        handler = getattr(self, f"tool_{name}", None)
        if handler is None:
            return _error("unknown_tool", name)
        with self.lock:
            result: dict[str, Any] = handler(args)
            return result

    def tool_get_context_info(self, args: dict[str, Any]) -> dict[str, Any]:
        cid = args["context_id"]
        count = sum(1 for m in self.memories.values() if m["context_id"] == cid)
        return {
            "status": "success",
            "context": {"id": cid, "name": cid},
            "stats": {"total_memories": count},
        }

    def tool_remember(self, args: dict[str, Any]) -> dict[str, Any]:
        if not 10 <= len(args.get("summary", "")) <= 500:
            return _error("validation_error", "summary must be 10-500 characters")
        memory_id = str(uuid.uuid4())
        now = _now()
        self.memories[memory_id] = {
            "id": memory_id,
            "context_id": args["context_id"],
            "summary": args["summary"],
            "content": args.get("content", ""),
            "type": args.get("type", "note"),
            "tags": list(args.get("tags", [])),
            "details": args.get("details") or {},
            "importance": args.get("importance", 0.5),
            "created_at": now,
            "updated_at": now,
        }
        return {"status": "success", "memory_id": memory_id, "scope": "working"}

    def tool_recall(self, args: dict[str, Any]) -> dict[str, Any]:
        words = set(re.findall(r"\w+", args["query"].lower()))
        filters = args.get("filters") or {}
        hits = []
        for memory in self.memories.values():
            if memory["context_id"] != args["context_id"]:
                continue
            if "type" in filters and memory["type"] != filters["type"]:
                continue
            wanted = set(filters.get("tags", []))
            have = set(memory["tags"])
            match_all = filters.get("tags_match", "any") == "all"
            if wanted and not (wanted <= have if match_all else wanted & have):
                continue
            text = " ".join([memory["summary"], memory["content"], *memory["tags"]]).lower()
            score = len(words & set(re.findall(r"\w+", text)))
            hits.append((score, memory["created_at"], memory))
        hits.sort(key=lambda h: (h[0], h[1]), reverse=True)
        results = [
            {"memory_id": m["id"], "summary": m["summary"], "type": m["type"], "score": s}
            for s, _, m in hits[: args.get("k", 5)]
        ]
        return {"status": "success", "results": results, "count": len(results)}

    def tool_reference(self, args: dict[str, Any]) -> dict[str, Any]:
        memory = self.memories.get(args["memory_id"])
        if memory is None or memory["context_id"] != args["context_id"]:
            return _error("memory_not_found", f"memory {args['memory_id']} not found")
        return {"status": "success", "memory": dict(memory)}

    def tool_forget(self, args: dict[str, Any]) -> dict[str, Any]:
        memory_id = args.get("memory_id")
        if memory_id not in self.memories:
            return {"status": "success", "deleted_count": 0, "memory_ids": []}
        del self.memories[memory_id]
        for key in [k for k in self.edges if memory_id in k]:
            del self.edges[key]
        return {"status": "success", "deleted_count": 1, "memory_ids": [memory_id]}

    def tool_create_edge(self, args: dict[str, Any]) -> dict[str, Any]:
        src, dst = args["source_id"], args["target_id"]
        if args["edge_type"] not in VALID_EDGE_TYPES:
            return _error("validation_error", f"invalid edge_type {args['edge_type']}")
        if src == dst or src not in self.memories or dst not in self.memories:
            return _error("memory_not_found", "edge endpoints must be two existing memories")
        edge = {
            "source_id": src,
            "target_id": dst,
            "edge_type": args["edge_type"],
            "weight": args.get("weight", 0.5),
            "confidence": args.get("confidence", 1.0),
            "created_at": _now(),
        }
        self.edges[(src, dst)] = edge
        return {"status": "success", "edge": edge}

    def tool_list_edges(self, args: dict[str, Any]) -> dict[str, Any]:
        memory_id = args["memory_id"]
        if memory_id not in self.memories:
            return _error("memory_not_found", f"memory {memory_id} not found")
        kinds = args.get("edge_types")
        edges = [
            e
            for (src, dst), e in self.edges.items()
            if memory_id in (src, dst) and (kinds is None or e["edge_type"] in kinds)
        ]
        return {"status": "success", "edges": edges}

    def tool_delete_edge(self, args: dict[str, Any]) -> dict[str, Any]:
        if self.edges.pop((args["source_id"], args["target_id"]), None) is None:
            return _error("edge_not_found", "no such edge")
        return {"status": "success"}

    def list_memories(self, query: dict[str, list[str]]) -> dict[str, Any]:
        cid = query.get("context_id", [None])[0]
        kind = query.get("type", [None])[0]
        limit = int(query.get("limit", ["50"])[0])
        offset = int(query.get("offset", ["0"])[0])
        with self.lock:
            rows = [
                m
                for m in self.memories.values()
                if (cid is None or m["context_id"] == cid) and (kind is None or m["type"] == kind)
            ]
        rows.sort(key=lambda m: m["created_at"], reverse=True)
        page = rows[offset : offset + limit]
        items = [
            {
                "id": m["id"],
                "summary": m["summary"],
                "type": m["type"],
                "scope": "working",
                "importance": m["importance"],
                "created_at": m["created_at"],
                "updated_at": m["updated_at"],
            }
            for m in page
        ]
        return {"memories": items, "total": len(rows), "has_more": offset + limit < len(rows)}


def _handler(cloud: FakeMemoryCloud) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass  # keep test output quiet

        def _send(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(data)

        def _authorized(self) -> bool:
            if self.headers.get("Authorization") == f"Bearer {cloud.token}":
                return True
            self._send(401, {"detail": "Invalid or missing API key"})
            return False

        def do_GET(self) -> None:
            if not self._authorized():
                return
            url = urlparse(self.path)
            if url.path == "/api/v1/memory/list":
                self._send(200, cloud.list_memories(parse_qs(url.query)))
            else:
                self._send(404, {"detail": "Not Found"})

        def do_POST(self) -> None:
            if not self._authorized():
                return
            if urlparse(self.path).path.rstrip("/") != "/mcp":
                self._send(404, {"detail": "Not Found"})
                return
            length = int(self.headers.get("Content-Length", "0"))
            request = json.loads(self.rfile.read(length) or b"{}")
            rid, method = request.get("id"), request.get("method")
            if method == "initialize":
                session = uuid.uuid4().hex
                cloud.sessions.add(session)
                result = {
                    "protocolVersion": "2025-03-26",
                    "capabilities": {"tools": {}},
                    "serverInfo": {"name": "fake-memory-cloud", "version": "0.0.0"},
                }
                self._send(
                    200,
                    {"jsonrpc": "2.0", "id": rid, "result": result},
                    {"mcp-session-id": session},
                )
                return
            if self.headers.get("mcp-session-id") not in cloud.sessions:
                self._send(
                    404,
                    {
                        "jsonrpc": "2.0",
                        "id": rid,
                        "error": {"code": -32603, "message": "unknown session"},
                    },
                )
                return
            if method != "tools/call":
                self._send(
                    200,
                    {
                        "jsonrpc": "2.0",
                        "id": rid,
                        "error": {"code": -32601, "message": "method not found"},
                    },
                )
                return
            params = request.get("params", {})
            payload = cloud.call_tool(params.get("name", ""), params.get("arguments", {}))
            content = [{"type": "text", "text": json.dumps(payload)}]
            self._send(200, {"jsonrpc": "2.0", "id": rid, "result": {"content": content}})

    return Handler
