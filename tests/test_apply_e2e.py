"""The script brain end to end through ``kagura-agent apply``, in real containers.

The STS lease is minted by the host (broker → boto3 → moto_server bound to the gateway
of a test network) and used inside the agent container: boto3 there reads the leased
files and reaches moto through the run's egress proxy. The proxy's upstream is a small
TCP relay container the test attaches, under the alias ``sts.test``, to the run's
outbound network as soon as apply creates it; the task's step waits for a marker file
the test writes into the project root after that, so the proxy never caches a miss.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from apply_helpers import (
    TEST_LABEL,
    all_leases,
    cli_env,
    json_lines,
    kagura,
    last_json,
    leftovers,
    live_leases,
    make_project,
    manifest_set,
    run_ids,
    spawn,
    wait_for_container,
    wait_for_run,
    write_task,
)

from kagura_agent.membrane import images
from kagura_agent.membrane.egress import audit
from kagura_agent.membrane.egress.owner import COMPONENT_OUTBOUND, LABEL_COMPONENT
from kagura_agent.membrane.hardening import LABEL_RUN
from kagura_agent.plan import history
from kagura_agent.state import Location, StateStore, owner_key
from testing.moto import moto_server

pytestmark = pytest.mark.usefixtures("docker_client")

ROOT_KEY = "AKIAKAGURAAPPLY00001:apply/root/" + "q" * 29
RELAY_PORT = 8080
# A TCP relay: the upstream the proxy connects to, forwarding to moto on the host.
RELAY = """
import socket, sys, threading
target = (sys.argv[1], int(sys.argv[2]))
def pipe(src, dst):
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
server = socket.create_server(("", 8080))
print("ready", flush=True)
while True:
    client, _ = server.accept()
    upstream = socket.create_connection(target)
    for a, b in ((client, upstream), (upstream, client)):
        threading.Thread(target=pipe, args=(a, b), daemon=True).start()
"""
WHOAMI = (
    'python3 -c \'import boto3; print(boto3.client("sts").get_caller_identity()["Arn"])\' > arn.txt'
)


@pytest.fixture()
def sts_world(docker_client: Any) -> Iterator[tuple[str, Any]]:
    """moto_server on a test network's gateway, and a relay container on that network."""
    network = docker_client.networks.create(
        f"kagura-apply-moto-{uuid.uuid4().hex[:8]}",
        driver="bridge",
        internal=True,
        labels=TEST_LABEL,
    )
    relay = None
    try:
        network.reload()
        gateway = network.attrs["IPAM"]["Config"][0]["Gateway"]
        with moto_server(host=gateway) as endpoint:
            port = endpoint.rsplit(":", 1)[1]
            relay = docker_client.containers.run(
                images.image_ref("base"),
                ["python3", "-c", RELAY, gateway, port],
                detach=True,
                labels=TEST_LABEL,
                network=network.name,
                user="1000:1000",
            )
            deadline = time.monotonic() + 15
            while b"ready" not in relay.logs():
                assert time.monotonic() < deadline, "relay never started"
                time.sleep(0.05)
            yield endpoint, relay
    finally:
        if relay is not None:
            relay.remove(force=True)
        network.remove()


def _attach_when_outbound_exists(client: Any, relay: Any, state_dir: Path, proc: Any) -> str:
    """Connect the relay to this run's outbound network as sts.test; then signal the step."""
    run_id = wait_for_run(state_dir, proc)
    labels = [f"{LABEL_RUN}={run_id}", f"{LABEL_COMPONENT}={COMPONENT_OUTBOUND}"]
    deadline = time.monotonic() + 60
    while not (nets := client.networks.list(filters={"label": labels})):
        assert proc.poll() is None, proc.stdout.read()
        assert time.monotonic() < deadline, "apply never created its outbound network"
        time.sleep(0.05)
    nets[0].connect(relay, aliases=["sts.test"])
    return str(nets[0].name)


def test_script_brain_with_egress_and_sts_lease(
    docker_client: Any,
    tmp_path: Path,
    state_dir: Path,
    sts_world: tuple[str, Any],
    state_target: Location,
) -> None:
    """The whole apply (runs, lease ledger, egress audit, applied plan) on each state
    backend."""
    endpoint, relay = sts_world
    key_id, secret = ROOT_KEY.split(":")
    iam = boto3.client(
        "iam",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id=key_id,
        aws_secret_access_key=secret,
    )
    role_arn = iam.create_role(RoleName="apply-test", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
    manifests = manifest_set(
        tmp_path,
        {
            "kind": "CredentialProvider",
            "metadata": {"name": "aws-test"},
            "spec": {
                "type": "aws-sts",
                "secret": "env:KAGURA_TEST_AWS_ROOT",
                "ttl": "15m",
                "aws": {
                    "region": "us-east-1",
                    "endpoint": endpoint,
                    # The fake STS listens on the bridge gateway: declared as the provider's.
                    "endpoint_addresses": [endpoint.split("//")[1].rsplit(":", 1)[0] + "/32"],
                    "bundle_endpoint": f"http://sts.test:{RELAY_PORT}",
                },
                "scopes": {
                    "tester": {
                        "description": "apply test",
                        "role_arn": role_arn,
                        "session_policy": {
                            "Version": "2012-10-17",
                            "Statement": [
                                {
                                    "Effect": "Allow",
                                    "Action": "sts:GetCallerIdentity",
                                    "Resource": "*",
                                }
                            ],
                        },
                    }
                },
            },
        },
        {
            "kind": "EgressPolicy",
            "metadata": {"name": "sts-test"},
            "spec": {
                "allow": [
                    {
                        "host": "sts.test",
                        "ports": [RELAY_PORT],
                        "http": True,
                        "allow_addresses": ["172.16.0.0/12", "10.0.0.0/8", "192.168.0.0/16"],
                    }
                ]
            },
        },
    )
    project = make_project(tmp_path)
    task = write_task(
        project,
        "sts-e2e",
        {
            "egress": ["sts-test"],
            "credentials": [{"provider": "aws-test", "scope": "tester"}],
            "steps": [
                "for i in $(seq 600); do test -e .upstream-ready && break; sleep 0.1; done",
                'test "$AWS_SHARED_CREDENTIALS_FILE" = /run/kagura/creds/aws/credentials',
                "grep -c aws_session_token /run/kagura/creds/aws/credentials > token-lines.txt",
                WHOAMI,
            ],
            "verify": ["grep -q assumed-role/apply-test/ arn.txt", "test -s token-lines.txt"],
        },
    )
    env = cli_env(state_dir, KAGURA_TEST_AWS_ROOT=ROOT_KEY)
    args = ["apply", "--yes", "--json", "--manifests", str(manifests), str(task)]
    args += ["--approve", "egress:sts-test", "--approve", "credential:aws-test/tester"]
    proc = spawn(args, env)
    try:
        outbound = _attach_when_outbound_exists(docker_client, relay, state_dir, proc)
        (project / ".upstream-ready").write_text("go\n")
        output, _ = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, output + relay.logs().decode()
    assert outbound.endswith("-outbound")
    arn = (project / "arn.txt").read_text().strip()
    assert ":assumed-role/apply-test/kagura-" in arn, arn
    # The host never handed the root key to the container: the ARN is the leased role's.
    assert key_id not in (project / "arn.txt").read_text()
    lines = json_lines(output)
    egress = [item for item in lines if item.get("kind") == "egress"]
    assert any(e.get("decision") == "allow" and e.get("host") == "sts.test" for e in egress), egress
    [run_id] = run_ids(state_dir)
    assert leftovers(docker_client, run_id) == []
    # An STS credential cannot be revoked: released, it is shown lapsing until its expiry.
    assert [lease["state"] for lease in live_leases(env)] == ["lapsing"]
    [row] = all_leases(env)
    assert row["state"] == "lapsing" and row["run_id"] == run_id, row
    result = last_json(output)
    assert result["outcome"] == "success" and result["run_id"] == run_id
    assert [v["exit_code"] for v in result["verify"]] == [0, 0]
    with StateStore(state_target) as store:
        assert audit.run_allowlist(store, run_id) is not None
        assert [e.host for e in audit.load_events(store, run_id)] != []
        assert history.last_applied("sts-e2e") is not None
    # On PostgreSQL nothing was written to the state directory's SQLite file.
    assert (state_dir / "state.db").exists() == isinstance(state_target, Path)


def _expected_host_config(plan: dict[str, Any]) -> dict[str, Any]:
    h = plan["hardening"]
    most = plan["budget"]["disk_bytes"] + 1024**2
    return {
        "CapDrop": ["ALL"],
        "CapAdd": h["cap_add"] or None,
        "SecurityOpt": ["no-new-privileges:true"],
        "ReadonlyRootfs": True,
        "Privileged": False,
        "PidsLimit": h["pids_limit"],
        "Memory": h["memory_bytes"],
        "MemorySwap": h["memory_bytes"],
        "NanoCpus": h["nano_cpus"],
        "Ulimits": [
            {"Name": "nofile", "Soft": h["nofile"], "Hard": h["nofile"]},
            # No single file past the disk budget (and 1 MiB): the kernel refuses it.
            {"Name": "fsize", "Soft": most, "Hard": most},
        ],
        # The kagura entrypoint is the container's init (it reaps and forwards signals),
        # so no Docker init process holds the brain channel.
        "Init": False,
        # No network even with egress: the proxy is reached through the socket volume.
        "NetworkMode": plan["hardening"]["network"],
        "IpcMode": h["ipc_mode"],
        "PidMode": "",
        "Runtime": h["runtime"],
        "Devices": h["devices"] or None,
        "Dns": None,
    }


def test_the_container_that_runs_equals_the_plan(
    docker_client: Any, tmp_path: Path, state_dir: Path
) -> None:
    manifests = manifest_set(
        tmp_path,
        {
            "kind": "EgressPolicy",
            "metadata": {"name": "nowhere"},
            "spec": {"allow": [{"host": "nowhere.test"}]},
        },
    )
    project = make_project(tmp_path)
    # Extra mounts live inside the project root and are mounted read-only.
    (project / "reference").mkdir()
    (project / "reference" / "notes.txt").write_text("read me\n")
    task = write_task(
        project,
        "inspected",
        {
            "egress": ["nowhere"],
            "mounts": [{"source": "reference", "target": "/reference"}],
            "steps": ["for i in $(seq 1200); do test -e .done && break; sleep 0.1; done"],
            "verify": ["test -e .done", "cat /reference/notes.txt"],
        },
    )
    env = cli_env(state_dir)
    planned = kagura(["plan", "--json", "--manifests", str(manifests), str(task)], env)
    assert planned.returncode == 0, planned.stderr
    [entry] = json.loads(planned.stdout)["plans"]
    plan = entry["plan"]
    needed = [a["category"] for a in plan["approvals"] if a["class"] == "needs-approval"]
    args = ["apply", "--yes", "--manifests", str(manifests), str(task)]
    proc = spawn(args + [arg for cat in needed for arg in ("--approve", cat)], env)
    try:
        run_id = wait_for_run(state_dir, proc)
        container = wait_for_container(docker_client, run_id)
        info = docker_client.api.inspect_container(container.id)
        socket_volume = f"kagura-egress-{run_id}-socket"
        (project / ".done").write_text("done\n")
        output, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, output

    config, host = info["Config"], info["HostConfig"]
    assert info["Image"] == plan["image"]["digest"]
    assert config["User"] == plan["hardening"]["user"]
    # kagura's own processes start in / (read-only); the agent works in the plan's workdir.
    assert config["WorkingDir"] == "/"
    assert config["Labels"]["dev.kagura.plan"] == plan["fingerprint"]
    assert config["Labels"]["dev.kagura.task"] == plan["task"]["name"]
    assert config["Labels"]["dev.kagura.run"] == run_id
    # The state store and process it answers to: only that store's crash sweeps take it.
    assert config["Labels"]["dev.kagura.store"] == owner_key(state_dir / "state.db")
    assert config["Labels"]["dev.kagura.owner"].split(":")[1] == str(proc.pid)
    assert config["OpenStdin"] is True and config["Tty"] is False
    assert config["StopSignal"] == "SIGTERM"
    assert config["StopTimeout"] == plan["hardening"]["stop_timeout"]
    for key, value in _expected_host_config(plan).items():
        assert host.get(key) == value, (key, host.get(key), value)
    assert host["Tmpfs"] == plan["hardening"]["tmpfs"]
    binds = [m for m in info["Mounts"] if m["Type"] == "bind"]
    mounted = sorted((m["Source"], m["Destination"], m["RW"]) for m in binds)
    # Tmpfs mounts are not in Mounts; the plan's binds are all there is, plus the egress
    # socket volume, read-only.
    wanted = sorted((m["source"], m["target"], m["mode"] == "rw") for m in plan["mounts"])
    assert mounted == wanted
    volumes = [(m["Name"], m["Destination"], m["RW"]) for m in info["Mounts"] if m not in binds]
    assert volumes == [(socket_volume, "/run/kagura/egress", False)]
    # The task file lies in the project root: it is mounted read-only over it; the root
    # has no .git yet: it is held empty and read-only, and gone after the run.
    assert [m["target"] for m in plan["mounts"]] == [
        "/workspace",
        "/reference",
        "/workspace/.git",
        "/workspace/task.yml",
    ]
    assert not (project / ".git").exists()
    # No credential or proxy secret in the config: the environment is only the proxy's.
    env_names = {item.split("=", 1)[0] for item in config["Env"]}
    assert {"HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY"} <= env_names
    assert not any(name.startswith(("AWS_", "ANTHROPIC_")) for name in env_names)
    assert leftovers(docker_client, run_id) == []
