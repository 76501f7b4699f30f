"""The state backend chosen by the operator's State manifest (manifest/statebackend.py).

Every command that opens the store resolves the same one: with no manifest folder given,
the operator's default folder (here ./manifests of the working directory); with
``--manifests DIR``, DIR's — and so do the processes it starts. ``KAGURA_AGENT_STATE_URL``
overrides it. A broken choice is a located error with its exit code, never a traceback,
and never shows the password."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from apply_helpers import REPO, make_project, write_task

from kagura_agent.state import StateStore
from testing import forked

STATE = (
    "apiVersion: kagura.dev/v1\nkind: State\nmetadata: {name: team}\n"
    "spec:\n  backend: postgres\n  url: env:KAGURA_TEAM_DB\n"
)


def _env(state_dir: Path, **extra: str) -> dict[str, str]:
    env = {**os.environ, "KAGURA_AGENT_STATE_DIR": str(state_dir), "NO_COLOR": "1"}
    for name in ("KAGURA_AGENT_STATE_URL", "KAGURA_AGENT_QUEUE_URL", "KAGURA_AGENT_MANIFESTS"):
        env.pop(name, None)
    return {**env, **extra}


def _run(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return forked.run(args, cwd=cwd, env=env, timeout=300).text()


def _components(url: str) -> set[str]:
    with StateStore(url) as store:
        try:
            rows = store.conn.execute("SELECT component FROM schema_versions").fetchall()
        except Exception:  # no schema_versions: nothing was ever written there
            return set()
    return {row[0] for row in rows}


@pytest.fixture()
def folder(tmp_path: Path) -> Path:
    """A host's working directory whose ./manifests holds the State manifest."""
    host = tmp_path / "host"
    (host / "manifests").mkdir(parents=True)
    (host / "manifests" / "state.yml").write_text(STATE)
    return host


def test_commands_without_manifests_read_the_default_folders_state(
    folder: Path, state_dir: Path, postgres_server: Any
) -> None:
    with postgres_server.fresh_database() as url:
        env = _env(state_dir, KAGURA_TEAM_DB=url)
        for args in (
            ["leases", "list", "--json"],
            ["leases", "sweep", "--json"],
            ["graduation", "status", "--json"],
            ["queue", "list", "--json"],
        ):
            done = _run(args, env, folder)
            assert done.returncode == 0, (args, done.stderr)
        assert {"leases", "graduation", "team"} <= _components(url)
        assert not (state_dir / "state.db").exists()


def test_apply_with_manifests_and_its_children_use_that_folders_state(
    folder: Path, tmp_path: Path, state_dir: Path, postgres_server: Any, docker_client: Any
) -> None:
    """``apply --manifests DIR`` from elsewhere: the run's record is in DIR's database,
    and ``leases list --manifests``-less commands find it through KAGURA_AGENT_MANIFESTS."""
    import shutil

    shutil.copytree(REPO / "manifests", folder / "ops")
    shutil.copy(folder / "manifests" / "state.yml", folder / "ops" / "state.yml")
    project = make_project(tmp_path)
    task = write_task(project, "stated", {"steps": ["echo hi > hi.txt"]})
    with postgres_server.fresh_database() as url:
        env = _env(state_dir, KAGURA_TEAM_DB=url)
        done = _run(
            ["apply", "--yes", "--manifests", str(folder / "ops"), str(task)], env, tmp_path
        )
        assert done.returncode == 0, done.stderr
        with StateStore(url) as store:
            rows = store.conn.execute("SELECT task, exit_code FROM runs").fetchall()
        assert [(r[0], r[1]) for r in rows] == [("stated", 0)]
        assert not (state_dir / "state.db").exists()
        listed = _run(
            ["leases", "list", "--all", "--json"],
            {**env, "KAGURA_AGENT_MANIFESTS": str(folder / "ops")},
            tmp_path,
        )
        assert listed.returncode == 0, listed.stderr
        assert not (state_dir / "state.db").exists()


def test_the_environment_overrides_the_manifest(
    folder: Path, state_dir: Path, postgres_server: Any
) -> None:
    with postgres_server.fresh_database() as named, postgres_server.fresh_database() as chosen:
        env = _env(state_dir, KAGURA_TEAM_DB=named, KAGURA_AGENT_STATE_URL=chosen)
        done = _run(["leases", "list", "--json"], env, folder)
        assert done.returncode == 0, done.stderr
        assert "leases" in _components(chosen)
        assert _components(named) == set()


@pytest.mark.parametrize(
    ("manifest", "value", "code", "said"),
    [
        (STATE, None, 2, "manifests/state.yml:6:8  $.spec.url  State team: env:KAGURA_TEAM_DB"
         " does not resolve"),
        (STATE, "sqlite:///tmp/x.db", 2, "manifests/state.yml:6:8  $.spec.url  State team:"
         " env:KAGURA_TEAM_DB holds no postgresql:// URL"),
        (STATE + "---\n" + STATE.replace("name: team", "name: other"), "postgresql://x@h/d", 2,
         "manifests/state.yml:9:7  $.kind  more than one State manifest"),
        (STATE, "postgresql://nobody:hunter2@127.0.0.1:1/none", 3,
         "cannot reach the state store postgresql://nobody:***@127.0.0.1:1/none"),
        (STATE.replace("env:KAGURA_TEAM_DB", "postgresql://nobody:hunter2@127.0.0.1:1/none"),
         None, 2, "$.spec.url  'postgresql://nobody:***@127.0.0.1:1/none' is not valid here"),
    ],
    ids=["unset", "not-postgres", "two", "unreachable", "inline"],
)  # fmt: skip
def test_a_broken_choice_is_a_located_error(
    folder: Path, state_dir: Path, manifest: str, value: str | None, code: int, said: str
) -> None:
    (folder / "manifests" / "state.yml").write_text(manifest)
    env = _env(state_dir, **({"KAGURA_TEAM_DB": value} if value else {}))
    env.pop("KAGURA_TEAM_DB", None) if value is None else None
    done = _run(["leases", "list"], env, folder)
    assert done.returncode == code, done.stderr
    assert said in done.stderr, done.stderr
    if code == 3:
        assert "(chosen by State team (manifests/state.yml:2))" in done.stderr
    assert "Traceback" not in done.stderr and "hunter2" not in done.stderr + done.stdout
    assert not (state_dir / "state.db").exists()  # never a silent fall-back to the file


def test_the_postgres_memory_backend_uses_the_state_manifests_database(
    folder: Path, tmp_path: Path, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kagura_agent.errors import SetupError
    from kagura_agent.memory.factory import postgres_url

    for name in ("KAGURA_AGENT_STATE_URL", "KAGURA_AGENT_MANIFESTS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("KAGURA_TEAM_DB", "postgresql://kagura@db.internal:5432/team")
    monkeypatch.chdir(folder)
    assert postgres_url() == "postgresql://kagura@db.internal:5432/team"
    monkeypatch.chdir(tmp_path)  # no ./manifests here: the embedded store
    with pytest.raises(SetupError) as err:
        postgres_url()
    assert "State manifest" in err.value.hint
