"""`run "text"` builds a Task whose prompt is exactly the text: nothing in it is a template."""

from __future__ import annotations

from pathlib import Path

import pytest

from kagura_agent.manifest.adhoc import write_adhoc_task
from kagura_agent.plan.build import plan_tasks


def test_template_syntax_in_the_text_is_kept_verbatim(
    state_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    monkeypatch.chdir(project)
    text = "fix {{ 7*7 }} and {% endraw %} {{ config.__class__ }}"
    path = write_adhoc_task(text, manifests=None, brain="claude")
    [plan] = plan_tasks(None, [str(path)])
    assert plan["task"]["prompt"] == text
    assert plan["task"]["project_root"] == str(project.resolve())
