"""The sdk engine: the Claude Agent SDK driving its bundled Claude Code CLI.

``claude_agent_sdk`` takes ~1 s to import, so it is imported inside ``run`` only, in a
worker thread (engines/loading.py): the entrypoint answers the host meanwhile.
SDK messages are mapped onto our events; SDK exceptions are translated here and never
escape the engine. Memory tools are offered as an in-process SDK MCP server whose calls
go to the injected MemoryClient (in the container: a request to the host); the
``dispatch`` tool (a sub-agent the host runs, brain/dispatch_tool.py) goes the same way.

Steering: the prompt goes in as the SDK's streaming input, kept open while the turn runs;
:meth:`SdkBrain.steer` adds a message to it. The CLI takes it as its next user message: in
a turn of its own once it has answered the one before, or (the bundled CLI, when the
message comes while a tool runs) inside the running turn, whose result then lists it. So
each message carries a uuid and a result answers the ones it lists (``user_message_uuids``;
a CLI that lists none answers the oldest). The turn ends (done) at the result that answers
the last message given; a message given after that is refused, never lost silently.

Turn and dollar budgets: the CLI holds a query to ``max_turns`` and ``max_budget_usd``
and ends it with an ``error_max_turns`` / ``error_max_budget_usd`` result (then exits).
The SDK has no control request that changes either limit in a running CLI, so instead of
ending the turn the engine asks the host to extend the budget (brain/capability.py); the
host asks the operator, bounded by the Policy ceilings, and answers with what is left of
the new budget by its own count. Approved: the same session goes on (``resume``, same
container) in a new CLI with those limits and a continuation prompt. Refused, denied or
unanswered: the turn ends with the CLI's error and why it was not extended.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import uuid
from collections.abc import AsyncIterator
from typing import Any

from kagura_agent.brain.capability import TOOL_DESCRIPTION, CapabilityClient
from kagura_agent.brain.dispatch_tool import (
    DISPATCH_SERVER,
    DISPATCH_TOOL,
    DispatchClient,
    dispatch_server,
)
from kagura_agent.brain.engines.loading import load
from kagura_agent.brain.events import (
    MAX_TEXT_CHARS,
    BrainEvent,
    CheckpointEvent,
    CostEvent,
    DoneEvent,
    ErrorEvent,
    TextEvent,
    ToolCallEvent,
    ToolResultEvent,
)
from kagura_agent.brain.memory_bridge import MemoryUnavailable
from kagura_agent.brain.protocol import BRAIN_BUDGETS, MemoryClient, Turn

CLI_PATH_ENV = "KAGURA_CLAUDE_CLI"
MEMORY_SERVER = "kagura-memory"
MEMORY_TOOLS = ("recall", "remember", "get", "explore", "link")
# Mid-run requests for one more capability: the host decides (brain/capability.py).
MEMBRANE_SERVER = "kagura-membrane"
REQUEST_TOOL = "request_access"


class SdkBrain:
    """Runs a prompt through ``claude_agent_sdk.query``."""

    name = "sdk"

    def __init__(
        self,
        *,
        cli_path: str | None = None,
        memory: MemoryClient | None = None,
        dispatch: DispatchClient | None = None,
        capabilities: CapabilityClient | None = None,
    ) -> None:
        self._cli_path = cli_path
        self._memory = memory
        self._dispatch = dispatch  # the host's sub-agent dispatch (brain/dispatch_tool.py)
        self._capabilities = capabilities  # mid-run capability requests (brain/capability.py)
        # Open while a turn runs: (uuid, text) of each message given mid-run.
        self._steering: asyncio.Queue[tuple[str, str] | None] | None = None
        self._messages = _Messages()  # the user messages of the running CLI

    def steer(self, text: str) -> tuple[bool, str]:
        """Give the running turn ``text`` as its next user message."""
        if self._steering is None:
            return False, "the turn is ending"
        # Counted as given now: a result that comes before the CLI reads it must not end the turn.
        self._steering.put_nowait((self._messages.give(text, steered=True), text))
        return True, ""

    def _resolve_cli(self, turn: Turn) -> str | None:
        return (
            turn.engine_options.get("cli_path")
            or self._cli_path
            or turn.env.get(CLI_PATH_ENV)
            or os.environ.get(CLI_PATH_ENV)
        )

    async def run(self, turn: Turn) -> AsyncIterator[BrainEvent]:
        """One SDK query (more when a turn or dollar budget is extended); yields text/tool
        events, then cost and done (or error)."""
        await load("claude_agent_sdk")
        import claude_agent_sdk as sdk

        spent = _Spent()
        prompt, session_id = turn.full_prompt(), turn.session_id
        turns_left, usd_left = turn.budget.turns, turn.budget.cost_usd
        while True:
            segment = _Segment()
            options = self._options(sdk, turn, session_id, turns_left, usd_left)
            async for event in self._query(sdk, options, prompt, spent, segment):
                yield event
            if segment.limited is None:
                return
            spent.add(segment)
            answer = await self._extend(segment, spent)
            if not answer["granted"]:
                if segment.session_id:
                    # The conversation so far, for the session's next run to resume within
                    # what it has left (an error carries no session id).
                    yield CheckpointEvent(step=0, pending=0, session_id=segment.session_id)
                yield ErrorEvent(
                    message=f"claude reported an error: {segment.detail}; the"
                    f" {BRAIN_BUDGETS[segment.limited]} budget was not extended: {answer['message']}",
                    code="budget",
                )
                return
            yield TextEvent(text=f"[{answer['message']}]\n\n")
            prompt, session_id = CONTINUE_PROMPT, segment.session_id or session_id
            if segment.unanswered:
                prompt += "\n\nMessages from the operator not answered yet:\n" + "\n".join(
                    segment.unanswered
                )
            # The host's count of what is left of each budget (None: no limit).
            turns_left = _left(answer.get("turns"), int)
            usd_left = _left(answer.get("cost_usd"), float)

    async def _extend(self, segment: _Segment, spent: _Spent) -> dict[str, Any]:
        """Ask the host for more of the budget that ran out (never this engine's call)."""
        limited = segment.limited
        assert limited is not None
        if self._capabilities is None:
            return {"granted": False, "message": "this run takes no mid-run requests"}
        reason = f"{segment.detail} after {spent.turns} turns, ${spent.usd:.4f}"
        return await self._capabilities.extend_budget(
            limited, spent.turns, round(spent.usd, 6), reason
        )

    def _options(
        self,
        sdk: Any,
        turn: Turn,
        session_id: str | None,
        turns_left: int | None,
        usd_left: float | None,
    ) -> Any:
        options = sdk.ClaudeAgentOptions(
            permission_mode=turn.permission_mode,
            model=turn.model,
            resume=session_id,
            cwd=turn.cwd,
            max_turns=turns_left,
            max_budget_usd=usd_left,
            cli_path=self._resolve_cli(turn),
            env=dict(turn.env),
        )
        servers: dict[str, Any] = {}
        if self._memory is not None:
            servers[MEMORY_SERVER] = _memory_server(sdk, self._memory)
            options.allowed_tools = [f"mcp__{MEMORY_SERVER}__{op}" for op in MEMORY_TOOLS]
        if turn.tool_servers:  # the operator's tool servers, approved in the plan
            servers.update(sdk_tool_servers(turn))
            options.allowed_tools = [*options.allowed_tools, *map(mcp_prefix, turn.tool_servers)]
        if self._dispatch is not None:
            servers[DISPATCH_SERVER] = dispatch_server(sdk, self._dispatch)
            options.allowed_tools = [*options.allowed_tools, DISPATCH_TOOL]
        if self._capabilities is not None:
            servers[MEMBRANE_SERVER] = _membrane_server(sdk, self._capabilities)
            options.allowed_tools = [
                *options.allowed_tools,
                f"mcp__{MEMBRANE_SERVER}__{REQUEST_TOOL}",
            ]
        if servers:
            options.mcp_servers = servers
        return options

    async def _query(
        self, sdk: Any, options: Any, prompt: str, spent: _Spent, segment: _Segment
    ) -> AsyncIterator[BrainEvent]:
        """One CLI process: ``prompt`` and any steering. A result that says a turn or dollar
        budget ran out ends it without a terminal event (``segment.limited`` says which)."""
        finished = False
        retries = _Retries()
        inbox: asyncio.Queue[tuple[str, str] | None] = asyncio.Queue()
        messages = self._messages = _Messages()
        self._steering = inbox

        async def prompts() -> AsyncIterator[dict[str, Any]]:
            given: tuple[str, str] | None = (messages.give(prompt), prompt)
            while given is not None:
                yield {
                    "type": "user",
                    "message": {"role": "user", "content": given[1]},
                    "parent_tool_use_id": None,
                    "session_id": "default",  # as the SDK's own client sends (resume is a flag)
                    "uuid": given[0],  # the result that answers it lists it
                }
                given = await inbox.get()

        try:
            async for message in sdk.query(prompt=prompts(), options=options):
                events = _map_message(sdk, message, retries)
                if isinstance(message, sdk.ResultMessage):
                    messages.answered(message)
                    made = _turns_made(message, options.max_turns)
                    events = spent.counted(_with_turns(events, made))
                    if message.subtype in _LIMITS:  # the CLI stops here: ask, not end
                        segment.stopped(message, made)
                        # Steered messages the stopped CLI had not come to yet go on.
                        segment.unanswered = messages.unanswered_steered()
                        events = [e for e in events if not isinstance(e, ErrorEvent)]
                        finished = True
                    if messages.pending() and not segment.limited:  # steered: more to answer
                        events = [e for e in events if not isinstance(e, DoneEvent)]
                    else:  # the last message is answered: close the input, end the query
                        self._steering = None
                        inbox.put_nowait(None)
                for event in events:
                    finished = finished or event.type in ("done", "error")
                    yield event
        except sdk.CLINotFoundError as exc:
            yield ErrorEvent(message=f"Claude Code CLI not found: {exc}", code="setup")
            segment.limited = None
            return
        except sdk.ClaudeSDKError as exc:
            if not finished:
                yield ErrorEvent(message=f"claude agent sdk: {exc}", code="engine")
            return  # after a budget result the CLI exits 1: that is expected
        finally:
            self._steering = None
            inbox.put_nowait(None)
        if not finished:
            yield ErrorEvent(message="the CLI ended without a result message", code="protocol")


# The CLI's result subtypes for a budget that ran out, and the budget each names.
_LIMITS = {"error_max_turns": "turns", "error_max_budget_usd": "cost_usd"}
CONTINUE_PROMPT = (
    "The operator extended your budget. Carry on with the task where you stopped;"
    " do not repeat work already done."
)


class _Messages:
    """The user messages given to one CLI process and which of them a result answered."""

    def __init__(self) -> None:
        self._order: list[tuple[str, str, bool]] = []  # (uuid, text, steered)
        self._answered: set[str] = set()

    def give(self, text: str, *, steered: bool = False) -> str:
        uid = str(uuid.uuid4())
        self._order.append((uid, text, steered))
        return uid

    def answered(self, result: Any) -> None:
        """Mark what ``result`` answered: the messages it lists, or else the oldest one."""
        listed = getattr(result, "user_message_uuids", None) or []
        one = getattr(result, "user_message_uuid", None)
        taken = {u for u in [*listed, one] if isinstance(u, str)} & {u for u, _, _ in self._order}
        if not taken:
            oldest = next((u for u, _, _ in self._order if u not in self._answered), None)
            taken = {oldest} if oldest else set()
        self._answered |= taken

    def pending(self) -> bool:
        return any(u not in self._answered for u, _, _ in self._order)

    def unanswered_steered(self) -> list[str]:
        return [text for u, text, steered in self._order if steered and u not in self._answered]


class _Spent:
    """Turns and dollars of the CLI processes that ended on a budget.

    The CLI counts turns per process, but its cost is the session's: a ``--resume``d CLI
    reports what the session cost before it plus its own spending (measured on the bundled
    CLI 2.1.337, tests/test_conformance_session.py). So the turns of earlier processes are
    added to a result's, and its cost is taken as it is (the last stopped one is kept)."""

    def __init__(self) -> None:
        self.turns = 0
        self.usd = 0.0

    def add(self, segment: _Segment) -> None:
        self.turns += segment.turns
        self.usd = segment.usd

    def counted(self, events: list[BrainEvent]) -> list[BrainEvent]:
        """The cost event of a result, with the turns of earlier processes added (the host's
        tally sees the whole turn)."""
        if not self.turns:
            return events
        return [
            dataclasses.replace(e, turns=None if e.turns is None else e.turns + self.turns)
            if isinstance(e, CostEvent)
            else e
            for e in events
        ]


class _Segment:
    """How one CLI process ended: ``limited`` is the budget that ran out (or None)."""

    def __init__(self) -> None:
        self.limited: str | None = None
        self.detail = ""
        self.turns = 0
        self.usd = 0.0
        self.session_id: str | None = None
        self.unanswered: list[str] = []  # steered messages the CLI never came to

    def stopped(self, message: Any, turns: int | None) -> None:
        self.limited = _LIMITS[message.subtype]
        self.detail = ", ".join(message.errors or []) or message.subtype
        self.turns = int(turns or 0)
        self.usd = float(message.total_cost_usd or 0.0)
        self.session_id = message.session_id


def _turns_made(message: Any, max_turns: int | None) -> int | None:
    """The turns a result's CLI made: its ``num_turns``, except when it stopped at
    ``--max-turns``, where the bundled CLI counts the turn it refused to start too
    (2.1.337: ``num_turns`` 3 after the 2 model calls of ``--max-turns 2``)."""
    turns = message.num_turns
    if message.subtype == "error_max_turns" and max_turns and isinstance(turns, int):
        return min(turns, max_turns)
    return turns if isinstance(turns, int) else None


def _with_turns(events: list[BrainEvent], turns: int | None) -> list[BrainEvent]:
    return [dataclasses.replace(e, turns=turns) if isinstance(e, CostEvent) else e for e in events]


def _left(value: object, kind: type[Any]) -> Any:
    """A limit from the host's answer: what is left of the budget, or None (no limit)."""
    if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
        return kind(value)
    return None


def sdk_tool_servers(turn: Turn) -> dict[str, dict[str, Any]]:
    """The turn's tool servers in the Claude Agent SDK's ``mcp_servers`` shapes: stdio
    ``{"type": "stdio", "command", "args", "env"}``, http ``{"type": "http", "url"}``."""
    servers: dict[str, dict[str, Any]] = {}
    for name, server in turn.tool_servers.items():
        if server["transport"] == "stdio":
            command, *args = server["command"]
            servers[name] = {"type": "stdio", "command": command, "args": args}
            if server["env"]:
                servers[name]["env"] = dict(server["env"])
        else:
            servers[name] = {"type": "http", "url": server["url"]}
    return servers


def mcp_prefix(name: str) -> str:
    """The CLI's permission rule for every tool of one MCP server."""
    return f"mcp__{name}"


class _Retries:
    """API calls the CLI had to repeat (its ``system`` ``api_retry`` messages)."""

    def __init__(self) -> None:
        self.count = 0


def _map_message(sdk: Any, message: Any, retries: _Retries) -> list[BrainEvent]:
    """Translate one SDK message into zero or more events."""
    events: list[BrainEvent] = []
    if isinstance(message, sdk.SystemMessage) and message.subtype == "api_retry":
        retries.count += 1
        data = message.data if isinstance(message.data, dict) else {}
        status = data.get("error_status")
        events.append(
            TextEvent(
                text=f"[the API call is retried (attempt {data.get('attempt', '?')},"
                f" status {status if status is not None else 'none'})]\n\n"
            )
        )
    elif isinstance(message, sdk.AssistantMessage | sdk.UserMessage):
        content = message.content
        if isinstance(content, str):
            return events  # a user echo of the prompt: nothing new to show
        for block in content:
            if isinstance(block, sdk.TextBlock) and isinstance(message, sdk.AssistantMessage):
                events.append(TextEvent(text=block.text[:MAX_TEXT_CHARS]))
            elif isinstance(block, sdk.ToolUseBlock):
                events.append(ToolCallEvent(id=block.id, name=block.name, input=dict(block.input)))
            elif isinstance(block, sdk.ToolResultBlock):
                events.append(
                    ToolResultEvent(
                        id=block.tool_use_id,
                        output=_result_text(block.content),
                        is_error=bool(block.is_error),
                    )
                )
    elif isinstance(message, sdk.ResultMessage):
        usage = message.usage or {}
        events.append(
            CostEvent(
                usd=message.total_cost_usd,
                turns=message.num_turns,
                input_tokens=_int_or_none(usage.get("input_tokens")),
                output_tokens=_int_or_none(usage.get("output_tokens")),
                retries=retries.count,
            )
        )
        if message.is_error:
            detail = message.result or ", ".join(message.errors or []) or message.subtype
            events.append(ErrorEvent(message=f"claude reported an error: {detail}"))
        else:
            events.append(DoneEvent(result=message.result, session_id=message.session_id))
    return events


def _result_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content[:MAX_TEXT_CHARS]
    parts = [str(item.get("text", "")) if isinstance(item, dict) else str(item) for item in content]
    return "\n".join(parts)[:MAX_TEXT_CHARS]


def _int_or_none(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _memory_server(sdk: Any, memory: MemoryClient) -> Any:
    """An in-process MCP server exposing recall/remember/get over ``memory``."""

    def reply(value: object) -> dict[str, Any]:
        return {"content": [{"type": "text", "text": json.dumps(value)}]}

    async def recall(args: dict[str, Any]) -> dict[str, Any]:
        return reply(await memory.recall(str(args["query"]), int(args.get("limit", 5))))

    async def remember(args: dict[str, Any]) -> dict[str, Any]:
        return reply({"id": await memory.remember(str(args["text"]), list(args.get("tags", [])))})

    async def get(args: dict[str, Any]) -> dict[str, Any]:
        return reply(await memory.get(str(args["id"])))

    def refused(exc: Exception) -> dict[str, Any]:
        return {"content": [{"type": "text", "text": f"refused: {exc}"}], "is_error": True}

    async def explore(args: dict[str, Any]) -> dict[str, Any]:
        try:
            return reply(await memory.explore(str(args["id"]), int(args.get("limit", 10))))
        except MemoryUnavailable as exc:  # the host's answer: unreadable or unknown
            return refused(exc)

    async def link(args: dict[str, Any]) -> dict[str, Any]:
        edge_type = str(args.get("type") or "related_to")
        try:
            return reply(await memory.link(str(args["source"]), str(args["target"]), edge_type))
        except MemoryUnavailable as exc:
            return refused(exc)

    tools = [
        sdk.tool("recall", "Recall memories relevant to a query", {"query": str, "limit": int})(
            recall
        ),
        sdk.tool("remember", "Store a memory for later runs", {"text": str})(remember),
        sdk.tool("get", "Fetch one memory by id", {"id": str})(get),
        sdk.tool(
            "explore",
            "A memory and its neighbours over edges (fixes, sources, related memories)",
            {
                "type": "object",
                "properties": {"id": {"type": "string"}, "limit": {"type": "integer"}},
                "required": ["id"],
            },
        )(explore),
        sdk.tool(
            "link",
            "Link two memories: type related_to or derived_from (source derived from target)",
            {
                "type": "object",
                "properties": {
                    "source": {"type": "string"},
                    "target": {"type": "string"},
                    # Not an enum: the host refuses other types (the check that counts).
                    "type": {"type": "string"},
                },
                "required": ["source", "target"],
            },
        )(link),
    ]
    return sdk.create_sdk_mcp_server(MEMORY_SERVER, tools=tools)


def _membrane_server(sdk: Any, capabilities: CapabilityClient) -> Any:
    """An in-process MCP server with the one tool that asks the host for a capability."""

    async def request_access(args: dict[str, Any]) -> dict[str, Any]:
        answer = await capabilities.request(
            str(args.get("kind") or ""), str(args.get("name") or ""), str(args.get("reason") or "")
        )
        word = "granted" if answer["granted"] else "refused"
        text = f"{word}: {answer['message']}"
        return {"content": [{"type": "text", "text": text}], "is_error": not answer["granted"]}

    tool = sdk.tool(
        REQUEST_TOOL,
        TOOL_DESCRIPTION,
        {
            "type": "object",
            "properties": {
                "kind": {"type": "string", "enum": ["egress", "credential"]},
                "name": {"type": "string"},
                "reason": {"type": "string"},
            },
            "required": ["kind", "name", "reason"],
        },
    )(request_access)
    return sdk.create_sdk_mcp_server(MEMBRANE_SERVER, tools=[tool])
