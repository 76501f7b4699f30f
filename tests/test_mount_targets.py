"""A task's extra mount never lands on, under or above what the membrane keeps, however its
target is written; refused by ``validate`` and ``plan`` at the target, not at container
start (tests/invalid/mount-target-reserved.yml has the located errors)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kagura_agent.cli.main import main
from kagura_agent.membrane.floor import (
    RESERVED_TARGETS,
    TMPFS_TARGETS,
    normalise_target,
    target_problem,
)
from kagura_agent.plan.hardening import tmpfs_mounts

FACTS = {"image_digests": {"kagura/agent:0.1.0": "sha256:" + "a" * 64}, "graduation": {}}


@pytest.mark.parametrize(
    ("written", "clean"),
    [
        ("/a/../workspace", "/workspace"),
        ("/workspace/", "/workspace"),
        ("//workspace//x/", "/workspace/x"),
        ("/./proc/./sys", "/proc/sys"),
        ("/../../dev", "/dev"),
        ("/var/run/kagura", "/run/kagura"),
        ("/var/run", "/run"),
        ("/var/lock/x", "/run/lock/x"),
        ("/var/runner", "/var/runner"),
        ("/data", "/data"),
        ("relative", ""),
        ("", ""),
        ("/a\0b", ""),
    ],
)
def test_a_target_is_normalised_as_the_engine_mounts_it(written: str, clean: str) -> None:
    assert normalise_target(written) == clean


@pytest.mark.parametrize(
    "kept", sorted({*RESERVED_TARGETS, *TMPFS_TARGETS, "/proc/sys/kernel", "/home/agent/x"})
)
def test_every_kept_path_and_what_lies_under_it_is_refused(kept: str) -> None:
    for written in (kept, kept + "/", "/x/.." + kept, "/" + kept, kept + "/./sub"):
        assert target_problem(written), written


@pytest.mark.parametrize("above", ["/", "/run", "/var/run", "/home", "/opt", "//"])
def test_a_target_above_a_kept_path_is_refused(above: str) -> None:
    assert "would hide" in str(target_problem(above))


@pytest.mark.parametrize("fine", ["/data", "/ref", "/opt/tools", "/workspace2", "/srv/ref/"])
def test_ordinary_targets_pass(fine: str) -> None:
    assert target_problem(fine) is None


def test_the_planned_tmpfs_are_the_ones_the_floor_keeps() -> None:
    assert sorted(tmpfs_mounts("1000:1000", 1)) == sorted(TMPFS_TARGETS)


@pytest.mark.parametrize("target", ["/a/../workspace", "/run/kagura", "/proc/sys/kernel"])
def test_plan_refuses_the_target_located(
    target: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    state_dir: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("KAGURA_AGENT_MANIFESTS", raising=False)
    (tmp_path / "facts.json").write_text(json.dumps(FACTS), encoding="utf-8")
    (tmp_path / "project" / "ref").mkdir(parents=True)
    (tmp_path / "task.yml").write_text(
        "apiVersion: kagura.dev/v1\nkind: Task\nmetadata: {name: m}\nspec:\n"
        "  project_root: project\n  steps: [ls]\n"
        f"  mounts:\n    - {{source: project/ref, target: '{target}'}}\n",
        encoding="utf-8",
    )
    assert main(["plan", "--facts", "facts.json", "task.yml"]) == 2
    err = capsys.readouterr().err
    assert f"task.yml:8:37  $.spec.mounts[0].target  mount target {target}" in err
    assert "Traceback" not in err
