"""Test resources: which tests need what, and what happens when it is missing.

A test's markers come from the fixtures it uses, never from a hand-written mark
(tests/conftest.py applies them at collection):

- ``docker``: it uses ``docker_client`` (or a fixture built on it: ``registry``,
  ``dockerd2``, ``egress_images``, ...);
- ``postgres``: it uses ``postgres_server``, or has a parameter ``"postgres"`` (a fixture
  such as ``state_target`` that starts the server on demand);
- ``slow``: it uses a resource that costs seconds without either (``SLOW_FIXTURES``).

A hand-written marker its fixtures do not give fails the test at setup (it would lie to
the fast tier); one they give is harmless.

The fast tier (``bash scripts/test.sh --fast``) runs what carries none of them. A test
that reaches a resource without its fixture fails loudly instead of being counted fast:
every test that is not marked ``docker`` sees DOCKER_HOST on a tripwire socket (a
connection to it fails the test, also from a subprocess), and under the fast tier
(``KAGURA_TEST_TIER=fast``) starting PostgreSQL or a Docker client fails the test.

Missing resources: a skip on a laptop, a failure in CI (KAGURA_REQUIRE_DOCKER=1).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import NoReturn

import pytest

TIER_ENV = "KAGURA_TEST_TIER"
# The fixtures that make a test need Docker or PostgreSQL; anything built on them
# inherits the marker through pytest's fixture closure.
DOCKER_FIXTURES = frozenset({"docker_client"})
POSTGRES_FIXTURES = frozenset({"postgres_server"})
# A parameter "postgres" (of state_target, the memory stores' backends) starts the server
# on demand (request.getfixturevalue), which pytest's fixture closure cannot see.
POSTGRES_PARAMETER = "postgres"
# Resources that take seconds without Docker or PostgreSQL: a benchmark, a wheel built
# and installed into a fresh virtualenv.
SLOW_FIXTURES = frozenset({"bench_run", "installed_wheel"})
# Where a test that runs without Docker points DOCKER_HOST (the without_docker fixture).
NO_DOCKER = "unix:///nonexistent/kagura-test-no-docker.sock"
# The folder of the tripwire socket a test not marked docker sees as DOCKER_HOST.
TRIPWIRE_PREFIX = "kagura-no-docker-"
ROOT = Path(__file__).resolve().parents[1]
MARKERS = ("docker", "postgres", "slow")
# Under pytest-xdist (--dist loadgroup), the tests that share something one worker must
# own run on one worker: a session fixture that is one of a kind on the host (the
# registry and the second dockerd: one each, images pushed once), or a world several
# tests only probe (started once per module, on one worker). Fixture -> group.
GROUPS = {
    "registry": "daemon2",
    "dockerd2": "daemon2",
    "probe_world": "egress-probes",
    # A wheel built and installed into a fresh virtualenv (~1 min): once, on one worker.
    "installed_wheel": "wheel",
}
# (A module whose tests all read one module-scoped run marks itself with xdist_group.)


def missing(reason: str) -> NoReturn:
    """Skip with ``reason`` — or fail, where CI promised the resource (Docker, images)."""
    if os.environ.get("KAGURA_REQUIRE_DOCKER") == "1":
        pytest.fail(f"KAGURA_REQUIRE_DOCKER=1 but {reason}")
    pytest.skip(reason)


def docker_unreachable(env: Mapping[str, str]) -> bool:
    """Whether a process with ``env`` cannot reach Docker: its DOCKER_HOST is the tripwire
    (a test not marked ``docker``) or the socket that does not exist (``without_docker``)."""
    host = env.get("DOCKER_HOST", "")
    return host == NO_DOCKER or host.startswith(f"unix://{tempfile.gettempdir()}/{TRIPWIRE_PREFIX}")


def fast_tier() -> bool:
    return os.environ.get(TIER_ENV) == "fast"


def refuse_in_fast_tier(what: str) -> None:
    """Fail the test that starts ``what`` under the fast tier: it is mis-marked."""
    if fast_tier():
        pytest.fail(
            f"the fast tier runs no test that needs {what}, but this one reached it without"
            " the fixture in its signature (a fixture requested on demand, or a direct"
            " call): request the fixture in the test's arguments so it is marked",
            pytrace=False,
        )


def needs(fixturenames: set[str], params: dict[str, object]) -> set[str]:
    """The markers a test with these fixtures (closure) and parameters must carry."""
    found = set()
    if fixturenames & DOCKER_FIXTURES:
        found.add("docker")
    on_demand = POSTGRES_PARAMETER in params.values()
    if fixturenames & POSTGRES_FIXTURES or on_demand:
        found.add("postgres")
    if fixturenames & SLOW_FIXTURES:
        found.add("slow")
    return found


def run_bench(name: str, folder: Path, extra: dict[str, str]) -> str:
    """``python bench/NAME.py`` in its quick mode, from ``folder``; its last line."""
    env = {**os.environ, "KAGURA_BENCH_QUICK": "1", "NO_COLOR": "1", **extra}
    env["KAGURA_AGENT_STATE_DIR"] = str(folder / "state")
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / f"{name}.py")],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-2000:]
    lines = done.stdout.rstrip("\n").splitlines()
    assert lines, done.stderr[-3000:]
    return lines[-1]


def group(fixturenames: set[str]) -> str | None:
    """The xdist group a test with these fixtures (closure) must run in, if any."""
    found = sorted({GROUPS[name] for name in fixturenames & GROUPS.keys()})
    assert len(found) <= 1, f"a test in two serial groups: {found}"
    return found[0] if found else None


class Tripwire:
    """A Unix socket standing in for the Docker daemon: it counts who connects and
    answers nothing (the client fails at once)."""

    def __init__(self) -> None:
        self.folder = tempfile.mkdtemp(prefix=TRIPWIRE_PREFIX)
        self.path = str(Path(self.folder) / "docker.sock")
        self.hits = 0
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(self.path)
        self._server.listen(64)
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"unix://{self.path}"

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            self.hits += 1
            conn.close()

    def close(self) -> None:
        self._server.close()
        Path(self.path).unlink(missing_ok=True)
        os.rmdir(self.folder)


def require_extra(module: str, extra: str) -> None:
    """Skip the calling test module when an optional extra is not installed, found without
    importing it: the SDK and what it pulls in cost each pytest worker 2 s to import at
    collection, for modules whose tests mostly run it in a child process anyway."""
    import importlib.util

    if importlib.util.find_spec(module) is None:
        pytest.skip(f"the {extra!r} extra is not installed", allow_module_level=True)
