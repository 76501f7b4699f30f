"""The agent container's own processes start where the agent cannot write.

Run 1's agent writes shadowing modules into /workspace (tests/planting.py: socket.py,
json.py, asyncio/, uuid.py, kagura_agent/, claude_agent_sdk/, sitecustomize.py, a .pth
...), each leaving a marker in /workspace/.marks when imported. Run 2 on the same root —
the sdk engine driving the fake claude CLI, behind the egress forwarder — starts its
launcher, forwarder and entrypoint (PID 1, which imports claude_agent_sdk for the turn)
isolated in /: none of them may import a planted module, and the run must work. Run 3,
with no egress (no launcher) in the packaged image, starts in / too.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from apply_helpers import cli_env, json_lines, kagura, last_json, make_project, manifest_set
from apply_helpers import write_task as write_task_file
from planting import PLANTED, marks_left, planting_step

from kagura_agent.brain.guard import writable_import_paths
from kagura_agent.membrane import hardening
from kagura_agent.membrane.egress import forwarder
from testing.agent_test_image import ensure_agent_test_image

API_KEY = "sk-ant-kagura-start-" + "s" * 30
MARKS = "/workspace/.marks"


def _manifests(tmp_path: Path, image_ref: str) -> Path:
    image = {
        "kind": "Image",
        "metadata": {"name": "agent-test"},
        "spec": {"recipe": "images/agent", "tag": image_ref, "baseline": True},
    }
    return manifest_set(tmp_path, image)


def _apply(project: Path, manifests: Path, state_dir: Path, spec: dict[str, Any]) -> Any:
    task = write_task_file(project, "start", {"image": "agent-test", **spec})
    if spec.get("image") is None:  # the packaged default image
        task.write_text(task.read_text().replace("  image: null\n", ""))
    env = cli_env(state_dir, ANTHROPIC_API_KEY=API_KEY)
    return kagura(["apply", "--yes", "--json", "--manifests", str(manifests), str(task)], env)


def test_run_2_imports_nothing_run_1_wrote_into_the_workspace(
    docker_client: Any, tmp_path: Path, state_dir: Path
) -> None:
    image_ref = ensure_agent_test_image(docker_client)
    manifests = _manifests(tmp_path, image_ref)
    project = make_project(tmp_path)
    first = _apply(
        project,
        manifests,
        state_dir,
        {"steps": [f"mkdir -p {MARKS} && " + planting_step(MARKS, "run2")], "verify": ["true"]},
    )
    assert first.returncode == 0, first.stderr[-4000:]
    for rel in PLANTED:
        assert (project / rel).is_file(), rel  # run 1's agent planted them all
    marks = project / ".marks"
    assert marks_left(marks) == []

    second = _apply(
        project,
        manifests,
        state_dir,
        {
            "brain": "claude",
            "prompt": "run: echo two > two.txt",
            "egress": ["anthropic"],
            "verify": ["grep -qx two two.txt"],
        },
    )
    assert marks_left(marks) == []
    assert second.returncode == 0, second.stderr[-4000:]
    result = last_json(second.stdout)
    assert result["outcome"] == "success"
    events = [e for e in json_lines(second.stderr) if e.get("kind") == "brain"]
    assert [e["type"] for e in events][-1] == "done"
    # The sdk engine ran (claude_agent_sdk was imported, from the image) and its CLI worked
    # in the workspace: the agent's own working directory is unchanged.
    [call] = [json.loads(line) for line in (project / ".fake-calls.jsonl").read_text().splitlines()]
    assert call["mode"] == "sdk" and call["cwd"] == "/workspace"

    # Run 3: no egress (no launcher: the image's entrypoint is the container's command),
    # in the packaged agent image, whose entrypoint may predate -I: it starts in / all
    # the same, where nothing can be planted.
    third = _apply(
        project,
        manifests,
        state_dir,
        {
            "image": None,
            "steps": ["echo three > three.txt"],
            "verify": ["grep -qx three three.txt"],
        },
    )
    assert marks_left(marks) == []
    assert third.returncode == 0, third.stderr[-4000:]


def test_every_kagura_python_in_the_container_starts_isolated_in_the_root() -> None:
    """What apply hands Docker: the container starts in /, the launcher and the forwarder
    (in its argv and as exec'd by the stub) run python3 -I, and the stub moves to / before
    it execs the image's entrypoint."""
    launcher = forwarder.launcher([("/run/kagura-egress/proxy.sock", 3128)], ["python3", "x"])
    assert launcher[:3] == ["python3", "-I", "-c"]
    stub = launcher[3]
    assert stub.splitlines()[1] == 'os.chdir("/")'
    assert '["python3", "-I", "-c", source' in stub
    assert forwarder.command("/s", 1)[:3] == ["python3", "-I", "-c"]
    assert hardening.START_DIR == "/"
    recipe = (Path(__file__).resolve().parents[1] / "images/agent/Dockerfile").read_text()
    assert 'ENTRYPOINT ["python3", "-I", "-m", "kagura_agent.brain.entrypoint"]' in recipe


def test_the_entrypoints_check_names_relative_and_writable_import_paths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "path", ["", "lib", str(tmp_path), str(tmp_path / "absent")])
    assert writable_import_paths() == ["''", "lib", str(tmp_path)]


def test_an_entrypoint_started_in_the_workspace_refuses_to_serve(
    docker_client: Any, tmp_path: Path
) -> None:
    """Started the old way (``python3 -m`` in /workspace, which the agent writes), PID 1
    says why and serves nothing."""
    image_ref = ensure_agent_test_image(docker_client)
    project = make_project(tmp_path)
    container = docker_client.containers.run(
        image_ref,
        entrypoint=["python3", "-m", "kagura_agent.brain.entrypoint"],
        working_dir="/workspace",
        user="1000:1000",
        network_mode="none",
        read_only=True,
        volumes={str(project): {"bind": "/workspace", "mode": "rw"}},
        labels={"dev.kagura.test": "container-start"},
        detach=True,
    )
    try:
        status = container.wait(timeout=60)
        logs = container.logs().decode()
    finally:
        container.remove(force=True)
    assert status["StatusCode"] == 70, logs
    assert "modules could be planted where it imports from (/workspace)" in logs
