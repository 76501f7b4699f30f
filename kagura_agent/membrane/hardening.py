"""The plan's ``hardening`` and ``mounts`` sections, as docker-py ``containers.create`` kwargs.

Pure: no Docker, no file system, no clock. Every protection is taken from the plan and
none is optional; a plan that asks for something weaker than the floor (privileged,
unconfined seccomp, host namespaces, devices, a writable extra mount) is refused here
with a RefusedError, so no code path can launch it.
"""

from __future__ import annotations

from typing import Any

from kagura_agent.errors import RefusedError, SetupError
from kagura_agent.plan.model import Hardening, Plan

LABEL_RUN = "dev.kagura.run"
LABEL_SESSION = "dev.kagura.session"
LABEL_TASK = "dev.kagura.task"
LABEL_PLAN = "dev.kagura.plan"
LABEL_ROLE = "dev.kagura.role"
ROLES = ("agent", "verify")

# Scratch space the entrypoint and tools need on a read-only root; /run/kagura receives
# the short-lived credentials the in-container entrypoint writes, so only uid 1000 reads it.
_DEFAULT_TMPFS = {
    "/tmp": "rw,nosuid,nodev,size=268435456",
    "/home/agent": "rw,nosuid,nodev,size=268435456",
    "/run/kagura": "rw,nosuid,nodev,noexec,size=16777216",
}
_TMPFS_MODES = {"/tmp": "1777", "/home/agent": "0700", "/run/kagura": "0700"}
_HOST_MODES = {"host"}


def _refuse(what: str) -> RefusedError:
    return RefusedError(f"plan hardening refused: {what}", hint="fix the image or policy manifest")


def _uid_gid(user: str) -> tuple[int, int]:
    uid, _, gid = user.partition(":")
    if not uid.isdigit() or not (gid or uid).isdigit():
        raise _refuse(f"user {user!r} must be numeric uid:gid")
    if int(uid) == 0:
        raise _refuse("the container may not run as root (uid 0)")
    return int(uid), int(gid or uid)


def _tmpfs(hardening: Hardening, uid: int, gid: int) -> dict[str, str]:
    wanted = dict(_DEFAULT_TMPFS)
    wanted.update(hardening.get("tmpfs") or {})
    result = {}
    for target, options in sorted(wanted.items()):
        opts = [o for o in str(options).split(",") if o and o.split("=")[0] not in {"uid", "gid"}]
        if not any(o.startswith("mode=") for o in opts):
            opts.append(f"mode={_TMPFS_MODES.get(target, '0700')}")
        # Owned by the agent user: the root file system is read-only, so these tmpfs
        # mounts are the only places it can write besides the project root.
        opts += [f"uid={uid}", f"gid={gid}"]
        result[target] = ",".join(opts)
    return result


def _mounts(plan: Plan) -> list[dict[str, Any]]:
    project_root = plan["task"]["project_root"]
    result = []
    for mount in plan.get("mounts", []):
        writable = mount.get("mode", "ro") == "rw"
        if writable and (mount.get("kind") != "project" or mount["source"] != project_root):
            raise _refuse(f"only the project root may be mounted writable, not {mount['source']}")
        result.append(
            {
                "Type": "bind",
                "Source": mount["source"],
                "Target": mount["target"],
                "ReadOnly": not writable,
                # rprivate: mounts made later on the host never propagate into the container.
                "BindOptions": {"Propagation": "rprivate"},
            }
        )
    return result


def _egress_mounts(mounts: list[dict[str, Any]], egress: str) -> list[dict[str, Any]]:
    if mounts and egress != "proxy":
        raise _refuse("an egress socket mount for a plan without egress")
    for mount in mounts:
        if mount.get("Type") != "volume" or mount.get("ReadOnly") is not True:
            raise _refuse(f"egress mount {mount.get('Target')} must be a read-only volume")
    return [dict(m) for m in mounts]


def _check_floor(h: Hardening) -> None:
    from kagura_agent.membrane.floor import hardening_violations

    broken = hardening_violations(h)
    if broken:
        raise _refuse("; ".join(broken))
    if h.get("privileged"):
        raise _refuse("privileged mode")
    if h.get("devices"):
        raise _refuse(f"devices {h['devices']}")
    if h.get("pid_mode", "private") in _HOST_MODES or h.get("ipc_mode", "private") in _HOST_MODES:
        raise _refuse("host PID or IPC namespace")
    if h.get("seccomp", "default") != "default":
        # Only Docker's default profile is accepted; a custom one could be weaker.
        raise _refuse(f"seccomp profile {h.get('seccomp')!r} (only 'default')")
    if h.get("no_new_privileges") is False or h.get("read_only_rootfs") is False:
        raise _refuse("no_new_privileges and read_only_rootfs cannot be turned off")
    if "ALL" not in [c.upper() for c in h.get("cap_drop", ["ALL"])]:
        raise _refuse("cap_drop must be ALL")


def labels(plan: Plan, run_id: str) -> dict[str, str]:
    """The labels every container of this run carries (and that list/sweep filter on)."""
    task = plan.get("task", {})
    return {
        LABEL_RUN: run_id,
        LABEL_SESSION: task.get("session") or "",
        LABEL_TASK: task.get("name") or "",
        LABEL_PLAN: plan.get("fingerprint") or "",
    }


def container_kwargs(
    plan: Plan,
    run_id: str,
    *,
    command: list[str] | None = None,
    environment: dict[str, str] | None = None,
    network: str | None = None,
    name: str | None = None,
    dns: list[str] | None = None,
    dns_opt: list[str] | None = None,
    egress_mounts: list[dict[str, Any]] | None = None,
    role: str = "agent",
) -> dict[str, Any]:
    """Translate a launch plan into docker-py keyword arguments for creating its container.

    The result is flat; ``runtime.split_kwargs`` separates the container-config keys from
    the host-config keys for ``APIClient.create_container`` (the high-level
    ``containers.create`` cannot set ``stop_timeout``).

    ``network`` is what the egress session gives (``none``: the agent reaches the proxy
    through the read-only socket volume in ``egress_mounts``); required when the plan's
    egress mode is ``proxy`` and ignored (``none``) otherwise. Only read-only volume mounts
    are accepted in ``egress_mounts``. ``environment`` must hold no secrets:
    credentials reach the container through /run/kagura, never through its config.

    ``role`` is ``agent`` (the brain's container) or ``verify``: a fresh container from
    the same image and mounts, with no network, no environment, no stdin (no brain
    channel) and an idle process to exec the verify commands in.
    """
    h = plan["hardening"]
    _check_floor(h)
    if role not in ROLES:
        raise SetupError(f"unknown container role {role!r}")
    uid, gid = _uid_gid(h.get("user", "1000:1000"))
    egress = (plan.get("egress") or {}).get("mode", "none")
    if role == "verify":
        network, environment, dns, dns_opt, egress = None, None, None, None, "none"
        egress_mounts = None  # not even the proxy's socket
    if egress == "proxy":
        if not network:
            raise SetupError("the plan's egress mode is proxy but no run network was given")
        network_mode = network
    else:
        network_mode = "none"
    nofile = int(h["nofile"])
    kwargs: dict[str, Any] = {
        "image": plan["image"].get("digest") or plan["image"]["ref"],
        "command": command,
        "user": f"{uid}:{gid}",
        "working_dir": h.get("workdir", "/workspace"),
        "labels": labels(plan, run_id),
        "environment": dict(environment or {}),
        "cap_drop": ["ALL"],
        "cap_add": list(h.get("cap_add", [])),
        # Docker applies its default seccomp profile when none is named; we never name one.
        "security_opt": ["no-new-privileges:true"],
        "read_only": True,
        "tmpfs": _tmpfs(h, uid, gid),
        "mounts": _mounts(plan) + _egress_mounts(egress_mounts or [], egress),
        "pids_limit": int(h["pids_limit"]),
        "mem_limit": int(h["memory_bytes"]),
        # Same as mem_limit: no swap, so the memory limit is a hard OOM boundary.
        "memswap_limit": int(h["memory_bytes"]),
        "nano_cpus": int(h["nano_cpus"]),
        "ulimits": [{"name": "nofile", "soft": nofile, "hard": nofile}],
        # The kagura entrypoint is its own init (brain/guard.py): Docker's would be a
        # process the agent's tools can ptrace, holding the brain channel's pipes.
        "init": bool(h.get("init", True)) and not (role == "agent" and command is None),
        "stop_signal": "SIGTERM",
        "stop_timeout": int(h.get("stop_timeout", 10)),
        "network_mode": network_mode,
        "ipc_mode": "private",
        "privileged": False,
        "devices": [],
        "runtime": h.get("runtime", "runc"),
        # The agent's stdout is the event stream, which may carry what a tool printed; with
        # no log driver it is never written to the host's disk (attach still works).
        "log_config": {"type": h.get("log_driver", "json-file"), "config": {}},
        "stdin_open": True,
        "tty": False,
    }
    if role == "verify":
        kwargs["labels"][LABEL_ROLE] = "verify"
        kwargs["entrypoint"] = ["sleep", "infinity"]
        kwargs["command"] = None
        kwargs["stdin_open"] = False
    if name:
        kwargs["name"] = name
    if dns is not None:
        # The egress session points the resolver at loopback: no name resolves inside.
        kwargs["dns"] = list(dns)
    if dns_opt is not None:
        kwargs["dns_opt"] = list(dns_opt)
    return kwargs
