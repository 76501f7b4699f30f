"""The ``dispatch`` tool: a sub-agent, run by the host, offered to engines that take tools.

The sdk engine gets it as an in-process SDK MCP server (``kagura-dispatch``); shell steps
and CLIs get ``python3 -m kagura_agent.brain.memtool dispatch``. Either way the request
goes to the host over the channel, which compiles the child's plan from the operator's
manifests (narrowing the parent's, never widening it), asks a human when the child needs
approval, runs it in its own container and answers with its result — or the reason it
was refused. The container only asks: it never sees the child's plan being made.
"""

from __future__ import annotations

import json
from typing import Any, Protocol

from kagura_agent.brain.memory_bridge import MemoryUnavailable

DISPATCH_SERVER = "kagura-dispatch"
DISPATCH_TOOL = f"mcp__{DISPATCH_SERVER}__dispatch"
DESCRIPTION = (
    "Run a sub-agent on a sub-task in its own sandbox and wait for its result. Fields:"
    " prompt (the sub-task), name (a short lowercase name), egress (EgressPolicy names it"
    " needs; the parent's baseline ones when left out), context (ids of memories to hand"
    " over), notes (texts to hand over as memories), workdir (a folder under the project"
    " root, default the name), verify (shell commands that decide success). The child may"
    " only narrow what this run holds; a wider request is refused with the reason."
)
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "prompt": {"type": "string"},
        "name": {"type": "string"},
        "egress": {"type": "array", "items": {"type": "string"}},
        "context": {"type": "array", "items": {"type": "string"}},
        "notes": {"type": "array", "items": {"type": "string"}},
        "workdir": {"type": "string"},
        "verify": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["prompt"],
}


class DispatchClient(Protocol):
    """The host's dispatch as an engine sees it (``BridgeMemory`` in the container)."""

    async def dispatch(self, request: dict[str, Any]) -> dict[str, Any]: ...


def dispatch_server(sdk: Any, client: DispatchClient) -> Any:
    """An in-process MCP server with the one ``dispatch`` tool over ``client``."""

    async def dispatch(args: dict[str, Any]) -> dict[str, Any]:
        try:
            result = await client.dispatch(dict(args))
        except MemoryUnavailable as exc:  # the host could not take the request at all
            return {"content": [{"type": "text", "text": f"refused: {exc}"}], "is_error": True}
        text = json.dumps(result)
        return {
            "content": [{"type": "text", "text": text}],
            "is_error": result.get("outcome") != "success",
        }

    tool = sdk.tool("dispatch", DESCRIPTION, SCHEMA)(dispatch)
    return sdk.create_sdk_mcp_server(DISPATCH_SERVER, tools=[tool])
