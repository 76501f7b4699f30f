"""A throwaway PostgreSQL for tests and benches, started by the project's own script.

``postgres()`` runs scripts/postgres-up.sh in a temporary folder (Debian's PostgreSQL 15,
non-root, 127.0.0.1 only) and stops it afterwards; ``fresh_database`` makes an empty
database on it, so each test gets its own queue and tables.
"""

from __future__ import annotations

import subprocess
import tempfile
import uuid
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


def fresh_database(url: str, prefix: str = "t") -> str:
    """Create an empty database on ``url``'s server; its URL."""
    import psycopg

    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"'.encode())
    return url.rsplit("/", 1)[0] + "/" + name
