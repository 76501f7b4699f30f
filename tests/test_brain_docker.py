"""The entrypoint inside the real agent image, attached through the membrane runtime.

The container is created from a membrane test plan (hardened: read-only root, uid 1000,
no network). This checkout's ``kagura_agent`` and the fake CLIs are bind-mounted
read-only, so the test exercises the current code even when the image predates it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path
from typing import Any

import pytest
from brain_helpers import DictMemory
from membrane_helpers import copied_into, make_plan, new_run_id
from resources import missing

from kagura_agent.brain.channel import BrainChannel, ChannelLimits
from kagura_agent.brain.events import BrainEvent, CostEvent, DoneEvent, ToolResultEvent
from kagura_agent.brain.protocol import Turn
from kagura_agent.brain.streams import DockerAttachStream
from kagura_agent.membrane import images
from testing.fake_claude import FAKE_DIR

pytestmark = pytest.mark.usefixtures("docker_client")

SOURCE = Path(__file__).resolve().parents[1] / "kagura_agent"
IMAGE_PATH = "/opt/fakes:/opt/kagura/bin:/usr/local/bin:/usr/bin:/bin"


def _agent_image(client: Any) -> None:
    ref = images.image_ref("agent")
    try:
        client.images.get(ref)
    except Exception:
        missing(f"{ref} is not built (kagura-agent images build agent)")


async def _events(channel: BrainChannel, turn: Turn) -> list[BrainEvent]:
    return [event async for event in channel.run_turn(turn)]


def test_entrypoint_in_agent_container(docker_client: Any, tmp_path: Path) -> None:
    from kagura_agent.membrane.runtime import DockerRuntime

    _agent_image(docker_client)
    project = tmp_path / "project"
    project.mkdir()
    # The agent runs as uid 1000; the operator's checkout would be theirs.
    if os.geteuid() == 0:
        os.chown(project, 1000, 1000)
    else:
        project.chmod(0o777)
    runtime = DockerRuntime(docker_client)
    plan = make_plan(
        project,
        image_name="agent",
        extra_mounts=[
            (copied_into(project, FAKE_DIR), "/opt/fakes"),
            (copied_into(project, SOURCE), "/opt/src/kagura_agent"),
        ],
    )
    env = {"PYTHONPATH": "/opt/src", "PATH": IMAGE_PATH, "KAGURA_CLAUDE_CLI": "/opt/fakes/claude"}
    container = runtime.create(plan, new_run_id(), environment=env)
    memory = DictMemory()
    try:
        sock = runtime.attach_socket(container)
        runtime.start(container)

        async def scenario() -> str:
            channel = BrainChannel(
                DockerAttachStream(sock),
                memory=memory,
                limits=ChannelLimits(stop_grace_seconds=5),
                on_stop=lambda: asyncio.to_thread(runtime.stop, container, 2),
                on_kill=lambda: asyncio.to_thread(runtime.kill, container),
            )
            async with channel:
                bundle = {
                    "files": {"aws/credentials": "[default]\naws_access_key_id = CANARY\n"},
                    "env": {"AWS_SHARED_CREDENTIALS_FILE": "/run/kagura/creds/aws/credentials"},
                }
                await channel.send_credentials("lease-1", bundle)
                steps = (
                    'stat -c "%a %u" "$AWS_SHARED_CREDENTIALS_FILE" /run/kagura/creds',
                    "python3 -m kagura_agent.brain.memtool remember 'from the container'",
                )
                script = await _events(channel, Turn(steps=steps, cwd="/workspace"))
                outputs = [e.output for e in script if isinstance(e, ToolResultEvent)]
                assert outputs[0].split() == ["600", "1000", "700", "1000"]
                assert outputs[1].strip() == '"mem-1"'
                assert isinstance(script[-1], DoneEvent)

                prompt = "run: echo in-container > proof.txt\nremember: sdk inside"
                sdk = await _events(channel, Turn(engine="sdk", prompt=prompt, cwd="/workspace"))
                cost = next(e for e in sdk if isinstance(e, CostEvent))
                assert cost.usd and cost.usd > 0 and isinstance(sdk[-1], DoneEvent)

                kb = Turn(engine="kagura-brain", prompt="hello", cwd="/workspace")
                brain = await _events(channel, kb)
                assert isinstance(brain[-1], DoneEvent) and "fake claude" in (
                    brain[-1].result or ""
                )

                await channel.revoke_credentials("lease-1")
                gone = await _events(channel, Turn(steps=("test ! -e /run/kagura/creds/aws",)))
                assert isinstance(gone[-1], DoneEvent)
            return channel.escalation or ""

        assert asyncio.run(scenario()) == "stop-line"
        assert runtime.wait(container, timeout=10)["exit_code"] == 0
    finally:
        with contextlib.suppress(Exception):
            runtime.remove(container)
    assert (project / "proof.txt").read_text() == "in-container\n"
    assert [text for op, text in memory.calls] == ["from the container", "sdk inside"]
