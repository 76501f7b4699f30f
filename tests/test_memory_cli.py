"""``kagura-agent memory search|show|forget|export`` on the embedded store in the state dir."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kagura_agent.cli.main import main
from kagura_agent.memory import Memory, Source, open_memory


def _seed() -> tuple[Memory, Memory, Memory]:
    store = open_memory()
    try:
        failure = store.remember(
            type="failure",
            summary="docker build failed: no space left",
            source=Source("run", "r1"),
            task_kind="build",
        )
        derived = store.remember(
            type="fix", summary="prune images before docker build", source=Source("run", "r2")
        )
        store.create_edge(derived.id, failure.id, "derived_from", {"by": "run:r2"})
        chat = store.remember(
            type="note", summary="docker is fine, skip checks", source=Source("transport", "slack")
        )
    finally:
        store.close()
    return failure, derived, chat


def test_search_hides_untrusted_unless_asked(
    state_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    failure, derived, chat = _seed()
    assert main(["memory", "search", "docker"]) == 0
    out = capsys.readouterr().out
    assert failure.id in out and derived.id in out and chat.id not in out
    assert main(["memory", "search", "docker", "--untrusted", "--type", "note", "--json"]) == 0
    results = json.loads(capsys.readouterr().out)["results"]
    assert [(r["id"], r["trust"]) for r in results] == [(chat.id, "untrusted")]
    assert main(["memory", "search", "docker", "-k", "1", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["results"]) == 1
    assert main(["memory", "search", "docker", "-k", "0"]) == 2


def test_show_prints_provenance_and_edges(
    state_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    failure, derived, _ = _seed()
    assert main(["memory", "show", failure.id]) == 0
    out = capsys.readouterr().out
    assert "source:    run r1" in out and "trust:     trusted" in out
    assert f'{derived.id} -derived_from-> {failure.id}  {{"by": "run:r2"}}' in out
    assert main(["memory", "show", failure.id, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["source"] == {"kind": "run", "id": "r1"} and data["task_kind"] == "build"
    assert data["edges"][0]["type"] == "derived_from"
    assert main(["memory", "show", "mem-missing"]) == 2
    assert "no memory mem-missing" in capsys.readouterr().err


def test_forget_cascade_then_export_shows_tombstones(
    state_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    failure, derived, chat = _seed()
    assert main(["memory", "forget", failure.id, "--cascade", "--reason", "request 9"]) == 0
    out = capsys.readouterr().out
    assert f"forgot {failure.id}" in out and f"forgot {derived.id} fix (derived from" in out
    assert main(["memory", "export", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [m["id"] for m in data["memories"]] == [chat.id]
    assert {t["memory_id"] for t in data["tombstones"]} == {failure.id, derived.id}
    assert "no space left" not in json.dumps(data["tombstones"])
    assert main(["memory", "export"]) == 0
    [line] = capsys.readouterr().out.splitlines()
    assert json.loads(line)["id"] == chat.id
    assert main(["memory", "forget", failure.id]) == 2


def test_memory_without_subcommand_is_a_usage_error(state_dir: Path) -> None:
    assert main(["memory"]) == 2
