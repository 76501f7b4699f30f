"""One reading of the Graduation kind (graduation/settings.py): the operator's document
merges key by key over the packaged one, every reader sees the same settings, and two
documents of the operator's own are a located error."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from apply_helpers import cli_env, kagura, make_project, manifest_set, write_task

from kagura_agent.graduation.settings import graduation_settings
from kagura_agent.manifest.workspace import load_workspace

PACKAGE = Path(__file__).resolve().parents[1] / "kagura_agent"
HOUSE: dict[str, Any] = {
    "kind": "Graduation",
    "metadata": {"name": "house-rules"},
    "spec": {
        "min_successes": 2,
        "failure_half_life": "3d",
        "tripwires": {"denied_egress": 4, "window": "30s"},
    },
}


def _operator_folder(base: Path, *documents: dict[str, Any]) -> Path:
    """An operator's folder holding only ``documents``; the packaged set lies beneath."""
    folder = base / "manifests"
    folder.mkdir(parents=True)
    text = yaml.safe_dump_all(
        [{"apiVersion": "kagura.dev/v1", **doc} for doc in documents], sort_keys=False
    )
    (folder / "graduation.yml").write_text(text)
    return folder


@pytest.mark.usefixtures("without_docker")
def test_an_operator_graduation_beside_the_packaged_one_sets_every_knob_it_names(
    tmp_path: Path, state_dir: Path
) -> None:
    """The repro: the tripwires of an operator's Graduation took effect (last document
    won) while its min_successes silently stayed at the packaged 5 (first document won)."""
    manifests = _operator_folder(tmp_path, HOUSE)
    env = cli_env(state_dir)
    status = kagura(["graduation", "status", "--json", "--manifests", str(manifests)], env)
    assert status.returncode == 0, status.stderr
    knobs = json.loads(status.stdout)["knobs"]
    assert knobs["min_successes"] == 2, knobs  # main: 5, the packaged value
    # What the operator's document does not set keeps the packaged value.
    assert (knobs["min_distinct_tasks"], knobs["cooldown"]) == (3, "7d")

    task = write_task(make_project(tmp_path), "t", {"steps": ["true"]})
    planned = kagura(["plan", "--json", "--manifests", str(manifests), str(task)], env)
    assert planned.returncode == 0, planned.stderr
    plan = json.loads(planned.stdout)["plans"][0]["plan"]
    tripwires = plan["tripwires"]
    assert (tripwires["denied_egress"], tripwires["window_seconds"]) == (4, 30)
    assert tripwires["source"] == "house-rules"
    assert plan["memory"]["failure_trust"]["half_life_seconds"] == 3 * 86400


def test_every_reader_sees_one_merge(tmp_path: Path) -> None:
    """The settings, field by field: the operator's keys, else the packaged ones."""
    catalog = load_workspace(str(_operator_folder(tmp_path, HOUSE)), []).catalog
    settings = graduation_settings(catalog)
    assert settings.knobs.min_successes == 2
    assert settings.knobs.min_distinct_tasks == 3
    assert settings.failure_half_life == 3 * 86400
    assert settings.tripwires["denied_egress"] == 4
    assert settings.tripwires["egress_log_bytes"] > 0  # unset: the default ceiling
    assert settings.budget.reserve == 0.3  # the packaged document's reserve


def test_an_identical_copy_of_the_packaged_document_is_the_packaged_one(tmp_path: Path) -> None:
    """A folder made from a copy of the packaged set (graduation.yml, ``default``) plus the
    operator's own Graduation: one document of the operator's, merged over the copy."""
    catalog = load_workspace(str(manifest_set(tmp_path, HOUSE)), []).catalog
    assert graduation_settings(catalog).knobs.min_successes == 2
    assert graduation_settings(catalog).tripwires["source"] == "house-rules"


@pytest.mark.usefixtures("without_docker")
def test_two_graduation_documents_of_the_operators_are_a_located_error(
    tmp_path: Path, state_dir: Path
) -> None:
    other = {"kind": "Graduation", "metadata": {"name": "stricter"}, "spec": {"min_successes": 9}}
    manifests = _operator_folder(tmp_path, HOUSE, other)
    done = kagura(["validate", "--manifests", str(manifests)], cli_env(state_dir))
    assert done.returncode == 2, done.stdout + done.stderr
    shown = done.stdout + done.stderr
    assert f"{manifests / 'graduation.yml'}:" in shown
    assert "more than one Graduation manifest" in shown
    assert "house-rules" in shown  # the hint names the first one


def test_the_graduation_kind_is_read_in_one_place() -> None:
    """No module but the reader looks the kind up in a catalog."""
    readers = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("of", "get", "default", "names")
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and node.args[0].value == "Graduation"
            ):
                readers.add(str(path.relative_to(PACKAGE)))
    assert readers == set()  # the reader itself names the kind through settings.KIND
