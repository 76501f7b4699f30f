"""The agent's egress forwarder is started by its container's own command, real Docker.

apply creates the agent's container with the forwarder's launcher in front of the
image's entrypoint (forwarder.launcher): the forwarder listens before the entrypoint
runs, so there is no ``docker exec`` into the agent's container and no readiness line to
wait for. Seen from inside a run: one forwarder process, a child of the entrypoint (PID
1, the kagura entrypoint as its own init), out of the tools' reach (not dumpable: its
/proc/PID/fd is refused them), holding no end of the brain channel (seen from the host:
its stdin, stdout and stderr are /dev/null, and none of the entrypoint's pipes), and 127.0.0.1:3128
answers.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from apply_helpers import (
    NOWHERE,
    cli_env,
    make_project,
    manifest_set,
    spawn,
    wait_for_container,
    wait_for_run,
    write_task,
)

from kagura_agent.processes import namespace_processes

pytestmark = pytest.mark.usefixtures("docker_client")

PROBE = """python3 - > forwarder.json <<'EOF'
import json, os, socket
found = []
for pid in os.listdir("/proc"):
    if not pid.isdigit():
        continue
    try:
        argv = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\\0")
    except OSError:
        continue
    if b"--serve-fds" in argv:
        stat = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        try:
            os.listdir(f"/proc/{pid}/fd")
            reachable = True
        except PermissionError:
            reachable = False
        found.append({"pid": int(pid), "ppid": int(stat[1]), "reachable": reachable})
init = [p.decode() for p in open("/proc/1/cmdline", "rb").read().split(b"\\0") if p]
socket.create_connection(("127.0.0.1", 3128), timeout=5).close()
print(json.dumps({"forwarders": found, "init": init}))
EOF
while [ ! -e seen-from-host ]; do sleep 0.05; done"""


def test_the_forwarder_runs_from_the_containers_own_command(
    docker_client: Any, tmp_path: Path, state_dir: Path
) -> None:
    manifests = manifest_set(tmp_path, NOWHERE)
    project = make_project(tmp_path)
    task = write_task(project, "probe", {"egress": ["nowhere"], "steps": [PROBE]})
    env = cli_env(state_dir)
    since = int(time.time()) - 1
    proc = spawn(["apply", "--yes", "--json", "--manifests", str(manifests), str(task)], env)
    try:
        run_id = wait_for_run(state_dir, proc)
        container = wait_for_container(docker_client, run_id)
        deadline = time.monotonic() + 60
        while not (project / "forwarder.json").exists():
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            assert time.monotonic() < deadline, "the probe never ran"
            time.sleep(0.05)
        fds = _forwarder_fds(container.attrs["State"]["Pid"])
        init_fds = _fds(container.attrs["State"]["Pid"])
        (project / "seen-from-host").write_text("")
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out[-3000:]
    seen = json.loads((project / "forwarder.json").read_text())
    [forwarder] = seen["forwarders"]
    assert forwarder["ppid"] == 1
    assert forwarder["reachable"] is False  # undumpable: no ptrace, no /proc/PID/fd
    assert "kagura_agent.brain.entrypoint" in seen["init"]
    assert [fds[fd] for fd in ("0", "1", "2")] == ["/dev/null"] * 3
    # No end of the brain channel (the entrypoint's own pipes). The forwarder's splice
    # pipes of a connection it is still closing (the probe's) are its own.
    channel = {t for t in init_fds.values() if t.startswith("pipe:")}
    assert channel, init_fds
    assert not channel & set(fds.values()), (fds, init_fds)
    # No exec into the run's containers at all (no verify commands either).
    events = docker_client.events(
        since=since,
        until=int(time.time()) + 1,
        decode=True,
        filters={"type": "container", "label": f"dev.kagura.run={run_id}"},
    )
    actions = [event.get("Action", "") for event in events]
    assert "start" in actions, actions
    assert not [a for a in actions if a.startswith("exec_")], actions


def _forwarder_fds(init: int) -> dict[str, str]:
    """The forwarder's descriptors, read from the host (which may: it has CAP_SYS_PTRACE
    or is the container's user): the one process of the container running --serve-fds."""
    found = namespace_processes(init)
    assert found, f"cannot see the processes of the container whose init is {init}"
    [pid] = [p for p in found if b"--serve-fds" in _argv(p)]
    return _fds(pid)


def _fds(pid: int) -> dict[str, str]:
    return {fd: os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}


def _argv(pid: int) -> list[bytes]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
