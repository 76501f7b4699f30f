"""The agent's egress forwarder is started by its container's own command, real Docker.

apply creates the agent's container with the forwarder's launcher in front of the
image's entrypoint (forwarder.launcher): the forwarder listens before the entrypoint
runs, so there is no ``docker exec`` into the agent's container and no readiness line to
wait for. Seen from inside a run: one forwarder process, a child of the entrypoint (PID
1, the kagura entrypoint as its own init), holding no end of the brain channel (its
stdin, stdout and stderr are /dev/null, and it has no pipe), and 127.0.0.1:3128 answers.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from apply_helpers import NOWHERE, cli_env, kagura, make_project, manifest_set, run_ids, write_task

pytestmark = pytest.mark.docker

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
        fds = {fd: os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
        found.append({"pid": int(pid), "ppid": int(stat[1]), "fds": fds})
init = [p.decode() for p in open("/proc/1/cmdline", "rb").read().split(b"\\0") if p]
socket.create_connection(("127.0.0.1", 3128), timeout=5).close()
print(json.dumps({"forwarders": found, "init": init}))
EOF"""


def test_the_forwarder_runs_from_the_containers_own_command(
    docker_client: Any, tmp_path: Path, state_dir: Path
) -> None:
    manifests = manifest_set(tmp_path, NOWHERE)
    project = make_project(tmp_path)
    task = write_task(project, "probe", {"egress": ["nowhere"], "steps": [PROBE]})
    env = cli_env(state_dir)
    since = int(time.time()) - 1
    done = kagura(["apply", "--yes", "--json", "--manifests", str(manifests), str(task)], env)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads((project / "forwarder.json").read_text())
    [forwarder] = seen["forwarders"]
    assert forwarder["ppid"] == 1
    assert "kagura_agent.brain.entrypoint" in seen["init"]
    assert [forwarder["fds"][fd] for fd in ("0", "1", "2")] == ["/dev/null"] * 3
    assert not [t for t in forwarder["fds"].values() if t.startswith("pipe:")], forwarder
    # No exec into the run's containers at all (no verify commands either).
    [run_id] = run_ids(state_dir)
    events = docker_client.events(
        since=since,
        until=int(time.time()) + 1,
        decode=True,
        filters={"type": "container", "label": f"dev.kagura.run={run_id}"},
    )
    actions = [event.get("Action", "") for event in events]
    assert "start" in actions, actions
    assert not [a for a in actions if a.startswith("exec_")], actions
