"""Projects, manifest sets, CLI runs and leftover checks for the apply tests.

Every apply here runs with the test's own state directory, so the ``runs`` table of that
directory names every run the test started; leftovers are looked up by those run ids
(the ``dev.kagura.run`` label carried by the agent container, the proxy and networks).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml
from resources import docker_unreachable

from kagura_agent.state import URL_ENV, Location, MissingTable, StateStore

REPO = Path(__file__).resolve().parents[1]
AGENT_UID = 1000
TEST_LABEL = {"dev.kagura.test": "apply"}


def make_project(base: Path, name: str = "project") -> Path:
    """An empty project root owned by uid 1000 (the container runs as the root's owner)."""
    root = base / name
    root.mkdir(parents=True)
    if os.geteuid() == 0:
        os.chown(root, AGENT_UID, AGENT_UID)
    else:
        root.chmod(0o777)
    return root


def write_task(project: Path, name: str, spec: dict[str, Any]) -> Path:
    """task.yml in ``project`` (its project root defaults to the file's folder)."""
    document = {"apiVersion": "kagura.dev/v1", "kind": "Task", "metadata": {"name": name}}
    path = project / "task.yml"
    path.write_text(yaml.safe_dump({**document, "spec": spec}, sort_keys=False))
    if os.geteuid() == 0:
        os.chown(path, AGENT_UID, AGENT_UID)
    return path


def plan_for_root(base: Path, root: Path) -> Any:
    """The planner's plan (never a hand-built dict) of a one-step script task whose project
    root is ``root``, from the shipped manifests; its file lies in ``base``, outside the
    root. For tests that open a run's row without applying (needs ``without_docker``)."""
    from kagura_agent.plan.build import compile_tasks

    folder = base / "plan-for-root"
    folder.mkdir(parents=True, exist_ok=True)
    task = folder / "task.yml"
    document = {"apiVersion": "kagura.dev/v1", "kind": "Task", "metadata": {"name": "t"}}
    spec = {"brain": "script", "steps": ["true"], "project_root": str(root)}
    task.write_text(yaml.safe_dump({**document, "spec": spec}, sort_keys=False))
    [compiled] = compile_tasks(str(REPO / "manifests"), [str(task)])
    return compiled.plan


def manifest_set(base: Path, *documents: dict[str, Any]) -> Path:
    """The shipped manifests plus ``documents`` (each a full manifest) in one folder."""
    folder = base / "manifests"
    shutil.copytree(REPO / "manifests", folder)
    if documents:
        text = yaml.safe_dump_all(
            [{"apiVersion": "kagura.dev/v1", **doc} for doc in documents], sort_keys=False
        )
        (folder / "zz-test.yml").write_text(text)
    return folder


def token_provider(secret_env: str = "KAGURA_TEST_TOKEN") -> dict[str, Any]:
    """A static, standing CredentialProvider ``token``: ``$secret_env`` reaches the container
    as TEST_TOKEN, scope ``use`` baseline (a canary credential the run holds)."""
    return {
        "kind": "CredentialProvider",
        "metadata": {"name": "token"},
        "spec": {
            "type": "static",
            "standing": True,
            "secret": f"env:{secret_env}",
            "static": {"env": "TEST_TOKEN"},
            "baseline_scopes": ["use"],
            "scopes": {"use": {"description": "a canary token"}},
        },
    }


# A baseline egress allowlist to a host that never answers: the run gets a proxy.
NOWHERE: dict[str, Any] = {
    "kind": "EgressPolicy",
    "metadata": {"name": "nowhere"},
    "spec": {"baseline": True, "allow": [{"host": "nowhere.test"}]},
}


def cli_env(state_dir: Path, **extra: str) -> dict[str, str]:
    env = {**os.environ, "KAGURA_AGENT_STATE_DIR": str(state_dir), "NO_COLOR": "1"}
    env.update(extra)
    return env


def kagura(
    args: list[str], env: dict[str, str], *, stdin: str = "", timeout: float = 180
) -> subprocess.CompletedProcess[str]:
    """``python -m kagura_agent ARGS`` to completion.

    Where ``env`` cannot reach Docker (a test not marked ``docker``), no container is
    started and the process boundary is only an interpreter's: the run is a child of the
    fork server (testing/forked.py: its own pid, environment, directory, streams and exit
    status, without an interpreter start and the package's imports each time). A test
    about the interpreter itself (``-I``, start-up variables, what gets imported) starts
    its own ``subprocess``."""
    if docker_unreachable(env):
        from testing import forked

        child = forked.run(args, cwd=REPO, env=env, stdin=stdin.encode(), timeout=timeout)
        return child.text()
    return subprocess.run(
        [sys.executable, "-m", "kagura_agent", *args],
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
    )


def spawn(args: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    """``python -m kagura_agent ARGS`` in the background (stderr merged into stdout)."""
    return subprocess.Popen(
        [sys.executable, "-m", "kagura_agent", *args],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=REPO,
    )


def _state(state_dir: Path) -> Location:
    """The store the test's ``kagura-agent`` processes use: KAGURA_AGENT_STATE_URL (the
    ``state_target`` fixture's PostgreSQL database) or the state directory's state.db."""
    return os.environ.get(URL_ENV) or state_dir / "state.db"


def run_ids(state_dir: Path) -> list[str]:
    """Every run recorded in the state store, oldest first."""
    store = StateStore.read_only(_state(state_dir))
    if store is None:
        return []
    with store:
        try:
            rows = store.conn.execute("SELECT run_id FROM runs ORDER BY started_at").fetchall()
        except MissingTable:
            return []
    return [row[0] for row in rows]


def run_row(state_dir: Path, run_id: str) -> dict[str, Any]:
    store = StateStore.read_only(_state(state_dir))
    assert store is not None
    with store:
        row = store.conn.execute("SELECT * FROM runs WHERE run_id = ?", (run_id,)).fetchone()
    assert row is not None
    return dict(row)


def wait_for_run(state_dir: Path, proc: Any = None, timeout: float = 30) -> str:
    """The run id of the first run, once the applying process ``proc`` has recorded it."""
    deadline = time.monotonic() + timeout
    while not (ids := run_ids(state_dir)):
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"apply exited {proc.returncode}: {proc.stdout.read()}")
        assert time.monotonic() < deadline, "apply never opened a run"
        time.sleep(0.05)
    return ids[0]


def run_containers(client: Any, run_id: str) -> list[Any]:
    import docker.errors

    label = f"dev.kagura.run={run_id}"
    found = []
    # docker-py's full listing inspects each container it listed and fails on one removed
    # in between; list sparsely, then look each up.
    for summary in client.containers.list(all=True, sparse=True, filters={"label": label}):
        try:
            found.append(client.containers.get(summary.id))
        except docker.errors.NotFound:
            continue
    return found


def leftovers(client: Any, run_id: str) -> list[str]:
    """Names of containers (agent, proxy), networks and volumes labelled with ``run_id``."""
    label = f"dev.kagura.run={run_id}"
    found = [f"container {c.name}" for c in run_containers(client, run_id)]
    volumes = client.api.volumes(filters={"label": label}).get("Volumes") or []
    found += [f"volume {v['Name']}" for v in volumes]
    return found + [f"network {n.name}" for n in client.networks.list(filters={"label": label})]


def wait_for_container(
    client: Any, run_id: str, *, running: bool = True, timeout: float = 60
) -> Any:
    """The run's agent container (not the proxy), once it exists (and runs)."""
    deadline = time.monotonic() + timeout
    while True:
        for container in run_containers(client, run_id):
            if "dev.kagura.task" in container.labels and (
                not running or container.status == "running"
            ):
                return container
        assert time.monotonic() < deadline, f"no agent container for {run_id}"
        time.sleep(0.1)


def live_leases(env: dict[str, str]) -> list[dict[str, Any]]:
    """Open ledger rows, as ``kagura-agent leases list --json`` reports them."""
    done = kagura(["leases", "list", "--json"], env, timeout=60)
    assert done.returncode == 0, done.stderr
    return list(json.loads(done.stdout)["leases"])


def all_leases(env: dict[str, str]) -> list[dict[str, Any]]:
    done = kagura(["leases", "list", "--all", "--json"], env, timeout=60)
    assert done.returncode == 0, done.stderr
    return list(json.loads(done.stdout)["leases"])


def json_lines(text: str) -> list[dict[str, Any]]:
    """The JSON objects among ``text``'s lines (live view lines with ``--json``)."""
    items = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{") and line.endswith("}"):
            try:
                items.append(json.loads(line))
            except ValueError:
                continue
    return items


def last_json(stdout: str) -> dict[str, Any]:
    """The result object ``apply --json`` prints last on stdout (indented JSON)."""
    start = stdout.rfind("\n{\n")
    start = 0 if stdout.startswith("{\n") and start < 0 else start + 1
    return dict(json.loads(stdout[start:]))
