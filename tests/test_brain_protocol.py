"""The event model, the Turn wire form, engine selection and the Docker frame demuxer."""

from __future__ import annotations

import asyncio
import json
import socket
import struct

import pytest
from golden import golden_plan

from kagura_agent.brain import engines
from kagura_agent.brain.engines import select_engine
from kagura_agent.brain.engines.script import ScriptBrain
from kagura_agent.brain.events import (
    CostEvent,
    DoneEvent,
    ErrorEvent,
    EventShapeError,
    ToolCallEvent,
    event_from_json,
    event_to_json,
)
from kagura_agent.brain.plan_turn import turn_from_plan
from kagura_agent.brain.protocol import PERMISSION_MODES, Budget, Turn, TurnContext
from kagura_agent.brain.streams import STDERR, STDOUT, DockerAttachStream, FrameDemuxer
from kagura_agent.errors import ExitCode, SetupError, UsageError


def test_events_round_trip_through_json() -> None:
    samples = [
        ToolCallEvent(id="t1", name="Bash", input={"command": "ls"}),
        CostEvent(usd=0.5, turns=3, input_tokens=10, output_tokens=2),
        DoneEvent(result="ok", session_id="s"),
        ErrorEvent(message="boom", code="timeout"),
    ]
    for event in samples:
        wire = json.loads(json.dumps(event_to_json(event)))
        assert event_from_json(wire) == event


@pytest.mark.parametrize(
    ("obj", "problem"),
    [
        ([], "JSON object"),
        ({"type": "exec", "cmd": "rm -rf /"}, "unknown event type"),
        ({"type": "text"}, "lacks field"),
        ({"type": "text", "text": "x", "extra": 1}, "unknown field"),
        ({"type": "cost", "usd": "1.0"}, "wrong type"),
        ({"type": "cost", "turns": True}, "wrong type"),
        ({"type": "tool_result", "id": "1", "output": "x", "is_error": 1}, "wrong type"),
    ],
)
def test_untrusted_event_shapes_rejected(obj: object, problem: str) -> None:
    with pytest.raises(EventShapeError, match=problem):
        event_from_json(obj)


def test_unknown_error_code_is_normalised() -> None:
    assert event_from_json({"type": "error", "message": "x", "code": "weird"}) == ErrorEvent(
        message="x", code="engine"
    )


def test_turn_wire_form_round_trips() -> None:
    turn = Turn(
        engine="script",
        steps=("echo hi", ("sh", "-c", "true")),
        context=TurnContext(known_failures="npm ci fails offline", memory_ids=("m1",)),
        budget=Budget(turns=3, wall_seconds=60, cost_usd=1.5),
        session_id="s1",
        completed_steps=1,
        permission_mode="plan",
        cwd="/workspace",
        env={"A": "1"},
        engine_options={"backend": None},
    )
    assert Turn.from_json(json.loads(json.dumps(turn.to_json()))) == turn


def test_turn_validation() -> None:
    assert set(PERMISSION_MODES) == {
        "default",
        "acceptEdits",
        "plan",
        "bypassPermissions",
        "dontAsk",
        "auto",
    }
    with pytest.raises(UsageError, match="permission mode"):
        Turn(prompt="x", permission_mode="acceptedits")
    with pytest.raises(UsageError, match="exactly one"):
        Turn(prompt="x", steps=("true",))
    with pytest.raises(UsageError, match="engine"):
        Turn(engine="gpt", prompt="x")
    with pytest.raises(UsageError, match="malformed"):
        Turn.from_json({"steps": [123]})


def test_full_prompt_carries_known_failures() -> None:
    turn = Turn(prompt="fix it", context=TurnContext(known_failures="- tests need network"))
    assert turn.full_prompt().startswith("fix it") and "tests need network" in turn.full_prompt()


def test_select_engine() -> None:
    assert isinstance(select_engine({"engine": "script"}), ScriptBrain)
    assert select_engine({"engine": "sdk", "permission_mode": "auto"}).name == "sdk"
    with pytest.raises(UsageError, match="permission mode"):
        select_engine({"engine": "sdk", "permission_mode": "yolo"})
    with pytest.raises(UsageError, match="backend"):
        select_engine({"engine": "kagura-brain", "backend": "gemini"})


def test_missing_extra_is_a_setup_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(engines._EXTRAS, "sdk", ("kagura_no_such_module", "claude"))
    with pytest.raises(SetupError) as info:
        select_engine({"engine": "sdk"})
    assert info.value.exit_code == ExitCode.SETUP
    assert "pip install 'kagura-agent[claude]'" in info.value.render()


def _frame(kind: int, payload: bytes) -> bytes:
    return struct.pack(">BxxxL", kind, len(payload)) + payload


def test_frame_demuxer_handles_split_frames() -> None:
    data = _frame(STDOUT, b'{"type":"text"') + _frame(STDERR, b"warn\n") + _frame(STDOUT, b"}\n")
    demux = FrameDemuxer()
    frames = []
    for i in range(len(data)):  # one byte at a time: the worst case for framing
        frames += demux.feed(data[i : i + 1])
    assert frames == [(STDOUT, b'{"type":"text"'), (STDERR, b"warn\n"), (STDOUT, b"}\n")]


def test_docker_attach_stream_over_a_socket() -> None:
    async def scenario() -> None:
        ours, theirs = socket.socketpair()
        stream = DockerAttachStream(ours)
        theirs.sendall(_frame(STDERR, b"noise\n") + _frame(STDOUT, b"hello\n"))
        assert await stream.read() == b"hello\n"
        assert stream.stderr_tail == "noise\n"
        await stream.write(b'{"type":"stop"}\n')
        assert theirs.recv(100) == b'{"type":"stop"}\n'
        theirs.close()
        assert await stream.read() == b""
        await stream.close()

    asyncio.run(scenario())


def test_turn_from_plan() -> None:
    plan = golden_plan("known-failures")
    plan["task"]["parent"] = {
        "task": "parent",
        "run": "r1",
        "context_memories": ["mem-7"],
        "narrowing": [],
    }
    turn = turn_from_plan(plan, completed_steps=1)
    assert turn.steps == ("make docs",) and turn.prompt is None
    assert turn.cwd == "/workspace" and turn.completed_steps == 1
    # The case's cost history (3 runs of ~50 s whose engines reported 3 turns) sets the
    # wall budget (host-measured, floor holding); turns are learnt only from model calls
    # counted at the proxy, which that history lacks, so the brain's default 20 stands.
    assert turn.budget == Budget(turns=20, wall_seconds=65, cost_usd=None)
    assert turn.context.memory_ids == ("mem-7",)
    assert turn.context.known_failures == (
        '- [trusted] failure: "sphinx: command not found";'
        ' fix [trusted]: "build-docs succeeded, changed: + step'
        " 'pip install -r docs/requirements.txt'\""
    )  # the untrusted failure is withheld from a run that did not opt into untrusted memory
    plan["task"]["context"]["include_untrusted"] = True
    opted = turn_from_plan(plan).context.known_failures.splitlines()
    assert opted[1] == '- [untrusted] failure: "linkcheck timed out"'
    hosted = golden_plan("host-runtime")
    host = turn_from_plan(hosted)
    assert host.cwd == hosted["task"]["project_root"]
    assert host.prompt == hosted["task"]["prompt"]
    assert host.steps is None and host.engine == "sdk"
    assert host.permission_mode == hosted["brain"]["permission_mode"]
    assert host.engine_options == {"backend": None, "local_provider": None, "endpoint": None}
