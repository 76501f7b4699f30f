"""`run "text"` builds a Task whose prompt is exactly the text: nothing in it is a template."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from kagura_agent.cli.run import write_task
from kagura_agent.plan.build import plan_tasks


def test_template_syntax_in_the_text_is_kept_verbatim(
    state_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    monkeypatch.chdir(project)
    text = "fix {{ 7*7 }} and {% endraw %} {{ config.__class__ }}"
    args = argparse.Namespace(brain="claude", manifests=None, egress=[], image=None)
    path = write_task(text, args, session=None)
    [plan] = plan_tasks(None, [str(path)])
    assert plan["task"]["prompt"] == text
    assert plan["task"]["project_root"] == str(project.resolve())
