"""The runtime against the real daemon: inspect equals plan, attach, digest refusal, images."""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from membrane_helpers import make_plan, new_run_id
from resources import missing

from kagura_agent.errors import ExitCode, RefusedError
from kagura_agent.membrane import attach, build, images
from kagura_agent.membrane.runtime import DockerRuntime, check_image_digest, daemon_isolation_report

pytestmark = pytest.mark.usefixtures("docker_client")


def _ensure(client: Any, name: str) -> str:
    ref = images.image_ref(name)
    if images.local_image_digest(ref) is None:
        build.build(client, [name], log=lambda n, line: None)
    digest = images.local_image_digest(ref)
    assert digest
    return digest


@pytest.fixture()
def runtime(docker_client: Any) -> Iterator[tuple[DockerRuntime, str]]:
    """A runtime and a fresh run id; the run's containers are removed afterwards."""
    _ensure(docker_client, "base")
    rt = DockerRuntime(docker_client)
    run_id = new_run_id()
    yield rt, run_id
    for container_id in rt.list({"dev.kagura.run": run_id}):
        rt.remove(container_id)


@pytest.fixture()
def project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    root.mkdir()
    if os.geteuid() == 0:
        os.chown(root, 1000, 1000)
    return root


def test_docker_inspect_equals_plan(
    runtime: tuple[DockerRuntime, str], project: Path, tmp_path: Path
) -> None:
    rt, run_id = runtime
    ref = project / "ref"
    ref.mkdir()
    plan = make_plan(project, extra_mounts=[(str(ref), "/ref")], cap_add=["CHOWN"])
    h = plan["hardening"]
    container_id = rt.create(plan, run_id, command=["sleep", "30"])
    rt.start(container_id)
    info = rt.inspect(container_id)
    config, host = info["Config"], info["HostConfig"]
    assert info["State"]["Running"] is True
    assert info["Image"] == plan["image"]["digest"]
    assert config["User"] == h["user"]
    assert config["WorkingDir"] == "/" and h["workdir"] == "/workspace"
    assert config["StopTimeout"] == h["stop_timeout"]
    assert config["OpenStdin"] is True and config["Tty"] is False
    assert config["Labels"]["dev.kagura.run"] == run_id
    assert config["Labels"]["dev.kagura.plan"] == plan["fingerprint"]
    assert config["Labels"]["dev.kagura.task"] == plan["task"]["name"]
    assert config["Labels"]["dev.kagura.session"] == ""
    assert host["CapDrop"] == h["cap_drop"]
    assert host["CapAdd"] == h["cap_add"]
    assert host["SecurityOpt"] == ["no-new-privileges:true"]  # default seccomp, no override
    assert host["ReadonlyRootfs"] is h["read_only_rootfs"]
    assert host["Tmpfs"] == h["tmpfs"]  # exactly the plan's options, nothing added
    assert host["PidsLimit"] == h["pids_limit"]
    assert host["Memory"] == host["MemorySwap"] == h["memory_bytes"]
    assert host["NanoCpus"] == h["nano_cpus"]
    most = plan["budget"]["disk_bytes"] + 1024**2  # no file past the disk budget
    assert host["Ulimits"] == [
        {"Name": "nofile", "Soft": h["nofile"], "Hard": h["nofile"]},
        {"Name": "fsize", "Soft": most, "Hard": most},
    ]
    assert host["Init"] is h["init"]
    assert host["PidMode"] == ""  # private PID namespace
    assert host["IpcMode"] == h["ipc_mode"]
    assert host["Privileged"] is h["privileged"]
    assert (host["Devices"] or []) == h["devices"]
    assert host["Runtime"] == h["runtime"]
    assert host["NetworkMode"] == h["network"] == "none"
    assert not host.get("Binds") and not host.get("VolumesFrom")
    live = sorted((m["Source"], m["Destination"], m["RW"], m["Type"]) for m in info["Mounts"])
    wanted = sorted((m["source"], m["target"], m["mode"] == "rw", "bind") for m in plan["mounts"])
    assert live == wanted
    rt.stop(container_id, timeout=1)
    assert rt.wait(container_id, timeout=30)["oom_killed"] is False


def test_attach_socket_carries_json_lines(
    runtime: tuple[DockerRuntime, str], project: Path
) -> None:
    rt, run_id = runtime
    echo = (
        "import json, sys\n"
        "for line in sys.stdin:\n"
        "    print(json.dumps({'got': json.loads(line)}), flush=True)\n"
    )
    container_id = rt.create(make_plan(project), run_id, command=["python3", "-c", echo])
    sock = rt.attach_socket(container_id)
    rt.start(container_id)
    sock.sendall(b'{"n": 1}\n{"n": 2}\n')
    sock.shutdown(socket.SHUT_WR)
    sock.settimeout(30)
    lines = [json.loads(line) for line in attach.stdout_lines(sock)]
    sock.close()
    assert lines == [{"got": {"n": 1}}, {"got": {"n": 2}}]
    assert rt.wait(container_id, timeout=30)["exit_code"] == 0


def test_stop_kill_and_list_by_label(runtime: tuple[DockerRuntime, str], project: Path) -> None:
    rt, run_id = runtime
    first = rt.create(make_plan(project), run_id, command=["sleep", "60"])
    second = rt.create(make_plan(project), run_id, command=["sleep", "60"])
    assert sorted(rt.list({"dev.kagura.run": run_id})) == sorted([first, second])
    rt.start(first)
    rt.start(second)
    rt.stop(first, timeout=1)
    rt.kill(second)
    assert rt.wait(second, timeout=30)["exit_code"] == 137
    rt.remove(first)
    rt.remove(first)  # absent is not an error
    assert rt.list({"dev.kagura.run": run_id}) == [second]


def test_image_digest_mismatch_is_refused_with_exit_6(
    runtime: tuple[DockerRuntime, str], project: Path
) -> None:
    rt, run_id = runtime
    plan = make_plan(project, digest="sha256:" + "0" * 64)
    # The plan pins an image ID this daemon does not hold (the tag points elsewhere).
    pinned = r"image kagura/base:0\.1\.0 differs on this Docker host: the plan pins sha256:0+,"
    with pytest.raises(RefusedError, match=pinned + r" kagura/base:0\.1\.0 is sha256:") as info:
        rt.create(plan, run_id, command=["true"])
    assert info.value.exit_code == ExitCode.REFUSED == 6
    assert rt.list({"dev.kagura.run": run_id}) == []
    good = make_plan(project)
    assert check_image_digest(good) == good["image"]["digest"]
    missing = make_plan(project, image_name="no-such-recipe", digest="sha256:" + "1" * 64)
    with pytest.raises(RefusedError, match=r"0\.1\.0 is not here"):
        check_image_digest(missing)


def test_shared_tenancy_refused_before_launch(
    runtime: tuple[DockerRuntime, str], project: Path
) -> None:
    rt, run_id = runtime
    with pytest.raises(RefusedError, match="tenancy 'shared'"):
        rt.create(make_plan(project, tenancy="shared"), run_id, command=["true"])
    report = daemon_isolation_report(rt.client)
    assert isinstance(report["userns_remap"], bool) and "runc" in report["runtimes"]
    assert bool(report["warnings"]) != (report["userns_remap"] or report["rootless"])


def test_agent_image_imports_kagura_and_sdk(docker_client: Any) -> None:
    digest = _ensure(docker_client, "agent")
    output = docker_client.containers.run(
        digest,
        entrypoint=["python3", "-c"],
        command=["import kagura_agent, claude_agent_sdk, kagura_brain, boto3; print('ok')"],
        remove=True,
        network_mode="none",
        labels={"dev.kagura.run": new_run_id()},
    )
    assert output.strip() == b"ok"


def test_images_list_knows_built_recipes(docker_client: Any) -> None:
    _ensure(docker_client, "base")
    rows = {row["name"]: row for row in images.list_images()}
    assert {"base", "python", "agent"} <= set(rows)
    base = rows["base"]
    assert base["built"] and base["id"] == images.local_image_digest("kagura/base:0.1.0")
    assert base["stale"] is False, base["reason"]
    assert base["recipe_digest"] == images.recipe_digest(images.recipes_dir() / "base")


def test_bootstrap_is_skipped_when_the_image_exists(docker_client: Any) -> None:
    from kagura_agent.membrane.bootstrap import BOOTSTRAP_REF, bootstrap

    existing = images.local_image_digest(BOOTSTRAP_REF)
    if existing is None:
        missing(f"{BOOTSTRAP_REF} not built here (scripts/ci-setup.sh builds it in CI)")
    messages: list[str] = []
    assert bootstrap(docker_client, log=messages.append) == existing
    assert "skipping" in messages[0]


def test_runtime_errors_become_kagura_errors(docker_client: Any) -> None:
    from kagura_agent.membrane.runtime import ContainerError

    rt = DockerRuntime(docker_client)
    with pytest.raises(ContainerError, match="not found") as info:
        rt.start("kagura-no-such-container")
    assert info.value.exit_code == ExitCode.SETUP
    rt.remove("kagura-no-such-container")  # absent is fine
