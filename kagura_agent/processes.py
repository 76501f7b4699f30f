"""Which process is which: this host's identity, a process's start time, whether a
recorded owner (pid, start time, host) still runs.

Stdlib only and cheap to import: the lease ledger, the runs table and the cockpit all
judge owners with it.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path


def this_host() -> str:
    """This host's identity: $KAGURA_AGENT_HOST_ID, else the machine id, else the hostname.

    Processes on one host share a pid namespace with it (and so may judge each other's
    pids); a process on another host is the team reaper's to judge, by heartbeat."""
    explicit = os.environ.get("KAGURA_AGENT_HOST_ID")
    if explicit:
        return explicit
    try:
        machine = Path("/etc/machine-id").read_text().strip()
    except OSError:
        machine = ""
    return machine or socket.gethostname()


def process_start(pid: int) -> str | None:
    """The process start time in clock ticks since boot (Linux /proc), or None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may contain spaces and parentheses: split after the last ')'.
    fields = stat.rpartition(")")[2].split()
    return fields[19] if len(fields) > 19 else None


def owner_alive(pid: int | None, start: str | None, host: str | None = None) -> bool:
    """Whether the recorded owner is still running (and is the same process). An owner on
    another host (``host`` recorded and not this one) counts as alive: not ours to judge."""
    if host is not None and host != this_host():
        return True
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by someone else
    if start is None:
        return True
    current = process_start(pid)
    if current is not None and current != start:
        return False  # the pid was reused by another process
    # A zombie (killed but not yet reaped) holds nothing: treat as dead.
    return not ended(pid, unknown=False)


def ended(pid: int, *, unknown: bool) -> bool:
    """Whether ``pid`` has ended (gone, or a zombie: killed but not yet reaped);
    ``unknown`` where /proc cannot tell."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return unknown
    return state in ("Z", "X")


def namespace_processes(init: int) -> dict[int, tuple[str, bool]] | None:
    """Every process in the PID namespace whose init is host pid ``init`` (a container's):
    ``{pid: (start time, undumpable)}``; None where this process cannot tell (a process
    in some nested namespace whose namespace it may not read).

    Undumpable (no ptrace, no /proc/PID/mem or fd for anyone without CAP_SYS_PTRACE):
    /proc/PID/stat is owned by root while the process runs as another user, which the
    kernel does exactly when the process is not dumpable (the /proc/PID folder itself
    keeps the process's owner)."""
    own = _status(init)
    if own is None or len(own.get("NSpid", "").split()) < 2:
        return None  # gone, or not in a namespace of its own
    try:
        namespace = os.readlink(f"/proc/{init}/ns/pid")
        pids = [int(name) for name in os.listdir("/proc") if name.isdigit()]
    except (OSError, ValueError):
        return None
    found: dict[int, tuple[str, bool]] = {}
    for pid in pids:
        status = _status(pid)
        if status is None or len(status.get("NSpid", "").split()) < 2:
            continue  # ended while we looked, or in this process's own namespace
        try:
            if os.readlink(f"/proc/{pid}/ns/pid") != namespace:
                continue
            owner = int(status["Uid"].split()[0])
            undumpable = os.stat(f"/proc/{pid}/stat").st_uid == 0 and owner != 0
        except FileNotFoundError:
            continue
        except (OSError, KeyError, ValueError, IndexError):
            return None  # not ours to read: it may be in the namespace
        start = process_start(pid)
        if start is not None:
            found[pid] = (start, undumpable)
    return found


def _status(pid: int) -> dict[str, str] | None:
    """/proc/PID/status as ``{field: value}`` (world-readable, unlike /proc/PID/ns)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    fields: dict[str, str] = {}
    for line in text.splitlines():
        name, _, value = line.partition(":")
        fields[name] = value.strip()
    return fields
