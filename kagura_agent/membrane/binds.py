"""What each bind mount of a started container really is, against what was checked.

A bind source is a path, and the container runtime follows it when the container
*starts*, after every check of ours (plan, freshness, ``create``). A project root inside
another agent's writable root — a dispatched child's, or a run on a folder of a running
run's root — can be renamed away by that agent in between and a symlink left in its
place (``child -> /home/op``): the container would get whatever it points to, read-write
as /workspace. So ``create`` records the identity (device, inode) of every source it
checked, and ``start`` compares each mount inside the started container with it before
anything of the agent runs (the brain waits for the host's first turn): a mismatch stops
the container and refuses the run.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from kagura_agent.membrane.hardening import mount_target
from kagura_agent.plan.model import Plan
from kagura_agent.processes import ended, process_start

Identity = tuple[str, int, int]  # (target in the container, st_dev, st_ino)


def source_identities(plan: Plan, role: str = "agent") -> list[Identity]:
    """(target in a container of ``role``, device, inode) of every bind source of
    ``plan``, now; a source that is not where the plan says (a symlink in its path since
    the plan) raises ValueError."""
    found = []
    for mount in plan["mounts"]:
        source = mount["source"]
        if os.path.realpath(source) != os.path.normpath(source):
            raise ValueError(f"mount source {source} moved since the plan (it is a symlink now)")
        info = os.stat(source)
        found.append((mount_target(mount, role), info.st_dev, info.st_ino))
    return found


def mismatches(
    expected: list[Identity], pid: int, exec_stat: Callable[[list[str]], list[str] | None]
) -> list[str]:
    """Every mount of the container (its init is ``pid``) that is not what was checked.

    Read through ``/proc/PID/root`` (the container's own view, symlinks not followed);
    where that cannot be read (a non-root operator and a non-dumpable init, a daemon in
    another PID namespace), ``exec_stat(targets)`` answers ``DEV:INO`` per target from
    inside the container, or None when the container is no longer running.
    """
    if pid <= 0:
        return []  # exited already (apply's containers wait for the host: a crash)
    started = process_start(pid)
    problems = _compare(expected, _look(expected, pid, exec_stat))
    if problems and _running(pid, started):
        # A container whose process is exiting loses its mounts first: look once more,
        # and believe a mismatch only of a process that ran before and after both looks.
        time.sleep(RELOOK_SECONDS)
        problems = _compare(expected, _look(expected, pid, exec_stat))
    return problems if problems and _running(pid, started) else []


RELOOK_SECONDS = 0.1


def _look(
    expected: list[Identity], pid: int, exec_stat: Callable[[list[str]], list[str] | None]
) -> list[str] | None:
    targets = [target for target, _, _ in expected]
    try:
        seen = []
        for target in targets:
            info = os.stat(f"/proc/{pid}/root{target}", follow_symlinks=False)
            seen.append(f"{info.st_dev}:{info.st_ino}")
        return seen
    except OSError:
        return exec_stat(targets)


def _compare(expected: list[Identity], seen: list[str] | None) -> list[str]:
    if seen is None:
        return []  # exited between the start and the look: nothing of it runs
    problems = []
    for index, (target, dev, ino) in enumerate(expected):
        got = seen[index] if index < len(seen) else None
        if got != f"{dev}:{ino}":
            problems.append(
                f"the mount at {target} is not what was checked (its source was swapped"
                " between the check and the container's start)"
            )
    return problems


def _running(pid: int, started: str | None) -> bool:
    """The container's process is the one looked at, and has not ended (nor is ending:
    a zombie). Where /proc cannot tell (no start time), it is taken to run."""
    if started is None:
        return True
    return process_start(pid) == started and not ended(pid, unknown=True)
