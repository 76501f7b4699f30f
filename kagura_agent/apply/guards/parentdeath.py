"""A dispatched child stops when its parent run dies, even by ``kill -9``.

The parent starts each child ``apply`` with ``KAGURA_AGENT_PARENT_PID`` set. The child asks
Linux for a parent-death signal and turns it into one SIGINT, apply's own clean-up path
(agent stopped, leases revoked, containers removed). A parent that dies before the request
is seen by its pid no longer being the child's parent, and the child interrupts itself.

Not SIGINT itself: Linux sends the parent-death signal each time the child is reparented,
and the child's parent is a *thread*. A parent killed with SIGKILL loses its threads one by
one: the child may be handed to a sibling thread first, then to init — two signals, the
second interrupting the first one's clean-up half way (a container and a volume left
behind). The same happens, with the parent alive, when the thread that started the child
ends. So the signal is SIGUSR2, and its handler sends SIGINT once, and only when the
parent process is gone (``getppid`` no longer the parent's pid). Elsewhere, and for an
``apply`` nobody dispatched, this does nothing. Every apply first takes SIGINT back if it
was started with it ignored (``take_back_sigint``): else none of this would stop it.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Mapping
from types import FrameType

PARENT_ENV = "KAGURA_AGENT_PARENT_PID"
# The project roots of the dispatching parent and its own dispatching ancestors
# (os.pathsep-separated): the child's root lies inside them on purpose (apply/records/runs.py
# root_locks leaves those folders to their runs' locks).
PARENT_ROOT_ENV = "KAGURA_AGENT_PARENT_ROOT"
_PR_SET_PDEATHSIG = 1
PARENT_DEATH_SIGNAL = signal.SIGUSR2


def child_environment(
    environ: Mapping[str, str] = os.environ, *, parent_root: str = ""
) -> dict[str, str]:
    """The environment for a child apply: this process is the parent to follow, and
    ``parent_root`` (when given) the project root it holds locked for the child, after the
    roots its own dispatching ancestors hold (a child's child lies inside them all)."""
    held = [r for r in environ.get(PARENT_ROOT_ENV, "").split(os.pathsep) if r]
    if parent_root:
        held.append(parent_root)
    return {**environ, PARENT_ENV: str(os.getpid()), PARENT_ROOT_ENV: os.pathsep.join(held)}


def take_back_sigint() -> bool:
    """SIGINT is apply's clean-up path: Ctrl-C, the cockpit's kill, a dispatcher stopping
    its children and the parent-death signal all send it. A process started with SIGINT
    ignored (under ``nohup``, as a background job of a script, by a serve or runner started
    that way) inherits the ignore, and none of those would stop it; such an apply takes
    SIGINT back. Whether it had to."""
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        return False
    signal.signal(signal.SIGINT, signal.default_int_handler)
    return True


def stop_with_parent(environ: Mapping[str, str] = os.environ) -> bool:
    """Ask for one SIGINT when the dispatching parent dies; whether it was asked."""
    wanted = environ.get(PARENT_ENV, "")
    if not wanted.isdigit() or not sys.platform.startswith("linux"):
        return False
    parent = int(wanted)
    told: list[bool] = []

    def parent_gone(signum: int = 0, frame: FrameType | None = None) -> None:
        if told or os.getppid() == parent:  # handed to another thread of the live parent
            return
        told.append(True)
        os.kill(os.getpid(), signal.SIGINT)

    signal.signal(PARENT_DEATH_SIGNAL, parent_gone)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, PARENT_DEATH_SIGNAL, 0, 0, 0) != 0:
        signal.signal(PARENT_DEATH_SIGNAL, signal.SIG_DFL)
        return False
    parent_gone()  # the parent was gone before the request
    return True
