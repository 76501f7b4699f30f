"""A leased AWS credential used inside a real agent container, renewed and withdrawn.

moto_server runs on the host, bound to the gateway address of an internal Docker network
the test creates; the hardened agent container sits on that network (a test-only path to
a host listener: apply gives agents no network, see tests/test_egress_proxy.py). The bundle reaches
the container only over its attached stdin (the brain channel); `docker inspect` and the
host's process table never see a value.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import boto3
import pytest
from membrane_helpers import copied_into, make_plan, new_run_id
from resources import missing

from kagura_agent.brain.channel import BrainChannel
from kagura_agent.brain.events import BrainEvent, DoneEvent, ToolResultEvent
from kagura_agent.brain.protocol import Turn
from kagura_agent.brain.streams import DockerAttachStream
from kagura_agent.clock import FixedClock
from kagura_agent.membrane import images
from kagura_agent.membrane.leases import Broker, LeaseRequest, deliver, keep_fresh, withdraw
from kagura_agent.state import open_store
from testing.moto import moto_server

pytestmark = pytest.mark.usefixtures("docker_client")

SOURCE = Path(__file__).resolve().parents[1] / "kagura_agent"
ROOT = {
    "aws_access_key_id": "AKIAKAGURACANARY0002",
    "aws_secret_access_key": "root/canary/" + "z" * 28,
}
LABEL = {"kagura.test": "leases-container"}
WHOAMI = 'python3 -c \'import boto3; print(boto3.client("sts").get_caller_identity()["Arn"])\''


def _agent_image(client: Any) -> str:
    ref = images.image_ref("agent")
    try:
        client.images.get(ref)
    except Exception:
        missing(f"{ref} is not built (kagura-agent images build agent)")
    return ref


async def _run(channel: BrainChannel, *steps: str) -> list[BrainEvent]:
    turn = Turn(steps=steps, cwd="/workspace")
    return [event async for event in channel.run_turn(turn)]


def _outputs(events: list[BrainEvent]) -> list[str]:
    assert isinstance(events[-1], DoneEvent), events[-1]
    return [e.output.strip() for e in events if isinstance(e, ToolResultEvent)]


def _host_cmdlines() -> str:
    texts = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            with contextlib.suppress(OSError):
                texts.append((proc / "cmdline").read_bytes().decode(errors="replace"))
    return "\n".join(texts)


def test_leased_aws_credential_inside_a_container(
    docker_client: Any, tmp_path: Path, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kagura_agent.membrane.runtime import DockerRuntime

    _agent_image(docker_client)
    network = docker_client.networks.create(
        f"kagura-leases-{uuid.uuid4().hex[:8]}", driver="bridge", internal=True, labels=LABEL
    )
    container = None
    runtime = DockerRuntime(docker_client)
    try:
        network.reload()
        gateway = network.attrs["IPAM"]["Config"][0]["Gateway"]
        with moto_server(host=gateway) as endpoint:
            iam = boto3.client("iam", endpoint_url=endpoint, region_name="us-east-1", **ROOT)
            role = iam.create_role(RoleName="deployer", AssumeRolePolicyDocument="{}")
            monkeypatch.setenv("KAGURA_TEST_AWS_ROOT", json.dumps(ROOT))
            clock = FixedClock(datetime.now(UTC))
            store = open_store()
            request = LeaseRequest.from_plan(
                {
                    "name": "aws-deployer",
                    "provider": "aws-main",
                    "type": "aws-sts",
                    "scope": "deployer",
                    "scope_spec": {
                        "role_arn": role["Role"]["Arn"],
                        "session_policy": {
                            "Version": "2012-10-17",
                            "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}],
                        },
                        "endpoint": endpoint,
                        "endpoint_addresses": [endpoint.split("//")[1].rsplit(":", 1)[0] + "/32"],
                        "bundle_endpoint": endpoint,
                    },
                    "ttl_seconds": 900,
                    "renewals": 1,
                    "budget_seconds": 1800,
                    "secret_ref": "env:KAGURA_TEST_AWS_ROOT",
                    "standing": False,
                    "class": "approved",
                }
            )
            broker = Broker(store, clock=clock)
            lease = broker.acquire(request)

            project = tmp_path / "project"
            project.mkdir()
            if os.geteuid() == 0:
                os.chown(project, 1000, 1000)
            plan = make_plan(
                project,
                image_name="agent",
                egress="proxy",
                extra_mounts=[(copied_into(project, SOURCE), "/opt/src/kagura_agent")],
            )
            container = runtime.create(
                plan, new_run_id(), environment={"PYTHONPATH": "/opt/src"}, network=network.name
            )
            sock = runtime.attach_socket(container)
            runtime.start(container)
            secrets = [json.dumps(ROOT), ROOT["aws_secret_access_key"]]

            async def scenario() -> None:
                channel = BrainChannel(
                    DockerAttachStream(sock),
                    on_stop=lambda: asyncio.to_thread(runtime.stop, container, 2),
                    on_kill=lambda: asyncio.to_thread(runtime.kill, container),
                )
                async with channel:
                    await deliver(channel, lease)
                    first_grant = lease.grant
                    [arn] = _outputs(await _run(channel, WHOAMI))
                    assert arn.endswith(f"assumed-role/deployer/kagura-{first_grant}")
                    assert lease.minted is not None
                    secrets.extend(lease.minted.sensitive_values())

                    # Renewal: the keeper mints before expiry and pushes the new bundle.
                    clock.advance(timedelta(minutes=11))
                    keeper = asyncio.create_task(keep_fresh(channel, [lease], poll_seconds=30))
                    for _ in range(200):
                        if lease.renewals_used:
                            break
                        await asyncio.sleep(0.05)
                    await asyncio.sleep(0.2)  # let the push's ack land
                    keeper.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await keeper
                    assert lease.grant != first_grant
                    secrets.extend(lease.minted.sensitive_values())
                    [arn] = _outputs(await _run(channel, WHOAMI))
                    assert arn.endswith(f"assumed-role/deployer/kagura-{lease.grant}")

                    inspected = json.dumps(docker_client.api.inspect_container(container))
                    cmdlines = _host_cmdlines()
                    for value in secrets:
                        assert value not in inspected
                        assert value not in cmdlines

                    assert await withdraw(channel, [lease]) == []
                    [gone] = _outputs(
                        await _run(channel, "test ! -e /run/kagura/creds/aws && echo wiped")
                    )
                    assert gone == "wiped"

            asyncio.run(scenario())
            store.close()
    finally:
        if container is not None:
            with contextlib.suppress(Exception):
                runtime.remove(container)
        network.remove()
