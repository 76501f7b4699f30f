"""Shared fixtures, and the markers derived from them (tests/resources.py).

Docker: tests use the ``docker_client`` fixture, which marks them ``docker``. Where no
daemon answers they skip with the reason, except when KAGURA_REQUIRE_DOCKER=1 (CI), where
they fail. ``docker``, ``postgres`` and ``slow`` follow from the fixtures a test uses; one
written by hand that its fixtures do not give fails the test.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import resources
from resources import missing

# A marker written by hand that the test's fixtures do not give it (it would lie to the
# fast tier): the test fails at setup, saying so.
_LYING = pytest.StashKey[list[str]]()


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the xdist_group markers
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        params = dict(getattr(getattr(item, "callspec", None), "params", {}))
        fixtures = set(getattr(item, "fixturenames", ()))
        needed = resources.needs(fixtures, params)
        by_hand = {name for name in resources.MARKERS if item.get_closest_marker(name)}
        item.stash[_LYING] = sorted(by_hand - needed)
        for name in sorted(needed - by_hand):
            item.add_marker(name)
        group = resources.group(fixtures)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
    if getattr(config.option, "loadgroup", False):  # a pytest-xdist worker under loadgroup
        for item in items:
            _name_group(item)


def _name_group(item: pytest.Item) -> None:
    """Suffix the test's id with its xdist group(s), as pytest-xdist's loadgroup scheduler
    reads them: pytest-xdist 3.8 writes the suffix to ``Item._nodeid``, which pytest 9.2's
    structured ids no longer read (pytest-dev/pytest-xdist#1386), so every group was
    silently spread over all workers. Set on the structured id here; where pytest-xdist's
    own renaming works, it adds the same group again and the scheduler reads the last."""
    names = sorted(
        {
            str(m.args[0] if m.args else m.kwargs.get("name", "default"))
            for m in item.iter_markers("xdist_group")
        }
    )
    if not names or "@" in item.nodeid.rpartition("]")[2]:
        return
    if isinstance(getattr(item, "_id", None), str) or not hasattr(item, "_id"):
        return  # an older pytest: pytest-xdist's own renaming works there
    from _pytest.nodeid import NodeId

    item._id = NodeId.parse(f"{item.nodeid}@{'_'.join(names)}")


def pytest_unconfigure(config: pytest.Config) -> None:
    # The fork server (testing/forked.py), if a test used it: ended and reaped here, so
    # its children's CPU time counts in this process's (pytest-xdist's workers end
    # without running atexit handlers).
    import sys

    if "testing.forked" in sys.modules:
        sys.modules["testing.forked"].shutdown()


@pytest.fixture(autouse=True)
def _markers_follow_fixtures(request: pytest.FixtureRequest) -> None:
    lying = request.node.stash.get(_LYING, [])
    if lying:
        pytest.fail(
            f"marked {', '.join(lying)} by hand, but its fixtures do not need it: markers"
            " follow from the fixtures a test uses (tests/resources.py); use the fixture"
            " (docker_client, postgres_server, bench_run, ...) instead of the mark",
            pytrace=False,
        )


@pytest.fixture(scope="session")
def _docker_tripwire() -> Iterator[resources.Tripwire]:
    tripwire = resources.Tripwire()
    yield tripwire
    tripwire.close()


@pytest.fixture(autouse=True)
def _no_docker_unless_marked(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[None]:
    """A test not marked ``docker`` sees DOCKER_HOST on a tripwire: reaching Docker (in
    process or from a subprocess it starts) fails it, instead of passing by luck."""
    if request.node.get_closest_marker("docker") is not None:
        yield
        return
    tripwire = request.getfixturevalue("_docker_tripwire")
    monkeypatch.setenv("DOCKER_HOST", tripwire.url)
    before = tripwire.hits
    yield
    if tripwire.hits != before:
        pytest.fail(
            "this test reached the Docker daemon but does not use the docker_client fixture"
            " (so it is not marked docker, and the fast tier would run it): add the fixture",
            pytrace=False,
        )


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
    resources.refuse_in_fast_tier("Docker")
    client, reason = _docker_or_reason()
    if client is None:
        missing(reason)
    yield client
    client.close()


@pytest.fixture()
def without_docker(monkeypatch: pytest.MonkeyPatch) -> None:
    """The test runs as on a machine without Docker Engine (DOCKER_HOST on a socket that
    does not exist): facts such as image digests are "not there", in every tier."""
    monkeypatch.setenv("DOCKER_HOST", resources.NO_DOCKER)


@pytest.fixture()
def bench_run(tmp_path: Path) -> Callable[..., str]:
    """Runs ``python bench/NAME.py`` once in its quick mode (a slow resource: seconds);
    returns its last line (tests/test_benches.py)."""
    return lambda name, **env: resources.run_bench(name, tmp_path, env)


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

    resources.refuse_in_fast_tier("PostgreSQL")
    yield from postgres.start(os.environ.get("KAGURA_TEST_POSTGRES_URL"))


@pytest.fixture(params=["sqlite", "postgres"])
def state_target(
    request: pytest.FixtureRequest, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Path | str]:
    """The state store a test runs against, once per backend: the SQLite file in the
    test's state directory, or a fresh PostgreSQL database. Either way it is also the
    configured store (``open_store()``, and the ``kagura-agent`` processes a test starts,
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
