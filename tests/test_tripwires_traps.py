"""Hijack tripwires from inside real containers: the canary file and /run/kagura/creds.

Each hijack run graduates its egress category first (a simulated week of evidence and a
human's unlock) and holds a leased token. The agent (the script brain: its steps are
shell commands in the container) then reads the canary in its home, or leaves a
``setsid`` process behind that reaches for /run/kagura/creds once the credentials are
wiped. Either stops the run long before its ``sleep 600``: the lease is revoked, verify
does not run, the category is demoted and an incident is listed. Honest runs that do
neither — while listing their home, writing the project and reading their credentials
while they hold them — record no incident. The canary lives in the container's tmpfs:
it never appears in the project root, not even when apply is killed with SIGKILL.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from apply_helpers import (
    cli_env,
    kagura,
    leftovers,
    live_leases,
    make_project,
    manifest_set,
    run_ids,
    run_row,
    spawn,
    wait_for_container,
    wait_for_run,
    write_task,
)
from test_cockpit import cockpit_world  # noqa: F401 - the fixture
from test_tripwires import MANIFESTS as EGRESS_MANIFESTS
from test_tripwires import TOKEN, _graduate

pytestmark = pytest.mark.usefixtures("docker_client")
ROOT = Path(__file__).resolve().parents[1]

CANARY = "/home/agent/.git-credentials"
# The leased token arrives as TEST_TOKEN and as the file /run/kagura/creds/github/token.
MANIFESTS = (
    *EGRESS_MANIFESTS[:2],
    {
        **EGRESS_MANIFESTS[2],
        "spec": {
            **EGRESS_MANIFESTS[2]["spec"],
            "static": {"env": "TEST_TOKEN", "file": "github/token"},
        },
    },
)
# A lingerer outside the brain's session: it reads the credentials while they are there
# (legitimately) and goes on reaching for them after the wipe.
LINGERER = (
    "setsid sh -c 'while :; do cat /run/kagura/creds/github/token >/dev/null 2>&1;"
    " sleep 0.02; done'"
    " </dev/null >/dev/null 2>&1 &"
)
HONEST = [
    "ls -la ~ /workspace /run/kagura > listing.txt",
    "cat /run/kagura/creds/github/token > /dev/null",
    'test -n "$TEST_TOKEN" && echo done > out.txt',
]


def _task(project: Path, name: str, steps: list[str], **extra: Any) -> Path:
    spec = {
        "egress": ["docs-site"],
        "credentials": [{"provider": "token", "scope": "use"}],
        "steps": steps,
        "verify": ["true"],
        **extra,
    }
    return write_task(project, name, spec)


def _plan(manifests: Path, task: Path, env: dict[str, str]) -> dict[str, Any]:
    planned = kagura(["plan", "--json", "--manifests", str(manifests), str(task)], env)
    assert planned.returncode == 0, planned.stderr
    [entry] = json.loads(planned.stdout)["plans"]
    return dict(entry["plan"])


def _hijacked(
    tmp_path: Path, state_dir: Path, steps: list[str], docker_client: Any
) -> dict[str, Any]:
    """Apply a graduated run doing ``steps``; assert it tripped; its incident."""
    manifests = manifest_set(tmp_path, *MANIFESTS)
    project = make_project(tmp_path)
    task = _task(project, "hijacked", steps)
    before = sorted(p.name for p in project.iterdir())
    env = cli_env(state_dir, KAGURA_TEST_TOKEN=TOKEN)
    plan = _plan(manifests, task, env)
    assert plan["tripwires"]["canary_file"] == CANARY
    assert plan["tripwires"]["creds_after_wipe"] is True
    [category] = [a["category"] for a in plan["approvals"] if a["category"].startswith("egress")]
    _graduate(category)

    started = time.monotonic()
    done = kagura(["apply", "--yes", "--json", "--manifests", str(manifests), str(task)], env)
    assert done.returncode == 1, done.stderr[-3000:]
    assert time.monotonic() - started < 120, "the tripwire did not stop the sleeping run"
    assert "hijack tripwire" in done.stderr and TOKEN not in done.stderr + done.stdout
    [run_id] = run_ids(state_dir)
    assert run_row(state_dir, run_id)["outcome"] == "failed"
    assert leftovers(docker_client, run_id) == []
    assert live_leases(env) == []  # revoked
    lines = [json.loads(line) for line in done.stderr.splitlines() if line.startswith("{")]
    [posted] = [item for item in lines if item.get("kind") == "incident"]
    assert not any("verify 'true' exited 0" in str(item.get("message")) for item in lines)

    status = kagura(["graduation", "status", "--json", "--manifests", str(manifests)], env)
    category_status = json.loads(status.stdout)["categories"][category]
    assert category_status["state"] == "locked", category_status  # demoted
    assert "tripwire" in (category_status.get("last_reset_reason") or "")

    listed = kagura(["incidents", "--json"], env)
    assert listed.returncode == 0, listed.stderr
    [incident] = json.loads(listed.stdout)["incidents"]
    assert incident["run_id"] == run_id and incident["id"] == posted["id"]
    assert "verify not run" in incident["actions"]
    assert any(e.get("type") == "tool_call" for e in incident["events"])
    text = kagura(["incidents"], env)
    assert incident["id"] in text.stdout and incident["run_id"] in text.stdout
    # Nothing of the trap reached the operator's project root.
    added = sorted(p.name for p in project.iterdir() if p.name not in before)
    assert added == [".kagura"] or added == [], added
    assert not _mentions_canary(project)
    return dict(incident)


def _mentions_canary(project: Path) -> list[str]:
    found = []
    for path in project.rglob("*"):
        if path.is_file() and b"kagura-agent:ghp_" in path.read_bytes():
            found.append(str(path))
    return found


def test_reading_the_canary_trips(docker_client: Any, tmp_path: Path, state_dir: Path) -> None:
    incident = _hijacked(
        tmp_path,
        state_dir,
        ["ls -la ~", "cat ~/.git-credentials >/dev/null; sleep 600"],
        docker_client,
    )
    assert incident["reason"].startswith(f"the canary file {CANARY} was touched"), incident


def test_reaching_for_wiped_credentials_trips(
    docker_client: Any, tmp_path: Path, state_dir: Path
) -> None:
    incident = _hijacked(
        tmp_path, state_dir, [LINGERER, "test -s /run/kagura/creds/github/token"], docker_client
    )
    reason = incident["reason"]
    assert reason.startswith("/run/kagura/creds/github/token was touched after the"), reason


# A lingerer that makes itself undumpable, as the entrypoint's own processes are, so it
# would pass for one of them if only undumpability were asked.
UNDUMPABLE_LINGERER = (
    "setsid python3 -c 'import ctypes, os, time\n"
    "ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)\n"
    'token = "/run/kagura/creds/github/token"\n'
    "while True:\n"
    "    os.path.exists(token) and open(token).read()\n"
    "    time.sleep(0.02)'"
    " </dev/null >/dev/null 2>&1 &"
)


def test_a_lingerer_that_hides_as_the_entrypoint_still_trips(
    docker_client: Any, tmp_path: Path, state_dir: Path
) -> None:
    """The decoy watch is skipped only when every process left was there, undumpable,
    before the turn: one started by a step is watched whatever it made of itself."""
    incident = _hijacked(
        tmp_path,
        state_dir,
        [UNDUMPABLE_LINGERER, "sleep 0.3", "test -s /run/kagura/creds/github/token"],
        docker_client,
    )
    reason = incident["reason"]
    assert reason.startswith("/run/kagura/creds/github/token was touched after the"), reason


def test_creds_in_a_run_given_none_trips(
    docker_client: Any, tmp_path: Path, state_dir: Path
) -> None:
    """No credentials delivered: /run/kagura/creds holds only the decoy, from the start."""
    project = make_project(tmp_path)
    task = write_task(project, "nosy", {"steps": ["ls /run/kagura/creds; sleep 600"]})
    env = cli_env(state_dir)
    done = kagura(["apply", "--yes", "--json", str(task)], env)
    assert done.returncode == 1, done.stderr[-3000:]
    listed = json.loads(kagura(["incidents", "--json"], env).stdout)["incidents"]
    [incident] = listed
    assert incident["reason"].startswith("/run/kagura/creds was touched"), incident
    [run_id] = run_ids(state_dir)
    assert leftovers(docker_client, run_id) == []


def test_an_honest_run_trips_nothing(docker_client: Any, tmp_path: Path, state_dir: Path) -> None:
    """It lists its home and /run/kagura, writes the project and uses its token: no trip."""
    manifests = manifest_set(tmp_path, *MANIFESTS)
    project = make_project(tmp_path)
    task = _task(project, "honest", HONEST, verify=["test -s out.txt"])
    env = cli_env(state_dir, KAGURA_TEST_TOKEN=TOKEN)
    plan = _plan(manifests, task, env)
    [category] = [a["category"] for a in plan["approvals"] if a["category"].startswith("egress")]
    _graduate(category)
    done = kagura(["apply", "--yes", "--json", "--manifests", str(manifests), str(task)], env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "hijack tripwire" not in done.stderr
    # Its steps were over when the credentials were wiped: no decoy watch held the exit.
    assert "no process of the agent's is left to watch" in done.stderr
    status = kagura(["graduation", "status", "--json", "--manifests", str(manifests)], env)
    assert json.loads(status.stdout)["categories"][category]["state"] != "locked"
    assert live_leases(env) == []
    listing = (project / "listing.txt").read_text()
    assert ".git-credentials" in listing  # planted, seen in a listing, never opened
    assert json.loads(kagura(["incidents", "--json"], env).stdout)["incidents"] == []
    assert not _mentions_canary(project)
    # A run given no credentials, listing everything but /run/kagura/creds: no trip.
    task = write_task(project, "plain", {"steps": ["ls -la ~ /run/kagura > plain.txt"]})
    done = kagura(["apply", "--yes", "--json", str(task)], env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(kagura(["incidents", "--json"], env).stdout)["incidents"] == []


def test_knobs_off_plant_nothing(docker_client: Any, tmp_path: Path, state_dir: Path) -> None:
    """canary_file: false and creds_after_wipe: false: nothing planted, nothing trips."""
    off = {
        "kind": "Graduation",
        "metadata": {"name": "no-traps"},
        "spec": {"tripwires": {"canary_file": False, "creds_after_wipe": False}},
    }
    manifests = manifest_set(tmp_path, off)
    project = make_project(tmp_path)
    steps = ["test ! -e ~/.git-credentials && test ! -e /run/kagura/creds && echo none > n.txt"]
    task = write_task(project, "off", {"steps": steps, "verify": ["test -s n.txt"]})
    env = cli_env(state_dir)
    plan = _plan(manifests, task, env)
    assert plan["tripwires"]["canary_file"] is None
    assert plan["tripwires"]["creds_after_wipe"] is False
    done = kagura(["apply", "--yes", "--json", "--manifests", str(manifests), str(task)], env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(kagura(["incidents", "--json"], env).stdout)["incidents"] == []


def test_the_canary_never_lands_in_the_project_root_even_after_kill_9(
    docker_client: Any, tmp_path: Path, state_dir: Path
) -> None:
    project = make_project(tmp_path)
    task = write_task(project, "killed", {"steps": ["sleep 600"]})
    before = sorted(p.name for p in project.iterdir())
    env = cli_env(state_dir)
    proc = spawn(["apply", "--yes", "--json", str(task)], env)
    try:
        run_id = wait_for_run(state_dir, proc)
        container = wait_for_container(docker_client, run_id)
        pid = int(container.attrs["State"]["Pid"])
        planted = Path(f"/proc/{pid}/root{CANARY}")
        deadline = time.monotonic() + 30
        while not planted.exists():  # stat only: opening it would trip the run
            assert time.monotonic() < deadline, "the canary was never planted"
            time.sleep(0.05)
        info = planted.stat()
        assert (info.st_uid, oct(info.st_mode & 0o777)) == (1000, "0o600")
        assert not _mentions_canary(project)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        assert proc.stdout is not None
        proc.stdout.close()
    added = sorted(p.name for p in project.iterdir() if p.name not in before)
    # The empty folders the run held for the absent .git and ./manifests (placeholders,
    # membrane/placeholders.py) stay until the next start sweeps the dead run.
    held = [name for name in added if name in (".git", "manifests")]
    assert all(not any((project / name).iterdir()) for name in held), held
    assert [name for name in added if name not in held] in ([], [".kagura"]), added
    assert not _mentions_canary(project) and not _mentions_canary(state_dir)
    # The next start sweeps the dead run: its container (and the canary with its tmpfs).
    # The operator's next task file lies outside the root: one written in the root while
    # the dead run's container still ran could be its agent's, and is refused (written.py).
    ops = tmp_path / "ops"
    ops.mkdir()
    task = write_task(ops, "next", {"steps": ["true"], "project_root": str(project)})
    done = kagura(["apply", "--yes", "--json", str(task)], env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert leftovers(docker_client, run_id) == []
    assert not planted.exists()
    assert not _mentions_canary(project) and not _mentions_canary(state_dir)
    assert json.loads(kagura(["incidents", "--json"], env).stdout)["incidents"] == []


def test_the_cockpit_thread_gets_the_incident(
    cockpit_world: Any,  # noqa: F811 - the fixture
    docker_client: Any,
    state_dir: Path,
) -> None:
    transport, start, base, _ = cockpit_world
    project = make_project(base, "chat")
    task = write_task(project, "chat", {"steps": ["cat ~/.git-credentials; sleep 600"]})
    cockpit = start()
    transport.send(f"launch {task}")
    out = transport.wait_for("⚠ incident", timeout=120)
    out = transport.wait_for("(exit 1)", timeout=120)
    [incident] = json.loads(kagura(["incidents", "--json"], cli_env(state_dir)).stdout)["incidents"]
    assert f"⚠ incident {incident['id']}: the canary file {CANARY} was touched" in out
    documented = " ".join((ROOT / "docs" / "cockpit.md").read_text(encoding="utf-8").split())
    shown = next(line for line in out.splitlines() if "⚠ incident" in line)
    assert shown.replace(incident["id"], "inc-…") in documented, shown
    assert "ghp_" not in out  # the canary value is scrubbed like a secret
    (session,) = cockpit.sessions()
    assert session.state == "failed" and session.run_id == incident["run_id"]
    assert leftovers(docker_client, session.run_id) == []
