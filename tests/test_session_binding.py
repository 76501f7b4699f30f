"""A named session resumes only for the task kind and project root that saved it.

A session's checkpoint carries the brain's conversation id (what the agent read, what its
tools printed) and the steps already done. Before, any task naming the same session —
another project, another kind — resumed them: its brain continued the other task's
conversation with its own capabilities.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from apply_helpers import make_project, write_task

from kagura_agent.apply.run.context import ApplyRuntime
from kagura_agent.apply.run.executor import ApplyOptions, apply_plan
from kagura_agent.clock import SystemClock
from kagura_agent.errors import RefusedError
from kagura_agent.patterns.checkpoint import (
    Checkpoint,
    foreign_checkpoint,
    load_checkpoint,
    save_checkpoint,
    session_owner,
)
from kagura_agent.plan.build import plan_tasks
from kagura_agent.plan.model import Plan
from kagura_agent.state import open_store
from testing.memory_runtime import MemoryRuntime

# Every test here runs against both state backends (SQLite, PostgreSQL).
pytestmark = pytest.mark.usefixtures("state_target")


def _plan(base: Path, name: str, session: str) -> Plan:
    project = make_project(base, f"{name}-root")
    task = write_task(project, name, {"brain": "script", "steps": ["true"], "session": session})
    (plan,) = plan_tasks(None, [str(task)])
    assert plan["applyable"], plan["refusals"]
    return plan


def _interrupted(plan: Plan) -> None:
    """What an interrupted run of ``plan`` leaves: a checkpoint bound to its task."""
    task = plan["task"]
    with open_store() as store:
        save_checkpoint(
            store,
            Checkpoint(
                session=str(task["session"]),
                step=0,
                pending=("true",),
                brain_session_id="brain-conversation-of-alpha",
                owner=session_owner(task["project_root"], task["kind"]),
            ),
        )


def test_foreign_checkpoint_names_the_owner(tmp_path: Path, state_dir: Path) -> None:
    mine = session_owner(str(tmp_path), "alpha")
    with open_store() as store:
        save_checkpoint(store, Checkpoint(session="s", step=1, owner=mine))
        assert foreign_checkpoint(store, "s", mine) is None
        assert foreign_checkpoint(store, None, mine) is None
        assert foreign_checkpoint(store, "unknown", mine) is None
        other = foreign_checkpoint(store, "s", session_owner("/elsewhere", "alpha"))
        assert other is not None and f"on {mine['project_root']}" in other
        assert "kind 'beta'" in str(
            foreign_checkpoint(store, "s", session_owner(str(tmp_path), "beta"))
        )
        save_checkpoint(store, Checkpoint(session="legacy", step=1))
        assert "names no owner" in str(foreign_checkpoint(store, "legacy", mine))


@pytest.mark.usefixtures("without_docker")
def test_another_task_cannot_resume_the_session(tmp_path: Path, state_dir: Path) -> None:
    alpha, beta = _plan(tmp_path, "alpha", "shared"), _plan(tmp_path, "beta", "shared")
    _interrupted(alpha)
    runtime = MemoryRuntime()
    checked: ApplyRuntime = runtime
    with pytest.raises(
        RefusedError, match="cannot resume: session 'shared' belongs to task kind 'alpha'"
    ):
        apply_plan(beta, ApplyOptions(clock=SystemClock()), checked)
    assert runtime.log == []  # refused before any container, network or lease
    with open_store() as store:
        kept = load_checkpoint(store, "shared")
    assert kept is not None and kept.brain_session_id == "brain-conversation-of-alpha"


@pytest.mark.usefixtures("without_docker")
def test_the_owner_resumes_its_session(tmp_path: Path, state_dir: Path) -> None:
    alpha = _plan(tmp_path, "alpha", "mine")
    _interrupted(alpha)
    runtime = MemoryRuntime()
    checked: ApplyRuntime = runtime
    result = apply_plan(alpha, ApplyOptions(clock=SystemClock()), checked)
    assert (result.outcome, result.exit_code) == ("success", 0), result
    with open_store() as store:
        assert load_checkpoint(store, "mine") is None  # finished: the checkpoint is cleared
