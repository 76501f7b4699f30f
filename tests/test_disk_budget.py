"""A run's writes to its project root are bounded by the task's ``budget.disk``.

From inside a real container the step writes 3 GiB into the project root; with a
64 MiB budget the run is stopped with the reason, and the root stays near the budget —
also while another host process writes to the same file system all through the run.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
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

from kagura_agent.apply.guards.cgroupio import Freezer, WriteMeter, cgroup_dir
from kagura_agent.apply.guards.diskwatch import Cadence, DiskWatch, tree_bytes
from kagura_agent.membrane import images

# One worker for the module (pytest-xdist --dist loadgroup): its runs write gigabytes each
# and measure how far past a budget they got; side by side, each is the others' "another
# process writing to the same disk", and the bounds stop meaning what they say.
pytestmark = pytest.mark.xdist_group("disk-budget")

BUDGET = 64 * 1024**2


def _own_writes() -> int:
    """What this process has written (its /proc/self/io): the writer here is the test."""
    with open("/proc/self/io", encoding="ascii") as handle:
        return next(int(line.split()[1]) for line in handle if line.startswith("write_bytes"))


def test_the_watch_fires_once_past_the_budget(tmp_path: Path) -> None:
    """Metered by the writer's own count: other processes on this shared disk (which may
    free space as fast as the test writes) do not decide it."""
    fired: list[str] = []
    (tmp_path / "old").write_bytes(b"x" * 4 * 1024**2)  # there before: not counted
    watch = DiskWatch(
        tmp_path,
        1024**2,
        fired.append,
        cadence=Cadence(poll_seconds=0.01, scan_seconds=0.01),
        meter=_own_writes,
    )
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
    watch = DiskWatch(
        tmp_path, 1024**2, fired.append, cadence=Cadence(poll_seconds=0.01, scan_seconds=0.01)
    )
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
            # Measured every 0.2 s whatever the file system says: /tmp is shared, and what
            # other tests free there hides these 8 MiB from its growth (seen under xdist).
            cadence=Cadence(poll_seconds=0.01, scan_seconds=0.01, rescan_seconds=0.2),
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


def test_space_another_process_frees_does_not_hide_what_the_run_adds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file system is shared: a neighbour freeing 100 MiB there before the run writes
    8 MiB leaves the file system 92 MiB below where the watch started. Its growth is
    counted from the lowest it has been, so the run's 8 MiB still ask for a measure. (The
    file system's usage is scripted here, the root and its measure are real; the periodic
    measure is out of the way.)"""
    from kagura_agent.apply.guards import diskwatch

    used = [1000 * 1024**2]
    monkeypatch.setattr(diskwatch, "_fs_used", lambda root: used[0])
    fired: list[str] = []
    watch = DiskWatch(
        tmp_path, 4 * 1024**2, fired.append, cadence=Cadence(poll_seconds=0.01, rescan_seconds=3600)
    ).start()
    try:
        time.sleep(0.1)
        used[0] -= 100 * 1024**2  # the neighbour frees
        time.sleep(0.1)
        (tmp_path / "big").write_bytes(b"x" * 8 * 1024**2)
        used[0] += 8 * 1024**2
        deadline = time.monotonic() + 10
        while not fired and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        watch.stop()
    [reason] = fired
    assert "past its disk budget of 4 MiB" in reason


def test_the_periodic_measure_holds_nothing_until_it_finds_the_budget_passed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Measured every 0.1 s with no signal near the budget: never held (a held container
    refuses `docker exec`: verify's, the agent branch's — seen as "cannot exec in a paused
    container"). Once such a measure finds the budget passed, it is measured again held,
    and only that measure stops the run."""
    from kagura_agent.apply.guards import diskwatch

    monkeypatch.setattr(diskwatch, "_fs_used", lambda root: 10**12)  # no growth signal
    holds: list[float] = []

    @contextlib.contextmanager
    def hold() -> Iterator[bool]:
        holds.append(time.monotonic())
        yield True

    fired: list[str] = []
    watch = DiskWatch(
        tmp_path,
        4 * 1024**2,
        fired.append,
        cadence=Cadence(poll_seconds=0.01, rescan_seconds=0.1),
        hold=hold,
    ).start()
    try:
        time.sleep(0.6)
        quiet_scans = watch.scans
        assert quiet_scans >= 3 and holds == [], (quiet_scans, holds)
        (tmp_path / "big").write_bytes(b"x" * 8 * 1024**2)
        deadline = time.monotonic() + 10
        while not fired and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        watch.stop()
    assert len(holds) == 1 and fired, (holds, fired)


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
    docker_client: Any,
    tmp_path: Path,
    state_dir: Path,
    name: str,
    spec: dict[str, Any],
    *,
    most: int = 512 * 1024**2,
) -> int:
    """Apply ``spec`` (which writes 3 GiB to ``big*``) with a 64 MiB disk budget: the run
    fails with the reason, ``big*`` stays near the budget (below ``most``), and nothing is
    left behind. Returns what was written."""
    manifests = manifest_set(tmp_path)
    project = make_project(tmp_path)
    task = write_task(project, name, {"budget": {"disk": "64m", "wall_time": "5m"}, **spec})
    started = time.monotonic()
    done = kagura(["apply", "--yes", "--manifests", str(manifests), str(task)], cli_env(state_dir))
    assert done.returncode == 1, done.stderr[-3000:]
    assert "past its disk budget of 64 MiB" in done.stderr, done.stderr[-3000:]
    written = sum(f.stat().st_blocks * 512 for f in project.glob("big*"))
    print(f"stopped after {written / 1024**2:.1f} MiB in {time.monotonic() - started:.1f}s")
    # Near the budget, far from 3 GiB (its last file may end a little short of it: the
    # root's folders and inodes count too).
    assert BUDGET - 16 * 1024**2 < written < most, written
    [run_id] = run_ids(state_dir)
    assert run_row(state_dir, run_id)["outcome"] == "failed"
    assert leftovers(docker_client, run_id) == []
    return written


def test_a_3_gib_write_is_stopped_at_the_budget(
    docker_client: Any, tmp_path: Path, state_dir: Path
) -> None:
    spec = {"steps": ["head -c 3G /dev/zero > big", "true"], "verify": ["true"]}
    _stopped_at_the_budget(docker_client, tmp_path, state_dir, "disk-hog", spec)


# 1 GiB as 64 files of 16 MiB: none past the budget on its own (the kernel's limit on a
# file's size is not what stops it), after a pause for the other process to get going.
MANY = "sleep 3; for i in $(seq 1 64); do head -c 16M /dev/zero > big$i; done"


def _other_process(folder: str, stop: Any) -> None:
    """Another host process on the same file system, until ``stop``: it writes all the
    time (a 64 MiB file, rewritten 4 MiB at a time) and frees space faster than a run
    can fill it (a 4 GiB file allocated first, cut by 15 MiB every 50 ms) — so the file
    system shrinks while the run writes."""
    reserve = os.path.join(folder, "reserve")
    with open(reserve, "wb") as handle:
        os.posix_fallocate(handle.fileno(), 0, 4 << 30)
    size = 4 << 30
    chunk = b"\1" * (4 << 20)
    with open(os.path.join(folder, "churn"), "wb") as churn:
        while not stop.is_set() and size > 0:
            churn.seek((size // len(chunk)) % 16 * len(chunk))
            churn.write(chunk)
            churn.flush()
            os.fsync(churn.fileno())
            size = max(0, size - (15 << 20))
            os.truncate(reserve, size)
            stop.wait(0.05)


def test_the_budget_holds_while_another_process_writes_to_the_same_disk(
    docker_client: Any, tmp_path: Path, state_dir: Path
) -> None:
    """The file system's growth says nothing of the run while another process writes to
    and frees space on the same disk: before, the root was measured only when the file
    system had grown past the budget (once a second at most while it stood there), and
    here it never did — the run wrote its whole 1 GiB past a 64 MiB budget. What the
    run's own processes write (apply/guards/cgroupio.WriteMeter) stops it near the budget."""
    other = tmp_path / "other"
    other.mkdir()
    stop = multiprocessing.Event()
    writer = multiprocessing.Process(target=_other_process, args=(str(other), stop))
    writer.start()
    try:
        time.sleep(2)  # the other process is at work before the run starts
        spec = {"steps": [MANY], "verify": ["true"]}
        written = _stopped_at_the_budget(
            docker_client, tmp_path, state_dir, "busy-disk", spec, most=BUDGET + 32 * 1024**2
        )
    finally:
        stop.set()
        writer.join(60)
    print(f"{(written - BUDGET) / 1024**2:.1f} MiB past the budget")


def test_one_file_past_the_budget_is_refused_by_the_kernel(
    docker_client: Any, tmp_path: Path, state_dir: Path
) -> None:
    """fallocate makes a file's blocks in one call, faster than any watch could see them
    (before, 3 GiB were on the host's disk when the watch stopped the run): the
    container's limit on a file's size (the budget and 1 MiB) refuses it."""
    manifests = manifest_set(tmp_path)
    project = make_project(tmp_path)
    spec = {
        "budget": {"disk": "64m", "wall_time": "5m"},
        "steps": ["! fallocate -l 3G big", "true"],  # SIGXFSZ: it fails
        "verify": ["test ! -s big"],
    }
    task = write_task(project, "fallocate", spec)
    done = kagura(["apply", "--yes", "--manifests", str(manifests), str(task)], cli_env(state_dir))
    assert done.returncode == 0, done.stderr[-3000:]
    assert (project / "big").stat().st_blocks == 0


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
    # 64 MiB is 16,384 inodes of one 4 KiB block; the folder holding them takes its own
    # blocks (~40 bytes a name: ~160 blocks), so the budget is reached a little before.
    assert 16_000 <= created < 400_000, created
    [run_id] = run_ids(state_dir)
    assert leftovers(docker_client, run_id) == []


def test_writing_to_a_deleted_file_is_stopped_at_the_budget(
    docker_client: Any, tmp_path: Path, state_dir: Path
) -> None:
    """The step deletes its files, then writes 3 GiB to them (32 MiB each: none past the
    limit on a file's size) and holds them open: the tree stays empty while the host's
    disk fills. It is stopped near the budget all the same."""
    write = (
        "import os, time\nblock = bytes(1 << 20)\nheld = []\n"
        "for i in range(96):\n"
        "    f = open(f'big{i}', 'wb'); os.unlink(f'big{i}'); held.append(f)\n"
        "    for _ in range(32): f.write(block)\n"
        "    f.flush()\n"
        "time.sleep(30)"
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


def _container(docker_client: Any, folder: Path, script: str) -> Any:
    """A container of the agent image running ``script`` as the agent's uid, ``folder``
    mounted at /w (labelled for this test, removed by the caller)."""
    return docker_client.containers.run(
        images.image_ref("agent"),
        ["sh", "-c", script],
        entrypoint=[],
        user="1000:1000",
        volumes={str(folder): {"bind": "/w", "mode": "rw"}},
        network_mode="none",
        labels={"dev.kagura.test": "disk-budget"},
        detach=True,
    )


def _init(container: Any) -> int:
    container.reload()
    return int(container.attrs["State"]["Pid"])


def test_the_meter_counts_every_process_of_a_container_and_never_falls(
    docker_client: Any, tmp_path: Path
) -> None:
    """Each ``head`` writes 4 MiB and is reaped by the shell: its bytes move into the
    shell's count, and a process gone keeps its last reading."""
    folder = make_project(tmp_path)
    script = "for i in 1 2 3 4 5 6; do head -c 4M /dev/zero > /w/f$i; sleep 0.2; done; sleep 30"
    container = _container(docker_client, folder, script)
    try:
        init = _init(container)
        meter = WriteMeter(lambda: [init])
        readings = []
        deadline = time.monotonic() + 30
        while len(list(folder.glob("f*"))) < 6 and time.monotonic() < deadline:
            readings.append(meter.read())
            time.sleep(0.02)
        time.sleep(0.3)
        readings.append(meter.read())
    finally:
        container.remove(force=True)
    values = [r for r in readings if r is not None]
    assert len(values) == len(readings)  # every process readable (the test runs as root)
    assert values == sorted(values)
    assert values[-1] >= 24 * 1024**2


def test_held_containers_write_nothing_and_die_where_they_are_held(
    docker_client: Any, tmp_path: Path
) -> None:
    folder = make_project(tmp_path)
    container = _container(
        docker_client, folder, "while true; do head -c 64k /dev/zero >> /w/log; done"
    )
    try:
        init = _init(container)
        freezer = Freezer(lambda: [init])
        while not (folder / "log").exists():
            time.sleep(0.01)
        # Freezing a loop that forks and writes settles within a second on a quiet machine,
        # within several on a loaded one (cgroup v1 says FREEZING until every task stops).
        with freezer.hold(timeout=20) as held:
            assert held
            size = (folder / "log").stat().st_size
            time.sleep(0.3)
            assert (folder / "log").stat().st_size == size  # nothing written while held
            freezer.kill_all()
        container.wait(timeout=30)
        assert (folder / "log").stat().st_size == size  # nor after: killed where it stood
    finally:
        container.remove(force=True)


def test_a_pid_that_is_no_containers_is_never_frozen() -> None:
    """Not this process's own cgroup (nor a hierarchy's root): apply must never freeze
    or kill its own host's processes for a pid that was no container's init."""
    assert cgroup_dir(os.getpid(), "freezer") is None
    freezer = Freezer(lambda: [os.getpid()])
    with freezer.hold() as held:
        assert held is False
    assert WriteMeter(lambda: [os.getpid()]).read() is None


def test_what_a_step_wrote_past_the_budget_between_two_readings_is_found_at_the_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No reading sees the step's write (the file system's figures unchanged, as before
    writeback; a cadence far slower than the step): when the watch stops, one last
    measure finds it, and ``exceeded`` says so (``late``: nobody was stopped). Before, a
    verify writing 65 MiB in ~40 ms against 64 MiB ended with no word of the budget."""
    from kagura_agent.apply.guards import diskwatch

    monkeypatch.setattr(diskwatch, "_fs_used", lambda root: 10**12)
    fired: list[str] = []
    slow = Cadence(poll_seconds=3600, scan_seconds=3600, rescan_seconds=3600)
    watch = DiskWatch(tmp_path, 4 * 1024**2, fired.append, cadence=slow).start()
    (tmp_path / "big").write_bytes(b"x" * 8 * 1024**2)
    watch.stop()
    assert fired == [] and watch.late
    assert watch.exceeded is not None and "past its disk budget of 4 MiB" in watch.exceeded


def test_an_exec_into_a_held_container_waits_for_the_hold_to_end(
    docker_client: Any, tmp_path: Path
) -> None:
    """The disk watch holds the run's containers still while it measures; runc refuses
    an exec meanwhile ("cannot exec in a paused container"), which failed verify with
    126 twice in full runs. The exec is tried again once the hold ends."""
    from kagura_agent.apply.run.docker import DockerApplyRuntime

    container = _container(docker_client, make_project(tmp_path), "sleep 60")
    try:
        freezer = Freezer(lambda: [_init(container)])
        runtime = DockerApplyRuntime(docker_client)
        with freezer.hold() as held:
            assert held
            result: list[tuple[int, bytes]] = []
            worker = threading.Thread(
                target=lambda: result.append(
                    runtime.exec(container.id, ["echo", "ran"], user="1000:1000", workdir="/")
                )
            )
            worker.start()
            time.sleep(1.0)  # the exec is refused while held, and tried again
            assert result == []
        worker.join(30)
        assert result == [(0, b"ran\n")], result
    finally:
        container.remove(force=True)


def test_a_streamed_exec_into_a_held_container_waits_and_keeps_nothing_of_the_refusal(
    docker_client: Any, tmp_path: Path
) -> None:
    """The same for an exec whose output is streamed into a file (the agent's branch is
    taken out so): refused while held, tried again once the hold ends, and the file holds
    the command's output only, not the daemon's refusal."""
    import io

    from kagura_agent.apply.run.docker import DockerApplyRuntime

    container = _container(docker_client, make_project(tmp_path), "sleep 60")
    try:
        freezer = Freezer(lambda: [_init(container)])
        runtime = DockerApplyRuntime(docker_client)
        into = io.BytesIO()
        with freezer.hold() as held:
            assert held
            result: list[tuple[int, int, bool]] = []
            worker = threading.Thread(
                target=lambda: result.append(
                    runtime.exec_stream(
                        container.id,
                        ["echo", "ran"],
                        user="1000:1000",
                        workdir="/",
                        into=into,
                        limit=1024,
                    )
                )
            )
            worker.start()
            time.sleep(1.0)
            assert result == []
        worker.join(30)
        assert result == [(0, 4, True)] and into.getvalue() == b"ran\n", (result, into.getvalue())
    finally:
        container.remove(force=True)


def test_a_command_that_ran_and_exited_126_is_not_run_again(
    docker_client: Any, tmp_path: Path
) -> None:
    """Only an exec that never started is tried again: one that ran (it had a process)
    and exited 126 without a word is its own result, run once."""
    from kagura_agent.apply.run.docker import DockerApplyRuntime

    folder = make_project(tmp_path)
    container = _container(docker_client, folder, "sleep 60")
    try:
        runtime = DockerApplyRuntime(docker_client)
        script = "echo once >> /w/runs; exit 126"
        code, output = runtime.exec(
            container.id, ["sh", "-c", script], user="1000:1000", workdir="/"
        )
        assert (code, output) == (126, b"")
        assert (folder / "runs").read_text() == "once\n"
    finally:
        container.remove(force=True)
