"""Each memory pattern end to end through the CLI: the embedded store, the script brain,
real agent containers (kagura/agent:0.1.0).

- failure learning: a failing run, a fixed run, then the plan of a similar task shows the
  known failure with its fix, and the brain's turn carries it;
- checkpoint/resume: a session interrupted (SIGINT) after step 1 resumes from step 2;
- sub-agent dispatch: a child narrowed to its parent's plan gets the context by memory id
  and records its output, which the parent reads back by id; a widening child is refused;
- erasure: forget --cascade removes the derived output and leaves content-free tombstones.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from kagura_agent.brain.plan_turn import turn_from_plan
from kagura_agent.membrane.hardening import LABEL_RUN

pytestmark = pytest.mark.usefixtures("docker_client")

REPO = Path(__file__).resolve().parents[1]
AGENT_UID = 1000


@pytest.fixture()
def env(state_dir: Path, docker_client: Any) -> Iterator[dict[str, str]]:
    """The CLI's environment; afterwards no container of this test's runs is left."""
    yield {
        **os.environ,
        "KAGURA_AGENT_STATE_DIR": str(state_dir),
        "NO_COLOR": "1",
        "PYTHONUNBUFFERED": "1",
    }
    for run_id in _run_ids(state_dir):
        assert not docker_client.containers.list(
            all=True, filters={"label": f"{LABEL_RUN}={run_id}"}
        )


def _run_ids(state_dir: Path) -> list[str]:
    path = state_dir / "state.db"
    if not path.exists():
        return []
    with sqlite3.connect(path) as conn:
        try:
            return [row[0] for row in conn.execute("SELECT run_id FROM runs")]
        except sqlite3.OperationalError:
            return []


def _project(base: Path, name: str) -> Path:
    """A project root owned by uid 1000, so the agent (running as its owner) can write it."""
    root = base / name
    root.mkdir(parents=True)
    os.chown(root, AGENT_UID, AGENT_UID)
    return root


def _task(project: Path, name: str, spec: dict[str, Any]) -> Path:
    path = project / "task.yml"
    document = {"apiVersion": "kagura.dev/v1", "kind": "Task", "metadata": {"name": name}}
    path.write_text(yaml.safe_dump({**document, "spec": spec}, sort_keys=False))
    return path


def _kagura(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kagura_agent", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        cwd=REPO,
    )


def _plan_json(task: Path, env: dict[str, str], expect: int = 0) -> dict[str, Any]:
    """The plan of ``task``; ``expect`` 6: plan says it is not applyable."""
    done = _kagura(["plan", "--json", str(task)], env)
    assert done.returncode == expect, done.stderr
    plan: dict[str, Any] = json.loads(done.stdout)["plans"][0]["plan"]
    return plan


def _apply(task: Path, env: dict[str, str], expect: int = 0) -> str:
    done = _kagura(["apply", "--yes", str(task)], env)
    output = done.stdout + done.stderr
    assert done.returncode == expect, output
    return output


# -- failure learning -------------------------------------------------------------------


def test_failed_then_fixed_run_becomes_a_known_failure_in_the_next_plan(
    tmp_path: Path, env: dict[str, str]
) -> None:
    project = _project(tmp_path, "docs")
    spec = {"kind": "build-docs", "steps": ["echo broken > out.txt"]}
    spec["verify"] = ["grep -q fixed out.txt"]
    task = _task(project, "docs", spec)
    assert "verify 'grep -q fixed out.txt' exited 1" in _apply(task, env, expect=1)
    task = _task(project, "docs", {**spec, "steps": ["echo fixed > out.txt"]})
    assert "linked this run as the fix of 1 earlier failure(s)" in _apply(task, env)

    # A similar task: another name, the same kind of work.
    similar = _task(_project(tmp_path, "docs-again"), "docs-again", spec)
    plan = _plan_json(similar, env)
    [known] = plan["memory"]["known_failures"]
    assert known["failure"] == "verify 'grep -q fixed out.txt' exited 1"
    # The fix names what the fixing run changed against the failed one.
    fix = "docs succeeded, changed: + step 'echo fixed > out.txt'; - step 'echo broken > out.txt'"
    assert known["fix"] == fix
    assert known["fix_changes"] == [
        {"change": "step", "op": "+", "value": "echo fixed > out.txt"},
        {"change": "step", "op": "-", "value": "echo broken > out.txt"},
    ]
    assert known["occurrences"] == 1 and known["last_failed"].endswith("Z")
    assert 0.99 <= known["weight"] <= 1.0  # it failed minutes ago: full weight
    trust = plan["memory"]["failure_trust"]
    assert trust["successes"] == 1 and trust["score"] == pytest.approx(0.5, abs=0.01)
    shown = _kagura(["plan", str(similar)], env).stdout
    assert (
        "known failure  [trusted] \"verify 'grep -q fixed out.txt' exited 1\" (1 time, last "
        in (shown)
    ), shown
    assert f'  -> fix: "{fix}"' in shown, shown
    # The brain receives both as context in its turn: quoted, with their tier (a verify
    # failure is the task's command and the host's exit code, so it is trusted).
    assert known["trust"] == "trusted"
    context = turn_from_plan(plan).context.known_failures
    assert "- [trusted] failure: \"verify 'grep -q fixed out.txt' exited 1\"" in context
    assert f'fix [trusted]: "{fix}"' in context
    # The fix is linked to the failure in the store; the edge keeps the change.
    edges = _kagura(["memory", "show", known["failure_id"], "--json"], env)
    [edge] = [
        e
        for e in json.loads(edges.stdout)["edges"]
        if (e["source_id"], e["target_id"], e["type"])
        == (known["fix_id"], known["failure_id"], "prevents")
    ]
    assert edge["details"]["changes"] == known["fix_changes"]


# -- checkpoint and resume --------------------------------------------------------------


def _checkpoint_step(state_dir: Path, session: str) -> int | None:
    try:
        with sqlite3.connect(f"file:{state_dir / 'state.db'}?mode=ro", uri=True) as conn:
            row = conn.execute("SELECT step FROM checkpoints WHERE session = ?", (session,))
            found = row.fetchone()
    except sqlite3.Error:
        return None
    return int(found[0]) if found else None


def test_interrupted_session_resumes_from_the_next_step(
    tmp_path: Path, env: dict[str, str], state_dir: Path
) -> None:
    project = _project(tmp_path, "long")
    steps = [
        "echo step1 >> log.txt",
        # Step 2 waits (first run only) so the interrupt lands inside it.
        "echo step2 >> log.txt; test -f resume.flag || sleep 600",
        "echo step3 >> log.txt",
    ]
    task = _task(project, "long", {"session": "s1", "steps": steps, "verify": ["test -f log.txt"]})
    proc = subprocess.Popen(
        [sys.executable, "-m", "kagura_agent", "apply", "--yes", str(task)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=REPO,
    )
    try:
        deadline = time.monotonic() + 60
        while _checkpoint_step(state_dir, "s1") != 1:
            assert proc.poll() is None and time.monotonic() < deadline, "no checkpoint after step 1"
            time.sleep(0.1)
        time.sleep(0.5)  # well inside step 2's sleep
        proc.send_signal(signal.SIGINT)
        output, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, output
    assert (project / "log.txt").read_text().split() == ["step1", "step2"]

    (project / "resume.flag").touch()
    output = _apply(task, env)
    assert "resuming session 's1' from step 2" in output
    # Step 1 ran once; step 2 was in flight when interrupted, so it runs again.
    assert (project / "log.txt").read_text().split() == ["step1", "step2", "step2", "step3"]
    assert _checkpoint_step(state_dir, "s1") is None  # finished: the checkpoint is cleared


# -- sub-agent dispatch and erasure -----------------------------------------------------


def _dispatch(tmp_path: Path, env: dict[str, str]) -> tuple[str, str, Path]:
    """A parent stores context in memory; a child narrowed to it runs with the id.

    Returns (context memory id, child's output memory id, the parent's project).
    """
    parent_root = _project(tmp_path, "parent")
    remember = "python3 -m kagura_agent.brain.memtool remember 'docs build needs sphinx 7'"
    parent = _task(
        parent_root,
        "parent",
        {"steps": [f"{remember} > ctx.json"], "verify": ["test -s ctx.json"]},
    )
    parent_run = re.search(r"run (run-[0-9a-f]+) succeeded", _apply(parent, env))
    assert parent_run is not None
    context_id = json.loads((parent_root / "ctx.json").read_text())
    child = _task(
        _project(parent_root, "child"),
        "child",
        {
            "parent": {"task": "parent", "context": [context_id]},
            "steps": ["echo built > result.txt"],
            "verify": ["test -s result.txt"],
        },
    )
    plan = _plan_json(child, env)
    assert plan["task"]["parent"] == {
        "task": "parent",
        "run": parent_run.group(1),
        "context_memories": [context_id],
        "narrowing": [],
    }
    assert plan["applyable"] is True
    # memtool writes are the agent's own words: untrusted, and the plan says so.
    assert plan["memory"]["untrusted_inputs"] == [f"memory:{context_id}"]
    assert turn_from_plan(plan).context.memory_ids == (context_id,)
    output = _apply(child, env)
    assert "narrowing    ok" in output
    found = re.search(r"output memory (mem-[0-9a-f]+) \(the parent recalls it", output)
    assert found is not None, output
    return context_id, found.group(1), parent_root


def test_child_runs_narrowed_and_the_parent_recalls_its_output_by_id(
    tmp_path: Path, env: dict[str, str]
) -> None:
    context_id, output_id, parent_root = _dispatch(tmp_path, env)
    shown = _kagura(["memory", "show", output_id, "--json"], env)
    assert shown.returncode == 0, shown.stderr
    output = json.loads(shown.stdout)
    assert (
        output["type"] == "output"
        and output["summary"] == "child succeeded: echo built > result.txt"
    )
    assert output["details"]["cites"] == [context_id]
    assert output["details"]["outcome"] == "success"
    assert [(e["source_id"], e["type"], e["target_id"]) for e in output["edges"]] == [
        (output_id, "derived_from", context_id)
    ]
    # A child asking for more than its parent had is refused before anything runs.
    wider = _task(
        _project(parent_root, "wider"),
        "wider",
        {
            "parent": {"task": "parent", "context": [context_id]},
            "egress": ["pypi"],
            "steps": ["true"],
        },
    )
    plan = _plan_json(wider, env, expect=6)
    assert plan["applyable"] is False
    assert (
        "egress https://pypi.org:443 is not allowed to the parent"
        in plan["task"]["parent"]["narrowing"]
    )
    refused = _apply(wider, env, expect=6)
    assert "child widens parent 'parent'" in refused


def test_forget_cascade_removes_the_derived_output_and_leaves_tombstones(
    tmp_path: Path, env: dict[str, str]
) -> None:
    context_id, output_id, _ = _dispatch(tmp_path, env)
    forgot = _kagura(["memory", "forget", context_id, "--cascade", "--reason", "gdpr"], env)
    assert forgot.returncode == 0, forgot.stderr
    assert f"forgot {output_id} output (derived from {context_id})" in forgot.stdout
    assert _kagura(["memory", "show", output_id], env).returncode == 2
    exported = _kagura(["memory", "export", "--json"], env)
    data = json.loads(exported.stdout)
    assert {context_id, output_id}.isdisjoint(m["id"] for m in data["memories"])
    tombstones = {t["memory_id"]: t for t in data["tombstones"]}
    assert tombstones[context_id]["reason"] == "gdpr"
    assert tombstones[context_id]["cascade_of"] is None
    assert tombstones[output_id]["cascade_of"] == context_id
    assert all("summary" not in t and "details" not in t for t in tombstones.values())
    assert "sphinx" not in exported.stdout and "echo built" not in exported.stdout
