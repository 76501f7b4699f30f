"""Runs with egress on a second, separate Docker daemon, both images pulled by digest.

The second daemon (scripts/dockerd2-up.sh) is a full Docker host: iptables on, its own
docker0 and chains, in a network namespace of its own. A plan made against the first
daemon pins the agent image and the egress proxy image (``image`` and ``egress.proxy``,
both pushed by ``images push`` to the registry); applied with DOCKER_HOST on the second
daemon, apply pulls both by digest and starts the proxy from exactly the pinned ID.

The membrane is proven from inside the agent container there: the allowed host answers
through the proxy; an unlisted host and an unlisted port are refused by the proxy; direct
TCP to the upstream, to the daemon's gateways and to a service on its host fails, and DNS
fails (a plain container on the same daemon reaches those, the control). A ``kill -9``
mid-run leaves the proxy, its network and socket volume on the second daemon, and the
next apply there sweeps them. Neither daemon's iptables sees the other's bridges. A warm
pooled proxy of another image than the pinned one never serves the run. A runner on the
second daemon takes a queued egress plan, pulls the proxy and runs it there.
"""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from apply_helpers import (
    cli_env,
    kagura,
    last_json,
    leftovers,
    make_project,
    manifest_set,
    run_ids,
    run_row,
    spawn,
    wait_for_container,
    wait_for_run,
    write_task,
)
from daemon2 import in_netns
from team_helpers import queue_url, runners, wait_registered, wait_until  # noqa: F401 - fixtures

from kagura_agent.membrane import images
from kagura_agent.membrane.egress import pool
from kagura_agent.membrane.egress.owner import COMPONENT_OUTBOUND, COMPONENT_PROXY, LABEL_COMPONENT
from kagura_agent.membrane.egress.session import EgressRequest, EgressSession
from kagura_agent.membrane.hardening import LABEL_RUN
from kagura_agent.plan import planfile
from kagura_agent.team import queue

pytestmark = pytest.mark.usefixtures("docker_client")

RELABELLED = "kagura/egress-proxy-test:relabelled"
PRIVATE = ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"]
EGRESS = {
    "kind": "EgressPolicy",
    "metadata": {"name": "d2-allowed"},
    "spec": {
        "baseline": True,
        "allow": [
            {"host": "allowed.test", "ports": [8080], "http": True, "allow_addresses": PRIVATE}
        ],
    },
}
# The upstream: HTTP on 8080 and 8081, as allowed.test and unlisted.test on the run's
# outbound network.
UPSTREAM = """
import http.server, threading
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b"hello from the second daemon"
        self.send_response(200); self.send_header("Content-Length", str(len(body)))
        self.end_headers(); self.wfile.write(body)
    def log_message(self, *args): pass
servers = [http.server.ThreadingHTTPServer(("", p), H) for p in (8080, 8081)]
for s in servers: threading.Thread(target=s.serve_forever, daemon=True).start()
print("ready", flush=True)
threading.Event().wait()
"""
# TCP connects to every HOST:PORT in .targets (written by the test): one "HOST PORT ERRNO"
# line each (0: connected).
PROBE = (
    "import socket\n"
    "for t in open('.targets').read().split():\n"
    "    ip, port = t.rsplit(':', 1)\n"
    "    s = socket.socket(); s.settimeout(3)\n"
    "    print(ip, port, s.connect_ex((ip, int(port))))\n"
)
# Where a listener in the second daemon's namespace (its "host") answers.
LISTENER = (
    "import socket, sys\n"
    "s = socket.create_server(('0.0.0.0', 0), backlog=64)\n"
    "print(s.getsockname()[1], flush=True)\n"
    "while True:\n"
    "    c, _ = s.accept(); c.close()\n"
)
STEPS = [
    "for i in $(seq 1200); do test -e .upstream-ready && break; sleep 0.1; done",
    "curl -sS --max-time 30 http://allowed.test:8080/ > allowed.txt 2>&1 || true",
    "curl -sS --max-time 30 -o /dev/null -w '%{http_code}' http://unlisted.test:8080/"
    " > unlisted.txt 2>/dev/null || true",
    "curl -sS --max-time 30 -o /dev/null -w '%{http_code}' http://allowed.test:8081/"
    " > other-port.txt 2>/dev/null || true",
    f'python3 -c "{PROBE}" > direct.txt 2>&1',
    "python3 -c \"import socket; socket.getaddrinfo('allowed.test', 8080)\" > dns.txt 2>&1"
    " && echo resolved >> dns.txt || echo failed >> dns.txt",
    "ls /sys/class/net > interfaces.txt",
]


@pytest.fixture(scope="module")
def pushed_both(
    tmp_path_factory: pytest.TempPathFactory, registry: str, docker_client: Any
) -> Iterator[dict[str, Any]]:
    """A manifest set whose agent Image and egress proxy Image name the registry, both
    pushed (``images push agent egress-proxy``); their pushed references by name."""
    base = tmp_path_factory.mktemp("pushed-both")
    proxy_image = {
        "kind": "Image",
        "metadata": {"name": "egress-proxy"},
        "spec": {
            "recipe": "images/egress-proxy",
            "tag": "kagura/egress-proxy:0.1.0",
            "repository": f"{registry}/kagura/egress-proxy",
        },
    }
    manifests = manifest_set(base, proxy_image, EGRESS)
    images = manifests / "images.yml"
    images.write_text(
        images.read_text().replace(
            "  tag: kagura/agent:0.1.0\n",
            f"  tag: kagura/agent:0.1.0\n  repository: {registry}/kagura/agent\n",
            1,
        )
    )
    done = kagura(
        ["images", "push", "agent", "egress-proxy", "--json", "--manifests", str(manifests)],
        cli_env(base / "state"),
        timeout=900,
    )
    assert done.returncode == 0, done.stderr
    rows = {row["name"]: row["pushed"] for row in json.loads(done.stdout)["images"]}
    assert rows["egress-proxy"].startswith(f"{registry}/kagura/egress-proxy@sha256:"), rows
    yield {"manifests": manifests, **rows}
    for repository in ("kagura/agent", "kagura/egress-proxy"):  # the push tags only
        with contextlib.suppress(Exception):  # already gone
            docker_client.api.remove_image(f"{registry}/{repository}:0.1.0")


def _plan(base: Path, manifests: Path, name: str, steps: list[str], verify: list[str]) -> Any:
    project = make_project(base, name)
    task = write_task(project, name, {"egress": ["d2-allowed"], "steps": steps, "verify": verify})
    saved = base / f"{name}.json"
    made = kagura(
        ["plan", "--manifests", str(manifests), "-o", str(saved), str(task)],
        cli_env(base / "state-a"),
    )
    assert made.returncode == 0, made.stderr
    return project, saved, json.loads(saved.read_text())


def _drop(client: Any, image_id: str) -> None:
    if any(image.id == image_id for image in client.images.list(all=True)):
        client.images.remove(image_id, force=True)


def _outbound(client: Any, run_id: str, proc: Any, timeout: float = 300) -> Any:
    labels = [f"{LABEL_RUN}={run_id}", f"{LABEL_COMPONENT}={COMPONENT_OUTBOUND}"]
    deadline = time.monotonic() + timeout
    while not (found := client.networks.list(filters={"label": labels})):
        assert proc.poll() is None, proc.stdout.read()
        assert time.monotonic() < deadline, "apply never created its outbound network"
        time.sleep(0.1)
    return found[0]


def _address(container: Any, network: str) -> str:
    container.reload()
    return str(container.attrs["NetworkSettings"]["Networks"][network]["IPAddress"])


def _rules(netns: str | None) -> str:
    """iptables-save in ``netns`` (the second daemon's), or in this machine's (None)."""
    argv = ["iptables-save"]
    if netns:
        done = in_netns(netns, argv, timeout=60)
    else:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_run_with_egress_on_the_second_daemon_holds_the_membrane(
    tmp_path: Path, pushed_both: dict[str, Any], dockerd2: Any, docker_client: Any
) -> None:
    manifests = pushed_both["manifests"]
    project, saved, plan = _plan(
        tmp_path,
        manifests,
        "d2-egress",
        STEPS,
        ["grep -q 'hello from the second daemon' allowed.txt"],
    )
    proxy = plan["egress"]["proxy"]
    assert proxy["pull"] == pushed_both["egress-proxy"] and proxy["digest"].startswith("sha256:")
    assert plan["image"]["pull"] == pushed_both["agent"]
    # The second host starts without either image.
    _drop(dockerd2, plan["image"]["digest"])
    _drop(dockerd2, proxy["digest"])

    listener = subprocess.Popen(
        ["nsenter", f"--net={dockerd2.netns}", "python3", "-c", LISTENER],
        stdout=subprocess.PIPE,
        text=True,
    )
    upstream = None
    state_b = tmp_path / "state-b"
    started = int(time.time()) - 1
    proc = spawn(["apply", "--json", str(saved)], cli_env(state_b, DOCKER_HOST=dockerd2.host))
    try:
        assert listener.stdout is not None
        host_port = int(listener.stdout.readline())
        run_id = wait_for_run(state_b, proc, timeout=600)
        network = _outbound(dockerd2, run_id, proc)
        upstream = dockerd2.containers.create(
            plan["image"]["digest"],
            entrypoint=["python3", "-c", UPSTREAM],
            user="1000:1000",
            labels={"dev.kagura.test": "daemon2"},
            network=network.name,
            networking_config={
                network.name: dockerd2.api.create_endpoint_config(
                    aliases=["allowed.test", "unlisted.test"]
                )
            },
        )
        upstream.start()
        deadline = time.monotonic() + 60
        while b"ready" not in upstream.logs():
            assert time.monotonic() < deadline, upstream.logs()
            time.sleep(0.1)
        gateway = network.attrs["IPAM"]["Config"][0]["Gateway"]
        targets = [
            f"{_address(upstream, network.name)}:8080",
            f"{gateway}:{host_port}",
            f"10.213.213.1:{host_port}",
        ]
        # The control: a plain container on that daemon reaches every target.
        control = upstream.exec_run(
            ["python3", "-c", PROBE.replace("open('.targets').read()", repr(" ".join(targets)))]
        ).output.decode()
        assert [line.rsplit(" ", 1)[1] for line in control.split("\n") if line] == ["0"] * 3, (
            control
        )
        # Each daemon's rules live in its own namespace: the run's bridge is in the second
        # daemon's chains and nowhere in this machine's.
        bridge = "br-" + network.id[:12]
        assert bridge in _rules(dockerd2.netns) and bridge not in _rules(None)
        (project / ".targets").write_text(" ".join(targets) + "\n")
        (project / ".upstream-ready").write_text("go\n")
        output, _ = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
        listener.kill()
        if upstream is not None:
            upstream.remove(force=True)
    assert proc.returncode == 0, output
    assert last_json(output)["outcome"] == "success"
    for reference in (pushed_both["agent"], pushed_both["egress-proxy"]):
        assert f"pulling {reference}" in output and f"pulled {reference}" in output, output

    # Inside the agent container on the second daemon:
    assert (project / "allowed.txt").read_text() == "hello from the second daemon"
    assert (project / "unlisted.txt").read_text() == "403"
    assert (project / "other-port.txt").read_text() == "403"
    direct = [line.split() for line in (project / "direct.txt").read_text().splitlines()]
    assert [f"{ip}:{port}" for ip, port, _ in direct] == targets
    assert all(code != "0" for _, _, code in direct), direct
    assert (project / "dns.txt").read_text().strip().endswith("failed")
    assert (project / "interfaces.txt").read_text().split() == ["lo"]

    # The proxy ran on the second daemon from the pinned ID; nothing ran on the first.
    ended = int(time.time()) + 1
    label = {"label": f"{LABEL_RUN}={run_id}", "type": "container"}
    on_b = list(dockerd2.events(since=started, until=ended, decode=True, filters=label))
    on_a = list(docker_client.events(since=started, until=ended, decode=True, filters=label))
    created = [e["Actor"]["Attributes"] for e in on_b if e.get("Action") == "create"]
    proxies = [a for a in created if a.get(LABEL_COMPONENT) == COMPONENT_PROXY]
    assert [a["image"] for a in proxies] == [proxy["digest"]], created
    assert on_a == []
    assert leftovers(dockerd2, run_id) == [] and leftovers(docker_client, run_id) == []


def test_kill_9_of_an_egress_run_on_the_second_daemon_is_swept_there(
    tmp_path: Path, pushed_both: dict[str, Any], dockerd2: Any
) -> None:
    manifests = pushed_both["manifests"]
    _, saved, _ = _plan(tmp_path, manifests, "d2-killed", ["sleep 600"], [])
    state_b = tmp_path / "state-b"
    host_b = cli_env(state_b, DOCKER_HOST=dockerd2.host)
    proc = spawn(["apply", "--json", str(saved)], host_b)
    dead = wait_for_run(state_b, proc, timeout=600)
    wait_for_container(dockerd2, dead, timeout=600)
    proc.kill()  # SIGKILL: no clean-up of its own
    proc.wait(timeout=30)
    left = leftovers(dockerd2, dead)
    assert any(name.endswith("-outbound") for name in left), left
    assert any(name.endswith("-socket") for name in left), left
    assert len(left) >= 4, left  # agent, proxy, network, socket volume

    _, again, _ = _plan(tmp_path, manifests, "d2-after", ["true"], [])
    done = kagura(["apply", "--json", str(again)], host_b, timeout=600)
    assert done.returncode == 0, done.stderr
    assert "removed what crashed runs left" in done.stderr
    assert leftovers(dockerd2, dead) == []
    assert run_row(state_b, dead)["outcome"] == "crashed"


def test_a_host_whose_proxy_image_differs_refuses(
    tmp_path: Path, pushed_both: dict[str, Any], dockerd2: Any, registry: str
) -> None:
    """The proxy pinned but not pushed (no repository for it): a host without that ID
    refuses with exit 6 before anything runs."""
    manifests = manifest_set(tmp_path, EGRESS)
    images = manifests / "images.yml"
    images.write_text(
        images.read_text().replace(
            "  tag: kagura/agent:0.1.0\n",
            f"  tag: kagura/agent:0.1.0\n  repository: {registry}/kagura/agent\n",
            1,
        )
    )
    _, saved, plan = _plan(tmp_path, manifests, "d2-unpinned-proxy", ["true"], [])
    proxy = plan["egress"]["proxy"]
    assert proxy["digest"] and proxy["pull"] is None
    _drop(dockerd2, proxy["digest"])
    state_b = tmp_path / "state-b"
    done = kagura(["apply", str(saved)], cli_env(state_b, DOCKER_HOST=dockerd2.host), timeout=600)
    assert done.returncode == 6, done.stderr
    assert "egress proxy image kagura/egress-proxy:0.1.0 differs on this Docker host" in done.stderr
    assert proxy["digest"] in done.stderr
    assert run_ids(state_b) == []


def test_the_second_daemon_keeps_its_chains_in_its_own_namespace(
    dockerd2: Any, docker_client: Any
) -> None:
    """dockerd2 manages iptables (its own DOCKER chains and NAT for 10.213.213.0/24) in its
    network namespace; the first daemon's docker0 and chains are not its business."""
    mine = _rules(dockerd2.netns)
    assert ":DOCKER-ISOLATION-STAGE-1" in mine and "-s 10.213.213.0/24" in mine
    theirs = _rules(None)
    assert ":DOCKER-ISOLATION-STAGE-1" in theirs  # the first daemon's, still there
    assert "10.213.213." not in theirs and "10.214." not in theirs
    bridge = docker_client.networks.get("bridge").attrs["IPAM"]["Config"][0]["Subnet"]
    assert bridge != "10.213.213.0/24"  # the first daemon's docker0 is its own


def test_a_warm_proxy_of_another_image_never_serves_a_pinned_plan(
    docker_client: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pool's keeper runs its proxy tag; when that tag is another image than the plan
    pins (rebuilt since the plan), the claimed session is removed and the run starts cold."""
    import docker

    monkeypatch.setenv("KAGURA_AGENT_STATE_DIR", str(tmp_path / "state"))
    pinned = docker_client.images.get(images.image_ref("egress-proxy")).id
    # Another image ID that runs the same proxy: the pinned one with one more label.
    dockerfile = f"FROM {images.image_ref('egress-proxy')}\nLABEL dev.kagura.test=daemon2\n"
    other, _ = docker_client.images.build(
        fileobj=io.BytesIO(dockerfile.encode()), tag=RELABELLED, rm=True
    )
    assert other.id != pinned
    plan = {
        "egress": {
            "mode": "proxy",
            "allow": [{"host": "allowed.test", "port": 8443}],
            "proxy": {"ref": RELABELLED, "digest": pinned, "pull": None},
        }
    }
    base = pool.pool_dir()
    keeper = pool.Keeper(docker.from_env(), pool.PoolSettings(size=1), image=RELABELLED, base=base)
    try:
        with pool.keeper_thread(keeper):
            deadline = time.monotonic() + 120
            while not (idle := [e for e in pool.entries(base) if e.state == pool.IDLE]):
                assert time.monotonic() < deadline, "the keeper never started a session"
                time.sleep(0.1)
            run_id = f"test-pinned-{time.monotonic_ns()}"
            session = EgressSession.start(
                docker_client, EgressRequest(plan, run_id, image=RELABELLED, from_pool=True)
            )
            try:
                assert not session.warm
                labels = {"label": f"{pool.LABEL_POOL}={idle[0].name}"}
                assert docker_client.containers.list(all=True, filters=labels) == []
            finally:
                session.close()
            assert leftovers(docker_client, run_id) == []
    finally:
        docker_client.images.remove(RELABELLED, force=True)


def test_a_runner_on_the_second_daemon_pulls_the_proxy_and_applies_a_queued_egress_plan(
    tmp_path: Path,
    pushed_both: dict[str, Any],
    dockerd2: Any,
    queue_url: str,  # noqa: F811 - the fixture
    runners: Any,  # noqa: F811 - the fixture
) -> None:
    """``kagura-agent runner`` with DOCKER_HOST on the second daemon takes an egress plan
    made on the first from the queue, pulls the pinned proxy image and runs it there."""
    manifests = pushed_both["manifests"]
    project, saved, plan = _plan(
        tmp_path, manifests, "d2-queued", ["ls /sys/class/net > interfaces.txt"], []
    )
    proxy = plan["egress"]["proxy"]
    _drop(dockerd2, proxy["digest"])
    runner = runners("runner-d2-egress", env={"DOCKER_HOST": dockerd2.host})
    wait_registered(queue_url, 1)
    started = int(time.time()) - 1
    queued = queue.enqueue_plan(queue_url, planfile.load(saved), who="op")
    wait_until(
        lambda: queue.run(queue_url, queued.run_id)["status"] in queue.TERMINAL, 600, "the run"
    )
    row = queue.run(queue_url, queued.run_id)
    assert (row["status"], row["runner"]) == ("success", "runner-d2-egress"), (row, runner.output())
    events = json.dumps(list(queue.follow(queue_url, queued.run_id, timeout=60)))
    assert f"pulling {proxy['pull']}" in events, events[-3000:]
    assert (project / "interfaces.txt").read_text().split() == ["lo"]
    label = {"label": f"{LABEL_RUN}={queued.run_id}", "type": "container"}
    on_b = dockerd2.events(since=started, until=int(time.time()) + 1, decode=True, filters=label)
    created = [e["Actor"]["Attributes"] for e in on_b if e.get("Action") == "create"]
    assert [a["image"] for a in created if a.get(LABEL_COMPONENT) == COMPONENT_PROXY] == [
        proxy["digest"]
    ]
    assert leftovers(dockerd2, queued.run_id) == []
