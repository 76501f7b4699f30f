"""The terminal cockpit (`serve` on stdin) reads any input in bounded time and memory.

Before, the transport kept appending to one buffer until a newline and split all of it
again on every 4 KiB read: 100 MB with no newline kept `serve` busy past two minutes
(quadratic), and a 2 MB unknown command was echoed back whole.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_a_huge_line_is_dropped_and_the_next_command_still_answers(tmp_path: Path) -> None:
    feed = tmp_path / "input"
    with feed.open("wb") as out:
        for _ in range(64):
            out.write(b"x" * 2**20)  # 64 MiB, no newline
        out.write(b"\nstatus\n" + b"y" * 100_000 + b"\n" + b"z" * 5000 + b"\n")
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "KAGURA_AGENT_STATE_DIR": str(tmp_path / "state"),
        "KAGURA_AGENT_CACHE_DIR": str(tmp_path / "cache"),
        "NO_COLOR": "1",
    }
    env.pop("KAGURA_AGENT_MANIFESTS", None)
    start = time.monotonic()
    with feed.open("rb") as stdin:
        proc = subprocess.run(
            [sys.executable, "-m", "kagura_agent", "serve", "--manifests", str(REPO / "manifests")],
            cwd=tmp_path,
            stdin=stdin,
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
    elapsed = time.monotonic() - start
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert elapsed < 15, elapsed
    lines = proc.stdout.splitlines()
    # The 64 MiB line and the 100 000-byte one are dropped with a word each; status and
    # the 5000-byte unknown command are answered, the latter quoted short.
    assert lines.count("a line longer than 64 KiB was ignored") == 2, proc.stdout[:2000]
    assert "no sessions yet" in lines
    assert f"unknown command '{'z' * 40}…'; say `help` for the commands" in lines
    assert len(proc.stdout) < 10_000
