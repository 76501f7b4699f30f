"""Plans that travel: the intent the operator approves is apart from the facts a host measures.

A plan made with one state directory (another host's graduation state, memory, Docker
daemon) applies with another when its facts satisfy the plan; a fact that changes a
capability refuses (exit 6); hand edits are refused whichever part they touch.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from apply_helpers import cli_env, kagura, make_project, manifest_set, run_ids, write_task

from kagura_agent.apply.run.freshness import check_fresh
from kagura_agent.errors import RefusedError
from kagura_agent.plan.build import plan_tasks
from kagura_agent.plan.history import last_applied
from kagura_agent.plan.intent import MEASURED, fact_changes, intent_fingerprint
from kagura_agent.plan.model import Plan, rows
from kagura_agent.plan.planner import fingerprint

HELLO = {"steps": ["echo travelled > out.txt"], "verify": ["grep -q travelled out.txt"]}
IMAGE = "sha256:" + "1" * 64
FACTS: dict[str, Any] = {
    "image_digests": {"kagura/agent:0.1.0": IMAGE},
    "daemon": {"userns_remap": False, "rootless": False, "runtimes": ["runc"], "version": "20"},
    "project_owner": [1000, 1000],
}


def _plan(tmp_path: Path, facts: dict[str, Any], name: str) -> Plan:
    manifests = tmp_path / "manifests"
    if not manifests.exists():
        manifest_set(tmp_path)
    project = tmp_path / "project"
    task = (
        project / "task.yml" if project.exists() else write_task(make_project(tmp_path), "t", HELLO)
    )
    facts_file = tmp_path / f"{name}.json"
    facts_file.write_text(json.dumps(facts))
    (plan,) = plan_tasks(str(manifests), [str(task)], facts_file=str(facts_file))
    return plan


def _edit(plan: Plan, change: Any) -> Plan:
    """A copy of ``plan`` changed by ``change`` with both hashes made consistent again."""
    edited: Any = json.loads(json.dumps(plan))
    change(edited)
    edited["intent"] = intent_fingerprint(edited)
    edited["fingerprint"] = fingerprint(edited)
    return edited  # type: ignore[no-any-return]


def test_facts_change_the_fingerprint_but_not_the_intent(tmp_path: Path, state_dir: Path) -> None:
    here = _plan(tmp_path, FACTS, "here")
    elsewhere = _plan(
        tmp_path,
        {
            **FACTS,
            "graduation": {"version": 7},
            "daemon": {**FACTS["daemon"], "version": "27"},
            "project_owner": [1001, 1001],
        },
        "elsewhere",
    )
    assert here["fingerprint"] != elsewhere["fingerprint"]
    assert here["intent"] == elsewhere["intent"] == intent_fingerprint(here)
    rendered = [change.render() for change in check_fresh(here, elsewhere)]
    assert rendered == [
        "daemon version: 20 → 27",
        "graduation version: 0 → 7",
        "project owner: [1000, 1000] → [1001, 1001]",
        "container user: 1000:1000 → 1001:1001 (this host's project owner)",
    ]
    # What the operator approves is intent: a manifest edit moves it.
    manifests = tmp_path / "manifests" / "brains.yml"
    manifests.write_text(manifests.read_text().replace("turns: 50", "turns: 49"))
    assert _plan(tmp_path, FACTS, "edited")["intent"] != here["intent"]


def test_every_measured_path_is_a_plan_field() -> None:
    """MEASURED names documented plan fields (a renamed field must not leak into the intent)."""
    fields = {path for path, _, _ in rows(Plan)}
    assert [path for path in MEASURED if path not in fields] == []


@pytest.mark.parametrize(
    ("facts", "refused"),
    [
        ({"daemon": {**FACTS["daemon"], "runtimes": ["runsc"]}}, "runtime: runc → [runsc]"),
        ({"image_digests": {"kagura/agent:0.1.0": "sha256:" + "9" * 64}}, "stale"),
        ({"untrusted_inputs": ["memory:m1"]}, "untrusted inputs: [] → [memory:m1]"),
    ],
)
def test_a_fact_that_changes_a_capability_refuses(
    tmp_path: Path, state_dir: Path, facts: dict[str, Any], refused: str
) -> None:
    saved = _plan(tmp_path, FACTS, "saved")
    here = _plan(tmp_path, {**FACTS, **facts}, "here")
    with pytest.raises(RefusedError, match=refused.replace("[", r"\[")) as error:
        check_fresh(saved, here)
    assert error.value.exit_code == 6


def test_weaker_isolation_and_a_larger_budget_refuse_a_tighter_one_does_not(
    tmp_path: Path, state_dir: Path
) -> None:
    remapped = {**FACTS, "daemon": {**FACTS["daemon"], "userns_remap": True}}
    saved = _plan(tmp_path, remapped, "saved")
    plain = _plan(tmp_path, FACTS, "plain")
    with pytest.raises(RefusedError, match="daemon userns_remap: True → False"):
        check_fresh(saved, plain)

    def grow(plan: Any) -> None:
        plan["budget"]["wall_seconds"] += 60

    def shrink(plan: Any) -> None:
        plan["budget"]["wall_seconds"] -= 60

    (change,) = fact_changes(plain, _edit(plain, grow))
    assert change.capability and change.what == "budget wall_seconds"
    (change,) = fact_changes(plain, _edit(plain, shrink))
    assert not change.capability


@pytest.mark.usefixtures("without_docker")
def test_hand_edits_are_refused_whichever_part_they_touch(tmp_path: Path, state_dir: Path) -> None:
    manifests = manifest_set(tmp_path)
    task = write_task(make_project(tmp_path), "edited", HELLO)
    saved = tmp_path / "plan.json"
    env = cli_env(state_dir)
    made = kagura(["plan", "--manifests", str(manifests), "-o", str(saved), str(task)], env)
    assert made.returncode == 0, made.stderr
    original = json.loads(saved.read_text())

    def widen_egress(plan: Any) -> None:
        rule = {"host": "evil.test", "port": 443, "scheme": "https", "allow_addresses": []}
        plan["egress"]["mode"] = "proxy"
        plan["egress"]["allow"].append({**rule, "policy": "x", "source": "x", "layer": "operator"})

    def graduate_image(plan: Any) -> None:
        plan["approvals"][0]["class"] = plan["image"]["class"] = "graduated"

    def loosen_with_stale_intent(plan: Any) -> None:
        plan["hardening"]["pids_limit"] = 100000

    cases = [
        (widen_egress, True, "saved plan is stale: the compiled plan differs in egress"),
        (graduate_image, True, "class of image:agent: graduated → baseline"),
        (loosen_with_stale_intent, False, "intent mismatch"),
    ]
    for change, rehash_intent, message in cases:
        edited: Any = json.loads(json.dumps(original))
        change(edited)
        if rehash_intent:
            edited["intent"] = intent_fingerprint(edited)
        edited["fingerprint"] = fingerprint(edited)
        saved.write_text(json.dumps(edited))
        done = kagura(["apply", "--yes", str(saved)], env)
        assert done.returncode == 6, (message, done.stderr)
        assert message in done.stderr, done.stderr
    assert run_ids(state_dir) == []


def test_a_plan_made_with_one_state_dir_applies_with_another(
    docker_client: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Host A (its own state: a graduation reset bumped its version) plans; host B applies.

    B shows the facts that differ, applies the same intent with its own facts, and
    records the run and the approvals' binding under B's state, keyed by the intent.
    """
    manifests = manifest_set(tmp_path)
    project = make_project(tmp_path)
    task = write_task(project, "travel", HELLO)
    host_a, host_b = cli_env(tmp_path / "state-a"), cli_env(tmp_path / "state-b")
    reset = kagura(
        ["graduation", "reset", "image:agent", "--manifests", str(manifests), "--who", "a"], host_a
    )
    assert reset.returncode == 0, reset.stderr
    saved = tmp_path / "plan.json"
    made = kagura(["plan", "--manifests", str(manifests), "-o", str(saved), str(task)], host_a)
    assert made.returncode == 0, made.stderr
    plan = json.loads(saved.read_text())
    assert plan["inputs"]["facts"]["graduation_version"] >= 1

    done = kagura(["apply", "--json", str(saved)], host_b)
    assert done.returncode == 0, done.stderr
    assert "differs on this host (no capability changes): graduation version:" in done.stderr
    assert json.loads(done.stdout)["outcome"] == "success"
    assert (project / "out.txt").read_text() == "travelled\n"
    assert run_ids(tmp_path / "state-a") == []
    (run_id,) = run_ids(tmp_path / "state-b")
    assert run_id
    monkeypatch.setenv("KAGURA_AGENT_STATE_DIR", str(tmp_path / "state-b"))
    last = last_applied("travel")  # same intent, B's facts
    assert last is not None and last["intent"] == plan["intent"]
    assert last["inputs"]["facts"]["graduation_version"] == 0


def test_an_image_with_a_repository_pins_where_to_pull_it(tmp_path: Path, state_dir: Path) -> None:
    manifests = manifest_set(tmp_path)
    images = manifests / "images.yml"
    repository = "registry.example:5000/kagura/agent"
    images.write_text(
        images.read_text().replace(
            "  tag: kagura/agent:0.1.0\n",
            f"  tag: kagura/agent:0.1.0\n  repository: {repository}\n",
        )
    )
    unpushed = _plan(tmp_path, FACTS, "unpushed")
    assert unpushed["image"]["pull"] is None
    assert any("is not pushed to " + repository in w for w in unpushed["warnings"])
    pulled = f"{repository}@sha256:" + "2" * 64
    pushed = _plan(tmp_path, {**FACTS, "image_pulls": {"kagura/agent:0.1.0": pulled}}, "pushed")
    assert pushed["image"]["pull"] == pulled
    assert not [w for w in pushed["warnings"] if "not pushed" in w]
    # Where the image comes from is part of what the operator approves.
    assert pushed["intent"] != unpushed["intent"]


@pytest.mark.usefixtures("without_docker")
@pytest.mark.parametrize("planned_in", ["elsewhere", "checkout"])
def test_a_plan_made_anywhere_is_fresh_for_a_child_working_for_a_checkout(
    tmp_path: Path, state_dir: Path, monkeypatch: pytest.MonkeyPatch, planned_in: str
) -> None:
    """A team runner started in a source checkout hands its children that folder; the
    packaged manifests are ./manifests there, yet a plan made in a folder above neither
    the task nor the checkout (its inputs named absolutely or <packaged>/NAME) is fresh."""
    from kagura_agent.apply.run.freshness import check_saved_plan_fresh
    from kagura_agent.paths import NEUTRAL_CWD, WORKDIR_ENV

    checkout = Path(__file__).resolve().parents[1]
    away = tmp_path / "away"
    away.mkdir()
    manifest_set(tmp_path)
    task = write_task(make_project(tmp_path), "t", HELLO)
    monkeypatch.chdir(away if planned_in == "elsewhere" else checkout)
    (plan,) = plan_tasks(str(tmp_path / "manifests"), [str(task)])  # this host's facts
    monkeypatch.chdir(NEUTRAL_CWD)
    monkeypatch.setenv(WORKDIR_ENV, str(checkout))
    assert check_saved_plan_fresh(plan).changes == ()
