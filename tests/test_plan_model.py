"""The typed plan (plan/model.py): every golden plan has the model's shape, and a saved plan
with a valid fingerprint but a broken shape is a located error (exit 2) in ``show``,
``apply`` and ``plan --against`` — never a KeyError or a traceback.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from apply_helpers import make_project, manifest_set, run_ids, write_task

from kagura_agent.cli.main import main
from kagura_agent.plan.fields import DESCRIPTIONS
from kagura_agent.plan.model import Plan, ShapeError, check_shape, rows
from kagura_agent.plan.planner import fingerprint

GOLDEN = Path(__file__).parent / "plans"
HELLO = {"steps": ["echo hi > out.txt"], "verify": ["test -f out.txt"]}


@pytest.mark.parametrize("case", sorted(p.parent.name for p in GOLDEN.glob("*/expected.json")))
def test_every_golden_plan_has_the_model_shape(case: str) -> None:
    check_shape(json.loads((GOLDEN / case / "expected.json").read_text()), Plan)


def test_every_field_is_described() -> None:
    paths = [path for path, _, _ in rows()]
    assert [p for p in paths if p not in DESCRIPTIONS] == []
    assert [p for p in DESCRIPTIONS if p not in paths] == []


def _drop_tmpfs(plan: dict[str, Any]) -> None:
    del plan["hardening"]["tmpfs"]


def _bad_class(plan: dict[str, Any]) -> None:
    plan["approvals"][0]["class"] = "trusted"


def _string_limit(plan: dict[str, Any]) -> None:
    plan["hardening"]["pids_limit"] = "256"


def _unknown_key(plan: dict[str, Any]) -> None:
    plan["egress"]["bypass"] = True


def _section_not_object(plan: dict[str, Any]) -> None:
    plan["brain"] = ["script"]


MALFORMED: list[tuple[Callable[[dict[str, Any]], None], str]] = [
    (_drop_tmpfs, "$.hardening  malformed plan: missing key 'tmpfs'"),
    (_bad_class, "$.approvals[0].class  malformed plan: must be one of"),
    (_string_limit, "$.hardening.pids_limit  malformed plan: must be integer, not string"),
    (_unknown_key, "$.egress  malformed plan: unknown key 'bypass'"),
    (_section_not_object, "$.brain  malformed plan: must be an object, not a list"),
]


def _malformed_saved_plan(tmp_path: Path, damage: Callable[[dict[str, Any]], None]) -> Path:
    manifests = manifest_set(tmp_path)
    project = make_project(tmp_path)
    task = write_task(project, "shape", HELLO)
    out = tmp_path / "plan.json"
    assert main(["plan", "--manifests", str(manifests), "-o", str(out), str(task)]) == 0
    plan = json.loads(out.read_text())
    damage(plan)
    plan["fingerprint"] = fingerprint(plan)  # a consistent fingerprint: only the shape is off
    out.write_text(json.dumps(plan, indent=2))
    return out


@pytest.mark.parametrize(("damage", "message"), MALFORMED, ids=lambda v: getattr(v, "__name__", ""))
@pytest.mark.parametrize("command", ["show", "apply", "against"])
@pytest.mark.usefixtures("without_docker")
def test_a_malformed_saved_plan_is_a_located_error(
    command: str,
    damage: Callable[[dict[str, Any]], None],
    message: str,
    tmp_path: Path,
    state_dir: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    saved = _malformed_saved_plan(tmp_path, damage)
    capsys.readouterr()
    if command == "against":
        task = tmp_path / "project" / "task.yml"
        argv = ["plan", "--manifests", str(tmp_path / "manifests"), str(task)]
        argv += ["--against", str(saved)]
    else:
        argv = [command, str(saved)]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert f"{saved}  {message}" in err, err
    assert "Traceback" not in err + out and "KeyError" not in err + out
    assert run_ids(state_dir) == []


def test_shape_errors_name_the_deepest_place() -> None:
    plan = json.loads((GOLDEN / "cost-history" / "expected.json").read_text())
    plan["budget"]["forecast"]["expected"]["wall_seconds"] = "slow"
    with pytest.raises(ShapeError) as caught:
        check_shape(plan, Plan)
    assert caught.value.path == "$.budget.forecast.expected.wall_seconds"
    assert caught.value.message.startswith("must be"), caught.value.message
