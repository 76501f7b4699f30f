"""Each engine on the host, driven by the protocol-faithful fakes in testing/fake_claude."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest
from brain_helpers import DictMemory, attached, collect
from resources import require_extra

from kagura_agent.brain.engines import select_engine
from kagura_agent.brain.engines.kagura_brain import KaguraBrain
from kagura_agent.brain.engines.script import ScriptBrain
from kagura_agent.brain.engines.sdk import SdkBrain
from kagura_agent.brain.events import (
    BrainEvent,
    CheckpointEvent,
    CostEvent,
    DoneEvent,
    ErrorEvent,
    TextEvent,
    ToolCallEvent,
    ToolResultEvent,
)
from kagura_agent.brain.protocol import Brain, Budget, Turn
from testing.cli_options import option
from testing.fake_claude import FAKE_CLAUDE, FAKE_DIR

require_extra("claude_agent_sdk", "claude")
require_extra("kagura_brain", "brain")


def run(brain: Brain, turn: Turn) -> list[BrainEvent]:
    async def go() -> list[BrainEvent]:
        return [event async for event in brain.run(turn)]

    return asyncio.run(go())


def fake_log(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture()
def fakes_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    log = tmp_path / "fake.log"
    monkeypatch.setenv("PATH", f"{FAKE_DIR}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("KAGURA_FAKE_LOG", str(log))
    return log


def test_script_engine_steps_checkpoints_and_failure(tmp_path: Path) -> None:
    steps = ("echo $GREETING > out.txt", ("cat", "out.txt"), "exit 4", "touch never")
    turn = Turn(steps=steps, cwd=str(tmp_path), env={"GREETING": "hi"})
    events = run(ScriptBrain(), turn)
    calls = [e for e in events if isinstance(e, ToolCallEvent)]
    assert [c.input["argv"] for c in calls][1] == ["cat", "out.txt"]
    results = [e for e in events if isinstance(e, ToolResultEvent)]
    assert [r.exit_code for r in results] == [0, 0, 4]
    assert results[1].output == "hi\n"
    assert [e.step for e in events if isinstance(e, CheckpointEvent)] == [1, 2]
    assert isinstance(events[-1], ErrorEvent) and events[-1].code == "step-failed"
    assert not (tmp_path / "never").exists()


def test_script_engine_resume_skips_done_steps(tmp_path: Path) -> None:
    steps = ("echo a >> log", "echo b >> log")
    events = run(ScriptBrain(), Turn(steps=steps, cwd=str(tmp_path), completed_steps=1))
    assert isinstance(events[0], TextEvent) and "skipping 1" in events[0].text
    assert isinstance(events[-1], DoneEvent)
    assert (tmp_path / "log").read_text() == "b\n"


def test_script_engine_caps_flooding_output(tmp_path: Path) -> None:
    events = run(ScriptBrain(), Turn(steps=("head -c 5000000 /dev/zero | tr '\\0' y",)))
    result = next(e for e in events if isinstance(e, ToolResultEvent))
    assert len(result.output) < 100_000 and result.output.startswith("[… truncated …]")


def test_sdk_engine_tool_call_and_cost(tmp_path: Path, fakes_on_path: Path) -> None:
    brain = SdkBrain(cli_path=str(FAKE_CLAUDE))
    turn = Turn(
        engine="sdk",
        prompt="please\nrun: echo sdk-tool > made.txt; echo ran",
        permission_mode="acceptEdits",
        model="claude-test",
        cwd=str(tmp_path),
        budget=Budget(turns=7, cost_usd=2.5),
    )
    events = run(brain, turn)
    call = next(e for e in events if isinstance(e, ToolCallEvent))
    assert call.name == "Bash" and "echo sdk-tool" in call.input["command"]
    result = next(e for e in events if isinstance(e, ToolResultEvent))
    assert result.id == call.id and result.output == "ran\n" and not result.is_error
    assert (tmp_path / "made.txt").read_text() == "sdk-tool\n"
    cost = next(e for e in events if isinstance(e, CostEvent))
    assert cost.usd == pytest.approx(0.0123) and cost.turns == 2 and cost.output_tokens == 10
    done = events[-1]
    assert isinstance(done, DoneEvent) and done.session_id
    argv = fake_log(fakes_on_path)[0]["argv"]
    assert isinstance(argv, list)
    assert option(argv, "--permission-mode") == "acceptEdits"
    assert option(argv, "--model") == "claude-test"
    assert option(argv, "--max-turns") == "7"
    # Resume by the SDK's session id.
    resumed = run(brain, Turn(engine="sdk", prompt="again", session_id=done.session_id))
    last = resumed[-1]
    assert isinstance(last, DoneEvent) and last.session_id == done.session_id
    assert f"--resume={done.session_id}" in fake_log(fakes_on_path)[1]["argv"]  # type: ignore[operator]


def test_sdk_engine_error_result(fakes_on_path: Path) -> None:
    events = run(SdkBrain(cli_path=str(FAKE_CLAUDE)), Turn(engine="sdk", prompt="fail please"))
    assert any(isinstance(e, CostEvent) for e in events)
    assert isinstance(events[-1], ErrorEvent) and "fake failure" in events[-1].message


def test_sdk_engine_cli_missing(tmp_path: Path) -> None:
    events = run(SdkBrain(cli_path=str(tmp_path / "nope")), Turn(engine="sdk", prompt="hi"))
    assert isinstance(events[-1], ErrorEvent) and events[-1].code == "setup"


def test_sdk_engine_memory_tools(fakes_on_path: Path) -> None:
    memory = DictMemory()

    class Client:
        async def recall(self, query: str, limit: int = 5) -> list[dict[str, object]]:
            return []

        async def remember(self, text: str, tags: list[str] | None = None) -> str:
            return await memory.remember(text, tags or [])

        async def get(self, memory_id: str) -> dict[str, object] | None:
            return None

    brain = SdkBrain(cli_path=str(FAKE_CLAUDE), memory=Client())
    events = run(brain, Turn(engine="sdk", prompt="remember: tests use fakes"))
    assert isinstance(events[-1], DoneEvent)
    assert memory.items["mem-1"]["text"] == "tests use fakes"
    assert any(isinstance(e, TextEvent) and "mem-1" in e.text for e in events)


def test_sdk_engine_in_entrypoint_with_host_memory(tmp_path: Path) -> None:
    """The sdk engine inside the entrypoint: memory tool calls reach the host's server."""
    memory = DictMemory()

    async def scenario() -> None:
        env = {"KAGURA_CREDS_DIR": str(tmp_path / "c"), "KAGURA_CLAUDE_CLI": str(FAKE_CLAUDE)}
        async with attached(env=env, memory=memory) as (channel, _):
            turn = Turn(engine="sdk", prompt="remember: sealed brains", cwd=str(tmp_path))
            events = await collect(channel, turn)
            assert isinstance(events[-1], DoneEvent)
            assert any(isinstance(e, CostEvent) and e.usd for e in events)

    asyncio.run(scenario())
    assert memory.calls == [("remember", "sealed brains")]


def test_kagura_brain_claude_backend(tmp_path: Path, fakes_on_path: Path) -> None:
    turn = Turn(
        engine="kagura-brain",
        prompt="say hi",
        model="opus",
        permission_mode="plan",
        cwd=str(tmp_path),
    )
    events = run(KaguraBrain(), turn)
    assert [e.type for e in events] == ["tool_call", "tool_result", "text", "cost", "done"]
    text = next(e for e in events if isinstance(e, TextEvent)).text
    assert text == "fake claude (opus, plan) answered: say hi"
    record = fake_log(fakes_on_path)[0]
    assert record["mode"] == "headless" and record["cwd"] == str(tmp_path)


def test_kagura_brain_codex_local_provider(fakes_on_path: Path) -> None:
    options: dict[str, str | None] = {"backend": "codex", "local_provider": "ollama"}
    turn = Turn(engine="kagura-brain", prompt="hello", model="qwen", engine_options=options)
    events = run(select_engine({"engine": "kagura-brain", "backend": "codex"}), turn)
    assert isinstance(events[-1], DoneEvent)
    assert events[-1].result == "fake codex (ollama, qwen) answered: hello"
    argv = fake_log(fakes_on_path)[0]["argv"]
    assert argv == ["exec", "--oss", "--local-provider", "ollama", "--model", "qwen"]


def test_kagura_brain_failure_and_timeout(fakes_on_path: Path) -> None:
    failed = run(KaguraBrain(), Turn(engine="kagura-brain", prompt="fail"))
    assert isinstance(failed[-1], ErrorEvent) and "simulated failure" in failed[-1].message
    hung = run(
        KaguraBrain(),
        Turn(engine="kagura-brain", prompt="hang", budget=Budget(wall_seconds=1)),
    )
    assert isinstance(hung[-1], ErrorEvent) and hung[-1].code == "timeout"


def test_kagura_brain_refuses_unsupported_mode(fakes_on_path: Path) -> None:
    turn = Turn(engine="kagura-brain", prompt="x", permission_mode="auto")
    events = run(KaguraBrain(), turn)
    assert isinstance(events[-1], ErrorEvent) and events[-1].code == "setup"


def test_kagura_brain_missing_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    events = run(KaguraBrain(), Turn(engine="kagura-brain", prompt="x"))
    assert isinstance(events[-1], ErrorEvent) and events[-1].code == "setup"
