"""`run "text"` builds a Task whose prompt is exactly the text: nothing in it is a template."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from kagura_agent.clock import FixedClock
from kagura_agent.manifest.adhoc import AdhocTask, write_adhoc_task
from kagura_agent.plan.build import plan_tasks


@pytest.mark.usefixtures("without_docker")
def test_template_syntax_in_the_text_is_kept_verbatim(
    state_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    monkeypatch.chdir(project)
    text = "fix {{ 7*7 }} and {% endraw %} {{ config.__class__ }}"
    path = write_adhoc_task(AdhocTask(text, brain="claude"), manifests=None)
    [plan] = plan_tasks(None, [str(path)])
    assert plan["task"]["prompt"] == text
    assert plan["task"]["project_root"] == str(project.resolve())


@pytest.mark.usefixtures("without_docker")
def test_one_off_tasks_written_at_the_same_instant_are_two_files(
    state_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cockpit writes from many threads: a task file is never overwritten by another."""
    project = tmp_path / "project"
    project.mkdir()
    monkeypatch.chdir(project)
    clock = FixedClock(datetime(2026, 12, 1, 12, 0, tzinfo=UTC))
    first = write_adhoc_task(AdhocTask("first", brain="claude"), manifests=None, clock=clock)
    second = write_adhoc_task(AdhocTask("second", brain="claude"), manifests=None, clock=clock)
    assert first != second and first.name.startswith(str(int(clock.now().timestamp() * 1000)))
    assert [plan_tasks(None, [str(p)])[0]["task"]["prompt"] for p in (first, second)] == [
        "first",
        "second",
    ]


@pytest.mark.usefixtures("without_docker")
def test_with_the_script_brain_the_text_is_the_step_it_runs(
    state_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`run --brain script "make test"` runs that command in the membrane. Before, it was
    refused by a located error in the task file it had generated ("give steps, not a
    prompt"), pointing the user at a file they never wrote."""
    project = tmp_path / "project"
    project.mkdir()
    monkeypatch.chdir(project)
    text = "echo {{ 7*7 }} > out.txt"
    path = write_adhoc_task(AdhocTask(text, brain="script"), manifests=None)
    [plan] = plan_tasks(None, [str(path)])
    assert plan["task"]["steps"] == [text]
    assert plan["task"]["prompt"] is None
    assert plan["brain"]["engine"] == "script"
