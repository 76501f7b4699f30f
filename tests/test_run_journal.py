"""The run's journal (apply/records/journal.py): what the live view showed, in the state store.

apply runs against the in-memory runtime (testing/memory_runtime.py) with the real
leases, redactor and state store; the journal is read back from ``run_events`` as the web
console reads it.
"""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest
from apply_helpers import NOWHERE, make_project, manifest_set, token_provider, write_task

from kagura_agent.apply.records import journal as journal_module
from kagura_agent.apply.records.journal import EVENT_CEILING, Journal, bounded
from kagura_agent.apply.run.executor import ApplyOptions, apply_plan
from kagura_agent.brain.events import (
    CostEvent,
    DoneEvent,
    TextEvent,
    ToolCallEvent,
    ToolResultEvent,
)
from kagura_agent.clock import SystemClock
from kagura_agent.plan.build import plan_tasks
from kagura_agent.plan.model import Plan
from testing.memory_runtime import BrainScript, MemoryRuntime

TOKEN = "kagura-journal-canary-" + "j" * 24
VERIFY = "test -s out.txt"


@pytest.fixture()
def plan(tmp_path: Path, state_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Plan:
    monkeypatch.setenv("KAGURA_JOURNAL_TOKEN", TOKEN)
    manifests = manifest_set(tmp_path, token_provider("KAGURA_JOURNAL_TOKEN"), NOWHERE)
    project = make_project(tmp_path)
    spec = {
        "brain": "script",
        "egress": ["nowhere"],
        "credentials": [{"provider": "token", "scope": "use"}],
        "steps": ["echo hi > out.txt"],
        "verify": [VERIFY],
    }
    (found,) = plan_tasks(str(manifests), [str(write_task(project, "journal", spec))])
    return found


def _events(state_dir: Path, run_id: str) -> list[tuple[str, dict[str, Any]]]:
    with sqlite3.connect(state_dir / "state.db") as db:
        rows = db.execute(
            "SELECT kind, item FROM run_events WHERE run_id = ? ORDER BY seq", (run_id,)
        ).fetchall()
    return [(str(kind), json.loads(item)) for kind, item in rows]


@pytest.mark.usefixtures("without_docker")
def test_the_run_keeps_what_its_live_view_showed_scrubbed(plan: Plan, state_dir: Path) -> None:
    brain = BrainScript(
        [
            TextEvent(f"my token is {TOKEN}\n\n"),
            TextEvent("and that was all"),
            ToolCallEvent(id="t1", name="bash", input={"argv": ["bash", "-c", "ls"]}),
            ToolResultEvent(id="t1", output="out.txt\n", exit_code=0),
            CostEvent(usd=0.5, turns=3),
            DoneEvent(result="done"),
        ]
    )
    result = apply_plan(
        plan, ApplyOptions(clock=SystemClock()), MemoryRuntime(brain, verify={VERIFY: (0, "")})
    )
    assert result.outcome == "success"
    events = _events(state_dir, result.run_id)
    kinds = [kind for kind, _ in events]
    assert "phase" in kinds and kinds.count("verify") == 1
    brain_items = [item for kind, item in events if kind == "brain"]
    # Consecutive text is one item; the leased credential never reaches the store.
    [text] = [item for item in brain_items if item["type"] == "text"]
    assert text["text"].startswith("my token is ") and "and that was all" in text["text"]
    assert TOKEN not in (state_dir / "state.db").read_bytes().decode("latin-1")
    assert [i["type"] for i in brain_items if i["type"] != "text"] == [
        "tool_call",
        "tool_result",
        "cost",
        "done",
    ]
    [(_, verify)] = [(k, i) for k, i in events if k == "verify"]
    assert verify["results"] == [{"command": VERIFY, "exit_code": 0, "tail": ""}]
    # The run's row says what the cost chart needs.
    with sqlite3.connect(state_dir / "state.db") as db:
        kind, budget, cost = db.execute(
            "SELECT kind, budget, cost_usd FROM runs WHERE run_id = ?", (result.run_id,)
        ).fetchone()
    assert (kind, cost) == (plan["task"]["kind"], 0.5)
    assert json.loads(budget)["turns"] == plan["budget"]["turns"]


def test_items_are_bounded_and_the_rest_counted(
    state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(journal_module, "EVENT_CEILING", 5)
    state_dir.mkdir(parents=True)
    kept = Journal(state_dir / "state.db", "run-bounded", SystemClock())
    kept.record("note", {"message": "x" * 100_000})
    for number in range(10):
        kept.record("phase", {"message": f"phase {number}"})
    kept.close()
    events = _events(state_dir, "run-bounded")
    assert [kind for kind, _ in events] == ["note", "phase", "phase", "phase", "phase", "unstored"]
    assert len(events[0][1]["message"]) < 2_100 and "not kept" in events[0][1]["message"]
    assert events[-1][1] == {"count": 6}
    assert EVENT_CEILING >= 1000  # the real ceiling leaves a long run its timeline


def test_items_reach_the_store_while_the_run_goes_on(state_dir: Path) -> None:
    """Batches are written as they come (the console shows a live run), not at the end."""
    state_dir.mkdir(parents=True)
    kept = Journal(state_dir / "state.db", "run-live", SystemClock())
    try:
        kept.record("phase", {"message": "first"})
        deadline = time.monotonic() + 5
        while not _events(state_dir, "run-live") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _events(state_dir, "run-live") == [("phase", {"message": "first"})]
    finally:
        kept.close()


def test_bounded_cuts_strings_lists_and_keys() -> None:
    value = bounded({"k" * 500: ["y" * 3000] * 500}, limit=10)
    [(key, items)] = value.items()
    assert len(key) == 200 and len(items) == 100 and items[0].startswith("y" * 10 + "…")
