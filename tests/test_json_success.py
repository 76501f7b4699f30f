"""``--json`` success output is the envelope too: ``{"ok": true, "errors": [], ...}``.

Every command that takes ``--json`` is either run here on a fresh state directory, or
named in ``ELSEWHERE`` with the test that checks its success output. A new ``--json``
command that is in neither fails ``test_every_json_command_is_covered``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from test_json_output import COMMANDS

from kagura_agent.cli.main import main
from kagura_agent.memory import Source, open_memory

ROOT = Path(__file__).resolve().parents[1]

# Commands whose success output needs a real run or image build; where it is checked.
ELSEWHERE = {
    "apply": "test_apply_e2e.py (result object with ok/errors)",
    "run": "forwards to apply --json; test_cockpit.py reads its result",
    "repl": "forwards each line to apply --json",
    "images build": "test_wheel.py / ci-setup build images; same print_ok as images list",
    "plan": "test_json_output.py::test_plan_json_has_one_shape_for_one_task_and_many",
    "show": "test_json_output.py::test_show_json_is_the_same_object",
    "egress log": "test_egress_lifecycle.py::test_egress_log_cli",
    "images push": "test_images_registry.py (the pushed fixture checks the envelope)",
    "queue list": "test_team_docs.py (needs PostgreSQL)",
    "queue runners": "test_team_docs.py (needs PostgreSQL)",
    "queue cancel": "test_team_docs.py (needs PostgreSQL)",
    "aftercare": "test_apply_setid.py::test_a_root_the_walk_cannot_finish_is_quarantined_until_checked_again",
    "queue follow": "streams one JSON object per event; test_team_runners.py reads them",
    "push": "test_agent_push.py::test_the_branch_is_pushed_with_a_token_leased_for_it_and_released",
    "init": "test_init.py::test_init_never_overwrites_and_leaves_nothing_behind (makes a folder)",
}


def _memory_id() -> str:
    store = open_memory()
    try:
        return store.remember(type="note", summary="a note", source=Source("run", "r1")).id
    finally:
        store.close()


# words -> (extra argv, with {id} a fresh memory's id; keys the body carries)
SUCCESS: dict[str, tuple[list[str], set[str]]] = {
    "validate": (["examples/hello/task.yml"], {"valid"}),
    "doctor": ([], {"checks"}),
    "images list": ([], {"images"}),
    "graduation status": ([], {"version", "knobs", "categories"}),
    "graduation proposals": ([], {"proposals"}),
    "graduation history": ([], {"decisions", "graduation_events"}),
    "memory search": (["note"], {"results"}),
    "memory show": (["{id}"], {"id", "summary", "edges"}),
    "memory forget": (["{id}"], {"forgotten"}),
    "memory trust": (["{id}", "--reason", "checked by hand"], {"memory", "decision"}),
    "memory export": ([], {"memories", "tombstones"}),
    "leases list": ([], {"leases"}),
    "leases sweep": ([], {"sweep"}),
    "incidents": ([], {"incidents"}),
    "egress sweep": ([], {"removed"}),
    "egress pool status": ([], {"sessions"}),
}

NEEDS_DOCKER = {"egress sweep", "doctor"}  # doctor is ready (ok) only with Docker


def test_every_json_command_is_covered() -> None:
    names = {" ".join(words) for words in COMMANDS}
    assert names == set(SUCCESS) | set(ELSEWHERE)


@pytest.mark.usefixtures("without_docker")
@pytest.mark.parametrize("name", sorted(set(SUCCESS) - NEEDS_DOCKER))
def test_success_is_the_envelope(
    name: str, state_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _check_success(name, capsys, monkeypatch)


@pytest.mark.parametrize("name", sorted(NEEDS_DOCKER))
def test_success_is_the_envelope_with_docker(
    name: str,
    state_dir: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    docker_client: Any,
) -> None:
    _check_success(name, capsys, monkeypatch)


def _check_success(
    name: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)
    extra, keys = SUCCESS[name]
    fill: Callable[[str], str] = str
    if any("{id}" in word for word in extra):
        memory_id = _memory_id()
        fill = lambda word: word.replace("{id}", memory_id)  # noqa: E731
    code = main([*name.split(), *map(fill, extra), "--json"])
    out, err = capsys.readouterr()
    data = json.loads(out)
    assert data["ok"] is True, err
    assert data["errors"] == []
    assert keys <= set(data), sorted(data)
    if name != "doctor":  # doctor's exit code reports readiness; its envelope is checked above
        assert code == 0, err
