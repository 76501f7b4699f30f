"""The membrane floor, in code: what no manifest, policy or plan file can turn off.

Policies add rules on top; this floor holds when they are missing, deleted or edited.
The planner marks a plan that breaks it not applyable (``floor_violations`` in the plan),
``apply`` refuses such a plan (also a hand-edited saved plan), and the container's
creation arguments are checked against it once more (membrane.hardening). Pure: no I/O.
"""

from __future__ import annotations

import ipaddress
import os
import posixpath
import re
from collections.abc import Mapping, Sequence
from typing import Any

# Capabilities that break the membrane: mounts and namespaces (SYS_ADMIN), the network
# the proxy enforces (NET_ADMIN), other processes (SYS_PTRACE), the kernel (SYS_MODULE,
# BPF, PERFMON, SYS_BOOT, SYS_RAWIO), files the uid may not read (DAC_READ_SEARCH),
# device nodes (MKNOD), mandatory access control and audit, clock and resource limits.
FORBIDDEN_CAPABILITIES = frozenset(
    {
        "ALL",
        "SYS_ADMIN",
        "NET_ADMIN",
        "SYS_PTRACE",
        "SYS_MODULE",
        "SYS_RAWIO",
        "DAC_READ_SEARCH",
        "BPF",
        "PERFMON",
        "SYS_BOOT",
        "MKNOD",
        "MAC_ADMIN",
        "MAC_OVERRIDE",
        "AUDIT_CONTROL",
        "AUDIT_READ",
        "SYSLOG",
        "SYS_TIME",
        "SYS_RESOURCE",
        "LINUX_IMMUTABLE",
        "CHECKPOINT_RESTORE",
        "SYS_PACCT",
        "SYS_TTY_CONFIG",
        "IPC_OWNER",
        "WAKE_ALARM",
        "BLOCK_SUSPEND",
    }
)

# What an Image may add back after dropping all: Docker's default set less MKNOD. Any
# other entry in a plan — a capability not named above, another spelling — is refused as
# well, so the floor does not rest on having named every dangerous capability.
ADDABLE_CAPABILITIES = frozenset(
    {
        "AUDIT_WRITE",
        "CHOWN",
        "DAC_OVERRIDE",
        "FOWNER",
        "FSETID",
        "KILL",
        "NET_BIND_SERVICE",
        "NET_RAW",
        "SETFCAP",
        "SETGID",
        "SETPCAP",
        "SETUID",
        "SYS_CHROOT",
    }
)

# Hard ceilings an Image cannot exceed, whatever its manifest says.
MAX_PIDS = 4096
MAX_MEMORY_BYTES = 32 * 1024**3
MAX_NANO_CPUS = 16 * 10**9
MAX_NOFILE = 65536
MAX_RUN_KAGURA_BYTES = 16 * 1024**2
# The tmpfs mounts every plan has (membrane hardening: scratch, the agent's home, and its
# credentials). A mount target may land on none of them.
TMPFS_TARGETS = ("/tmp", "/home/agent", "/run/kagura")
# Where an extra mount may never land, nor above (a mount over a parent hides them too):
# the project root's mount point, the credentials tmpfs, the kernel's interfaces, and the
# image's programs with the kagura code its PID 1 imports before the agent has run — a
# read-only bind of files from the project root there would run the agent's writing as
# the run's own process. Each planned tmpfs is added from the plan.
# The agent's own repository in branch mode (plan/commits.py): a tmpfs over the project
# root's .git, and where the operator's .git is mounted read-only instead.
AGENT_GIT = "/workspace/.git"
OPERATOR_GIT = "/kagura/operator.git"

RESERVED_TARGETS = (
    "/workspace",
    "/kagura",
    "/run/kagura",
    "/proc",
    "/sys",
    "/dev",
    "/usr",
    "/etc",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/opt/kagura",
)
# Symlinks in every Debian image: Docker follows them inside the container when it
# mounts, so /var/run/kagura lands on /run/kagura.
_IMAGE_LINKS = (("/var/run", "/run"), ("/var/lock", "/run/lock"))
_SOCKETS = re.compile(r"(^|/)(docker|containerd|podman|crio|cri-dockerd)\.sock$")
_ENGINE_DIRS = ("/var/run/docker", "/run/docker", "/var/lib/docker", "/run/containerd")
# Address ranges an egress entry may never resolve to: loopback (the proxy itself),
# link-local (cloud metadata at 169.254.169.254, fe80::), "this network", and AWS's
# IPv6 metadata address.
_NEVER_REACHABLE = tuple(
    ipaddress.ip_network(n)
    for n in (
        "127.0.0.0/8",
        "169.254.0.0/16",
        "0.0.0.0/8",
        "::1/128",
        "fe80::/10",
        "::/128",
        "fd00:ec2::254/128",
    )
)


def hardening_violations(h: Mapping[str, Any]) -> list[str]:
    """Why the ``hardening`` section breaks the floor (empty when it does not)."""
    found: list[str] = []
    caps = sorted({str(c).upper().removeprefix("CAP_") for c in h.get("cap_add") or []})
    bad = [c for c in caps if c in FORBIDDEN_CAPABILITIES]
    if bad:
        found.append(f"capabilities {', '.join(bad)} break the membrane and are never added")
    unknown = [c for c in caps if c not in FORBIDDEN_CAPABILITIES | ADDABLE_CAPABILITIES]
    if unknown:
        shown = ", ".join(repr(c) for c in unknown)
        found.append(f"capabilities {shown} are not among those an Image may add back")
    if "ALL" not in [str(c).upper() for c in h.get("cap_drop", ["ALL"])]:
        found.append("cap_drop must be ALL")
    if h.get("privileged") is not False:
        found.append("privileged mode")
    if h.get("devices"):
        found.append("devices")
    for key in ("pid_mode", "ipc_mode"):
        if h.get(key, "private") != "private":
            found.append(f"{key} {h.get(key)!r} (host namespaces are never shared)")
    if h.get("network", "none") != "none":
        # No route but the proxy: egress goes through a Unix socket, never a network.
        found.append(f"network {h.get('network')!r} (only none; egress uses the proxy socket)")
    if h.get("seccomp", "default") != "default":
        found.append(f"seccomp {h.get('seccomp')!r} (only Docker's default profile)")
    if h.get("no_new_privileges") is not True or h.get("read_only_rootfs") is not True:
        found.append("no_new_privileges and read_only_rootfs cannot be turned off")
    found += user_violations(str(h.get("user", "")))
    found += tmpfs_violations(h.get("tmpfs"), str(h.get("user", "")))
    for key, ceiling, shown in (
        ("pids_limit", MAX_PIDS, str(MAX_PIDS)),
        ("memory_bytes", MAX_MEMORY_BYTES, "32g"),
        ("nano_cpus", MAX_NANO_CPUS, "16 cpus"),
        ("nofile", MAX_NOFILE, str(MAX_NOFILE)),
    ):
        value = h.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            found.append(f"{key} must be a positive integer")
        elif value > ceiling:
            found.append(f"{key} {value} is above the ceiling {shown}")
    return found


def user_violations(user: str) -> list[str]:
    """The container runs as a numeric uid:gid that is not root's."""
    uid, _, gid = user.partition(":")
    if not uid.isdigit() or not (gid or uid).isdigit():
        return [f"user {user!r} must be a numeric uid:gid"]
    if int(uid) == 0:
        return ["the container may not run as root (uid 0)"]
    return []


def tmpfs_violations(tmpfs: object, user: str) -> list[str]:
    """Every tmpfs is noexec,nosuid,nodev and owned by the agent; /run/kagura (where the
    credentials land) is there, owner-only and at most 16 MiB."""
    if not isinstance(tmpfs, Mapping) or not all(isinstance(v, str) for v in tmpfs.values()):
        return ["tmpfs must map each target to its mount options"]
    found = []
    uid, _, gid = user.partition(":")
    for target, options in sorted(tmpfs.items()):
        if target != normalise_target(target):
            found.append(f"tmpfs target {target!r} is not a clean absolute path")
        elif target not in ("/run/kagura", AGENT_GIT):
            found += [
                f"tmpfs {target} would hide {kept}, which the membrane keeps"
                for kept in RESERVED_TARGETS
                if kept != "/run/kagura" and (_within(target, kept) or _within(kept, target))
            ]
        opts = options.split(",")
        values = dict(o.split("=", 1) for o in opts if "=" in o)
        missing = [flag for flag in ("noexec", "nosuid", "nodev") if flag not in opts]
        widened = [flag for flag in ("exec", "suid", "dev") if flag in opts]
        if missing or widened:
            found.append(f"tmpfs {target} must be noexec,nosuid,nodev ({options})")
        if values.get("uid") != uid or values.get("gid") != (gid or uid):
            found.append(f"tmpfs {target} must be owned by the agent user {user}")
    run = tmpfs.get("/run/kagura")
    if run is None:
        found.append("tmpfs /run/kagura is missing (credentials would have nowhere private)")
    else:
        values = dict(o.split("=", 1) for o in run.split(",") if "=" in o)
        size = values.get("size", "")
        if values.get("mode") != "0700":
            found.append("tmpfs /run/kagura must be mode 0700")
        if not size.isdigit() or not 0 < int(size) <= MAX_RUN_KAGURA_BYTES:
            found.append("tmpfs /run/kagura needs a size in bytes of at most 16 MiB")
    return found


def normalise_target(target: str) -> str:
    """``target`` as the container engine will mount it: ``//``, ``.``, ``..`` and a
    trailing slash folded lexically (as Docker cleans a path), then the image's standard
    symlinks followed (/var/run is /run). ``""`` when it is not an absolute path."""
    if not target.startswith("/") or "\0" in target:
        return ""
    clean = "/" + posixpath.normpath(target).lstrip("/")
    for link, real in _IMAGE_LINKS:
        if clean == link or clean.startswith(link + "/"):
            clean = real + clean[len(link) :]
    return clean.rstrip("/") or "/"


def target_problem(target: str, tmpfs: Sequence[str] = TMPFS_TARGETS) -> str | None:
    """Why an extra mount may not land at ``target`` in the container, or None.

    Refused: a target that is not absolute, or that is, lies under or lies above one of
    RESERVED_TARGETS or a planned tmpfs (``tmpfs``) — written any way (``/a/../workspace``,
    ``/workspace/``, ``//proc``, ``/var/run/kagura``)."""
    clean = normalise_target(target)
    if not clean:
        return f"mount target {target!r} is not an absolute path"
    shown = target if clean == target else f"{target} (that is {clean})"
    for reserved in dict.fromkeys((*RESERVED_TARGETS, *tmpfs)):
        if _within(clean, reserved):
            return f"mount target {shown} is over {reserved}, which the membrane keeps"
        if _within(reserved, clean):
            return f"mount target {shown} would hide {reserved}, which the membrane keeps"
    return None


def _within(path: str, top: str) -> bool:
    return path == top or top == "/" or path.startswith(top + "/")


def mount_violations(
    mounts: Sequence[Mapping[str, Any]], project_root: str = "", tmpfs: Sequence[str] = ()
) -> list[str]:
    """The container engine's socket or data directories are never mounted; only the
    project root is writable, at /workspace; the read-only mounts over its inputs
    (``protected``) lie under /workspace; no other mount lands on what the membrane keeps
    (``target_problem``)."""
    found = []
    planned = tuple(tmpfs) or TMPFS_TARGETS
    for mount in mounts:
        source = str(mount.get("source", ""))
        target = str(mount.get("target", ""))
        kind = mount.get("kind")
        if _SOCKETS.search(source) or any(
            source == d or source.startswith(d + "/") for d in _ENGINE_DIRS
        ):
            found.append(f"mount {source} (the container engine is never reachable)")
        project = kind == "project" and source == project_root and target == "/workspace"
        if mount.get("mode") != "ro" and not project:
            found.append(
                f"mount {source} -> {target} is {mount.get('mode')}; only the project root"
                " is writable"
            )
        if kind == "project":
            if not project:
                found.append(f"project mount {source} -> {target} is not the task's root")
        elif kind == "protected":
            moved = target == OPERATOR_GIT and source == os.path.join(project_root, ".git")
            if moved and AGENT_GIT not in planned:
                found.append(
                    f"protected mount {source} -> {target} leaves /workspace/.git writable"
                    " (the agent's repository tmpfs must be over it)"
                )
            elif not moved and not normalise_target(target).startswith("/workspace/"):
                found.append(f"protected mount {source} -> {target} is not under /workspace")
        else:
            problem = target_problem(target, planned)
            if problem:
                found.append(problem)
    return found


def egress_violations(egress: Mapping[str, Any]) -> list[str]:
    """Allowed address exceptions never reach loopback, link-local or metadata ranges."""
    found = []
    ranges = list(egress.get("allow_addresses") or [])
    for entry in egress.get("allow") or []:
        ranges.extend(entry.get("allow_addresses") or [])
    for text in dict.fromkeys(str(r) for r in ranges):
        try:
            network = ipaddress.ip_network(text, strict=False)
        except ValueError:
            found.append(f"egress allow_addresses {text!r} is not a CIDR range")
            continue
        if any(_overlaps(network, never) for never in _NEVER_REACHABLE):
            found.append(
                f"egress allow_addresses {text} reaches loopback, link-local or cloud metadata"
            )
    return found


def _overlaps(
    a: ipaddress.IPv4Network | ipaddress.IPv6Network,
    b: ipaddress.IPv4Network | ipaddress.IPv6Network,
) -> bool:
    if isinstance(a, ipaddress.IPv4Network) and isinstance(b, ipaddress.IPv4Network):
        return a.overlaps(b)
    if isinstance(a, ipaddress.IPv6Network) and isinstance(b, ipaddress.IPv6Network):
        return a.overlaps(b)
    return False


def floor_violations(plan: Mapping[str, Any]) -> list[str]:
    """Every way ``plan`` breaks the membrane floor."""
    return [
        *hardening_violations(plan.get("hardening") or {}),
        *mount_violations(
            plan.get("mounts") or [],
            str((plan.get("task") or {}).get("project_root", "")),
            tuple((plan.get("hardening") or {}).get("tmpfs") or ()),
        ),
        *egress_violations(plan.get("egress") or {}),
    ]
