"""Pure tests: hardening kwargs, mount checks, isolation gate, apt sources, recipe digests."""

from __future__ import annotations

import os
import socket
import struct
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from membrane_helpers import edited, make_plan

from kagura_agent.errors import ExitCode, RefusedError, SetupError
from kagura_agent.membrane import attach, bootstrap, hardening, images, isolation
from kagura_agent.membrane.mounts import check_mount
from kagura_agent.membrane.runtime import check_image_digest, split_kwargs

DIGEST = "sha256:" + "a" * 64


def test_container_kwargs_maps_every_hardening_field(tmp_path: Path) -> None:
    plan = make_plan(tmp_path, digest=DIGEST, cap_add=["CHOWN"], pids_limit=99, nofile=321)
    kw = hardening.container_kwargs(hardening.ContainerSpec(plan, "run-1", command=["true"]))
    assert kw["image"] == DIGEST
    assert kw["user"] == "1000:1000"
    assert kw["cap_drop"] == ["ALL"] and kw["cap_add"] == ["CHOWN"]
    assert kw["security_opt"] == ["no-new-privileges:true"]
    assert kw["read_only"] is True and kw["privileged"] is False and kw["devices"] == []
    assert kw["pids_limit"] == 99
    assert kw["mem_limit"] == kw["memswap_limit"] == 512 * 1024 * 1024
    assert kw["nano_cpus"] == 1_000_000_000
    disk = plan["budget"]["disk_bytes"] + 1024**2
    assert kw["ulimits"] == [
        {"name": "nofile", "soft": 321, "hard": 321},
        {"name": "fsize", "soft": disk, "hard": disk},  # no file past the disk budget
    ]
    assert kw["init"] is True and kw["stop_timeout"] == 10
    assert kw["network_mode"] == "none" and kw["ipc_mode"] == "private"
    assert kw["runtime"] == "runc" and kw["working_dir"] == "/"
    assert "pid_mode" not in kw and "network" not in kw
    assert kw["stdin_open"] is True and kw["tty"] is False
    assert kw["labels"] == {
        "dev.kagura.run": "run-1",
        "dev.kagura.session": "",
        "dev.kagura.task": "membrane-test",
        "dev.kagura.plan": plan["fingerprint"],
    }


def test_agent_container_runs_its_entrypoint_as_init_and_verify_is_cut_off(
    tmp_path: Path,
) -> None:
    plan = make_plan(tmp_path, digest=DIGEST, egress="proxy")
    agent = hardening.container_kwargs(
        hardening.ContainerSpec(plan, "run-1", network="kagura-net", environment={"A": "1"})
    )
    # The kagura entrypoint is PID 1 itself: no dumpable Docker init holds the channel.
    assert agent["init"] is False and agent["network_mode"] == "kagura-net"
    verify = hardening.container_kwargs(
        hardening.ContainerSpec(
            plan,
            "run-1",
            network="kagura-net",
            environment={"A": "1"},
            dns=["127.0.0.1"],
            role="verify",
        )
    )
    assert verify["network_mode"] == "none" and verify["environment"] == {}
    assert "dns" not in verify and verify["stdin_open"] is False
    assert verify["init"] is True and verify["entrypoint"] == ["sleep", "infinity"]
    assert verify["labels"]["dev.kagura.role"] == "verify"
    assert verify["labels"]["dev.kagura.run"] == "run-1"
    floor = ("cap_drop", "security_opt", "read_only", "pids_limit", "mem_limit", "user", "mounts")
    assert {k: verify[k] for k in floor} == {k: agent[k] for k in floor}
    with pytest.raises(SetupError):
        hardening.container_kwargs(
            hardening.ContainerSpec(plan, "run-1", network="kagura-net", role="brain")
        )


def test_tmpfs_is_exactly_what_the_plan_says(tmp_path: Path) -> None:
    plan = make_plan(tmp_path, digest=DIGEST, tmpfs_size="64m")
    tmpfs = plan["hardening"]["tmpfs"]
    # The plan states every option the container gets (Docker adds nothing we rely on).
    assert tmpfs == {
        "/tmp": "rw,noexec,nosuid,nodev,size=67108864,mode=1777,uid=1000,gid=1000",
        "/home/agent": "rw,noexec,nosuid,nodev,size=67108864,mode=0700,uid=1000,gid=1000",
        "/run/kagura": "rw,noexec,nosuid,nodev,size=16777216,mode=0700,uid=1000,gid=1000",
    }
    assert hardening.container_kwargs(hardening.ContainerSpec(plan, "r"))["tmpfs"] == tmpfs


@pytest.mark.parametrize(
    ("options", "why"),
    [
        ("rw,nosuid,nodev,size=16777216,mode=0700,uid=1000,gid=1000", "noexec,nosuid,nodev"),
        ("rw,noexec,nosuid,nodev,exec,size=16777216,mode=0700,uid=1000,gid=1000", "noexec"),
        ("rw,noexec,nosuid,nodev,size=268435456,mode=0700,uid=1000,gid=1000", "16 MiB"),
        ("rw,noexec,nosuid,nodev,size=16777216,mode=0755,uid=1000,gid=1000", "0700"),
        ("rw,noexec,nosuid,nodev,size=16777216,mode=0700,uid=0,gid=0", "owned by the agent"),
        (None, "/run/kagura is missing"),
    ],
)
def test_credentials_tmpfs_weaker_than_floor_is_refused(
    tmp_path: Path, options: str | None, why: str
) -> None:
    plan = make_plan(tmp_path, digest=DIGEST)
    tmpfs = dict(plan["hardening"]["tmpfs"])
    if options is None:
        del tmpfs["/run/kagura"]
    else:
        tmpfs["/run/kagura"] = options
    with pytest.raises(RefusedError, match=why):
        hardening.container_kwargs(hardening.ContainerSpec(edited(plan, tmpfs=tmpfs), "r"))


def test_mounts_only_project_root_writable(tmp_path: Path) -> None:
    ref = tmp_path / "ref"
    ref.mkdir()
    plan = make_plan(tmp_path, digest=DIGEST, extra_mounts=[(str(ref), "/ref")])
    mounts = hardening.container_kwargs(hardening.ContainerSpec(plan, "r"))["mounts"]
    assert [(m["Target"], m["ReadOnly"]) for m in mounts] == [
        ("/workspace", False),
        ("/ref", True),
        ("/workspace/.git", True),  # absent: held empty, read-only (membrane/placeholders.py)
    ]
    plan["mounts"][1]["mode"] = "rw"
    with pytest.raises(RefusedError, match="only the project root"):
        hardening.container_kwargs(hardening.ContainerSpec(plan, "r"))


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("privileged", True),
        ("devices", ["/dev/kvm"]),
        ("pid_mode", "host"),
        ("ipc_mode", "host"),
        ("seccomp", "unconfined"),
        ("no_new_privileges", False),
        ("read_only_rootfs", False),
        ("cap_drop", []),
        ("user", "0:0"),
        ("user", "root"),
    ],
)
def test_weaker_than_floor_is_refused(tmp_path: Path, field: str, value: object) -> None:
    plan = edited(make_plan(tmp_path, digest=DIGEST), **{field: value})
    with pytest.raises(RefusedError) as info:
        hardening.container_kwargs(hardening.ContainerSpec(plan, "r"))
    assert info.value.exit_code == ExitCode.REFUSED


def test_proxy_egress_needs_a_network(tmp_path: Path) -> None:
    plan = make_plan(tmp_path, digest=DIGEST, egress="proxy")
    with pytest.raises(SetupError):
        hardening.container_kwargs(hardening.ContainerSpec(plan, "r"))
    kw = hardening.container_kwargs(
        hardening.ContainerSpec(plan, "r", network="kagura-r", dns=["10.9.0.2"])
    )
    assert kw["network_mode"] == "kagura-r" and kw["dns"] == ["10.9.0.2"]


def test_split_kwargs_separates_host_config(tmp_path: Path) -> None:
    create, host = split_kwargs(
        hardening.container_kwargs(hardening.ContainerSpec(make_plan(tmp_path, digest=DIGEST), "r"))
    )
    assert {"image", "user", "labels", "stop_timeout", "stdin_open"} <= set(create)
    assert {"cap_drop", "mounts", "tmpfs", "pids_limit", "runtime"} <= set(host)
    assert not set(create) & set(host)


def test_check_mount_rules(tmp_path: Path) -> None:
    root = tmp_path / "project"
    (root / "sub").mkdir(parents=True)
    outside = tmp_path / "ref"
    outside.mkdir()
    (root / "etc-link").symlink_to("/etc")
    (root / "ok-link").symlink_to(root / "sub")
    r = str(root)
    assert check_mount(r, r, writable=True) is None
    assert check_mount(str(root / "sub"), r, writable=False) is None
    assert check_mount(str(root / "ok-link"), r, writable=False) is None
    assert check_mount(str(outside), r, writable=False) is None
    assert "only be read-only" in (check_mount(str(outside), r, writable=True) or "")
    assert "only be read-only" in (check_mount(str(root / "sub"), r, writable=True) or "")
    assert "leaves the project root" in (
        check_mount(str(root / "etc-link"), r, writable=False) or ""
    )
    assert "host root" in (check_mount("/", r, writable=False) or "")
    assert "home directory" in (check_mount(str(Path.home()), r, writable=False) or "")
    assert check_mount("relative/path", r, writable=False) is not None
    assert check_mount(str(tmp_path / "missing"), r, writable=False) is not None
    assert "device" in (check_mount("/dev/null", r, writable=False) or "")
    assert check_mount("/proc/self", r, writable=False) is not None


def test_check_mount_refuses_sockets_and_docker_sock(tmp_path: Path) -> None:
    path = tmp_path / "docker.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    try:
        assert "engine socket" in (check_mount(str(path), str(tmp_path), writable=False) or "")
        other = tmp_path / "app.sock"
        server2 = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server2.bind(str(other))
        assert "socket" in (check_mount(str(other), str(tmp_path), writable=False) or "")
        server2.close()
    finally:
        server.close()
    if os.path.exists("/var/run/docker.sock"):
        assert check_mount("/var/run/docker.sock", str(tmp_path), writable=False) is not None


@pytest.mark.usefixtures("without_docker")
def test_shared_tenancy_needs_sandbox_runtime(tmp_path: Path) -> None:
    with pytest.raises(RefusedError, match="gVisor or Kata"):
        isolation.check_tenancy(make_plan(tmp_path, tenancy="shared")["hardening"])
    isolation.check_tenancy(make_plan(tmp_path, tenancy="shared", runtime="runsc")["hardening"])
    isolation.check_tenancy(make_plan(tmp_path)["hardening"])


def test_isolation_report_reads_security_options() -> None:
    plain = isolation.isolation_report({"SecurityOptions": ["name=seccomp,profile=default"]})
    assert plain["userns_remap"] is False and plain["rootless"] is False and plain["warnings"]
    remapped = isolation.isolation_report(
        {
            "SecurityOptions": ["name=seccomp,profile=default", "name=userns"],
            "Runtimes": {"runc": {}, "runsc": {}},
        }
    )
    assert remapped["userns_remap"] is True and remapped["warnings"] == []
    assert remapped["sandbox_runtimes"] == ["runsc"]


def test_apt_sources_from_one_line_and_deb822(tmp_path: Path) -> None:
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list").write_text(
        "# comment\ndeb [signed-by=/k.gpg arch=amd64] http://mirror.invalid/debian bookworm main"
        " contrib\ndeb-src http://mirror.invalid/debian bookworm main\n"
    )
    (tmp_path / "sources.list.d" / "debian.sources").write_text(
        "Types: deb\n# note\nURIs: http://mirror.invalid/debian\n"
        "Suites: bookworm-updates\nComponents: main\n\n"
        "Types: deb\nURIs: http://security.invalid/debian-security\n"
        "Suites: bookworm-security\nComponents: main\n\n"
        "Types: deb\nURIs: http://other.invalid/x\nSuites: nodistro\nComponents: main\n"
    )
    found = bootstrap.debian_sources(tmp_path)
    assert found[0] == bootstrap.AptSource(
        "http://mirror.invalid/debian", "bookworm", ("main", "contrib")
    )
    assert [s.suite for s in found] == ["bookworm", "bookworm-updates", "bookworm-security"]
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(SetupError):
        bootstrap.debian_sources(empty)


def test_recipe_digest_and_parent(tmp_path: Path) -> None:
    recipe = tmp_path / "python"
    recipe.mkdir()
    (recipe / "Dockerfile").write_text("ARG BASE_IMAGE=kagura/base:0.1.0\nFROM ${BASE_IMAGE}\n")
    first = images.recipe_digest(recipe)
    (recipe / "wheelhouse").mkdir()
    (recipe / "wheelhouse" / "x.whl").write_text("ignored")
    assert images.recipe_digest(recipe) == first
    (recipe / "extra.sh").write_text("echo\n")
    assert images.recipe_digest(recipe) != first and first.startswith("sha256:")
    assert images.parent_recipe(recipe) == "base"
    repo_images = images.recipes_dir()
    assert images.recipe_names(repo_images)[:3] == ["base", "python", "agent"]
    assert images.parent_recipe(repo_images / "base") is None
    assert images.base_image_default(repo_images / "base").startswith("debian:bookworm")
    assert "@sha256:" in images.base_image_default(repo_images / "base")


def test_local_image_digest_is_fast_without_a_daemon(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    started = time.perf_counter()
    assert images.local_image_digest("kagura/base:0.1.0") is None
    assert time.perf_counter() - started < 0.05


def test_check_image_digest_refuses_unresolved_plan(tmp_path: Path) -> None:
    plan = make_plan(tmp_path, digest="")
    with pytest.raises(RefusedError, match="kagura/base") as info:
        check_image_digest(plan)
    assert info.value.exit_code == 6


def test_attach_frames_demultiplex() -> None:
    left, right = socket.socketpair()
    frames = [(1, b'{"a": 1}\n{"b"'), (2, b"noise\n"), (1, b": 2}\n")]
    for stream_id, payload in frames:
        left.sendall(struct.pack(">BxxxL", stream_id, len(payload)) + payload)
    left.close()
    assert list(attach.stdout_lines(right)) == [b'{"a": 1}', b'{"b": 2}']
    right.close()


def test_unreachable_daemon_is_a_setup_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from kagura_agent.membrane.runtime import DockerRuntime, connect

    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    with pytest.raises(SetupError, match="unreachable") as info:
        connect(timeout=2)
    assert info.value.exit_code == ExitCode.SETUP
    import docker

    rt = DockerRuntime(
        docker.DockerClient(base_url="unix:///nonexistent/docker.sock", version="1.41")
    )
    with pytest.raises(SetupError):
        rt.list()


def test_egress_mounts_must_be_read_only_volumes(tmp_path: Path) -> None:
    plan = make_plan(tmp_path, digest=DIGEST, egress="proxy")
    volume = {"Type": "volume", "Source": "v", "Target": "/run/kagura/egress", "ReadOnly": True}
    kw = hardening.container_kwargs(
        hardening.ContainerSpec(plan, "r", network="none", egress_mounts=[volume])
    )
    assert kw["network_mode"] == "none" and kw["mounts"][-1] == volume
    for bad in ({**volume, "ReadOnly": False}, {**volume, "Type": "bind", "Source": "/"}):
        with pytest.raises(RefusedError):
            hardening.container_kwargs(
                hardening.ContainerSpec(plan, "r", network="none", egress_mounts=[bad])
            )
    with pytest.raises(RefusedError):
        hardening.container_kwargs(
            hardening.ContainerSpec(make_plan(tmp_path, digest=DIGEST), "r", egress_mounts=[volume])
        )


def test_bind_mounts_are_checked_from_inside_when_proc_cannot_be_read() -> None:
    """Where /proc/PID/root is not ours to read (a non-root operator, a daemon in another
    PID namespace), the container's own ``stat`` answers; a swapped mount is still found,
    and a container that already exited has nothing left to check."""
    from kagura_agent.membrane.binds import mismatches

    expected = [("/workspace", 1, 2), ("/workspace/.git", 1, 3)]
    gone = 2**22 + 7  # above pid_max: no /proc entry
    asked: list[list[str]] = []

    def inside(answer: list[str] | None) -> Callable[[list[str]], list[str] | None]:
        def stat(targets: list[str]) -> list[str] | None:
            asked.append(targets)
            return answer

        return stat

    assert mismatches(expected, gone, inside(["1:2", "1:3"])) == []
    assert asked == [["/workspace", "/workspace/.git"]]
    [problem] = mismatches(expected, gone, inside(["1:2", "7:7"]))
    assert problem.startswith("the mount at /workspace/.git is not what was checked")
    assert mismatches(expected, gone, inside(None)) == []
    assert len(mismatches(expected, gone, inside([]))) == 2  # no answer is no match


def test_a_mount_mismatch_counts_only_for_a_process_still_running() -> None:
    """A container whose process is exiting loses its mounts first: what is seen of a
    process that ended during the look is no swap. One that runs on is refused."""
    import subprocess

    from kagura_agent.membrane.binds import mismatches

    wrong = [("/nonexistent-target", 1, 2)]  # not in the process's root: asked inside
    proc = subprocess.Popen(["sleep", "30"])
    try:
        assert len(mismatches(wrong, proc.pid, lambda targets: ["7:7"])) == 1

        def ends_while_looked_at(targets: list[str]) -> list[str]:
            proc.kill()
            proc.wait()
            return ["7:7"]

        assert mismatches(wrong, proc.pid, ends_while_looked_at) == []
    finally:
        proc.kill()
        proc.wait()
