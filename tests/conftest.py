"""Shared fixtures.

Docker: tests marked ``docker`` use the ``docker_client`` fixture. Where no daemon answers
they skip with the reason, except when KAGURA_REQUIRE_DOCKER=1 (CI), where they fail.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from resources import missing


def _docker_or_reason() -> tuple[Any, str]:
    try:
        import docker

        client = docker.from_env(timeout=30)
        client.ping()
        return client, ""
    except Exception as exc:
        return None, f"no Docker Engine reachable ({exc.__class__.__name__}: {exc})"


@pytest.fixture(scope="session")
def docker_client() -> Iterator[Any]:
    client, reason = _docker_or_reason()
    if client is None:
        missing(reason)
    yield client
    client.close()


@pytest.fixture()
def cloudflare() -> Iterator[Any]:
    """A local fake of the Cloudflare API on 127.0.0.1 (testing/fake_cloudflare.py)."""
    from testing.fake_cloudflare import FakeCloudflare

    fake = FakeCloudflare().start()
    yield fake
    fake.stop()


@pytest.fixture()
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An isolated state directory for the test (KAGURA_AGENT_STATE_DIR)."""
    path = tmp_path / "state"
    monkeypatch.setenv("KAGURA_AGENT_STATE_DIR", str(path))
    return path


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[Any]:
    """One PostgreSQL server for the session (tests/postgres.py); started on first use."""
    import os

    import postgres

    yield from postgres.start(os.environ.get("KAGURA_TEST_POSTGRES_URL"))


@pytest.fixture(params=["sqlite", "postgres"])
def state_target(
    request: pytest.FixtureRequest, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Path | str]:
    """The state store a test runs against, once per backend: the SQLite file in the
    test's state directory, or a fresh PostgreSQL database. Either way it is also the
    configured store (``StateStore()``, and the ``kagura-agent`` processes a test starts,
    open it): KAGURA_AGENT_STATE_URL is set for PostgreSQL and unset for SQLite."""
    from kagura_agent.state import URL_ENV

    if request.param == "sqlite":
        monkeypatch.delenv(URL_ENV, raising=False)
        yield state_dir / "state.db"
        return
    server = request.getfixturevalue("postgres_server")
    with server.fresh_database() as url:
        monkeypatch.setenv(URL_ENV, url)
        yield url


@pytest.fixture(scope="session")
def registry(docker_client: Any) -> Iterator[str]:
    """HOST:PORT of Debian's docker-registry on 127.0.0.1 for the session (tests/daemon2.py)."""
    import daemon2

    yield from daemon2.registry()


@pytest.fixture(scope="session")
def dockerd2(tmp_path_factory: pytest.TempPathFactory, registry: str) -> Iterator[Any]:
    """A client of a second, separate Docker daemon with iptables in its own network
    namespace, pulling from ``registry`` (tests/daemon2.py); .host is its DOCKER_HOST."""
    import daemon2

    yield from daemon2.second_daemon(tmp_path_factory.mktemp("dockerd2"), registry)
