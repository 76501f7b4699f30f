"""A throwaway PostgreSQL for benches, started by the project's own script.

``postgres()`` runs scripts/postgres-up.sh in a temporary folder (Debian's PostgreSQL 15,
non-root, 127.0.0.1 only) and stops it afterwards. (Tests use tests/postgres.py, which
also makes a fresh database per test.)
"""

from __future__ import annotations

import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "postgres-up.sh"


class PostgresMissing(Exception):
    """The script could not start a server here (no binaries, no permission)."""


@contextmanager
def postgres() -> Iterator[str]:
    """A running server's URL (its own database ``kagura``) for the ``with`` block."""
    folder = Path(tempfile.mkdtemp(prefix="kagura-pg-test-"))
    folder.chmod(0o755)
    data = folder / "pg"
    started = subprocess.run(
        ["bash", str(SCRIPT), str(data)], capture_output=True, text=True, timeout=300
    )
    if started.returncode != 0:
        raise PostgresMissing(f"scripts/postgres-up.sh failed: {started.stderr.strip()[-500:]}")
    try:
        yield started.stdout.strip().splitlines()[-1]
    finally:
        subprocess.run(["bash", str(SCRIPT), "--stop", str(data)], capture_output=True, timeout=120)
        subprocess.run(["rm", "-rf", str(folder)], check=False)
