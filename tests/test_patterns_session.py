"""Checkpoint/resume, sub-agent dispatch with memory handoff, and cascading erasure."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from memory_helpers import START

from kagura_agent.clock import FixedClock
from kagura_agent.memory import Source
from kagura_agent.memory.sqlite import SqliteMemoryStore
from kagura_agent.patterns import dispatch, erasure
from kagura_agent.patterns.checkpoint import (
    Checkpoint,
    CredentialInCheckpoint,
    clear_checkpoint,
    load_checkpoint,
    resume,
    save_checkpoint,
)
from kagura_agent.state import open_store

# Every test here runs against both state backends (SQLite, PostgreSQL).
pytestmark = pytest.mark.usefixtures("state_target")


@pytest.fixture()
def store(tmp_path: Path) -> Iterator[SqliteMemoryStore]:
    opened = SqliteMemoryStore(tmp_path / "m.db", clock=FixedClock(START))
    yield opened
    opened.close()


def test_checkpoint_survives_reopen_and_resume_says_where(tmp_path: Path) -> None:
    state = open_store()
    assert resume(state, "nightly") is None and resume(state, None) is None
    for step in (1, 2):
        save_checkpoint(
            state,
            Checkpoint(
                session="nightly",
                step=step,
                pending=[["make", "test"]],
                brain_session_id="brain-42",
                budget_left={"turns": 10 - step, "wall_seconds": 500.0, "cost_usd": None},
                plan_fingerprint="sha256:abc",
            ),
            clock=FixedClock(START),
        )
    state.close()
    reopened = open_store()
    point = resume(reopened, "nightly")
    assert point is not None
    assert (point.step, point.next_step, point.brain_session_id) == (2, 3, "brain-42")
    assert point.budget_left["turns"] == 8 and point.saved == START
    assert (
        point.message()
        == "resuming session 'nightly' from step 3 (1 pending, brain session brain-42)"
    )
    assert clear_checkpoint(reopened, "nightly") and load_checkpoint(reopened, "nightly") is None
    reopened.close()


@pytest.mark.parametrize(
    "pending", [[{"env": {"AWS_SECRET_ACCESS_KEY": "x"}}], [{"github_token": "ghs_x"}]]
)
def test_checkpoint_refuses_credentials(tmp_path: Path, pending: list[Any]) -> None:
    state = open_store()
    with pytest.raises(CredentialInCheckpoint):
        save_checkpoint(state, Checkpoint(session="s", step=1, pending=pending))
    assert load_checkpoint(state, "s") is None
    state.close()


def test_dispatch_hands_context_by_id_and_parent_reads_output(store: SqliteMemoryStore) -> None:
    parent = dispatch.handoff(
        store, parent_run="p1", context=["repo uses poetry", "tests live in t/"]
    )
    assert parent["run"] == "p1" and len(parent["context_memories"]) == 2
    context = dispatch.load_context(store, parent["context_memories"])
    assert [m.summary for m in context] == ["repo uses poetry", "tests live in t/"]
    output = dispatch.record_output(
        store, child_run="c1", parent=parent, summary="child found 3 flaky tests"
    )
    [read] = dispatch.child_outputs(store, [output.id, "mem-gone"])
    assert read.summary == "child found 3 flaky tests"
    assert read.details["cites"] == parent["context_memories"]
    assert {e.target_id for e in store.edges(output.id, type="derived_from")} == set(
        parent["context_memories"]
    )
    with pytest.raises(KeyError):
        dispatch.load_context(store, ["mem-missing"])


PARENT: dict[str, Any] = {
    "egress": {
        "mode": "proxy",
        "allow": [
            {"host": "pypi.org", "port": 443, "scheme": "https"},
            {"host": "api.github.com", "port": 443, "scheme": "https"},
        ],
        "allow_addresses": [],
    },
    "credentials": [
        {"provider": "gh", "scope": "read", "ttl_seconds": 900, "class": "baseline"},
        {"provider": "aws", "scope": "admin", "ttl_seconds": 900, "class": "denied"},
    ],
    "mounts": [
        {"kind": "project", "source": "/work/proj", "target": "/workspace", "mode": "rw"},
        {"kind": "extra", "source": "/ref", "target": "/ref", "mode": "ro"},
    ],
}


def test_a_narrower_child_has_no_violations() -> None:
    child = {
        "egress": {"mode": "proxy", "allow": [PARENT["egress"]["allow"][0]]},
        "credentials": [{"provider": "gh", "scope": "read", "ttl_seconds": 300}],
        "mounts": [{"source": "/work/proj/sub", "target": "/workspace", "mode": "rw"}],
    }
    assert dispatch.narrowing_violations(PARENT, child) == []
    assert dispatch.narrowing_violations(PARENT, {}) == []


def test_every_widening_is_reported() -> None:
    child = {
        "egress": {
            "mode": "proxy",
            "allow": [
                {"host": "pypi.org", "port": 80, "scheme": "http"},
                {"host": "evil.example", "port": 443, "scheme": "https"},
            ],
            "allow_addresses": ["10.0.0.0/8"],
        },
        "credentials": [
            {"provider": "gh", "scope": "write", "ttl_seconds": 60},
            {"provider": "gh", "scope": "read", "ttl_seconds": 3600},
            {"provider": "aws", "scope": "admin", "ttl_seconds": 60},
        ],
        "mounts": [
            {"source": "/work/projector", "target": "/x", "mode": "ro"},
            {"source": "/ref/docs", "target": "/ref", "mode": "rw"},
        ],
    }
    found = dispatch.narrowing_violations(PARENT, child)
    assert len(found) == 8, found
    assert any("evil.example" in v for v in found)
    assert any("gh/read ttl 3600s" in v for v in found)
    assert any("aws/admin is not held" in v for v in found)  # denied to the parent
    assert any("/work/projector is outside" in v for v in found)
    assert any("/ref/docs is rw" in v for v in found)
    assert dispatch.narrowing_violations(
        {"egress": {"mode": "none"}}, {"egress": {"mode": "proxy"}}
    )


def test_forget_cascade_follows_edges_and_cites(store: SqliteMemoryStore) -> None:
    run = Source("run", "r")
    root = store.remember(type="note", summary="customer record 42", source=run)
    by_edge = store.remember(type="note", summary="summary of record", source=run)
    store.create_edge(by_edge.id, root.id, "derived_from")
    by_cite = store.remember(
        type="note",
        summary="report quoting it",
        source=Source("import", "x"),
        details={"cites": [root.id]},
    )
    grandchild = store.remember(type="note", summary="digest of summary", source=run)
    store.create_edge(grandchild.id, by_edge.id, "derived_from")
    bystander = store.remember(type="note", summary="unrelated memory", source=run)

    assert erasure.forget(store, "mem-nope", cascade=True) == []
    tombstones = erasure.forget(store, root.id, cascade=True, reason="erasure request 7")
    assert [t.memory_id for t in tombstones] == [root.id, by_edge.id, by_cite.id, grandchild.id]
    assert tombstones[0].reason == "erasure request 7" and tombstones[0].cascade_of is None
    assert {t.cascade_of for t in tombstones[1:]} == {root.id}
    assert [m.id for m in store.export()] == [bystander.id]
    assert len(store.tombstones()) == 4


def test_forget_without_cascade_keeps_derivations(store: SqliteMemoryStore) -> None:
    run = Source("run", "r")
    root = store.remember(type="note", summary="root memory", source=run)
    child = store.remember(type="note", summary="child memory", source=run)
    store.create_edge(child.id, root.id, "derived_from")
    assert [t.memory_id for t in erasure.forget(store, root.id)] == [root.id]
    assert store.get(child.id) is not None and store.edges(child.id) == []
