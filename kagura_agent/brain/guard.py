"""Keep the agent's tools away from the process that holds the brain channel.

The entrypoint holds the channel (the stdin/stdout Docker attached to) and, for the
lifetime of a lease, the credentials. The agent's tools run as the same uid, so without
more they could ptrace it, read its memory and environment through /proc, or open its
stdin/stdout through /proc/<pid>/fd and read credential bundles or forge brain events.

Three measures, all taken before anything else runs:

* the image starts it isolated (``python3 -I``) in ``/`` (apply makes that the container's
  working directory): nothing the agent wrote in /workspace on an earlier run is on its
  ``sys.path``. ``writable_import_paths`` is the check: as PID 1 the entrypoint refuses to
  serve when an entry of its ``sys.path`` is relative or writable by its user — which is
  the agent's user, so such a folder is the agent's too.

* ``make_undumpable``: ``prctl(PR_SET_DUMPABLE, 0)``. The kernel then refuses ptrace
  and /proc/<pid>/{mem,environ,fd,…} to any process without CAP_SYS_PTRACE — which the
  container dropped. Children that exec a program (every tool) become dumpable again;
  the entrypoint itself stays out of reach.
* ``run_as_init``: the entrypoint is the container's PID 1 (Docker's own init would be a
  dumpable process holding the channel's pipes). It forks: the child serves the channel,
  the parent reaps orphans and forwards signals, as an init must, and exits with the
  child's status — which ends the container and kills every process left in it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys

PR_SET_DUMPABLE = 4
PR_GET_DUMPABLE = 3
_FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)


def _prctl(option: int, value: int) -> int:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    return int(libc.prctl(option, value, 0, 0, 0))


def make_undumpable() -> bool:
    """Mark this process non-dumpable; False where the platform cannot (not Linux)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        return _prctl(PR_SET_DUMPABLE, 0) == 0 and _prctl(PR_GET_DUMPABLE, 0) == 0
    except (OSError, AttributeError):
        return False


def writable_import_paths() -> list[str]:
    """The entries of ``sys.path`` this process could write (or that are relative to its
    working directory): where the agent, running as the same user, could plant a module."""
    found = []
    for entry in sys.path:
        if not os.path.isabs(entry):
            found.append(entry or "''")
        elif os.path.isdir(entry) and os.access(entry, os.W_OK):
            found.append(entry)
    return found


def run_as_init() -> int | None:
    """As PID 1: fork; return None in the child (go on serving), and in the parent reap
    every child until the server exits, then return its exit status."""
    server = os.fork()
    if server == 0:
        return None  # the server keeps Python's own signal handling

    def forward(signum: int, frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(server, signum)

    for signum in _FORWARDED:
        signal.signal(signum, forward)
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:  # nobody left (the server was reaped already)
            return 1
        if pid == server:
            code = os.waitstatus_to_exitcode(status)
            return code if code >= 0 else 128 - code
