"""A damaged state or memory database is reported as damaged and left as it is.

The commands already exited 3 without a traceback, but told the operator to "set
KAGURA_AGENT_STATE_DIR to a writable directory" for a file of random bytes or a
truncated one, which sends them after permissions; nothing may rewrite the file.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from testing import forked

DAMAGED = "the file is damaged or is no kagura-agent store"


def cli(state: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """The CLI in a process of its own (forked, testing/forked.py): a store it opened is
    never one a process opened before."""
    env = {
        **os.environ,
        "KAGURA_AGENT_STATE_DIR": str(state),
        "KAGURA_AGENT_CACHE_DIR": str(state.parent / "cache"),
        "NO_COLOR": "1",
    }
    env.pop("KAGURA_AGENT_MANIFESTS", None)
    return forked.run(argv, cwd=state.parent, env=env, timeout=120).text()


@pytest.mark.parametrize(
    ("file", "argv"),
    [
        ("state.db", ["leases", "list"]),
        ("state.db", ["graduation", "status"]),
        ("memory.db", ["memory", "search", "x"]),
    ],
)
@pytest.mark.parametrize("damage", ["random", "truncated"])
def test_a_damaged_database_says_so_and_is_kept(
    tmp_path: Path, file: str, argv: list[str], damage: str
) -> None:
    state = tmp_path / "state"
    made = cli(state, *argv)  # a healthy store first
    assert made.returncode == 0, made.stderr
    db = state / file
    data = db.read_bytes()
    db.write_bytes(os.urandom(8192) if damage == "random" else data[:3000])
    before = db.read_bytes()
    for extra in ([], ["--json"]):
        proc = cli(state, *argv, *extra)
        assert proc.returncode == 3, proc.stdout + proc.stderr
        assert "Traceback" not in proc.stdout + proc.stderr
        assert f"hint: {DAMAGED}" in proc.stderr, proc.stderr
        if extra:
            (error,) = json.loads(proc.stdout)["errors"]
            assert error["hint"].startswith(DAMAGED)
    assert db.read_bytes() == before
