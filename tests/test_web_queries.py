"""The console's reads (kagura_agent/web/queries.py) on both state store backends: a run
applied for real (in-memory runtime) is read back as the console shows it; on PostgreSQL
the team queue's runs are there too, queued through the real queue."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from kagura_agent.brain.events import CostEvent, DoneEvent, ToolCallEvent, ToolResultEvent
from kagura_agent.clock import SystemClock, iso
from kagura_agent.state import StateStore, open_store
from kagura_agent.web import queries, timeline
from kagura_agent.web.queries import Notes, RunFilter
from testing.web_scene import Scene, apply_run, proxy_decisions, squid_line


@pytest.mark.usefixtures("without_docker")
def test_the_console_reads_a_run_on_either_backend(
    tmp_path: Path, state_target: Path | str
) -> None:
    plan = Scene(tmp_path).plan("docs-refresh", "docs")
    result = apply_run(
        plan,
        [
            ToolCallEvent(id="t1", name="bash", input={"argv": ["bash", "-c", "ls"]}),
            ToolResultEvent(id="t1", output="a\n", exit_code=0),
            CostEvent(usd=0.02, turns=2),
            DoneEvent(result="done"),
        ],
    )
    with open_store() as store:
        line = squid_line(time.time(), "CONNECT", "exfil.example.net", 443, status=403,
                          squid_status="TCP_DENIED")  # fmt: skip
        proxy_decisions(store, plan, result.run_id, iso(SystemClock().now()), [line])
    store = StateStore.read_only(state_target)
    assert store is not None
    notes = Notes()
    with store:
        rows, cursor = queries.runs_page(store, notes, RunFilter(kind="docs"))
        assert [r["run_id"] for r in rows] == [result.run_id] and cursor is None
        assert rows[0]["outcome"] == "success" and rows[0]["cost_usd"] == 0.02
        assert queries.runs_page(store, notes, RunFilter(kind="other"))[0] == []
        assert queries.run_filters(store, notes)["kinds"] == ["docs"]
        items = queries.journal(store, notes, result.run_id)
        entries = timeline.merged(
            timeline.journal_entries(items),
            timeline.egress_entries(queries.egress_latest(store, notes, result.run_id)),
        )
        kinds = [e.kind for e in entries]
        assert "phase" in kinds and "tool call" in kinds and kinds[-1] == "denied"
        assert queries.egress_counts(store, notes, result.run_id)["deny"] == 1
        assert [k["kind"] for k in queries.cost_kinds(store, notes)] == ["docs"]
        assert queries.pending_questions(store, notes, SystemClock().now()) == []
        team = queries.team(store)
    assert notes.lines == []
    if isinstance(state_target, Path):
        assert team is None  # the embedded store has no team queue
        return
    assert team is not None and team["runs"] == []
    from kagura_agent.team.queue import enqueue_plan

    queued = enqueue_plan(state_target, plan, who="tester")
    store = StateStore.read_only(state_target)
    assert store is not None
    with store:
        team = queries.team(store)
    assert team is not None
    assert team["counts"] == {"queued": 1}
    assert [r["run_id"] for r in team["runs"]] == [queued.run_id]
