"""``kagura-agent demo`` end to end: the real Claude Code CLI (the agent test image with
the bundled CLI) in the membrane against the demo's scripted endpoint, as a newcomer runs
it from the README: with ``--yes`` (no terminal), on a terminal (a pty: the steering
message typed, the mid-run question answered), and stopped with Ctrl-C. What it started
is gone afterwards: its endpoint and network (its own label) and the run's containers,
proxy and networks (found by the demo's project mount, so nothing of another test's)."""

from __future__ import annotations

import os
import pty
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from apply_helpers import REPO, cli_env, leftovers

from kagura_agent.demo.drive import STEERING
from kagura_agent.demo.endpoint import SAYS
from kagura_agent.demo.world import LABEL
from testing.agent_test_image import ensure_agent_test_image

pytestmark = pytest.mark.usefixtures("docker_client")

CANARY = "sk-ant-demo-canary-" + "k" * 32
ACCESS = "mcp__kagura-membrane__request_access"


@pytest.fixture(scope="module")
def real_image(docker_client: Any) -> str:
    return ensure_agent_test_image(docker_client, real_cli=True)


def _env(tmp_path: Path, state_dir: Path) -> dict[str, str]:
    # TMPDIR: the demo's throwaway folder is made under the test's own.
    return cli_env(state_dir, ANTHROPIC_API_KEY=CANARY, TMPDIR=str(tmp_path))


def _argv(image: str, *more: str) -> list[str]:
    return [sys.executable, "-m", "kagura_agent", "demo", "--image", image, *more]


def _names(output: str) -> tuple[str, str]:
    """(the demo's network, the run's id) as the demo printed them."""
    network = re.search(r"on internal network (kagura-demo-[0-9a-f]+)", output)
    run = re.search(r"mid-run request m-([0-9a-f]{12})-", output)
    assert network and run, output[-3000:]
    return network.group(1), f"run-{run.group(1)}"


def _demo_objects(client: Any, network: str) -> list[str]:
    label = {"label": f"{LABEL}={network}"}
    found = [f"container {c.name}" for c in client.containers.list(all=True, filters=label)]
    return found + [f"network {n.name}" for n in client.networks.list(filters=label)]


def _files(folder: Path) -> str:
    return "".join(
        p.read_text(errors="replace")
        for p in folder.rglob("*")
        if p.is_file() and p.stat().st_size < 10**7
    )


def test_the_demo_runs_the_real_cli_end_to_end_without_a_terminal(
    docker_client: Any, real_image: str, tmp_path: Path, state_dir: Path
) -> None:
    started = time.monotonic()
    done = subprocess.run(
        _argv(real_image, "--yes", "--keep"),
        env=_env(tmp_path, state_dir),
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=400,
    )
    wall = time.monotonic() - started
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-6000:]
    print(f"demo --yes: {wall:.1f}s wall")
    network, run_id = _names(out)
    # The plan was shown, with the endpoint on this machine.
    assert "ON THIS MACHINE: container kagura-demo-model-" in out
    # Tool calls live, each answer saying it is scripted.
    for tool in ("▸ Write:", "▸ Read:", "▸ Edit:", f"▸ {ACCESS}:"):
        assert tool in out, out[-6000:]
    assert out.count(SAYS) >= 6
    # The question, the demo's answer and the steering message, each said.
    assert "? the agent asks, mid-run:\nThe brain asks for egress:pypi mid-run" in out
    assert "» --yes: answered yes on the operator's behalf" in out
    assert f"» steering the agent (--yes: the demo's message): {STEERING}" in out
    assert "↳ message 1 reached the brain as its next user message" in out
    assert "egress:pypi approved by demo:--yes via demo" in out
    # The project was edited by the CLI, and the agent saw the answer and the message.
    [root] = list(tmp_path.glob("kagura-demo-*"))
    project = root / "project"
    assert (project / "hello.py").read_text() == 'print("hello from the kagura-agent demo")\n'
    assert "Run `python3 hello.py`." in (project / "README.md").read_text()
    notes = (project / "NOTES.md").read_text()
    assert "request_access answered: granted: egress:pypi approved by demo:--yes" in notes
    assert f"Messages from the operator while I worked:\n{STEERING}\n" in notes
    # No key anywhere: the operator's environment had one, the demo never used it.
    assert CANARY not in out and CANARY not in _files(root)
    # Nothing the demo or its run started is left.
    assert _demo_objects(docker_client, network) == []
    assert leftovers(docker_client, run_id) == []


def _read_until(fd: int, text: str, seen: list[str], timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while text not in "".join(seen):
        assert time.monotonic() < deadline, "".join(seen)[-4000:]
        ready, _, _ = select.select([fd], [], [], 1.0)
        if ready:
            try:
                seen.append(os.read(fd, 65536).decode(errors="replace"))
            except OSError:  # the child closed the terminal
                break


def test_on_a_terminal_the_operator_steers_and_answers_the_approval_prompt(
    docker_client: Any, real_image: str, tmp_path: Path, state_dir: Path
) -> None:
    primary, secondary = pty.openpty()
    proc = subprocess.Popen(
        _argv(real_image, "--keep"),
        env=_env(tmp_path, state_dir),
        cwd=REPO,
        stdin=secondary,
        stdout=secondary,
        stderr=secondary,
        close_fds=True,
    )
    os.close(secondary)
    seen: list[str] = []
    try:
        _read_until(primary, "(steering):", seen)
        _read_until(primary, "s) > ", seen)
        os.write(primary, b"typed at the terminal: add a line\n")
        _read_until(primary, "[y/N]", seen)
        os.write(primary, b"y\n")
        _read_until(primary, "removed the demo's", seen)
        assert proc.wait(timeout=120) == 0, "".join(seen)[-4000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(primary)
    out = "".join(seen)
    network, run_id = _names(out)
    assert "? the agent asks, mid-run:" in out and "Approve? [y/N]" in out
    [root] = list(tmp_path.glob("kagura-demo-*"))
    notes = (root / "project" / "NOTES.md").read_text()
    assert "approved by" in notes and "via demo" in notes and "--yes" not in notes
    assert "typed at the terminal: add a line" in notes
    assert _demo_objects(docker_client, network) == []
    assert leftovers(docker_client, run_id) == []


def test_ctrl_c_mid_run_leaves_nothing_behind(
    docker_client: Any, real_image: str, tmp_path: Path, state_dir: Path
) -> None:
    proc = subprocess.Popen(
        _argv(real_image, "--yes"),
        env=_env(tmp_path, state_dir),
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    lines: list[str] = []
    run_id = network = ""
    for line in proc.stdout:
        lines.append(line)
        found = re.search(r"on internal network (kagura-demo-[0-9a-f]+)", line)
        network = found.group(1) if found else network
        if "▸ Write:" in line:
            run_id = _running_run(docker_client, tmp_path)
            proc.send_signal(signal.SIGINT)
            break
    rest, _ = proc.communicate(timeout=120)
    out = "".join(lines) + rest
    assert proc.returncode == 130, out[-4000:]
    assert network and run_id, out[-4000:]
    assert "removed the demo endpoint" in out
    assert _demo_objects(docker_client, network) == []
    assert leftovers(docker_client, run_id) == []
    assert list(tmp_path.glob("kagura-demo-*")) == []


def _running_run(client: Any, tmp_path: Path) -> str:
    """The run id of the agent container that mounts a project under ``tmp_path``."""
    for container in client.containers.list(filters={"label": "dev.kagura.run"}):
        mounts = container.attrs.get("Mounts") or []
        if any(str(m.get("Source", "")).startswith(str(tmp_path)) for m in mounts):
            return str(container.labels["dev.kagura.run"])
    return ""


def test_missing_images_and_a_missing_docker_say_what_to_run(
    docker_client: Any, tmp_path: Path, state_dir: Path
) -> None:
    env = _env(tmp_path, state_dir)
    done = subprocess.run(
        _argv("kagura/no-such-image:0"), env=env, cwd=REPO, capture_output=True, text=True
    )
    assert done.returncode == 3, done.stderr
    assert "the demo needs the image(s) kagura/no-such-image:0" in done.stderr
    assert "kagura-agent images build --missing" in done.stderr
    assert "Traceback" not in done.stderr
    env["DOCKER_HOST"] = f"unix://{tmp_path}/no-docker.sock"
    done = subprocess.run(_argv("x:1"), env=env, cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 3 and "Docker Engine unreachable" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert list(tmp_path.glob("kagura-demo-*")) == []
