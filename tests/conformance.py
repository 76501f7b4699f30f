"""The brain conformance suite's world: the real Claude Code CLI through ``kagura-agent apply``.

The agent image is kagura/agent with this checkout's source and no fake CLI
(``ensure_agent_test_image(real_cli=True)``): the sdk engine runs the CLI claude-agent-sdk
bundles. The model is testing/fake_messages_api.py in a container on an internal network,
told turn by turn what to do (a script); the run's proxy injects the operator's key
towards it (testing.fake_anthropic.route_env, which also reaches child applies a dispatch
starts) and has no route off the machine.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from apply_helpers import (
    REPO,
    cli_env,
    json_lines,
    last_json,
    make_project,
    manifest_set,
    write_task,
)

from testing.fake_anthropic import route_env
from testing.fake_messages_api import FakeMessagesApiContainer, fake_messages_api_container

API_KEY = "sk-ant-conformance-" + "r" * 32
LABEL = {"dev.kagura.test": "conformance"}
IMAGE_NAME = "agent-real"


def image_manifest(image: str) -> dict[str, Any]:
    return {
        "kind": "Image",
        "metadata": {"name": IMAGE_NAME},
        "spec": {"recipe": "images/agent", "tag": image, "baseline": True},
    }


@contextlib.contextmanager
def model(
    client: Any, base_image: str, script: dict[str, Any]
) -> Iterator[FakeMessagesApiContainer]:
    """The scripted model, for as long as the test needs it."""
    with fake_messages_api_container(client, base_image, LABEL, script) as fake:
        yield fake


def env(state_dir: Path, fake: FakeMessagesApiContainer, **extra: str) -> dict[str, str]:
    """A ``kagura-agent`` process's environment: the test's state, the operator's key, the
    run's model calls routed to ``fake``."""
    return cli_env(state_dir, ANTHROPIC_API_KEY=API_KEY, **route_env(fake), **extra)


def task(
    tmp_path: Path,
    image: str,
    spec: dict[str, Any],
    *extra: dict[str, Any],
    name: str = "conformance",
) -> tuple[Path, Path, Path]:
    """(manifests folder, task file, project root) for a ``claude`` task on the real CLI."""
    folder = manifest_set(tmp_path, image_manifest(image), *extra)
    project = make_project(tmp_path)
    full = {"image": IMAGE_NAME, "brain": "claude", "egress": ["anthropic"], **spec}
    return folder, write_task(project, name, full), project


def apply_argv(folder: Path, task_file: Path, *more: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "kagura_agent",
        "apply",
        "--yes",
        "--json",
        *more,
        "--manifests",
        str(folder),
        str(task_file),
    ]


def apply(
    argv: list[str], environment: dict[str, str], timeout: float = 300
) -> tuple[int, dict[str, Any], list[dict[str, Any]], str]:
    """Run apply to its end: (exit code, its JSON result, the live JSON lines, stderr)."""
    done = subprocess.run(
        argv, env=environment, cwd=REPO, capture_output=True, text=True, timeout=timeout
    )
    result = last_json(done.stdout) if done.stdout.strip() else {}
    return done.returncode, result, json_lines(done.stderr), done.stderr


def brain_events(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [item for item in lines if item.get("kind") == "brain"]


def agent_calls(
    fake: FakeMessagesApiContainer, conversation: int | None = 0
) -> list[dict[str, Any]]:
    """The model calls of one scripted conversation (tool-carrying, answered)."""
    return [
        r
        for r in fake.records()
        if r.get("turn", {}).get("agent") and r["turn"]["conversation"] == conversation
    ]


def egress_decisions(state_dir: Path, run_id: str) -> list[dict[str, Any]]:
    """The proxy's decisions of ``run_id`` as the state store keeps them."""
    with sqlite3.connect(state_dir / "state.db") as conn:
        conn.row_factory = sqlite3.Row
        rows = conn.execute(
            "SELECT method, host, port, inport, path, status, decision, reason"
            " FROM egress_events WHERE run_id = ? ORDER BY seq",
            (run_id,),
        ).fetchall()
    return [dict(row) for row in rows]


def summary(decisions: list[dict[str, Any]]) -> list[str]:
    """One line per distinct (method, host, port, path, decision, reason), with a count."""
    counts: dict[str, int] = {}
    for d in decisions:
        key = f"{d['method']} {d['host']}:{d['port']} {d['path'] or '-'} via {d['inport']}"
        key += f" -> {d['decision']} {d['reason']} {d['status']}"
        counts[key] = counts.get(key, 0) + 1
    return [f"{n} x {key}" for key, n in counts.items()]


def dump(obj: object) -> str:
    return json.dumps(obj, indent=1)[:6000]


def launch(
    folder: Path, task_file: Path, environment: dict[str, str], *, approval_timeout: float = 60
) -> subprocess.Popen[str]:
    """apply as serve runs it (``--steer-stdin``): its stdin takes steering and nudges."""
    more = ("--steer-stdin", "--approval-timeout", str(approval_timeout))
    return subprocess.Popen(
        apply_argv(folder, task_file, *more),
        env=environment,
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def bash(command: str, **turn: Any) -> dict[str, Any]:
    """A scripted turn: one Bash call."""
    return {"tools": [{"name": "Bash", "input": {"command": command}}], **turn}


def brain(mode: str) -> dict[str, Any]:
    """The shipped ``claude`` brain with another permission mode, named ``claude-MODE``
    (lower case). The shipped one (acceptEdits) lets the CLI edit files but refuses most
    commands (a loop, python3, sleep: "requires approval"; an sdk run has nobody to ask),
    so the tests whose agent runs programs use ``bypassPermissions``."""
    spec = {
        "engine": "sdk",
        "model": "claude-sonnet-4-5",
        "permission_mode": mode,
        "runtime": "container",
        "auth": {"mode": "api-key", "credential": "anthropic"},
        "budget": {"turns": 30, "wall_time": "10m", "cost_usd": 2},
    }
    return {"kind": "Brain", "metadata": {"name": f"claude-{mode.lower()}"}, "spec": spec}


BYPASS = "claude-bypasspermissions"
