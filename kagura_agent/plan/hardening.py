"""The plan's container: its hardening section (user, capabilities, tmpfs mounts, limits
— the knobs an Image may set over the defaults), and whether the user it runs as can
write the project root. Pure, like the rest of the planner."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Any

from kagura_agent.facts import Facts
from kagura_agent.manifest.task import ResolvedTask
from kagura_agent.plan.model import BrainSection, EgressMode, Hardening, Mount, Tenancy
from kagura_agent.units import parse_size

HARDENING_DEFAULTS: dict[str, Any] = {
    "pids_limit": 256,
    "memory": "2g",
    "cpus": 1.0,
    "nofile": 1024,
    "cap_add": [],
    "runtime": "runc",
    "stop_timeout": 10,
    "tmpfs_size": "256m",
}
DEFAULT_USER = "1000:1000"
# /run/kagura receives the run's short-lived credentials (a few KiB): small, and never
# executable. Not an Image knob: no image needs more room for credentials.
RUN_KAGURA_TMPFS_BYTES = 16 * 1024 * 1024
# Every tmpfs states the flags the container gets. Docker adds noexec,nosuid,nodev to a
# tmpfs unless an option says otherwise, so the plan writes them out rather than rely on it.
TMPFS_FLAGS = "rw,noexec,nosuid,nodev"
REFUSED = "refused: "  # unwritable_project's prefix for a refusal rather than a warning


def unwritable_project(
    brain: BrainSection, hardening: Hardening, mounts: list[Mount], facts: Facts
) -> str:
    """Why the container user cannot write the project root ("" when it can).

    The agent never runs as root, so a project root the container user may not write (a
    root-owned checkout; one the agent itself left ``chmod 000``) is refused up front with
    the command that fixes it, rather than failing mid-run. Without the mode fact (older
    facts files) a root owner is only a warning.
    """
    owner = facts.project_owner
    if owner is None or brain["runtime"] != "container":
        return ""
    user = hardening["user"]
    mode = facts.project_mode
    if mode is None:
        if owner[0] != 0:
            return ""
        return (
            f"the project root is owned by root; the agent runs as {user} and cannot"
            " write it (chown it to a non-root user)"
        )
    root = next((m["source"] for m in mounts if m["kind"] == "project"), "")
    access = root_access(owner, mode, root)
    if access.writable:
        return ""
    who = "root" if owner[0] == 0 else f"uid {owner[0]}"
    return (
        f"{REFUSED}the project root is owned by {who} (mode {mode:o}) and the agent, which"
        f" never runs as root, runs as {user} and could not write it; fix: {access.fix}"
    )


@dataclass(frozen=True)
class RootAccess:
    """What the agent can do with a project root of some owner and mode: the container
    user it runs as, whether that user can create and change entries in it, and the
    command that makes it so (run as the root's owner or root; "" when it can)."""

    user: str
    writable: bool
    fix: str


def root_access(owner: list[int], mode: int, root: str) -> RootAccess:
    """The container user's access to ``root`` (owned by ``owner``, with ``mode``).

    Writing entries of a directory takes its write *and* search bits, from the one class
    the kernel picks: the owner's when the user is the owner, else the group's when its
    group is the directory's, else the others'. The fix, followed as written, makes the
    next plan pass: ``chmod u+rwx`` when the agent is the owner (it may have taken its own
    bits away: ``chmod 000 /workspace``), else ``chown -R`` to the user the agent will then
    run as (the new owner), with ``chmod u+rwx`` when the owner's bits lack it.
    """
    user = _container_user(Facts(project_owner=owner, project_mode=mode))
    uid, gid = (int(part) for part in user.split(":"))
    if uid == owner[0]:
        bits = mode >> 6
    elif gid == owner[1]:
        bits = mode >> 3
    else:
        bits = mode
    if bits & 0o3 == 0o3:
        return RootAccess(user, True, "")
    quoted = shlex.quote(root)
    owner_ok = (mode >> 6) & 0o7 == 0o7
    if uid == owner[0]:
        return RootAccess(user, False, f"chmod u+rwx {quoted}")
    chown = f"chown -R {user} {quoted}"
    return RootAccess(user, False, chown if owner_ok else f"{chown} && chmod u+rwx {quoted}")


def _container_user(facts: Facts) -> str:
    """The project root's owner, so the agent can write it — but never root."""
    owner = facts.project_owner
    if owner and owner[0] != 0 and owner[1] != 0:
        return f"{owner[0]}:{owner[1]}"
    return DEFAULT_USER


def hardening_section(
    task: ResolvedTask, tenancy: Tenancy, facts: Facts, egress_mode: EgressMode
) -> Hardening:
    knobs = {**HARDENING_DEFAULTS, **task.image.spec.get("hardening", {})}
    user = _container_user(facts)
    return {
        "user": user,
        "cap_drop": ["ALL"],
        "cap_add": sorted(knobs["cap_add"]),
        "no_new_privileges": True,
        "seccomp": "default",
        "read_only_rootfs": True,
        "tmpfs": tmpfs_mounts(user, parse_size(knobs["tmpfs_size"])),
        "pids_limit": knobs["pids_limit"],
        "memory_bytes": parse_size(knobs["memory"]),
        "nano_cpus": round(float(knobs["cpus"]) * 1e9),
        "nofile": knobs["nofile"],
        "init": True,
        "stop_timeout": knobs["stop_timeout"],
        # Always none: with egress the agent still has no interface but loopback and
        # reaches its proxy through a Unix socket (membrane/egress/session.py).
        "network": "none",
        "pid_mode": "private",
        "ipc_mode": "private",
        "privileged": False,
        "devices": [],
        "runtime": knobs["runtime"],
        "log_driver": "none",
        "tenancy": tenancy,
        "workdir": "/workspace",
    }


def tmpfs_mounts(user: str, scratch_bytes: int) -> dict[str, str]:
    """The tmpfs mounts with the exact options the container gets (checked against its
    /proc/mounts in tests/test_membrane_container.py).

    Owned by the agent user: the root file system is read-only, so these are the only
    places it can write besides the project root. /tmp is world-writable and sticky like
    any /tmp; the agent's home and /run/kagura (its credentials) are owner-only.
    """
    uid, _, gid = user.partition(":")
    owner = f"uid={uid},gid={gid or uid}"
    return {
        "/tmp": f"{TMPFS_FLAGS},size={scratch_bytes},mode=1777,{owner}",
        "/home/agent": f"{TMPFS_FLAGS},size={scratch_bytes},mode=0700,{owner}",
        "/run/kagura": f"{TMPFS_FLAGS},size={RUN_KAGURA_TMPFS_BYTES},mode=0700,{owner}",
    }
