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
