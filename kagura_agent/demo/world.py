"""What the demo makes, and removes: a throwaway folder (manifests, the project, a state
store of its own) and the scripted endpoint's container on an internal network.

The manifests are an operator's, written out: the agent image, a ``demo`` Brain (the sdk
engine) whose endpoint is ``local`` (the network and container made here, which only the
run's proxy joins), a CredentialProvider for the endpoint (a placeholder the proxy
injects: the endpoint takes no key) and nothing else. PyPI stays out of the task's
egress, so the agent has to ask for it mid-run.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from kagura_agent.demo import endpoint
from kagura_agent.errors import SetupError
from kagura_agent.membrane.runtime import docker_errors

LABEL = "dev.kagura.demo"
TOKEN_ENV = "KAGURA_DEMO_ENDPOINT_TOKEN"
# What the proxy injects towards the endpoint: it takes no key, and this is none.
TOKEN = "kagura-demo-endpoint-takes-no-key"
READY_SECONDS = 30.0
# The agent's user in the container (the plan's hardening): it must be able to write the
# project when the demo runs as root.
AGENT_UID = 1000
README = (
    "# Demo project\n\nA throwaway project for `kagura-agent demo`.\n\nTODO: say how to run it.\n"
)
PROMPT = (
    "Add a hello.py that prints a greeting, say in README.md how to run it, and note in"
    " NOTES.md what the operator tells you."
)


@dataclass(frozen=True)
class World:
    """The demo's folder: ``manifests``, ``project`` (with ``task.yml``) and ``state``."""

    root: Path
    network: str
    container: str

    @property
    def manifests(self) -> Path:
        return self.root / "manifests"

    @property
    def project(self) -> Path:
        return self.root / "project"

    @property
    def task(self) -> Path:
        return self.project / "task.yml"

    @property
    def state(self) -> Path:
        return self.root / "state"


def _manifests(image: str, network: str, container: str) -> list[dict[str, Any]]:
    head = {"apiVersion": "kagura.dev/v1"}
    return [
        {
            **head,
            "kind": "Image",
            "metadata": {"name": "demo-agent", "description": "The agent image (real CLI)."},
            "spec": {"recipe": "images/agent", "tag": image, "baseline": True},
        },
        {
            **head,
            "kind": "Brain",
            "metadata": {
                "name": "demo",
                "description": "The real Claude Code CLI against the demo's scripted endpoint.",
            },
            "spec": {
                "engine": "sdk",
                "model": "claude-sonnet-4-5",
                "permission_mode": "acceptEdits",
                "runtime": "container",
                "auth": {"mode": "api-key", "credential": "demo-endpoint"},
                "endpoint": {
                    "local": {"network": network, "container": container, "port": endpoint.PORT},
                    "baseline": True,
                },
                "budget": {"turns": 12, "wall_time": "5m", "cost_usd": 1},
            },
        },
        {
            **head,
            "kind": "CredentialProvider",
            "metadata": {
                "name": "demo-endpoint",
                "description": "A placeholder for the demo endpoint, which takes no key.",
            },
            "spec": {
                "type": "static",
                "standing": True,
                "secret": f"env:{TOKEN_ENV}",
                "static": {"env": "ANTHROPIC_API_KEY"},
                "baseline_scopes": ["api"],
                "scopes": {"api": {"description": "Call the demo endpoint."}},
            },
        },
    ]


def make_world(root: Path, image: str) -> World:
    """Write the demo's manifests and project under ``root`` (an empty folder)."""
    suffix = secrets.token_hex(4)
    world = World(root, f"kagura-demo-{suffix}", f"kagura-demo-model-{suffix}")
    world.manifests.mkdir()
    world.project.mkdir()
    world.state.mkdir(mode=0o700)
    text = yaml.safe_dump_all(_manifests(image, world.network, world.container), sort_keys=False)
    (world.manifests / "demo.yml").write_text(text, encoding="utf-8")
    (world.project / "README.md").write_text(README, encoding="utf-8")
    task = {
        "apiVersion": "kagura.dev/v1",
        "kind": "Task",
        "metadata": {"name": "demo"},
        "spec": {"brain": "demo", "image": "demo-agent", "prompt": PROMPT, "egress": []},
    }
    world.task.write_text(yaml.safe_dump(task, sort_keys=False), encoding="utf-8")
    if os.geteuid() == 0:  # the agent never runs as root: give it the throwaway project
        for path in (world.project, world.project / "README.md"):
            os.chown(path, AGENT_UID, AGENT_UID)
    return world


@contextlib.contextmanager
def endpoint_container(client: Any, image: str, world: World) -> Iterator[Any]:
    """The scripted endpoint, running in ``image`` on the world's internal network (no
    route off the machine, nothing published); removed with its network on exit."""
    labels = {LABEL: world.network}
    with docker_errors("creating the demo's network"):
        network = client.networks.create(world.network, internal=True, labels=labels)
    container = None
    try:
        source = Path(endpoint.__file__).read_text(encoding="utf-8")
        with docker_errors("starting the demo endpoint"):
            container = client.containers.run(
                image,
                ["-c", source, "--port", str(endpoint.PORT)],
                entrypoint=["python3"],
                name=world.container,
                detach=True,
                labels=labels,
                network=network.name,
                user="65534:65534",
                read_only=True,
                cap_drop=["ALL"],
                security_opt=["no-new-privileges"],
                mem_limit="128m",
                pids_limit=64,
            )
        deadline = time.monotonic() + READY_SECONDS
        while b"ready" not in container.logs():
            container.reload()
            if container.status == "exited" or time.monotonic() > deadline:
                tail = container.logs()[-1000:].decode(errors="replace")
                raise SetupError(f"the demo endpoint did not start: {tail}")
            time.sleep(0.05)
        yield container
    finally:
        remove(client, world.network)


def remove(client: Any, name: str) -> None:
    """Remove what the demo labelled ``name``: its containers, then its network."""
    with contextlib.suppress(Exception):
        for found in client.containers.list(all=True, filters={"label": f"{LABEL}={name}"}):
            with contextlib.suppress(Exception):
                found.remove(force=True)
    with contextlib.suppress(Exception):
        for net in client.networks.list(filters={"label": f"{LABEL}={name}"}):
            with contextlib.suppress(Exception):
                net.remove()
