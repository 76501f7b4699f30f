"""Every view of a plan gives apply's verdict: ``admit`` (plan/admission.py), recomputed
from what the plan says, never the ``applyable`` a plan file carries.

The attack: a saved plan edited to ``privileged: true``, ``cap_add: [SYS_ADMIN]`` and a
writable docker.sock mount, its intent and fingerprint recomputed so that it loads. apply
refuses it; the reviewer must see the same, with privileged and the writable mount shown
as they are.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from apply_helpers import run_ids
from plan_forgery import forge

from kagura_agent import gitops
from kagura_agent.apply.run.executor import ApplyOptions, refuse_unapplyable
from kagura_agent.cli.main import main
from kagura_agent.errors import RefusedError
from kagura_agent.plan import planfile
from kagura_agent.plan.admission import admit
from kagura_agent.plan.diff import diff_plans
from kagura_agent.plan.render import render_markdown, render_text
from kagura_agent.ui import Style

GOLDEN = Path(__file__).parent / "plans"
FACTS = {"image_digests": {"kagura/agent:0.1.0": "sha256:" + "a" * 64}, "graduation": {}}
SOCK = "/var/run/docker.sock"


@pytest.fixture()
def saved(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, state_dir: Path) -> Path:
    """An honest saved plan for a script task (packaged manifests)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.delenv("KAGURA_AGENT_MANIFESTS", raising=False)
    (tmp_path / "facts.json").write_text(json.dumps(FACTS), encoding="utf-8")
    (tmp_path / "project").mkdir()
    (tmp_path / "task.yml").write_text(
        "apiVersion: kagura.dev/v1\nkind: Task\nmetadata: {name: views}\nspec:\n"
        "  project_root: project\n  steps: [ls]\n",
        encoding="utf-8",
    )
    out = tmp_path / "plan.json"
    assert main(["plan", "--facts", "facts.json", "task.yml", "-o", str(out)]) == 0
    return out


def _privileged_with_the_socket(plan: dict[str, Any]) -> None:
    plan["hardening"]["privileged"] = True
    plan["hardening"]["cap_add"] = ["SYS_ADMIN"]
    plan["mounts"].append(
        {
            "kind": "extra",
            "source": SOCK,
            "target": SOCK,
            "mode": "rw",
            "category": f"mount:{SOCK}",
            "class": "baseline",
            "reason": "baseline",
        }
    )


def test_every_view_of_a_forged_plan_shows_it_refused_as_it_is(
    saved: Path, state_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    forged = forge(saved, _privileged_with_the_socket, saved.with_name("forged.json"))
    capsys.readouterr()
    plan = planfile.load(forged)
    assert plan["applyable"] is True and plan["floor"] == []  # what the file claims
    verdict = admit(plan)
    assert not verdict.applyable and verdict.edited
    reasons = [
        "capabilities SYS_ADMIN break the membrane and are never added",
        "privileged mode",
        f"mount {SOCK} (the container engine is never reachable)",
        f"mount {SOCK} -> {SOCK} is rw; only the project root is writable",
    ]
    assert list(verdict.floor) == reasons

    assert main(["show", str(forged)]) == 0
    text = capsys.readouterr().out
    assert "applyable    NO" in text and "applyable    yes" not in text
    assert "PRIVILEGED" in text and "(+SYS_ADMIN)" in text
    assert f"WRITES       {SOCK} -> {SOCK} (rw)" in text and f"{SOCK} (ro)" not in text
    assert "(the only writable mount)" not in text
    assert all(f"FLOOR {reason}" in text for reason in reasons)
    assert "EDITED" in text and "rules pass (as recorded, not re-evaluated)" in text

    assert main(["show", "--format", "markdown", str(forged)]) == 0
    markdown = capsys.readouterr().out
    assert "Applyable: **NO**" in markdown and "**PRIVILEGED**" in markdown
    assert f"`{SOCK}` → `{SOCK}` (rw)" in markdown
    assert all(f"- **floor**: {reason}" in markdown for reason in reasons)
    # review's comment is this markdown (gitops.plan_section), with the diff folded in.
    assert "Applyable: **NO**" in gitops.plan_section(plan, [], "the saved plan")

    assert main(["show", "--json", str(forged)]) == 0
    [entry] = json.loads(capsys.readouterr().out)["plans"]
    assert entry["admission"]["applyable"] is False and entry["admission"]["edited"] is True
    assert [r["message"] for r in entry["admission"]["refusals"]] == [
        f"membrane floor: {reason}" for reason in reasons
    ]

    # plan --against the forged plan: the diff names what it changed and its verdict.
    assert main(["plan", "--facts", "facts.json", "task.yml", "--against", str(forged)]) == 0
    diff = capsys.readouterr().out
    for line in (
        f"- mount {SOCK} -> {SOCK} (mode rw)",
        "~ hardening privileged True → False",
        "~ applyable False → True",
    ):
        assert line in diff, diff

    # apply refuses it for the same reasons, before it pulls or re-plans anything.
    with pytest.raises(RefusedError, match="plan breaks the membrane floor: capabilities SYS"):
        refuse_unapplyable(plan, ApplyOptions())
    assert main(["apply", "--yes", str(forged)]) == 6
    err = capsys.readouterr().err
    assert all(reason in err for reason in reasons) and "stale" not in err
    assert run_ids(state_dir) == []


def test_a_plan_edited_to_drop_its_refusals_is_still_refused(saved: Path) -> None:
    """The recorded refusals are kept: an edit can only remove them, and applyable alone
    cannot say yes over them (nor over a plan that says no with nothing recorded)."""
    plan = planfile.load(saved)
    plan["refusals"] = [{"code": "policy-deny", "message": "policy x (no)", "source": "x"}]
    assert [r["message"] for r in admit(plan).refusals] == ["policy x (no)"]
    plan["refusals"] = []
    plan["applyable"] = False
    assert not admit(plan).applyable
    assert "applyable    NO" in render_text(plan, Style(False))


@pytest.mark.parametrize(
    "target", ["/a/../workspace", "/workspace/", "//run/kagura/creds", "/proc/sys/kernel", "/"]
)
def test_a_saved_plan_edited_to_mount_over_what_the_membrane_keeps_is_refused(
    target: str, saved: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = str(saved.parent / "project")

    def mount_over(plan: dict[str, Any]) -> None:
        plan["mounts"].append({"kind": "extra", "source": source, "target": target, "mode": "ro"})

    forge(saved, mount_over)
    capsys.readouterr()
    assert main(["show", str(saved)]) == 0
    text = capsys.readouterr().out
    assert f"FLOOR mount target {target}" in text and "applyable    NO" in text
    assert main(["apply", "--yes", str(saved)]) == 6
    assert f"mount target {target}" in capsys.readouterr().err


@pytest.mark.parametrize("case", sorted(p.name for p in GOLDEN.iterdir() if p.is_dir()))
def test_the_views_verdict_is_the_planners_on_every_golden_plan(case: str) -> None:
    """``admit`` agrees with what the planner recorded for every plan it writes, so a view
    differs from the recorded verdict only for a plan changed after it was planned."""
    plan = json.loads((GOLDEN / case / "expected.json").read_text(encoding="utf-8"))
    verdict = admit(plan)
    assert verdict.applyable is plan["applyable"] and not verdict.edited
    assert list(verdict.floor) == plan["floor"]
    assert [r["message"] for r in verdict.refusals] == [r["message"] for r in plan["refusals"]]
    assert ("Applyable: **yes**" in render_markdown(plan)) is plan["applyable"]
    assert not [c for c in diff_plans(plan, plan) if c.section == "applyable"]
