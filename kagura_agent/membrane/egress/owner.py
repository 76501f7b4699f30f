"""Which process owns a run's Docker objects, and whether that process is still alive.

Every network, volume and proxy an egress session creates carries ``dev.kagura.owner`` =
``host:pid:start`` where ``start`` is the process start time from /proc (so a reused pid
is not mistaken for the owner). A crash sweep removes objects whose owner is gone.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

from kagura_agent.processes import process_start

LABEL_OWNER = "dev.kagura.owner"
LABEL_COMPONENT = "dev.kagura.component"
COMPONENT_PROXY = "egress-proxy"
COMPONENT_INTERNAL = "egress-internal"  # earlier versions: swept, no longer created
COMPONENT_SOCKET = "egress-socket"
COMPONENT_OUTBOUND = "egress-outbound"


def _start_time(pid: int) -> str:
    """The process start time (processes.process_start); '' where /proc is absent."""
    return process_start(pid) or ""


def current_owner() -> str:
    pid = os.getpid()
    return f"{socket.gethostname()}:{pid}:{_start_time(pid)}"


def owner_alive(owner: str) -> bool:
    """False only when we can tell the owner is gone; objects of other hosts count as alive."""
    parts = owner.rsplit(":", 2)
    if len(parts) != 3 or not parts[1].isdigit():
        return False  # unreadable label: nothing could be waiting on it
    host, pid_text, start = parts
    if host != socket.gethostname():
        return True
    pid = int(pid_text)
    if Path("/proc").is_dir():
        return _start_time(pid) != "" and _start_time(pid) == start
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
