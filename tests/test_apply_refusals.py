"""Saved plans: a fresh one applies; a stale one and a hand-edited one are refused (exit 6).

Refusals happen before any side effect, so they run without Docker; the fresh plan's
apply is the positive control and needs the daemon. Also: ``run -`` with an empty task.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from apply_helpers import cli_env, kagura, make_project, manifest_set, run_ids, write_task

from kagura_agent.cli.main import main

HELLO = {
    "steps": ['echo "hello from $(id -u)" > hello.txt'],
    "verify": ["grep -q 'hello from 1000' hello.txt"],
}


def _saved_plan(tmp_path: Path, manifests: Path) -> tuple[Path, Path]:
    project = make_project(tmp_path)
    task = write_task(project, "saved", HELLO)
    out = tmp_path / "plan.json"
    assert main(["plan", "--manifests", str(manifests), "-o", str(out), str(task)]) == 0
    return task, out


@pytest.mark.usefixtures("without_docker")
def test_a_stale_saved_plan_names_the_changed_task(
    tmp_path: Path, state_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manifests = manifest_set(tmp_path)
    task, saved = _saved_plan(tmp_path, manifests)
    task.write_text(task.read_text().replace("hello from", "hi from"))
    capsys.readouterr()
    assert main(["apply", "--manifests", str(manifests), str(saved)]) == 6
    err = capsys.readouterr().err
    assert "saved plan is stale" in err and f"{task} changed" in err, err
    assert run_ids(state_dir) == []  # refused before anything ran


@pytest.mark.usefixtures("without_docker")
def test_a_stale_saved_plan_names_the_changed_manifest(
    tmp_path: Path, state_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manifests = manifest_set(tmp_path)
    _task, saved = _saved_plan(tmp_path, manifests)
    brains = manifests / "brains.yml"
    brains.write_text(brains.read_text().replace("turns: 50", "turns: 49"))
    capsys.readouterr()
    assert main(["apply", str(saved)]) == 6
    err = capsys.readouterr().err
    assert "saved plan is stale" in err and "brains.yml changed" in err, err
    assert run_ids(state_dir) == []


@pytest.mark.usefixtures("without_docker")
def test_a_plan_changed_by_hand_is_refused(
    tmp_path: Path, state_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manifests = manifest_set(tmp_path)
    _task, saved = _saved_plan(tmp_path, manifests)
    plan = json.loads(saved.read_text())
    plan["hardening"]["pids_limit"] = 100000  # loosen a limit, keep the old fingerprint
    saved.write_text(json.dumps(plan, indent=2))
    capsys.readouterr()
    assert main(["apply", str(saved)]) == 6
    err = capsys.readouterr().err
    assert "fingerprint mismatch" in err, err
    assert run_ids(state_dir) == []


def test_a_fresh_saved_plan_applies_exactly(
    docker_client: Any, tmp_path: Path, state_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manifests = manifest_set(tmp_path)
    task, saved = _saved_plan(tmp_path, manifests)
    fingerprint = json.loads(saved.read_text())["fingerprint"]
    capsys.readouterr()
    assert main(["apply", "--json", str(saved)]) == 0, capsys.readouterr().err
    result = json.loads(capsys.readouterr().out)
    assert result["outcome"] == "success"
    assert (task.parent / "hello.txt").read_text() == "hello from 1000\n"
    [run_id] = run_ids(state_dir)
    assert result["run_id"] == run_id
    # The last applied plan is kept for the next diff, and it is the one we saved.
    from kagura_agent.plan.history import last_applied

    applied = last_applied("saved")
    assert applied is not None and applied["fingerprint"] == fingerprint


@pytest.mark.parametrize("stdin", ["", "  \n\t\n"])
def test_run_with_an_empty_task_on_stdin_is_a_usage_error(
    tmp_path: Path, state_dir: Path, stdin: str
) -> None:
    done = kagura(["run", "--yes", "-"], cli_env(state_dir), stdin=stdin, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "task must not be empty" in done.stderr


@pytest.mark.usefixtures("without_docker")
def test_a_saved_plan_is_fresh_from_another_working_directory(
    tmp_path: Path, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Input files are named relative to where plan ran; apply re-plans from there."""
    from kagura_agent.apply.run.freshness import check_saved_plan_fresh
    from kagura_agent.plan import planfile

    project = make_project(tmp_path)
    write_task(project, "elsewhere", HELLO)
    monkeypatch.chdir(project)
    saved = tmp_path / "plan.json"
    assert main(["plan", "task.yml", "-o", str(saved)]) == 0
    plan = planfile.load(saved)
    assert plan["task"]["file"] == "task.yml"
    for where in (tmp_path, Path("/")):
        monkeypatch.chdir(where)
        check_saved_plan_fresh(plan)  # no RefusedError


@pytest.mark.usefixtures("without_docker")
def test_a_plan_made_beside_the_packaged_manifests_is_fresh(
    tmp_path: Path, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Planned in the checkout with no --manifests (./manifests is the packaged set):
    apply re-plans with the absolute manifests_dir and must see the same inputs."""
    from kagura_agent.apply.run.freshness import check_saved_plan_fresh
    from kagura_agent.plan import planfile

    checkout = Path(__file__).resolve().parents[1]
    monkeypatch.chdir(checkout)
    monkeypatch.delenv("KAGURA_AGENT_MANIFESTS", raising=False)
    saved = tmp_path / "plan.json"
    assert main(["plan", "--allow-unapplyable", "examples/hello/task.yml", "-o", str(saved)]) == 0
    plan = planfile.load(saved)
    assert plan["inputs"]["layers"] == [{"layer": "packaged", "dir": "manifests"}]
    for where in (checkout, Path("/")):
        monkeypatch.chdir(where)
        check_saved_plan_fresh(plan)  # no RefusedError


def test_a_fact_alone_is_shown_and_a_changed_intent_is_stale() -> None:
    from kagura_agent.apply.run.freshness import check_fresh
    from kagura_agent.errors import RefusedError
    from kagura_agent.plan.intent import intent_fingerprint
    from kagura_agent.plan.planner import fingerprint

    saved = json.loads((Path(__file__).parent / "plans/hello-script/expected.json").read_text())
    saved["intent"] = intent_fingerprint(saved)
    saved["fingerprint"] = fingerprint(saved)
    # Another host's graduation state: a fact that changes no capability is only shown.
    facts_changed = json.loads(json.dumps(saved))
    facts_changed["inputs"]["facts"]["graduation_version"] = 99
    facts_changed["fingerprint"] = fingerprint(facts_changed)
    (change,) = check_fresh(saved, facts_changed)
    assert (change.render(), change.capability) == ("graduation version: 0 → 99", False)
    # The same fact moving a class is a capability: refused, naming it.
    class_changed = json.loads(json.dumps(facts_changed))
    class_changed["approvals"][0]["class"] = "needs-approval"
    class_changed["fingerprint"] = fingerprint(class_changed)
    with pytest.raises(RefusedError, match="class of image:agent: baseline → needs-approval"):
        check_fresh(saved, class_changed)
    # Output the operator approves (the intent) differs: stale, naming the section.
    output_changed = json.loads(json.dumps(saved))
    output_changed["hardening"]["pids_limit"] = 128
    output_changed["budget"]["turns"] = 7
    output_changed["fingerprint"] = fingerprint(output_changed)
    with pytest.raises(RefusedError, match="stale: the compiled plan differs in hardening"):
        check_fresh(saved, output_changed)
