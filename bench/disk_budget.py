"""Disk budget under a concurrent writer: how far past ``budget.disk`` a run gets when
another host process writes to the same file system at the same time.

Each round applies, through ``kagura-agent apply``, a script task whose step writes
3 GiB into its project root as 96 files of 32 MiB (none past the budget on its own), with
a 256 MiB disk budget, in a real container. The figure is what the run left in its root
past the budget when it was stopped (MiB; the median of N rounds of each kind):

- ``quiet``: nothing else writes (the baseline, measured in the same run);
- ``busy``: a host process writes to the same file system from before the run starts to
  after it ends — two 600 MiB files in turn, one deleted as the other is rewritten — so
  the file system stands past the budget all through the run without the run;
- ``freeing``: the other process also frees space faster than the run fills it (a large
  file allocated first, cut down all through the run): the file system shrinks while the
  run writes, and a watch of the file system's growth alone never fires;
- ``allocate``: quiet, but the step allocates its files with ``fallocate`` (blocks without
  a write, which only the file system's growth shows).

    python bench/disk_budget.py [--runs 3]

KAGURA_BENCH_QUICK=1 (CI, tests/test_benches.py): one round of ``quiet`` and ``allocate``
only (the other two write gigabytes beside the run); their figures print as ``-``.

RESULT disk_budget over_quiet_mib=… over_busy_mib=… over_freeing_mib=… over_allocate_mib=…
budget_mib=256 runs=N ratio=busy/quiet (near 1 or below: the other writer costs the
budget nothing).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
QUICK = os.environ.get("KAGURA_BENCH_QUICK") == "1"
BUDGET_MIB = 256
WRITE = "sleep 4; for i in $(seq 1 96); do head -c 32M /dev/zero > big$i; done"
STEPS = {
    "quiet": WRITE,
    "busy": WRITE,
    "freeing": WRITE,
    # Blocks without a write: what the meter cannot see, caught by the file system's growth.
    "allocate": "sleep 4; for i in $(seq 1 96); do fallocate -l 32M big$i; done",
}


def _writer(folder: str, stop: multiprocessing.synchronize.Event) -> None:
    """Two 600 MiB files in turn, 8 MiB at a time, until ``stop``."""
    chunk = b"\0" * (8 << 20)
    turn = 0
    while not stop.is_set():
        path = os.path.join(folder, f"other{turn % 2}")
        with open(path, "wb") as handle:
            for _ in range(75):
                if stop.is_set():
                    break
                handle.write(chunk)
                handle.flush()
                os.fsync(handle.fileno())
        turn += 1
        other = os.path.join(folder, f"other{turn % 2}")
        if os.path.exists(other):
            os.unlink(other)


def _freer(folder: str, stop: multiprocessing.synchronize.Event) -> None:
    """Writes all the time (a 64 MiB file, 4 MiB at a time) and frees space faster than the
    run fills it (an 8 GiB file allocated first, cut by 15 MiB every 50 ms)."""
    reserve = os.path.join(folder, "reserve")
    size = 8 << 30
    with open(reserve, "wb") as handle:
        os.posix_fallocate(handle.fileno(), 0, size)
    chunk = b"\1" * (4 << 20)
    with open(os.path.join(folder, "churn"), "wb") as churn:
        while not stop.is_set() and size > 0:
            churn.seek(size // len(chunk) % 16 * len(chunk))
            churn.write(chunk)
            churn.flush()
            os.fsync(churn.fileno())
            size = max(0, size - (15 << 20))
            os.truncate(reserve, size)
            stop.wait(0.05)


def _round(base: Path, mode: str) -> float:
    """One apply; MiB past the budget the run left in its root."""
    work = Path(tempfile.mkdtemp(prefix="disk-budget-", dir=base))
    project = work / "project"
    project.mkdir()
    if os.geteuid() == 0:
        os.chown(project, 1000, 1000)  # the container runs as the root's owner
    else:
        project.chmod(0o777)
    task = project / "task.yml"
    spec = {"budget": {"disk": f"{BUDGET_MIB}m", "wall_time": "5m"}, "steps": [STEPS[mode]]}
    task.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kagura.dev/v1",
                "kind": "Task",
                "metadata": {"name": "disk"},
                "spec": spec,
            }
        )
    )
    env = {**os.environ, "KAGURA_AGENT_STATE_DIR": str(work / "state"), "NO_COLOR": "1"}
    stop = multiprocessing.Event()
    writer = None
    if mode in ("busy", "freeing"):
        (work / "other").mkdir()
        target = _writer if mode == "busy" else _freer
        writer = multiprocessing.Process(target=target, args=(str(work / "other"), stop))
        writer.start()
        time.sleep(3)  # past the budget before the run starts
    try:
        # The kagura-agent of this checkout (run from it, so a bench copied into another
        # checkout measures that one's code).
        done = subprocess.run(
            [sys.executable, "-m", "kagura_agent", "apply", "--yes", str(task)],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
    finally:
        stop.set()
        if writer is not None:
            writer.join(60)
    if "past its disk budget" not in done.stderr and done.returncode != 0:
        raise SystemExit(f"the run failed for another reason:\n{done.stderr[-2000:]}")
    written = sum(f.stat().st_blocks * 512 for f in project.glob("big*"))
    subprocess.run(["rm", "-rf", str(work)], check=False)
    return written / 2**20 - BUDGET_MIB


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="kagura-bench-disk-", dir="/var/tmp"))
    runs = 1 if QUICK else args.runs
    modes = ["quiet", "allocate"] if QUICK else list(STEPS)
    results: dict[str, list[float]] = {mode: [] for mode in STEPS}
    try:
        for _ in range(runs):
            for mode in modes:
                over = _round(base, mode)
                results[mode].append(over)
                print(f"{mode}: {over:.0f} MiB past the {BUDGET_MIB} MiB budget", flush=True)
    finally:
        subprocess.run(["rm", "-rf", str(base)], check=False)
    over = {
        mode: f"{statistics.median(found):.0f}" if found else "-" for mode, found in results.items()
    }
    quiet, busy = statistics.median(results["quiet"]), results["busy"]
    ratio = "-" if not busy else f"{statistics.median(busy) / quiet:.2f}" if quiet > 0 else "inf"
    print(
        f"RESULT disk_budget over_quiet_mib={over['quiet']} over_busy_mib={over['busy']}"
        f" over_freeing_mib={over['freeing']} over_allocate_mib={over['allocate']}"
        f" budget_mib={BUDGET_MIB} runs={runs} ratio={ratio}"
    )


if __name__ == "__main__":
    main()
