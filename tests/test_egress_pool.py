"""The warm pool of egress sessions (membrane/egress/pool.py): hygiene and crash safety.

- A run's files, environment, credential and allowlist are never visible to the next run
  that gets a warm session: each pooled session serves one run and is destroyed.
- A pooled proxy killed while idle is replaced.
- ``kill -9`` of an apply holding a warm session (and of the keeper) leaves nothing behind
  after the next start.
- Claiming is atomic: many claimers at once, each session goes to exactly one.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import docker
import pytest
import yaml
from apply_helpers import (
    REPO,
    cli_env,
    json_lines,
    kagura,
    last_json,
    leftovers,
    live_leases,
    make_project,
    spawn,
    token_provider,
    wait_for_container,
    wait_for_run,
    write_task,
)

from kagura_agent.membrane import images
from kagura_agent.membrane.egress import audit, owner, pool
from kagura_agent.state import StateStore

PORT = 8080
PRIVATE = ["172.16.0.0/12", "10.0.0.0/8", "192.168.0.0/16"]
SERVE = f"cd /tmp && echo hello > index.html && echo ready && exec python3 -m http.server {PORT}"
SECRET_A = "run-a-secret-0123456789abcdef"


def _policy(name: str, host: str) -> dict[str, Any]:
    entry = {"host": host, "ports": [PORT], "http": True, "allow_addresses": PRIVATE}
    return {
        "kind": "EgressPolicy",
        "metadata": {"name": name},
        "spec": {"baseline": True, "allow": [entry]},
    }


def _manifests(base: Path) -> Path:
    folder = base / "manifests"
    folder.mkdir()
    for source in (REPO / "manifests").glob("*.yml"):
        (folder / source.name).write_text(source.read_text())
    docs = [_policy("alpha", "alpha.test"), _policy("beta", "beta.test"), token_provider()]
    text = yaml.safe_dump_all([{"apiVersion": "kagura.dev/v1", **d} for d in docs])
    (folder / "zz-pool.yml").write_text(text)
    return folder


def _pool_objects(client: Any, base: Path) -> dict[str, list[str]]:
    """Session name -> its containers, networks and volumes still in Docker, of the pool
    in ``base`` only (the daemon is shared: other tests and checkouts keep pools too)."""
    label = pool.LABEL_POOL
    mine = [label, f"{pool.LABEL_POOL_DIR}={base}"]
    found: dict[str, list[str]] = {}
    for c in client.api.containers(all=True, filters={"label": mine}):
        found.setdefault(c["Labels"][label], []).append(f"container {c['Names'][0]}")
    for n in client.api.networks(filters={"label": mine}):
        found.setdefault(n["Labels"][label], []).append(f"network {n['Name']}")
    for v in client.api.volumes(filters={"label": mine}).get("Volumes") or []:
        found.setdefault(v["Labels"][label], []).append(f"volume {v['Name']}")
    return found


def _wait(what: str, check: Any, timeout: float = 120) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _idle(base: Path) -> list[pool.PooledSession]:
    found = [e.session() for e in pool.entries(base) if e.state == pool.IDLE]
    return [s for s in found if s is not None]


def _session_of(state: Path, run_id: str) -> str:
    with StateStore(state / "state.db") as store:
        return audit.run_session(audit.open_store(store), run_id)


@pytest.fixture()
def upstream(docker_client: Any) -> Any:
    """An HTTP server answering alpha.test and beta.test on every network it joins."""
    container = docker_client.containers.run(
        images.image_ref("base"),
        ["sh", "-c", SERVE],
        detach=True,
        labels={"dev.kagura.test": "egress-pool"},
        user="1000:1000",
        network_mode="none",
    )
    try:
        _wait("the upstream", lambda: b"ready" in container.logs(), 30)
        docker_client.api.disconnect_container_from_network(container.id, "none")
        yield container
    finally:
        container.remove(force=True)


def test_a_warm_session_carries_nothing_of_one_run_to_the_next(
    docker_client: Any, upstream: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = tmp_path / "state"
    monkeypatch.setenv("KAGURA_AGENT_STATE_DIR", str(state))
    manifests = _manifests(tmp_path)
    base = pool.pool_dir()
    # Its own client: docker-py clients are not shared between threads here.
    keeper = pool.Keeper(docker.from_env(), pool.PoolSettings(size=2), base=base)
    with pool.keeper_thread(keeper):
        first = _wait("two idle sessions", lambda: len(_idle(base)) >= 2 and _idle(base))
        # The upstream joins both idle sessions' outbound networks under both names, so a
        # refusal below can only come from the run's own proxy configuration.
        for session in first[:2]:
            docker_client.api.connect_container_to_network(
                upstream.id, session.network, aliases=["alpha.test", "beta.test"]
            )
        env = cli_env(state, KAGURA_TEST_TOKEN=SECRET_A)
        root_a = make_project(tmp_path, "a")
        task_a = write_task(
            root_a,
            "run-a",
            {
                "egress": ["alpha"],
                "credentials": [{"provider": "token", "scope": "use"}],
                "steps": [
                    f"curl -sf http://alpha.test:{PORT}/ > own.txt",
                    'echo "$TEST_TOKEN" > /tmp/a-left-this; echo a-was-here > ~/a-home-file',
                    "ls -A /run/kagura/egress > sockets.txt",
                ],
            },
        )
        done_a = kagura(
            ["apply", "--yes", "--json", "--manifests", str(manifests), str(task_a)], env
        )
        assert done_a.returncode == 0, done_a.stderr[-3000:]
        run_a = last_json(done_a.stdout)["run_id"]
        assert (root_a / "own.txt").read_text().strip() == "hello"

        root_b = make_project(tmp_path, "b")
        task_b = write_task(
            root_b,
            "run-b",
            {
                "egress": ["beta"],
                "steps": [
                    f"curl -sf http://beta.test:{PORT}/ > own.txt",
                    f"curl -s -o /dev/null -w '%{{http_code}}' http://alpha.test:{PORT}/ > other.txt",
                    "env > env.txt",
                    "ls -A /tmp ~ /run/kagura/egress > seen.txt 2>&1; true",
                ],
            },
        )
        done_b = kagura(
            ["apply", "--yes", "--json", "--manifests", str(manifests), str(task_b)], env
        )
        assert done_b.returncode == 0, done_b.stderr[-3000:]
        run_b = last_json(done_b.stdout)["run_id"]

        warm_a, warm_b = _session_of(state, run_a), _session_of(state, run_b)
        assert warm_a.startswith("warm:") and warm_b.startswith("warm:"), (warm_a, warm_b)
        assert warm_a != warm_b  # never the same session twice
        assert any("warm session" in str(e.get("message")) for e in json_lines(done_b.stderr))
        # B's proxy refused A's host: A's allowlist was not in it.
        assert (root_b / "other.txt").read_text().strip() == "403"
        assert (root_b / "own.txt").read_text().strip() == "hello"
        # Nothing of A's credential, files or environment reached B.
        seen = (root_b / "env.txt").read_text() + (root_b / "seen.txt").read_text()
        assert SECRET_A not in seen and "TEST_TOKEN" not in seen
        assert "a-left-this" not in seen and "a-home-file" not in seen
        assert (root_b / "seen.txt").read_text().count("proxy.sock") == 1
        with StateStore(state / "state.db") as store:
            events_b = audit.load_events(audit.open_store(store), run_b)
            events_a = audit.load_events(store, run_a)
        assert {(e.host, e.decision) for e in events_b} == {
            ("beta.test", "allow"),
            ("alpha.test", "deny"),
        }
        assert {(e.host, e.decision) for e in events_a} == {("alpha.test", "allow")}
        # A's and B's sessions are destroyed (in the background) ...
        used = {warm_a.split(":", 1)[1], warm_b.split(":", 1)[1]}
        _wait(
            "the used sessions removed", lambda: not used & set(_pool_objects(docker_client, base))
        )
        # ... and the idle sessions left never held either run's allowlist or credential.
        for session in _idle(base):
            conf = docker_client.api.exec_create(session.proxy_id, ["cat", "/run/squid/squid.conf"])
            text = docker_client.api.exec_start(conf["Id"]).decode()
            assert "http_access deny all" in text
            assert "alpha.test" not in text and "beta.test" not in text
            config = docker_client.api.inspect_container(session.proxy_id)["Config"]
            assert SECRET_A not in json.dumps(config)
    assert _pool_objects(docker_client, base) == {}
    assert leftovers(docker_client, run_a) == [] and leftovers(docker_client, run_b) == []


def test_a_pooled_proxy_killed_while_idle_is_replaced(
    docker_client: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KAGURA_AGENT_STATE_DIR", str(tmp_path / "state"))
    base = pool.pool_dir()
    keeper = pool.Keeper(docker.from_env(), pool.PoolSettings(size=1), base=base)
    with pool.keeper_thread(keeper):
        (victim,) = _wait("an idle session", lambda: _idle(base))
        docker_client.api.kill(victim.proxy_id)

        def replaced() -> list[pool.PooledSession]:
            fresh = [s for s in _idle(base) if s.name != victim.name]
            return fresh if victim.name not in _pool_objects(docker_client, base) else []

        (fresh,) = _wait("a replacement", replaced)
        state = docker_client.api.inspect_container(fresh.proxy_id)["State"]
        assert state["Running"]
        assert victim.name not in {e.name for e in pool.entries(base)}
    assert _pool_objects(docker_client, base) == {}


def test_kill_9_of_an_apply_with_a_warm_session_leaves_nothing_after_the_next_start(
    docker_client: Any, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    env = cli_env(state, KAGURA_TEST_TOKEN=SECRET_A)
    manifests = _manifests(tmp_path)
    keeper = subprocess.Popen(
        [sys.executable, "-m", "kagura_agent", "egress", "pool", "serve", "--size", "1"],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=REPO,
    )
    base = state / "egress-pool"
    try:
        _wait("an idle session", lambda: _idle(base))
        root = make_project(tmp_path, "doomed")
        task = write_task(
            root,
            "doomed",
            {
                "egress": ["alpha"],
                "credentials": [{"provider": "token", "scope": "use"}],
                "steps": ["sleep 600"],
            },
        )
        proc = spawn(["apply", "--yes", "--json", "--manifests", str(manifests), str(task)], env)
        run_id = wait_for_run(state, proc)
        wait_for_container(docker_client, run_id)
        claimed = _wait(
            "the run's warm session",
            lambda: [e for e in pool.entries(base) if e.state == pool.CLAIMED],
        )
        name = claimed[0].name
        assert name in _pool_objects(docker_client, base)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        # The keeper dies the same way: nothing answers for any pooled session now.
        keeper.send_signal(signal.SIGKILL)
        keeper.wait(timeout=30)
        assert name in _pool_objects(docker_client, base)  # nobody cleaned up after SIGKILL

        # The next start: an ordinary apply (no keeper, so a cold session).
        root_next = make_project(tmp_path, "next")
        task_next = write_task(root_next, "next", {"egress": ["beta"], "steps": ["true"]})
        done = kagura(
            ["apply", "--yes", "--json", "--manifests", str(manifests), str(task_next)], env
        )
        assert done.returncode == 0, done.stderr[-3000:]
        assert _session_of(state, last_json(done.stdout)["run_id"]) == "cold"
        assert _pool_objects(docker_client, base) == {}  # the claimed session and the idle one
        assert leftovers(docker_client, run_id) == []  # the agent's container
        assert pool.entries(base) == []
        # A static secret cannot be revoked: its row stays in view as lapsing (as after
        # any kill -9), nothing else of the dead run is held.
        assert "1 lapsing" in done.stderr
        assert [lease["run_id"] for lease in live_leases(env)] == [run_id]
    finally:
        for child in (keeper,):
            if child.poll() is None:
                child.kill()
                child.wait()


def _claim_all(base: str, keeper: str, out: Any) -> None:
    got = []
    while (claimed := pool.claim(f"run-{os.getpid()}", "img", Path(base))) is not None:
        got.append(claimed[0].name)
    out.put(got)


def test_each_idle_session_is_claimed_by_exactly_one_process(tmp_path: Path) -> None:
    me = owner.current_owner()
    names = [f"kagura-pool-{i:04d}" for i in range(60)]
    for name in names:
        session = pool.PooledSession(name, "id-" + name, name, "v", "n", me, time.time(), "img")
        (tmp_path / pool.IDLE).mkdir(exist_ok=True)
        (tmp_path / pool.IDLE / f"{name}.json").write_text(json.dumps(session.__dict__))
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    workers = [ctx.Process(target=_claim_all, args=(str(tmp_path), me, out)) for _ in range(6)]
    for worker in workers:
        worker.start()
    got = [out.get(timeout=60) for _ in workers]
    for worker in workers:
        worker.join(timeout=60)
    flat = [name for claimed in got for name in claimed]
    assert sorted(flat) == names  # every one claimed, none twice
    claimed_files = list((tmp_path / pool.CLAIMED).glob("*.json"))
    assert len(claimed_files) == len(names)
    # Each file names its claimer, and records the claiming run.
    for path in claimed_files:
        session = pool.PooledSession.load(path)
        assert session is not None and session.run_id.startswith("run-")
        assert "@" in path.name


def test_who_answers_for_a_pooled_session(tmp_path: Path) -> None:
    live, dead = "h:1:1", "h:2:2"
    alive = {live: True, dead: False}.__getitem__

    def put(state: str, name: str, keeper: str, claimer: str = "") -> None:
        folder = tmp_path / state
        folder.mkdir(exist_ok=True)
        session = pool.PooledSession(name, "", name, "v", "n", keeper, 0.0, "img", "run-x")
        stem = f"{name}@{claimer}" if claimer else name
        (folder / f"{stem}.json").write_text(json.dumps(session.__dict__))

    put(pool.IDLE, "idle-live-keeper", live)
    put(pool.IDLE, "idle-dead-keeper", dead)
    put(pool.CLAIMED, "claimed-live-run-dead-keeper", dead, live)
    put(pool.CLAIMED, "claimed-dead-run-live-keeper", live, dead)
    put(pool.RETIRED, "retired-live-keeper", live)
    put(pool.RETIRED, "retired-dead-keeper", dead)
    assert pool.names_alive(tmp_path, is_alive=alive) == {
        "idle-live-keeper": True,
        "idle-dead-keeper": False,
        "claimed-live-run-dead-keeper": True,  # the keeper's death spares a running apply
        "claimed-dead-run-live-keeper": False,
        "retired-live-keeper": True,
        "retired-dead-keeper": False,
    }


@pytest.mark.usefixtures("without_docker")
def test_the_plan_says_whether_a_run_may_get_a_warm_session(tmp_path: Path) -> None:
    """Packaged: yes (size 2); an operator Policy with size 0: no. (A brain whose key the
    proxy injects gets no: the golden plan sdk-api-key shows ``"pool": false``.)"""
    from apply_helpers import manifest_set

    def pool_flag(*documents: dict[str, Any], name: str) -> bool:
        base = tmp_path / name
        base.mkdir()
        manifests = manifest_set(base, _policy("alpha", "alpha.test"), *documents)
        task = write_task(make_project(base), name, {"egress": ["alpha"], "steps": ["true"]})
        env = cli_env(base / "state")
        done = kagura(["plan", "--json", "--manifests", str(manifests), str(task)], env)
        assert done.returncode == 0, done.stderr
        [entry] = json.loads(done.stdout)["plans"]
        return bool(entry["plan"]["egress"]["pool"])

    assert pool_flag(name="packaged") is True
    off = {
        "kind": "Policy",
        "metadata": {"name": "no-pool"},
        "spec": {"egress_pool": {"size": 0}},
    }
    assert pool_flag(off, name="off") is False
