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
