"""A run's writes to its project root are bounded by the task's ``budget.disk``.

From inside a real container the step writes 3 GiB into the project root; with a
64 MiB budget the run is stopped with the reason, and the root stays near the budget.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from apply_helpers import (
    cli_env,
    kagura,
    leftovers,
    make_project,
    manifest_set,
    run_ids,
    run_row,
    write_task,
)

from kagura_agent.apply.diskwatch import DiskWatch, tree_bytes

BUDGET = 64 * 1024**2


def test_the_watch_fires_once_past_the_budget(tmp_path: Path) -> None:
    fired: list[str] = []
    (tmp_path / "old").write_bytes(b"x" * 4 * 1024**2)  # there before: not counted
    watch = DiskWatch(tmp_path, 1024**2, fired.append, poll_seconds=0.01, scan_seconds=0.01)
    watch.start()
    try:
        (tmp_path / "small").write_bytes(b"x" * 512 * 1024)
        time.sleep(0.2)
        assert fired == [] and watch.exceeded is None
        with (tmp_path / "big").open("wb") as handle:
            handle.write(os.urandom(8 * 1024**2))
            handle.flush()
            os.fsync(handle.fileno())
        deadline = time.monotonic() + 10
        while not fired and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        watch.stop()
    [reason] = fired
    assert "past its disk budget of 1 MiB" in reason
    assert tree_bytes(tmp_path) >= 12 * 1024**2


def test_empty_files_count_against_the_budget(tmp_path: Path) -> None:
    """Zero bytes each, an inode each: 2,000 empty files are past a 1 MiB budget (a host's
    inodes run out long before its bytes; each entry is charged a block)."""
    fired: list[str] = []
    watch = DiskWatch(tmp_path, 1024**2, fired.append, poll_seconds=0.01, scan_seconds=0.01)
    watch.start()
    try:
        (tmp_path / "many").mkdir()
        for i in range(2000):
            (tmp_path / "many" / str(i)).touch()
        deadline = time.monotonic() + 10
        while not fired and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        watch.stop()
    [reason] = fired
    assert "past its disk budget of 1 MiB" in reason


def test_a_deleted_file_held_open_counts_against_the_budget(tmp_path: Path) -> None:
    """Written after its name is gone, a file is in no folder the scan walks, yet its blocks
    stay taken while a process of the run holds it."""
    fired: list[str] = []
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_DELETED, str(tmp_path / "gone"), str(8 * 1024**2)],
        stdout=subprocess.PIPE,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"ready\n"
        watch = DiskWatch(
            tmp_path,
            1024**2,
            fired.append,
            poll_seconds=0.01,
            scan_seconds=0.01,
            holders=lambda: [holder.pid],
        )
        watch.start()
        try:
            os.kill(holder.pid, signal.SIGUSR1)  # now write
            deadline = time.monotonic() + 10
            while not fired and time.monotonic() < deadline:
                time.sleep(0.02)
        finally:
            watch.stop()
    finally:
        holder.kill()
        holder.wait()
    assert not (tmp_path / "gone").exists()
    [reason] = fired
    assert "past its disk budget of 1 MiB" in reason


# Opens PATH, deletes it, says ready; on SIGUSR1 writes SIZE bytes to it and holds it.
HOLD_DELETED = """
import os, signal, sys, time
path, size = sys.argv[1], int(sys.argv[2])
f = open(path, "wb"); os.unlink(path)
go = []
signal.signal(signal.SIGUSR1, lambda *a: go.append(1))
print("ready", flush=True)
while not go: time.sleep(0.01)
f.write(os.urandom(size)); f.flush(); os.fsync(f.fileno())
time.sleep(60)
"""


def _stopped_at_the_budget(
    docker_client: Any, tmp_path: Path, state_dir: Path, name: str, spec: dict[str, Any]
) -> None:
    """Apply ``spec`` (which writes 3 GiB to ``big``) with a 64 MiB disk budget: the run
    fails with the reason, ``big`` stays near the budget, and nothing is left behind."""
    manifests = manifest_set(tmp_path)
    project = make_project(tmp_path)
    task = write_task(project, name, {"budget": {"disk": "64m", "wall_time": "5m"}, **spec})
    started = time.monotonic()
    done = kagura(["apply", "--yes", "--manifests", str(manifests), str(task)], cli_env(state_dir))
    assert done.returncode == 1, done.stderr[-3000:]
    assert "past its disk budget of 64 MiB" in done.stderr, done.stderr[-3000:]
    written = (project / "big").stat().st_blocks * 512
    print(f"stopped after {written / 1024**2:.0f} MiB in {time.monotonic() - started:.1f}s")
    assert BUDGET < written < 512 * 1024**2, written  # near the budget, far from 3 GiB
    [run_id] = run_ids(state_dir)
    assert run_row(state_dir, run_id)["outcome"] == "failed"
    assert leftovers(docker_client, run_id) == []


def test_a_3_gib_write_is_stopped_at_the_budget(
    docker_client: Any, tmp_path: Path, state_dir: Path
) -> None:
    spec = {"steps": ["head -c 3G /dev/zero > big", "true"], "verify": ["true"]}
    _stopped_at_the_budget(docker_client, tmp_path, state_dir, "disk-hog", spec)


def test_a_3_gib_write_from_verify_is_stopped_at_the_budget(
    docker_client: Any, tmp_path: Path, state_dir: Path
) -> None:
    """Verify runs what the agent left (here a script); its writes count against the budget."""
    spec = {"steps": ["echo 'head -c 3G /dev/zero > big' > check.sh"], "verify": ["bash check.sh"]}
    _stopped_at_the_budget(docker_client, tmp_path, state_dir, "verify-hog", spec)


def test_creating_empty_files_without_end_is_stopped_at_the_budget(
    docker_client: Any, tmp_path: Path, state_dir: Path
) -> None:
    """An agent exhausting the host's inodes with empty files (no data block at all): with
    a 64 MiB budget it is stopped after some tens of thousands, not 1,000,000."""
    make = "import os\nos.mkdir('many')\nfor i in range(1000000): os.close(os.open(f'many/{i}', os.O_CREAT | os.O_WRONLY))"
    manifests = manifest_set(tmp_path)
    project = make_project(tmp_path)
    spec = {
        "budget": {"disk": "64m", "wall_time": "10m"},
        "steps": [f'python3 -c "{make}"', "true"],
        "verify": ["true"],
    }
    task = write_task(project, "inode-hog", spec)
    done = kagura(["apply", "--yes", "--manifests", str(manifests), str(task)], cli_env(state_dir))
    created = len(os.listdir(project / "many"))
    print(f"stopped after {created} empty files")
    assert done.returncode == 1, done.stderr[-3000:]
    assert "past its disk budget of 64 MiB" in done.stderr, done.stderr[-3000:]
    assert 16_384 <= created < 400_000, created
    [run_id] = run_ids(state_dir)
    assert leftovers(docker_client, run_id) == []


def test_writing_to_a_deleted_file_is_stopped_at_the_budget(
    docker_client: Any, tmp_path: Path, state_dir: Path
) -> None:
    """The step deletes its file, then writes 3 GiB to it and holds it open: the tree stays
    empty while the host's disk fills. It is stopped near the budget all the same."""
    write = (
        "import os, time\nf = open('big', 'wb')\nos.unlink('big')\nblock = bytes(1 << 20)\n"
        "for _ in range(3072): f.write(block)\nf.flush()\nos.fsync(f.fileno())\ntime.sleep(30)"
    )
    manifests = manifest_set(tmp_path)
    project = make_project(tmp_path)
    spec = {
        "budget": {"disk": "64m", "wall_time": "5m"},
        "steps": [f'python3 -c "{write}"', "true"],
        "verify": ["true"],
    }
    task = write_task(project, "deleted-hog", spec)
    started = time.monotonic()
    done = kagura(["apply", "--yes", "--manifests", str(manifests), str(task)], cli_env(state_dir))
    print(f"ended in {time.monotonic() - started:.1f}s")
    assert done.returncode == 1, done.stderr[-3000:]
    assert "past its disk budget of 64 MiB" in done.stderr, done.stderr[-3000:]
    assert time.monotonic() - started < 25, "stopped near the budget, not at the step's end"
    [run_id] = run_ids(state_dir)
    assert leftovers(docker_client, run_id) == []
