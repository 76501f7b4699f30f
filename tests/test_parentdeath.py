"""A dispatched child apply stops when its parent dies, even by SIGKILL (parent-death signal)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from kagura_agent.apply.guards.parentdeath import PARENT_ENV, stop_with_parent

# A child that waits for SIGINT and leaves a mark when it arrives.
CHILD = """
import os, sys, time
from kagura_agent.apply.guards.parentdeath import stop_with_parent
try:
    assert stop_with_parent()
    print("ready", flush=True)
    time.sleep(60)
except KeyboardInterrupt:
    open(sys.argv[1] + ".tmp", "w").write("interrupted")
    os.rename(sys.argv[1] + ".tmp", sys.argv[1])  # the mark appears whole
"""

# A parent that starts that child with child_environment() and waits forever.
PARENT = """
import subprocess, sys, time
from kagura_agent.apply.guards.parentdeath import child_environment
child = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]], env=child_environment())
print(child.pid, flush=True)
time.sleep(60)
"""


def test_an_apply_nobody_dispatched_asks_for_nothing() -> None:
    assert stop_with_parent({}) is False
    assert stop_with_parent({PARENT_ENV: "not-a-pid"}) is False


def test_a_child_whose_parent_is_already_gone_interrupts_itself(tmp_path: Path) -> None:
    mark = tmp_path / "mark"
    env = {**os.environ, PARENT_ENV: str(os.getpid() + 1_000_000)}  # not its parent
    done = subprocess.run([sys.executable, "-c", CHILD, str(mark)], env=env, timeout=60)
    assert done.returncode == 0
    assert mark.read_text() == "interrupted"


def test_a_child_is_interrupted_when_its_parent_is_killed(tmp_path: Path) -> None:
    mark = tmp_path / "mark"
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, CHILD, str(mark)], stdout=subprocess.PIPE, text=True
    )
    assert parent.stdout is not None
    child_pid = int(parent.stdout.readline())
    assert parent.stdout.readline() == "ready\n"  # the child has asked for the signal
    _kill_and_wait_for(parent, mark)
    assert mark.read_text() == "interrupted"
    deadline = time.monotonic() + 30
    while _alive(child_pid):
        assert time.monotonic() < deadline
        time.sleep(0.1)


def _kill_and_wait_for(parent: subprocess.Popen[str], mark: Path) -> None:
    """SIGKILL the parent; wait until the child has left its mark."""
    parent.send_signal(signal.SIGKILL)
    parent.wait(timeout=30)
    deadline = time.monotonic() + 30
    while not mark.exists():
        assert time.monotonic() < deadline, "the child never heard its parent die"
        time.sleep(0.1)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie reparented to init counts as gone
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


# A child whose clean-up takes a while, and which says whether it was interrupted again.
SLOW_CHILD = """
import os, sys, time
from kagura_agent.apply.guards.parentdeath import stop_with_parent
marks = []
try:
    assert stop_with_parent()
    print("ready", flush=True)
    time.sleep(60)
except KeyboardInterrupt:
    marks.append("interrupted")
    try:
        time.sleep(2)  # its clean-up
    except KeyboardInterrupt:
        marks.append("again")
open(sys.argv[1] + ".tmp", "w").write(" ".join(marks))
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
"""

# A parent that starts the child from a thread which ends once the child is ready (Linux
# then hands the child to another thread of this process), with more threads besides.
THREADED_PARENT = """
import subprocess, sys, threading, time
from kagura_agent.apply.guards.parentdeath import child_environment
children = []
def start():
    child = subprocess.Popen(
        [sys.executable, "-c", sys.argv[1], sys.argv[2]], env=child_environment(),
        stdout=subprocess.PIPE, text=True,
    )
    assert child.stdout.readline() == "ready\\n"
    children.append(child)
starter = threading.Thread(target=start)
starter.start()
starter.join()
for _ in range(4):
    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
print(children[0].pid, flush=True)
time.sleep(60)
"""


def test_the_child_is_interrupted_once_and_only_when_the_parent_process_is_gone(
    tmp_path: Path,
) -> None:
    mark = tmp_path / "mark"
    parent = subprocess.Popen(
        [sys.executable, "-c", THREADED_PARENT, SLOW_CHILD, str(mark)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert parent.stdout is not None
    child_pid = int(parent.stdout.readline())
    # The thread that started it has ended: a parent-death signal, the parent lives on.
    time.sleep(1.0)
    assert not mark.exists(), mark.read_text()
    assert _alive(child_pid)
    _kill_and_wait_for(parent, mark)
    assert mark.read_text() == "interrupted"  # not "interrupted again": one clean-up, whole
