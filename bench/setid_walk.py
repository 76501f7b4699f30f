"""The host-side setuid/setgid check (apply/aftercare/setid.py) on a large project root.

Builds a tree of N files (default 100,000: 1,000 directories of 100 files) in a temp
folder, then times ``clear_setid`` over it, cold-ish (first walk after building) and
warm (median of the next runs), with the run's ctime bound in the past (every entry
is a candidate; the worst case) and a handful of setuid files and of files with a named-user
ACL planted to clear. Also times the start-of-run ACL record of the tree's directories
(``acl.snapshot``), which the run's open pays.

    python bench/setid_walk.py [--files 100000] [--runs 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from kagura_agent.apply.aftercare import acl
from kagura_agent.apply.aftercare.setid import clear_setid, ctime_floor

PER_DIR = 100


def build(root: Path, files: int) -> None:
    for d in range(files // PER_DIR):
        folder = root / f"d{d:04}"
        folder.mkdir()
        for f in range(PER_DIR):
            (folder / f"f{f:03}.py").write_bytes(b"")


# KAGURA_BENCH_QUICK=1 (CI, tests/test_benches.py): one iteration at small sizes, to show
# the bench still runs and ends with its RESULT line; its numbers mean nothing then.
QUICK = os.environ.get("KAGURA_BENCH_QUICK") == "1"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--files", type=int, default=1000 if QUICK else 100_000)
    parser.add_argument("--runs", type=int, default=1 if QUICK else 5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        since = ctime_floor()
        build(root, args.files)
        started = time.perf_counter()
        snap = acl.snapshot(str(root))
        snapshot_s = time.perf_counter() - started
        named = acl.build(
            [(acl.USER_OBJ, 6, acl.UNDEFINED_ID), (acl.USER, 6, 31337)]
            + [(tag, 4, acl.UNDEFINED_ID) for tag in (acl.GROUP_OBJ, acl.MASK, acl.OTHER)]
        )
        times = []
        for _ in range(args.runs + 1):
            for i in range(5):  # planted each run: the walk has something to clear
                path = root / f"d{i:04}" / "f000.py"
                os.chmod(path, 0o4755)
                os.setxattr(root / f"d{i:04}" / "f001.py", acl.ACCESS, named)
            started = time.perf_counter()
            report = clear_setid(str(root), since, root_acl=snap)
            times.append(time.perf_counter() - started)
            assert report.cleared.count == 5 and report.complete, report
            assert report.acl_removed.count == 5, report
        result = {
            "files": args.files,
            "entries": report.scanned,
            "first_s": round(times[0], 3),
            "median_s": round(statistics.median(times[1:]), 3),
            "us_per_entry": round(statistics.median(times[1:]) / report.scanned * 1e6, 2),
            "acl_snapshot_s": round(snapshot_s, 3),
        }
    print("RESULT setid_walk " + " ".join(f"{key}={value}" for key, value in result.items()))


if __name__ == "__main__":
    main()
