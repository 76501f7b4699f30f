"""Every way a run can end early takes the same clean-up path.

Each run here has the full set of things to clean up: a leased credential (a static
provider, so its ledger row must be closed), this run's egress proxy and networks, and
the agent container. Ctrl-C, SIGTERM, a brain past its wall budget, a brain flooding
its channel, a brain crash and a Docker error each end with none of them left and the
documented exit code; after ``kill -9`` the next apply sweeps what the dead run left.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from apply_helpers import (
    NOWHERE,
    REPO,
    cli_env,
    json_lines,
    leftovers,
    live_leases,
    make_project,
    manifest_set,
    run_ids,
    run_row,
    spawn,
    token_provider,
    wait_for_container,
    wait_for_run,
    write_task,
)
from resources import missing

pytestmark = pytest.mark.usefixtures("docker_client")

TOKEN = "kagura-apply-canary-" + "t" * 24
TEST_MANIFESTS: tuple[dict[str, Any], ...] = (
    token_provider(),
    NOWHERE,
    {
        "kind": "Brain",
        "metadata": {"name": "strict"},
        "spec": {"engine": "script", "max_line_bytes": 65536, "budget": {"wall_time": "3s"}},
    },
    {
        "kind": "Brain",
        "metadata": {"name": "capped"},
        "spec": {"engine": "script", "max_line_bytes": 65536},
    },
)


def _start(
    tmp_path: Path, state_dir: Path, steps: list[str], *, brain: str = "script"
) -> tuple[Any, dict[str, str]]:
    manifests = manifest_set(tmp_path, *TEST_MANIFESTS)
    project = make_project(tmp_path)
    spec = {
        "brain": brain,
        "egress": ["nowhere"],
        "credentials": [{"provider": "token", "scope": "use"}],
        "steps": steps,
    }
    task = write_task(project, "ends-early", spec)
    env = cli_env(state_dir, KAGURA_TEST_TOKEN=TOKEN)
    proc = spawn(["apply", "--yes", "--json", "--manifests", str(manifests), str(task)], env)
    return proc, env


def _finish(proc: Any, timeout: float = 90) -> str:
    try:
        output, _ = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
    return str(output)


def _assert_nothing_left(client: Any, run_id: str, env: dict[str, str], output: str) -> None:
    assert leftovers(client, run_id) == [], output
    assert live_leases(env) == [], output
    assert TOKEN not in output  # the live view redacts the leased value


@pytest.mark.parametrize(
    ("signum", "exit_code", "outcome"),
    [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")],
)
def test_signal_mid_run_cleans_up(
    docker_client: Any,
    tmp_path: Path,
    state_dir: Path,
    signum: signal.Signals,
    exit_code: int,
    outcome: str,
) -> None:
    proc, env = _start(tmp_path, state_dir, ['test -n "$TEST_TOKEN"', "sleep 600"])
    run_id = wait_for_run(state_dir, proc)
    wait_for_container(docker_client, run_id)
    assert len(leftovers(docker_client, run_id)) == 4  # agent, proxy, network, socket volume
    assert len(live_leases(env)) == 1
    time.sleep(0.5)  # let the brain reach the sleeping step
    proc.send_signal(signum)
    output = _finish(proc)
    assert proc.returncode == exit_code, output
    _assert_nothing_left(docker_client, run_id, env, output)
    assert run_row(state_dir, run_id)["outcome"] == outcome


def test_sigint_stops_an_apply_started_with_sigint_ignored(
    docker_client: Any, tmp_path: Path, state_dir: Path
) -> None:
    """Started under nohup or as a background job of a script, a process inherits SIGINT
    ignored; the cockpit's kill, a dispatcher and the parent-death signal still stop apply
    with SIGINT, so apply takes it back (this failed: the run went on to its end)."""
    manifests = manifest_set(tmp_path, *TEST_MANIFESTS)
    project = make_project(tmp_path)
    spec = {"brain": "script", "egress": ["nowhere"], "steps": ["sleep 600"]}
    task = write_task(project, "ignored", spec)
    env = cli_env(state_dir)
    argv = ["apply", "--yes", "--json", "--manifests", str(manifests), str(task)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "kagura_agent", *argv],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=REPO,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    run_id = wait_for_run(state_dir, proc)
    wait_for_container(docker_client, run_id)
    time.sleep(0.5)  # let the brain reach the sleeping step
    proc.send_signal(signal.SIGINT)
    output = _finish(proc)
    assert proc.returncode == 130, output
    assert leftovers(docker_client, run_id) == [], output
    assert run_row(state_dir, run_id)["outcome"] == "interrupted"


def test_brain_past_its_wall_budget_is_stopped(
    docker_client: Any, tmp_path: Path, state_dir: Path
) -> None:
    started = time.monotonic()
    proc, env = _start(tmp_path, state_dir, ["sleep 600"], brain="strict")
    output = _finish(proc)
    assert proc.returncode == 1, output
    assert time.monotonic() - started < 60, "the 3 s budget was not enforced"
    errors = [e for e in json_lines(output) if e.get("type") == "error"]
    assert errors and errors[0]["code"] == "timeout", errors
    [run_id] = run_ids(state_dir)
    _assert_nothing_left(docker_client, run_id, env, output)
    assert run_row(state_dir, run_id)["outcome"] == "failed"


# A compromised brain writing straight onto its channel (the stdout Docker attached to),
# past the engine and the entrypoint's own writer. The agent's tools must not be able to
# reach that stream, so the test plays the compromised brain from the host: as root it
# writes to the stdout of the container's init process, which is the channel's pipe.
FLOODS = {
    "huge-line": ("head -c 50000000 /dev/zero | tr '\\0' x > {fd}", "oversize"),
    "endless-lines": ("yes flood > {fd}", "protocol"),
}


def _wait_for_file(path: Path, proc: Any, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"apply exited {proc.returncode}: {proc.stdout.read()[-3000:]}")
        assert time.monotonic() < deadline, f"{path.name} never appeared"
        time.sleep(0.05)


@pytest.mark.parametrize("flood", sorted(FLOODS))
def test_brain_flooding_its_channel_is_stopped(
    docker_client: Any, tmp_path: Path, state_dir: Path, flood: str
) -> None:
    if os.geteuid() != 0:
        missing("writing onto a container's channel from the host needs root")
    command, code = FLOODS[flood]
    proc, env = _start(tmp_path, state_dir, ["touch .busy && sleep 600"], brain="capped")
    run_id = wait_for_run(state_dir, proc)
    container = wait_for_container(docker_client, run_id)
    _wait_for_file(tmp_path / "project" / ".busy", proc)  # the turn is running
    init_pid = container.attrs["State"]["Pid"]
    flooder = subprocess.Popen(["sh", "-c", command.format(fd=f"/proc/{init_pid}/fd/1")])
    try:
        output = _finish(proc)
    finally:
        flooder.kill()
        flooder.wait()
    assert proc.returncode == 1, output[-3000:]
    assert len(output) < 2_000_000, "the flood reached the terminal"
    errors = [e for e in json_lines(output) if e.get("type") == "error"]
    assert errors and errors[0]["code"] == code, (errors, output[-3000:])
    _assert_nothing_left(docker_client, run_id, env, output[-3000:])


def test_after_kill_9_the_next_apply_sweeps_the_dead_run(
    docker_client: Any, tmp_path: Path, state_dir: Path
) -> None:
    proc, env = _start(tmp_path / "first", state_dir, ["sleep 600"])
    dead = wait_for_run(state_dir, proc)
    wait_for_container(docker_client, dead)
    proc.kill()
    proc.wait(timeout=30)
    assert leftovers(docker_client, dead) != []  # nothing could clean up after SIGKILL
    assert len(live_leases(env)) == 1

    again, env = _start(tmp_path / "second", state_dir, ["true"])
    output = _finish(again)
    assert again.returncode == 0, output
    assert "removed what crashed runs left" in output
    assert leftovers(docker_client, dead) == []
    assert run_row(state_dir, dead)["outcome"] == "crashed"
    # A static secret cannot be revoked: the sweep keeps the dead run's row in view as
    # lapsing (closed at its expiry by a later sweep), and the second run's row is closed.
    assert "1 lapsing" in output
    [orphan] = live_leases(env)
    assert orphan["run_id"] == dead and orphan["owner_pid"] == proc.pid
    [_, second] = run_ids(state_dir)
    assert leftovers(docker_client, second) == []


def test_docker_error_mid_run_takes_the_same_clean_up_path(
    docker_client: Any, tmp_path: Path, state_dir: Path
) -> None:
    # An OCI runtime this daemon does not have: Docker refuses the container only after
    # the lease is minted and the egress proxy is up.
    assert "kata" not in (docker_client.info().get("Runtimes") or {})
    broken = {
        "kind": "Image",
        "metadata": {"name": "agent-kata"},
        "spec": {
            "recipe": "images/agent",
            "tag": "kagura/agent:0.1.0",
            "baseline": True,
            "hardening": {"runtime": "kata"},
        },
    }
    manifests = manifest_set(tmp_path, *TEST_MANIFESTS, broken)
    project = make_project(tmp_path)
    spec = {
        "image": "agent-kata",
        "egress": ["nowhere"],
        "credentials": [{"provider": "token", "scope": "use"}],
        "steps": ["true"],
    }
    task = write_task(project, "docker-error", spec)
    env = cli_env(state_dir, KAGURA_TEST_TOKEN=TOKEN)
    proc = spawn(["apply", "--yes", "--json", "--manifests", str(manifests), str(task)], env)
    output = _finish(proc)
    assert proc.returncode == 3, output
    assert "kata" in output
    [run_id] = run_ids(state_dir)
    _assert_nothing_left(docker_client, run_id, env, output)
    assert run_row(state_dir, run_id)["outcome"] == "failed"


def test_brain_crash_mid_run_cleans_up(docker_client: Any, tmp_path: Path, state_dir: Path) -> None:
    # The step kills its parent, the in-container entrypoint: the channel ends mid-turn.
    proc, env = _start(tmp_path, state_dir, ["kill -9 $PPID; sleep 600"])
    output = _finish(proc)
    assert proc.returncode == 1, output
    errors = [e for e in json_lines(output) if e.get("type") == "error"]
    assert errors and errors[0]["code"] == "crash", errors
    [run_id] = run_ids(state_dir)
    _assert_nothing_left(docker_client, run_id, env, output)
