"""The plan's ``hardening`` and ``mounts`` sections, as docker-py ``containers.create`` kwargs.

Pure: no Docker, no file system, no clock. Every protection is taken from the plan and
none is optional; a plan that asks for something weaker than the floor (privileged,
unconfined seccomp, host namespaces, devices, a writable extra mount) is refused here
with a RefusedError, so no code path can launch it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from kagura_agent.errors import RefusedError, SetupError
from kagura_agent.membrane.floor import AGENT_GIT, OPERATOR_GIT, floor_violations
from kagura_agent.plan.model import Plan

LABEL_RUN = "dev.kagura.run"
LABEL_SESSION = "dev.kagura.session"
LABEL_TASK = "dev.kagura.task"
LABEL_PLAN = "dev.kagura.plan"
LABEL_ROLE = "dev.kagura.role"
# The state store whose runs made an object (state.owner_key): a crash sweep takes only
# its own store's objects, so state directories sharing a daemon never sweep each other.
LABEL_STORE = "dev.kagura.store"
ROLES = ("agent", "verify")
# Where a container's processes start: the image's root, read-only, which no agent writes.
# The agent works in the plan's ``hardening.workdir`` (/workspace: the turn names it as
# the engines' working directory, and verify commands are exec'd there), but kagura's own
# processes — the forwarder's launcher, the brain's entrypoint (PID 1) — must not start
# in it: ``python -m`` and ``-c`` import from their working directory, and run 1 of a root
# could leave a socket.py or kagura_agent/ there for run 2's PID 1.
START_DIR = "/"


def _refuse(what: str) -> RefusedError:
    return RefusedError(f"plan hardening refused: {what}", hint="fix the image or policy manifest")


def _uid_gid(user: str) -> tuple[int, int]:
    uid, _, gid = user.partition(":")
    if not uid.isdigit() or not (gid or uid).isdigit():
        raise _refuse(f"user {user!r} must be numeric uid:gid")
    if int(uid) == 0:
        raise _refuse("the container may not run as root (uid 0)")
    return int(uid), int(gid or uid)


def mount_target(mount: Mapping[str, Any], role: str) -> str:
    """Where ``mount`` lands in a container of ``role``: the plan's target, but verify
    sees the operator's repository where git looks for it (read-only); the agent's own
    (plan/commits.py) was a tmpfs of its container, gone with it."""
    target = str(mount["target"])
    if role == "verify" and mount["kind"] == "protected" and target == OPERATOR_GIT:
        return AGENT_GIT
    return target


def _mounts(plan: Plan, role: str = "agent") -> list[dict[str, Any]]:
    project_root = plan["task"]["project_root"]
    result = []
    for mount in plan["mounts"]:
        writable = mount["mode"] == "rw"
        target = mount_target(mount, role)
        if writable and (mount["kind"] != "project" or mount["source"] != project_root):
            raise _refuse(f"only the project root may be mounted writable, not {mount['source']}")
        result.append(
            {
                "Type": "bind",
                "Source": mount["source"],
                "Target": target,
                "ReadOnly": not writable,
                # rprivate: mounts made later on the host never propagate into the container.
                "BindOptions": {"Propagation": "rprivate"},
            }
        )
    return result


def _egress_mounts(mounts: Sequence[Mapping[str, Any]], egress: str) -> list[dict[str, Any]]:
    if mounts and egress != "proxy":
        raise _refuse("an egress socket mount for a plan without egress")
    for mount in mounts:
        if mount.get("Type") != "volume" or mount.get("ReadOnly") is not True:
            raise _refuse(f"egress mount {mount.get('Target')} must be a read-only volume")
    return [dict(m) for m in mounts]


def _check_floor(plan: Plan) -> None:
    """The membrane floor once more, on the plan this container is created from (a saved
    plan may have been edited by hand since it was compiled): hardening, mounts, egress."""
    broken = floor_violations(plan)
    if broken:
        raise _refuse("; ".join(broken))


# How far one file may pass the disk budget before the kernel refuses it: enough for the
# disk watch to see the budget passed and name it as the reason the run was stopped.
FSIZE_SLACK = 1024**2


def _ulimits(nofile: int, disk_bytes: int) -> list[dict[str, Any]]:
    """Open files; and no single file much larger than the run's disk budget, however it
    grows (written, allocated with fallocate, extended with truncate): the kernel refuses
    it (EFBIG) at once, where the host's disk watch (apply/guards/diskwatch.py) would see an
    allocation only after it was made."""
    found: list[dict[str, Any]] = [{"name": "nofile", "soft": nofile, "hard": nofile}]
    if disk_bytes > 0:
        most = disk_bytes + FSIZE_SLACK
        found.append({"name": "fsize", "soft": most, "hard": most})
    return found


def labels(plan: Plan, run_id: str) -> dict[str, str]:
    """The labels every container of this run carries (and that list/sweep filter on)."""
    task = plan["task"]
    return {
        LABEL_RUN: run_id,
        LABEL_SESSION: task["session"] or "",
        LABEL_TASK: task["name"],
        LABEL_PLAN: plan["fingerprint"],
    }


@dataclass(frozen=True)
class ContainerSpec:
    """One container of a run: the plan it is made from, and what the run adds to it.

    Built once by whoever creates the container (``DockerRuntime.create``, a test) and
    passed whole to :func:`container_kwargs`; frozen, so a variation is
    ``dataclasses.replace(spec, ...)``.

    ``role`` is ``agent`` (the brain's container) or ``verify``: a fresh container from
    the same image and mounts, with no network, no environment, no stdin (no brain
    channel) and an idle process to exec the verify commands in (:meth:`as_built`).
    ``network`` is what the egress session gives (``none``: the agent reaches the proxy
    through the read-only socket volume in ``egress_mounts``); required when the plan's
    egress mode is ``proxy`` and ignored (``none``) otherwise. ``forward`` (the egress
    forwarder's (socket, port) pairs): the container's own command starts the forwarder
    before the image's entrypoint. ``environment`` must hold no secrets: credentials
    reach the container through /run/kagura, never through its config.
    """

    plan: Plan
    run_id: str
    role: str = "agent"
    command: list[str] | None = None
    environment: Mapping[str, str] = field(default_factory=dict)
    # Its way out: the run's network, the proxy's socket volume, the forwarder's pairs.
    network: str | None = None
    egress_mounts: Sequence[Mapping[str, Any]] = ()
    forward: Sequence[tuple[str, int]] = ()
    name: str | None = None
    # The egress session points the resolver at loopback: no name resolves inside.
    dns: list[str] | None = None
    dns_opt: list[str] | None = None

    def as_built(self) -> ContainerSpec:
        """The spec as its role allows: a verify container gets no network, environment,
        resolver or egress socket, whatever it was asked."""
        if self.role != "verify":
            return self
        return replace(self, network=None, environment={}, dns=None, dns_opt=None, egress_mounts=())


def container_kwargs(spec: ContainerSpec) -> dict[str, Any]:
    """Translate a container of a launch plan into docker-py keyword arguments.

    The result is flat; ``runtime.split_kwargs`` separates the container-config keys from
    the host-config keys for ``APIClient.create_container`` (the high-level
    ``containers.create`` cannot set ``stop_timeout``). Only read-only volume mounts are
    accepted in ``egress_mounts``.
    """
    plan, run_id, role, command = spec.plan, spec.run_id, spec.role, spec.command
    h = plan["hardening"]
    _check_floor(plan)
    if role not in ROLES:
        raise SetupError(f"unknown container role {role!r}")
    uid, gid = _uid_gid(h["user"])
    spec = spec.as_built()
    egress = "none" if role == "verify" else plan["egress"]["mode"]
    network = spec.network
    if egress == "proxy":
        if not network:
            raise SetupError("the plan's egress mode is proxy but no run network was given")
        network_mode = network
    else:
        network_mode = "none"
    nofile = int(h["nofile"])
    kwargs: dict[str, Any] = {
        "image": plan["image"]["digest"] or plan["image"]["ref"],
        "command": command,
        "user": f"{uid}:{gid}",
        "working_dir": START_DIR,
        "labels": labels(plan, run_id),
        "environment": dict(spec.environment),
        "cap_drop": ["ALL"],
        "cap_add": list(h["cap_add"]),
        # Docker applies its default seccomp profile when none is named; we never name one.
        "security_opt": ["no-new-privileges:true"],
        "read_only": True,
        # Exactly the plan's options: the planner wrote every flag, size, mode and owner.
        "tmpfs": {k: v for k, v in h["tmpfs"].items() if role != "verify" or k != AGENT_GIT},
        "mounts": _mounts(plan, role) + _egress_mounts(spec.egress_mounts, egress),
        "pids_limit": int(h["pids_limit"]),
        "mem_limit": int(h["memory_bytes"]),
        # Same as mem_limit: no swap, so the memory limit is a hard OOM boundary.
        "memswap_limit": int(h["memory_bytes"]),
        "nano_cpus": int(h["nano_cpus"]),
        "ulimits": _ulimits(nofile, plan["budget"]["disk_bytes"]),
        # The kagura entrypoint is its own init (brain/guard.py): Docker's would be a
        # process the agent's tools can ptrace, holding the brain channel's pipes.
        "init": h["init"] and not (role == "agent" and command is None),
        "stop_signal": "SIGTERM",
        "stop_timeout": h["stop_timeout"],
        "network_mode": network_mode,
        "ipc_mode": "private",
        "privileged": False,
        "devices": [],
        "runtime": h["runtime"],
        # The agent's stdout is the event stream, which may carry what a tool printed; with
        # no log driver it is never written to the host's disk (attach still works).
        "log_config": {"type": h["log_driver"], "config": {}},
        "stdin_open": True,
        "tty": False,
    }
    if role == "verify":
        kwargs["labels"][LABEL_ROLE] = "verify"
        kwargs["entrypoint"] = ["sleep", "infinity"]
        kwargs["command"] = None
        kwargs["stdin_open"] = False
    if spec.name:
        kwargs["name"] = spec.name
    if spec.dns is not None:
        kwargs["dns"] = list(spec.dns)
    if spec.dns_opt is not None:
        kwargs["dns_opt"] = list(spec.dns_opt)
    return kwargs
