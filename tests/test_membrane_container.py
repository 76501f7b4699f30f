"""Hardening asserted from inside real containers built from our images, plus escape probes.

Every container here is created through DockerRuntime from a plan dict and removed
afterwards; all carry the dev.kagura.run label with a test-… run id.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from membrane_helpers import make_plan, new_run_id

from kagura_agent.errors import RefusedError
from kagura_agent.membrane.build import build
from kagura_agent.membrane.images import image_ref, local_image_digest
from kagura_agent.membrane.runtime import DockerRuntime

pytestmark = pytest.mark.usefixtures("docker_client")


@pytest.fixture(scope="session")
def base_image(docker_client: Any) -> str:
    """kagura/base, built (on the bootstrap image) only when missing."""
    ref = image_ref("base")
    if local_image_digest(ref) is None:
        build(docker_client, ["base"], log=lambda name, line: None)
    digest = local_image_digest(ref)
    assert digest
    return digest


_RUN_IDS: list[str] = []


@pytest.fixture()
def runtime(docker_client: Any, base_image: str) -> Iterator[DockerRuntime]:
    """A DockerRuntime; removes every container of the runs this test started."""
    rt = DockerRuntime(docker_client)
    yield rt
    while _RUN_IDS:
        for container_id in rt.list({"dev.kagura.run": _RUN_IDS.pop()}):
            rt.remove(container_id)


@pytest.fixture()
def project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    root.mkdir()
    # The agent runs as uid 1000; the operator's checkout would be theirs.
    if os.geteuid() == 0:
        os.chown(root, 1000, 1000)
    else:
        root.chmod(0o777)
    return root


def run(rt: DockerRuntime, plan: dict[str, Any], script: str) -> tuple[int, str, bool]:
    """Run ``bash -c script`` in the plan's container; (exit code, output, OOM-killed)."""
    run_id = new_run_id()
    _RUN_IDS.append(run_id)
    # The plan's log driver is none (nothing the agent prints lands on the host's disk),
    # so the output goes to a file in the project root.
    out = Path(plan["task"]["project_root"]) / f".out-{run_id}"
    command = ["bash", "-c", f"exec > /workspace/{out.name} 2>&1\n{script}"]
    container_id = rt.create(plan, run_id, command=command)
    try:
        rt.start(container_id)
        status = rt.wait(container_id, timeout=120)
        output = out.read_text(errors="replace") if out.exists() else ""
        return status["exit_code"], output, status["oom_killed"]
    finally:
        rt.remove(container_id)


def test_runs_as_uid_1000_without_capabilities(runtime: DockerRuntime, project: Path) -> None:
    code, out, _ = run(
        runtime,
        make_plan(project),
        "id -u; id -g; grep -E '^(Cap|NoNewPrivs|Seccomp)' /proc/self/status",
    )
    assert code == 0, out
    lines = out.split()
    assert lines[:2] == ["1000", "1000"]
    status = dict(zip(lines[2::2], lines[3::2], strict=True))
    for field in ("CapInh:", "CapPrm:", "CapEff:", "CapBnd:", "CapAmb:"):
        assert int(status[field], 16) == 0, (field, status)
    assert status["NoNewPrivs:"] == "1"
    assert status["Seccomp:"] == "2"  # a filter is loaded: Docker's default profile


def test_the_tools_an_agent_expects_are_in_the_image(runtime: DockerRuntime, project: Path) -> None:
    """git and GitHub's gh among them (gh reaches GitHub only through a granted
    credential and the run's egress, like everything else)."""
    tools = "bash git gh curl jq rg ssh python3 ps"
    code, out, _ = run(
        runtime,
        make_plan(project),
        f"for t in {tools}; do command -v $t >/dev/null || echo missing $t; done; gh --version",
    )
    assert code == 0, out
    assert "missing" not in out, out
    assert out.startswith("gh version "), out


def test_root_filesystem_is_read_only(runtime: DockerRuntime, project: Path) -> None:
    # Permissions alone would stop uid 1000 in /usr or /etc, so each refusal must be the
    # read-only file system's; /var/tmp (1777 on the image's root) is the control that
    # only a read-only root refuses.
    paths = ("/var/tmp/probe", "/usr/probe", "/etc/probe", "/opt/probe", "/probe")
    _code, out, _ = run(
        runtime,
        make_plan(project),
        "stat -c 'MODE %a' /var/tmp;"
        f" for p in {' '.join(paths)};"
        ' do err=$(touch $p 2>&1) && echo "WROTE $p" || echo "REFUSED $p $err"; done;'
        " touch /tmp/ok /home/agent/ok /run/kagura/ok /workspace/ok && echo SCRATCH-OK;"
        " stat -c '%a %u' /run/kagura",
    )
    assert "MODE 1777" in out, out
    refused = [line for line in out.splitlines() if line.startswith("REFUSED")]
    assert [line.split()[1] for line in refused] == list(paths), out
    assert all(line.endswith("Read-only file system") for line in refused), out
    assert "SCRATCH-OK" in out and "700 1000" in out, out
    assert (project / "ok").exists() and (project / "ok").stat().st_uid == 1000


def test_pids_limit_stops_a_fork_loop(runtime: DockerRuntime, project: Path) -> None:
    script = (
        "python3 -c '\n"
        "import os, time\n"
        "n = 0\n"
        "try:\n"
        "    while n < 500:\n"
        "        if os.fork() == 0:\n"
        "            time.sleep(30); os._exit(0)\n"
        "        n += 1\n"
        "except OSError as exc:\n"
        '    print("BLOCKED", n, exc.errno)\n\''
    )
    _code, out, _ = run(runtime, make_plan(project, pids_limit=40), script)
    assert "BLOCKED" in out, out
    assert int(out.split()[1]) < 40


def test_memory_limit_oom_kill_is_reported(runtime: DockerRuntime, project: Path) -> None:
    plan = make_plan(project, memory="64m")
    code, out, oom = run(runtime, plan, "python3 -c 'x = [b\"k\" * (1 << 20) for _ in range(400)]'")
    assert oom is True and code == 137, (code, out)


def test_no_network_interface_but_loopback(runtime: DockerRuntime, project: Path) -> None:
    code, out, _ = run(runtime, make_plan(project), "ls /sys/class/net")
    assert code == 0 and out.split() == ["lo"], out


PROBES = {
    "unshare": "unshare -U -r true",
    "mount": "mount -t tmpfs none /mnt",
    "proc-sys": "echo 1 > /proc/sys/kernel/panic",
    "raw-socket": "python3 -c 'import socket; socket.socket(socket.AF_INET, socket.SOCK_RAW, 1)'",
    "docker-sock": "python3 -c 'import socket; s = socket.socket(socket.AF_UNIX);"
    ' [s.connect(p) for p in ("/var/run/docker.sock", "/run/docker.sock")]\'',
    "write-outside": "touch /var/probe",
    "chroot-escape": "chroot / true",
}


@pytest.mark.parametrize("probe", sorted(PROBES))
def test_escape_probe_fails(runtime: DockerRuntime, project: Path, probe: str) -> None:
    code, out, _ = run(runtime, make_plan(project), f"{PROBES[probe]} && echo ESCAPED")
    assert code != 0 and "ESCAPED" not in out, out


def test_symlink_to_etc_is_refused_and_cannot_write_through(
    runtime: DockerRuntime, project: Path, tmp_path: Path
) -> None:
    (project / "etc-link").symlink_to("/etc")
    (project / "sub").mkdir()
    plan = make_plan(project, extra_mounts=[(str(project / "sub"), "/hostetc")])
    # The planner refuses the link itself; a hand-edited saved plan could still name it.
    plan["mounts"][1]["source"] = str(project / "etc-link")
    run_id = new_run_id()
    _RUN_IDS.append(run_id)
    with pytest.raises(RefusedError, match="leaves the project root"):
        runtime.create(plan, run_id, command=["true"])
    assert runtime.list({"dev.kagura.run": run_id}) == []
    marker = "kagura-probe-" + new_run_id()
    _code, out, _ = run(
        runtime, make_plan(project), f"echo x > /workspace/etc-link/{marker} && echo ESCAPED"
    )
    assert "ESCAPED" not in out and not Path("/etc", marker).exists()


def test_extra_mount_is_read_only(runtime: DockerRuntime, project: Path, tmp_path: Path) -> None:
    ref = project / "ref"
    ref.mkdir()
    (ref / "data.txt").write_text("reference\n")
    plan = make_plan(project, extra_mounts=[(str(ref), "/ref")])
    _code, out, _ = run(runtime, plan, "cat /ref/data.txt; touch /ref/new && echo ESCAPED")
    assert "reference" in out and "ESCAPED" not in out
    assert sorted(p.name for p in ref.iterdir()) == ["data.txt"]


# Flags the kernel shows only when set (or, for rw/ro, always): the plan must say each one.
_FLAG_PAIRS = (("ro", "rw"), ("noexec", "exec"), ("nosuid", "suid"), ("nodev", "dev"))
# Docker's own tmpfs mounts (not the plan's): device nodes, shm, masked /proc and /sys paths.
_ENGINE_TMPFS = ("/dev", "/proc/", "/sys/")


def _proc_mounts(text: str) -> dict[str, tuple[str, list[str]]]:
    """/proc/mounts as {target: (fstype, options)}; the last mount of a target wins."""
    found = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[1].startswith("/"):
            found[parts[1]] = (parts[2], parts[3].split(","))
    return found


def _flags(options: list[str]) -> list[str]:
    """The state of each flag pair: the first of a pair when set, else the second."""
    return [on if on in options else off for on, off in _FLAG_PAIRS]


def _values(options: list[str]) -> dict[str, str]:
    return dict(o.split("=", 1) for o in options if "=" in o)


def _kernel_size(value: str) -> int:
    units = {"k": 1024, "m": 1024**2, "g": 1024**3}
    return int(value[:-1]) * units[value[-1]] if value[-1] in units else int(value)


def test_proc_mounts_inside_the_container_equal_the_plan(
    runtime: DockerRuntime, project: Path
) -> None:
    """The plan states exactly the mounts the container gets (issue 17's tmpfs defect:
    /run/kagura was planned rw,nosuid,nodev at 256 MiB and only Docker's default made it
    noexec). Every tmpfs's flags, size, mode and owner, every bind mount's rw/ro and the
    read-only root are read from /proc/mounts in a real container and compared."""
    ref = project / "ref"
    ref.mkdir()
    plan = make_plan(project, extra_mounts=[(str(ref), "/ref")])
    planned = plan["hardening"]["tmpfs"]
    assert set(planned) == {"/tmp", "/home/agent", "/run/kagura"}
    run_kagura = planned["/run/kagura"].split(",")
    assert {"noexec", "nosuid", "nodev", "size=16777216", "mode=0700"} <= set(run_kagura)
    code, out, _ = run(
        runtime,
        plan,
        "cat /proc/mounts; echo '#!/bin/sh' > /run/kagura/x; chmod 700 /run/kagura/x;"
        " /run/kagura/x && echo EXECUTED || echo NOEXEC",
    )
    assert code == 0, out
    mounts = _proc_mounts(out)
    live_tmpfs = {t for t, (kind, _) in mounts.items() if kind == "tmpfs"}
    ours = {t for t in live_tmpfs if not t.startswith(_ENGINE_TMPFS) and t != "/dev"}
    assert ours == set(planned), out
    for target, options in planned.items():
        kind, live = mounts[target]
        want = options.split(",")
        assert kind == "tmpfs"
        assert _flags(live) == _flags(want), (target, live, want)
        got, wanted = _values(live), _values(want)
        assert _kernel_size(got["size"]) == int(wanted["size"]), (target, live)
        # The kernel leaves out values equal to its defaults (mode 1777, uid 0, gid 0).
        assert int(got.get("mode", "1777"), 8) == int(wanted["mode"], 8), (target, live)
        assert got.get("uid", "0") == wanted["uid"] and got.get("gid", "0") == wanted["gid"]
    uid, _, gid = plan["hardening"]["user"].partition(":")
    assert _values(mounts["/run/kagura"][1])["uid"] == uid and gid
    assert "NOEXEC" in out and "EXECUTED" not in out, out
    assert _flags(mounts["/"][1])[0] == ("ro" if plan["hardening"]["read_only_rootfs"] else "rw")
    for mount in plan["mounts"]:
        assert _flags(mounts[mount["target"]][1])[0] == mount["mode"], mount


def test_a_bind_source_swapped_for_a_symlink_after_the_check_is_refused_at_start(
    runtime: DockerRuntime, tmp_path: Path
) -> None:
    """A dispatched child's root lies inside its parent's writable root, and the parent's
    agent runs all along. Between the child's checks (plan, freshness, create) and the
    container's start, when the runtime follows the bind source path, the parent renames
    the folder away and leaves a symlink to a folder of the operator's in its place: the
    child would get that folder read-write as /workspace. The start compares what each
    mount really is with what was checked, and refuses."""
    parent = tmp_path / "parent"
    child = parent / "child"
    child.mkdir(parents=True)
    secret = tmp_path / "operator-only"
    secret.mkdir()
    (secret / "id_rsa").write_text("canary-key-5b1e\n")
    for folder in (child, secret):  # a checkout each: no placeholder to give it away
        (folder / ".git").mkdir()
    if os.geteuid() == 0:
        for path in (parent, child, secret, secret / "id_rsa"):
            os.chown(path, 1000, 1000)
    plan = make_plan(child)
    run_id = new_run_id()
    _RUN_IDS.append(run_id)
    # As apply's entrypoint: nothing of the agent runs before the host's first turn.
    container_id = runtime.create(plan, run_id, command=["sleep", "60"])
    try:
        child.rename(parent / "moved")
        child.symlink_to(secret)
        with pytest.raises(RefusedError, match="/workspace is not what was checked"):
            runtime.start(container_id)
        assert runtime.wait(container_id, timeout=30)["exit_code"] != 0  # killed
    finally:
        runtime.remove(container_id)
    # A plan whose source is a symlink by the time of create is refused there.
    with pytest.raises(RefusedError, match="moved since the plan"):
        runtime.create(plan, new_run_id(), command=["true"])
