"""A throwaway PostgreSQL server for the tests, started once per session by the project's
own script (scripts/postgres-up.sh: Debian's PostgreSQL 15, non-root, temp data dir,
127.0.0.1 only), and one fresh database per test.

``KAGURA_TEST_POSTGRES_URL`` points the tests at a server someone else started instead
(its user must be allowed to CREATE DATABASE). Where no server can start, a test that
needs one skips with the reason — and fails under KAGURA_REQUIRE_DOCKER=1 (CI).
"""

from __future__ import annotations

import secrets
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from resources import missing

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "postgres-up.sh"


@dataclass
class Server:
    url: str  # the admin database (where CREATE DATABASE runs)
    folder: Path | None  # the data folder we started (None: someone else's server)

    def database_url(self, name: str) -> str:
        return urlunsplit(urlsplit(self.url)._replace(path="/" + name))

    @contextmanager
    def fresh_database(self) -> Iterator[str]:
        """A new, empty database for one test; dropped (with its connections) after."""
        import psycopg

        from kagura_agent.state import pg as state_pg

        name = "t_" + secrets.token_hex(6)
        with psycopg.connect(self.url, autocommit=True) as admin:
            admin.execute(f"CREATE DATABASE {name}")  # type: ignore[arg-type]
        try:
            yield self.database_url(name)
        finally:
            state_pg.close_pools()
            with psycopg.connect(self.url, autocommit=True) as admin:
                admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")  # type: ignore[arg-type]


def start(url_from_env: str | None) -> Iterator[Server]:
    """The session's server: someone else's (``url_from_env``) or one started here."""
    try:
        import psycopg  # noqa: F401
        import psycopg_pool  # noqa: F401
    except ImportError as exc:
        missing(f"psycopg / psycopg-pool not installed ({exc}); pip install -e '.[team]'")
    if url_from_env:
        yield Server(url_from_env, None)
        return
    folder = Path(tempfile.mkdtemp(prefix="kagura-pg-test-"))
    done = subprocess.run(
        ["bash", str(SCRIPT), str(folder)], capture_output=True, text=True, timeout=600
    )
    if done.returncode != 0 or not done.stdout.strip():
        missing(f"PostgreSQL could not start via {SCRIPT.name}: {done.stderr.strip()[-500:]}")
    try:
        yield Server(done.stdout.strip().splitlines()[-1], folder)
    finally:
        subprocess.run(["bash", str(SCRIPT), "--stop", str(folder)], capture_output=True)
        subprocess.run(["rm", "-rf", str(folder)], capture_output=True)
