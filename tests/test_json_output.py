"""``--json`` is machine-readable on success and on failure, for every command.

Failure is always the envelope ``{"ok": false, "exit_code": N, "errors": [{file, line,
col, path, message, hint, severity}]}`` on stdout (the human message still goes to
stderr); ``plan --json`` and ``show --json`` are always one object with a ``plans`` list,
each entry carrying its diff.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from kagura_agent.cli.main import build_parser, main

ROOT = Path(__file__).resolve().parents[1]
ERROR_KEYS = {"file", "line", "col", "path", "message", "hint", "severity"}


def _json_commands() -> list[list[str]]:
    """Every (sub)command that takes --json, as the words that name it."""
    found: list[list[str]] = []

    def walk(parser: argparse.ArgumentParser, words: list[str]) -> None:
        if any("--json" in action.option_strings for action in parser._actions):
            found.append(words)
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, [*words, name])

    walk(build_parser(), [])
    return found


COMMANDS = _json_commands()


def _envelope(out: str, code: int) -> dict[str, object]:
    data = json.loads(out)
    assert data["ok"] is False and data["exit_code"] == code
    assert data["errors"] and all(set(e) == ERROR_KEYS for e in data["errors"])
    return data


def test_the_json_commands_are_found() -> None:
    names = {" ".join(words) for words in COMMANDS}
    assert {"validate", "plan", "show", "apply", "doctor", "images list", "leases list"} <= names


@pytest.mark.parametrize("words", COMMANDS, ids=[" ".join(w) for w in COMMANDS])
def test_a_usage_mistake_under_json_is_the_envelope(
    words: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    code = main([*words, "--json", "--no-such-option"])
    out, err = capsys.readouterr()
    assert code == 2
    data = _envelope(out, 2)
    assert data["errors"][0]["hint"].startswith("usage: kagura-agent")  # type: ignore[index]
    assert "error:" in err


@pytest.mark.parametrize(
    ("argv", "code", "message"),
    [
        (["validate", "--json", "no-such.yml"], 2, "does not exist"),
        (["plan", "--json", "no-such.yml"], 2, "does not exist"),
        (["show", "--json", "no-such-plan.json"], 2, "no-such-plan.json"),
        (["apply", "--json", "--yes", "no-such.yml"], 2, "does not exist"),
    ],
)
def test_a_failure_under_json_is_the_envelope(
    argv: list[str],
    code: int,
    message: str,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KAGURA_AGENT_STATE_DIR", str(tmp_path / "state"))
    assert main(argv) == code
    data = _envelope(capsys.readouterr().out, code)
    assert message in str(data["errors"])


def test_validation_errors_are_located_in_the_envelope(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "task.yml").write_text(
        "apiVersion: kagura.dev/v1\nkind: Task\nmetadata: {name: t}\n"
        "spec:\n  steps: [echo hi]\n  egres: [pypi]\n"
    )
    assert main(["plan", "--json", "task.yml"]) == 2
    data = _envelope(capsys.readouterr().out, 2)
    [first] = data["errors"]  # type: ignore[misc]
    assert (first["file"], first["line"], first["col"]) == ("task.yml", 6, 3)
    assert first["path"] == "$.spec.egres" and "unknown key" in first["message"]


def _plan_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, object]:
    code = main(["plan", "--json", *argv])
    data: dict[str, object] = json.loads(capsys.readouterr().out)
    # Exit 6 when a plan is not applyable (a root-owned checkout), the JSON printed alike.
    refused = not all(e["admission"]["applyable"] for e in data["plans"])  # type: ignore[attr-defined]
    assert code == (6 if refused else 0)
    return data


@pytest.mark.usefixtures("without_docker")
def test_plan_json_has_one_shape_for_one_task_and_many(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("KAGURA_AGENT_STATE_DIR", str(tmp_path / "state"))
    one = _plan_json(capsys, "examples/hello/task.yml")
    many = _plan_json(capsys, "examples/hello/task.yml", "examples/templated/task.yml")
    for data in (one, many):
        assert set(data) == {"ok", "version", "errors", "changed", "plans"}
        assert data["ok"] is True and data["errors"] == [] and data["version"] == 1
        for entry in data["plans"]:  # type: ignore[attr-defined]
            assert set(entry) == {"task", "plan", "admission", "against", "changes"}
            assert entry["plan"]["task"]["name"] == entry["task"]
            assert entry["admission"]["applyable"] is entry["plan"]["applyable"]
            assert entry["against"] == "the last applied plan"
            # Nothing applied yet: the diff lists everything the plan grants.
            brain = {"op": "+", "section": "brain", "text": "engine script", "widens": False}
            assert brain in entry["changes"] or entry["task"] != "hello"
    assert len(one["plans"]) == 1 and len(many["plans"]) > 1  # type: ignore[arg-type]
    assert one["changed"] is True


@pytest.mark.usefixtures("without_docker")
def test_show_json_is_the_same_object(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("KAGURA_AGENT_STATE_DIR", str(tmp_path / "state"))
    saved = tmp_path / "plan.json"
    assert main(["plan", "examples/hello/task.yml", "--allow-unapplyable", "-o", str(saved)]) == 0
    capsys.readouterr()
    assert main(["show", "--json", str(saved)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["ok"] is True and data["changed"] is False
    [entry] = data["plans"]
    assert entry["against"] is None and entry["changes"] == []
    assert entry["plan"] == json.loads(saved.read_text())
