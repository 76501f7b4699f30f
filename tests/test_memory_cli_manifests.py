"""``kagura-agent memory`` opens the store the plan would: the manifest set's default
Memory manifest (``--manifests``), or the one ``--memory NAME`` names."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from kagura_agent.cli.main import main
from kagura_agent.memory import Source, open_memory
from kagura_agent.paths import repo_root
from kagura_agent.state import URL_ENV
from testing.fake_memory_cloud import FakeMemoryCloud

TOKEN = "fake-memory-token"


def _manifests(tmp_path: Path, memory_yml: str) -> Path:
    root = repo_root()
    assert root is not None
    folder = tmp_path / "manifests"
    shutil.copytree(root / "manifests", folder)
    (folder / "memory.yml").write_text(memory_yml, encoding="utf-8")
    return folder


def _memory_doc(name: str, spec: str, default: bool) -> str:
    return (
        f"apiVersion: kagura.dev/v1\nkind: Memory\nmetadata: {{name: {name}}}\n"
        f"spec:\n  default: {str(default).lower()}\n{spec}"
    )


def test_default_memory_manifest_chooses_the_sqlite_file(
    tmp_path: Path, state_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    chosen = tmp_path / "team-memory.db"
    manifests = _manifests(
        tmp_path,
        _memory_doc("team", f"  backend: sqlite\n  path: {chosen}\n", True)
        + "---\n"
        + _memory_doc("embedded", "  backend: sqlite\n", False),
    )
    store = open_memory({"backend": "sqlite", "location": str(chosen)})
    team = store.remember(type="note", summary="team runbook lives here", source=Source("run", "r"))
    store.close()
    store = open_memory()  # the state directory's store, which the manifest did not choose
    local = store.remember(type="note", summary="runbook of one machine", source=Source("run", "r"))
    store.close()

    assert main(["memory", "search", "runbook", "--manifests", str(manifests), "--json"]) == 0
    found = [r["id"] for r in json.loads(capsys.readouterr().out)["results"]]
    assert found == [team.id]
    args = ["memory", "search", "runbook", "--manifests", str(manifests), "--memory", "embedded"]
    assert main([*args, "--json"]) == 0
    assert [r["id"] for r in json.loads(capsys.readouterr().out)["results"]] == [local.id]
    assert main(["memory", "show", team.id, "--manifests", str(manifests)]) == 0
    assert "team runbook" in capsys.readouterr().out
    assert main(["memory", "export", "--manifests", str(manifests), "--memory", "nope"]) == 2
    assert "unknown Memory 'nope'" in capsys.readouterr().err


def test_cloud_memory_manifest_is_used_with_its_token_reference(
    tmp_path: Path,
    state_dir: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KAGURA_TEST_MEMORY_TOKEN", TOKEN)
    with FakeMemoryCloud(token=TOKEN) as cloud:
        spec = (
            f"  backend: cloud\n  url: {cloud.mcp_url}\n  token: env:KAGURA_TEST_MEMORY_TOKEN\n"
            "  endpoint_addresses: [127.0.0.1/32]\n"  # the fake's loopback, declared
        )
        manifests = _manifests(tmp_path, _memory_doc("cloud", spec, True))
        store = open_memory({"backend": "cloud", "location": cloud.mcp_url}, token=TOKEN)
        stored = store.remember(
            type="note", summary="cloud remembers the deploy", source=Source("run", "r")
        )
        store.close()
        assert main(["memory", "show", stored.id, "--manifests", str(manifests), "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["summary"] == "cloud remembers the deploy"
    assert not (state_dir / "memory.db").exists()  # the embedded store was never opened


@pytest.mark.usefixtures("without_docker")
def test_postgres_memory_manifest_uses_the_team_state_database(
    tmp_path: Path,
    state_dir: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    postgres_server: Any,
) -> None:
    manifests = _manifests(
        tmp_path,
        _memory_doc("team", "  backend: postgres\n", True)
        + "---\n"
        + _memory_doc("embedded", "  backend: sqlite\n", False),
    )
    with postgres_server.fresh_database() as url:
        monkeypatch.setenv(URL_ENV, url)
        store = open_memory({"backend": "postgres", "location": "state-store"})
        team = store.remember(type="note", summary="team runbook", source=Source("run", "r"))
        store.close()
        assert main(["memory", "search", "runbook", "--manifests", str(manifests), "--json"]) == 0
        found = [r["id"] for r in json.loads(capsys.readouterr().out)["results"]]
        assert found == [team.id]
        assert not (state_dir / "memory.db").exists()  # nothing went to the embedded file
        # plan reads it too (read-only): a task's context memory that came from chat is
        # an untrusted input of the plan, as with the embedded store.
        told = Source("transport", "slack:C1")
        store = open_memory({"backend": "postgres", "location": "state-store"})
        chat = store.remember(type="note", summary="chat said so", source=told)
        store.close()
        (tmp_path / "project").mkdir()
        task = tmp_path / "project" / "task.yml"
        task.write_text(
            "apiVersion: kagura.dev/v1\nkind: Task\nmetadata: {name: hello}\nspec:\n"
            f"  steps: [echo hi]\n  context: {{memories: [{chat.id}]}}\n",
            encoding="utf-8",
        )
        argv = [str(task), "--manifests", str(manifests), "--json", "--allow-unapplyable"]
        assert main(["plan", *argv]) == 0
        plan = json.loads(capsys.readouterr().out)["plans"][0]["plan"]
        assert plan["memory"]["backend"] == "postgres"
        assert f"memory:{chat.id}" in plan["memory"]["untrusted_inputs"]
        monkeypatch.delenv(URL_ENV)
        assert main(["memory", "search", "runbook", "--manifests", str(manifests)]) == 3
        err = capsys.readouterr().err
        assert "the state store is the embedded SQLite file" in err and URL_ENV in err
