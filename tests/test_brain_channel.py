"""The host channel driving the real entrypoint over real pipes in a subprocess."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import pytest
from brain_helpers import DictMemory, attached, collect, mode

from kagura_agent.brain.channel import BrainChannel, ChannelLimits
from kagura_agent.brain.events import (
    CheckpointEvent,
    DoneEvent,
    ErrorEvent,
    TextEvent,
    ToolResultEvent,
)
from kagura_agent.brain.protocol import Budget, Turn
from kagura_agent.errors import SetupError

BUNDLE = {
    "files": {"aws/credentials": "[default]\naws_access_key_id = CANARY-KEY\n"},
    "env": {"AWS_SHARED_CREDENTIALS_FILE": "<set per test>"},
}


def _bundle(creds: Path) -> dict[str, dict[str, str]]:
    env = {"AWS_SHARED_CREDENTIALS_FILE": str(creds / "aws" / "credentials")}
    return {"files": BUNDLE["files"], "env": env}


def test_script_turn_over_pipes(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with attached(env={"KAGURA_CREDS_DIR": str(tmp_path / "c")}) as (channel, rec):
            turn = Turn(steps=("echo hello > out.txt", "cat out.txt"), cwd=str(tmp_path))
            events = await collect(channel, turn)
            assert [e.type for e in events][-2:] == ["cost", "done"]
            results = [e for e in events if isinstance(e, ToolResultEvent)]
            assert results[-1].output == "hello\n"
            assert await channel.stop() == "stop-line"  # exited on the polite stop line
            assert rec.calls == [] and await rec.proc.wait() == 0

    asyncio.run(scenario())


def test_credentials_written_owner_only_and_revoked(tmp_path: Path) -> None:
    creds = tmp_path / "creds"

    async def scenario() -> None:
        async with attached(env={"KAGURA_CREDS_DIR": str(creds)}) as (channel, _):
            await channel.send_credentials("lease-1", _bundle(creds))
            cred_file = creds / "aws" / "credentials"
            assert cred_file.read_text().endswith("CANARY-KEY\n")
            assert mode(cred_file) == 0o600
            assert mode(creds / "aws") == 0o700 and mode(creds) == 0o700
            # The tools see the lease's env.
            turn = Turn(steps=('cat "$AWS_SHARED_CREDENTIALS_FILE"',))
            events = await collect(channel, turn)
            assert "CANARY-KEY" in next(e for e in events if isinstance(e, ToolResultEvent)).output
            # A renewal rewrites in place.
            renewed = {"files": {"aws/credentials": "renewed\n"}, "env": _bundle(creds)["env"]}
            await channel.send_credentials("lease-1", renewed)
            assert cred_file.read_text() == "renewed\n"
            await channel.revoke_credentials("lease-1")
            assert not cred_file.exists() and not (creds / "aws").exists()
            # A later turn no longer sees the env either.
            events = await collect(channel, Turn(steps=('test -z "$AWS_SHARED_CREDENTIALS_FILE"',)))
            assert isinstance(events[-1], DoneEvent)

    asyncio.run(scenario())


def test_credentials_wiped_on_stop(tmp_path: Path) -> None:
    creds = tmp_path / "creds"

    async def scenario() -> None:
        async with attached(env={"KAGURA_CREDS_DIR": str(creds)}) as (channel, _):
            await channel.send_credentials("lease-1", _bundle(creds))
            assert (creds / "aws" / "credentials").exists()
        assert list(creds.iterdir()) == []

    asyncio.run(scenario())


def test_bundle_path_escape_refused(tmp_path: Path) -> None:
    creds = tmp_path / "creds"

    async def scenario() -> None:
        async with attached(env={"KAGURA_CREDS_DIR": str(creds)}) as (channel, _):
            with pytest.raises(SetupError, match="refused"):
                await channel.send_credentials("bad", {"files": {"../escape": "x"}, "env": {}})
        assert not (tmp_path / "escape").exists()

    asyncio.run(scenario())


def test_memory_round_trip_through_host(tmp_path: Path) -> None:
    memory = DictMemory()
    memtool = f"{sys.executable} -m kagura_agent.brain.memtool"

    async def scenario() -> None:
        env = {"KAGURA_CREDS_DIR": str(tmp_path / "c")}
        async with attached(env=env, memory=memory) as (channel, _):
            steps = (
                f"{memtool} remember 'the build needs make 4'",
                f"{memtool} recall make",
                f"{memtool} get mem-1",
            )
            events = await collect(channel, Turn(steps=steps))
            outputs = [e.output for e in events if isinstance(e, ToolResultEvent)]
            assert outputs[0].strip() == '"mem-1"'
            assert '"the build needs make 4"' in outputs[1]
            assert '"id": "mem-1"' in outputs[2]
            assert isinstance(events[-1], DoneEvent)
            # The host refuses malformed requests; the step sees the refusal.
            events = await collect(channel, Turn(steps=(f"{memtool} recall x --limit 500",)))
            assert isinstance(events[-1], ErrorEvent)
            assert "limit" in next(e for e in events if isinstance(e, ToolResultEvent)).output
        assert [c[0] for c in memory.calls] == ["remember", "recall", "get"]

    asyncio.run(scenario())


def test_memory_refused_without_server(tmp_path: Path) -> None:
    memtool = f"{sys.executable} -m kagura_agent.brain.memtool"

    async def scenario() -> None:
        async with attached(env={"KAGURA_CREDS_DIR": str(tmp_path / "c")}) as (channel, _):
            events = await collect(channel, Turn(steps=(f"{memtool} get mem-1",)))
            result = next(e for e in events if isinstance(e, ToolResultEvent))
            assert "no memory" in result.output and result.is_error

    asyncio.run(scenario())


def test_oversized_line_stops_the_brain(tmp_path: Path) -> None:
    limits = ChannelLimits(max_line_bytes=4096, stop_grace_seconds=2)

    async def scenario() -> None:
        env = {"KAGURA_CREDS_DIR": str(tmp_path / "c")}
        async with attached(env=env, limits=limits) as (channel, _):
            events = await collect(channel, Turn(steps=("head -c 20000 /dev/zero | tr '\\0' x",)))
            assert isinstance(events[-1], ErrorEvent) and events[-1].code == "oversize"
            assert channel.closed

    asyncio.run(scenario())


def test_flood_without_newline_is_cut_off() -> None:
    # A "container" that writes forever without a newline and ignores stdin.
    flood = [sys.executable, "-c", "import sys\nwhile True: sys.stdout.write('x' * 65536)"]
    limits = ChannelLimits(max_line_bytes=100_000, stop_grace_seconds=0.5, kill_grace_seconds=2)

    async def scenario() -> None:
        async with attached(flood, limits=limits) as (channel, rec):
            events = await collect(channel, Turn(steps=("true",)))
            assert [(e.type, getattr(e, "code", "")) for e in events] == [("error", "oversize")]
            assert rec.calls == ["on_stop"]  # SIGTERM was enough
            assert channel.closed

    asyncio.run(scenario())


def test_malformed_event_is_a_protocol_error() -> None:
    fake = [sys.executable, "-c", 'print(\'{"type": "tool_call", "id": 1}\', flush=True)']
    limits = ChannelLimits(stop_grace_seconds=2)

    async def scenario() -> None:
        async with attached(fake, limits=limits) as (channel, _):
            events = await collect(channel, Turn(steps=("true",)))
            assert len(events) == 1 and isinstance(events[0], ErrorEvent)
            assert events[0].code == "protocol" and "tool_call" in events[0].message

    asyncio.run(scenario())


def test_idle_timeout(tmp_path: Path) -> None:
    limits = ChannelLimits(idle_seconds=0.5, stop_grace_seconds=2)

    async def scenario() -> None:
        env = {"KAGURA_CREDS_DIR": str(tmp_path / "c")}
        async with attached(env=env, limits=limits) as (channel, rec):
            started = time.monotonic()
            events = await collect(channel, Turn(steps=("sleep 30",)))
            assert isinstance(events[-1], ErrorEvent) and events[-1].code == "idle"
            assert time.monotonic() - started < 5
            assert channel.escalation == "stop-line" and rec.calls == []

    asyncio.run(scenario())


def test_wall_budget_enforced_in_container(tmp_path: Path) -> None:
    async def scenario() -> None:
        env = {"KAGURA_CREDS_DIR": str(tmp_path / "c")}
        async with attached(env=env) as (channel, _):
            started = time.monotonic()
            turn = Turn(steps=("sleep 30",), budget=Budget(wall_seconds=1))
            events = await collect(channel, turn)
            assert isinstance(events[-1], ErrorEvent) and events[-1].code == "timeout"
            assert time.monotonic() - started < 5

    asyncio.run(scenario())


def test_wall_budget_enforced_by_host_and_escalates_to_kill() -> None:
    # Ignores stdin, SIGTERM and the budget: only on_kill ends it.
    stubborn = [
        sys.executable,
        "-c",
        "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        'print(\'{"type": "text", "text": "working"}\', flush=True)\ntime.sleep(60)',
    ]
    limits = ChannelLimits(wall_grace_seconds=0.2, stop_grace_seconds=0.3, kill_grace_seconds=1)

    async def scenario() -> None:
        async with attached(stubborn, limits=limits) as (channel, rec):
            # 3 s: the stubborn process must be up and have said "working" before the
            # budget ends (0.5 s was not enough for a Python to start on a loaded machine).
            turn = Turn(steps=("true",), budget=Budget(wall_seconds=3))
            events = await collect(channel, turn)
            assert [e.type for e in events] == ["text", "error"]
            assert isinstance(events[-1], ErrorEvent) and events[-1].code == "timeout"
            assert rec.calls == ["on_stop", "on_kill"]
            assert channel.escalation == "on_kill"

    asyncio.run(scenario())


def test_crash_mid_turn_is_an_error() -> None:
    dies = [sys.executable, "-c", "import sys; sys.exit(3)"]

    async def scenario() -> None:
        async with attached(dies) as (channel, _):
            events = await collect(channel, Turn(steps=("true",)))
            assert [(e.type, getattr(e, "code", "")) for e in events] == [("error", "crash")]

    asyncio.run(scenario())


def test_resume_skips_completed_steps(tmp_path: Path) -> None:
    async def scenario() -> None:
        env = {"KAGURA_CREDS_DIR": str(tmp_path / "c")}
        async with attached(env=env) as (channel, _):
            steps = ("echo one >> log", "false", "echo three >> log")
            first = await collect(channel, Turn(steps=steps, cwd=str(tmp_path)))
            checkpoints = [e for e in first if isinstance(e, CheckpointEvent)]
            assert [c.step for c in checkpoints] == [1]
            fixed = ("echo one >> log", "true", "echo three >> log")
            done = checkpoints[-1].step
            second = await collect(
                channel, Turn(steps=fixed, cwd=str(tmp_path), completed_steps=done)
            )
            assert isinstance(second[-1], DoneEvent)
        assert (tmp_path / "log").read_text() == "one\nthree\n"

    asyncio.run(scenario())


def test_stop_mid_turn_kills_the_step(tmp_path: Path) -> None:
    """Ctrl-C path: the caller abandons the turn and stops; no step process survives."""
    pid_file = tmp_path / "pid"

    async def scenario() -> None:
        env = {"KAGURA_CREDS_DIR": str(tmp_path / "c")}
        async with attached(env=env) as (channel, rec):
            turn = Turn(steps=(f"sleep 60 & echo $! > {pid_file}; wait",))
            async for event in channel.run_turn(turn):
                assert event.type == "tool_call"
                break  # abandon the turn as soon as it is running
            await asyncio.sleep(0.3)
            assert await channel.stop() == "stop-line" and rec.calls == []
            assert await rec.proc.wait() == 0

    asyncio.run(scenario())
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + 3
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (
        not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]
    )


QUICK = ChannelLimits(idle_seconds=5, stop_grace_seconds=0.1, kill_grace_seconds=0.1)


class _Quiet:
    """A container that takes what it is sent and says nothing (the test speaks for it)."""

    def __init__(self) -> None:
        self.sent: list[bytes] = []
        self._closed = asyncio.Event()

    async def read(self) -> bytes:
        await self._closed.wait()
        return b""

    async def write(self, data: bytes) -> None:
        self.sent.append(data)

    async def close(self) -> None:
        self._closed.set()


def test_a_stop_asked_as_an_event_arrives_is_not_lost() -> None:
    """Ctrl-C (the task's cancellation) in the same pass of the loop as the brain's next
    event: the turn still ends there. With asyncio.wait_for it did not on Python 3.11 —
    wait_for returned the event and dropped the cancellation, and the run went on to its
    idle timeout (seen in CI: a kill from chat while the agent's container started)."""

    async def scenario() -> None:
        channel = BrainChannel(_Quiet(), limits=QUICK)
        events: list[object] = []

        async def consume() -> None:
            async for event in channel.run_turn(Turn(steps=("true",))):
                events.append(event)

        consumer = asyncio.create_task(consume())
        await channel.turn_sent.wait()
        await asyncio.sleep(0.05)  # the consumer waits for the first event
        channel._events.put_nowait(TextEvent(text="on its way"))
        consumer.cancel()
        with pytest.raises(asyncio.CancelledError):
            await consumer
        await channel.stop()

    asyncio.run(scenario())


def test_a_stop_asked_as_an_acknowledgement_arrives_is_not_lost() -> None:
    async def scenario() -> None:
        channel = BrainChannel(_Quiet(), limits=QUICK)
        asking = asyncio.create_task(channel.send_user_message(1, "hello"))
        await asyncio.sleep(0.05)  # sent; waiting for the container's answer
        channel._acks[("user-message-taken", "1")].set_result({"taken": True})
        asking.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asking
        await channel.stop()

    asyncio.run(scenario())
