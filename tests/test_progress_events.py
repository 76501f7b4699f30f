"""The run's progress as typed events (apply/records/progress.py): one event, rendered by
every view — the terminal, ``apply --json``, the cockpit's chat, the web timeline and
``queue follow`` (a replay of the JSON) — with its severity its type's, never a colour a
step passes."""

from __future__ import annotations

import ast
import io
import json
import typing
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import pytest
from apply_helpers import plan_for_root

import kagura_agent
from kagura_agent.apply.records import progress
from kagura_agent.apply.records.journal import recording
from kagura_agent.apply.records.live import LiveView
from kagura_agent.apply.records.progress import (
    EVENTS,
    EgressDenied,
    Note,
    Phase,
    ProgressEvent,
    ReleaseProblem,
    Severity,
    VerifyExited,
    from_json,
    to_json,
)
from kagura_agent.apply.records.runs import open_run, sweep_dead_runs
from kagura_agent.clock import FixedClock, SystemClock
from kagura_agent.cockpit.runner import chat_line
from kagura_agent.membrane.secrets import Redactor
from kagura_agent.state import open_store
from kagura_agent.ui import Style
from kagura_agent.web.timeline import journal_entries

PACKAGE = Path(kagura_agent.__file__).parent


def _shown(event: ProgressEvent, *, as_json: bool = False, colour: bool = False) -> str:
    out = io.StringIO()
    view = LiveView(Redactor(), stream=out, as_json=as_json)
    view.style = Style(colour)
    view.emit(event)
    return out.getvalue()


def test_one_event_reads_the_same_on_the_terminal_in_json_in_chat_and_on_the_web(
    tmp_path: Path,
) -> None:
    event = ReleaseProblem("lease l-1: the vault did not answer")
    words = "release problem (kept for the sweeper): lease l-1: the vault did not answer"

    # The terminal: one line of ours, in red (its type is a problem), no colour passed.
    assert _shown(event) == f"        {words}\n"
    assert _shown(event, colour=True) == f"\x1b[31m        {words}\x1b[0m\n"

    # --json: the kind the readers always read, the event's stable name, its severity
    # and its facts.
    [line] = _shown(event, as_json=True).splitlines()
    item = json.loads(line)
    assert item == {
        "kind": "note",
        "event": "release_problem",
        "severity": "problem",
        "message": words,
        "problem": "lease l-1: the vault did not answer",
    }

    # The cockpit's chat reads that line back as the same event.
    assert chat_line(line) == f"  {words}"

    # queue follow replays the stored stream: the same line, the same red.
    out = io.StringIO()
    follower = LiveView(Redactor(), stream=out)
    follower.style = Style(True)
    assert follower.replay(item, 1.0)
    assert out.getvalue() == f"\x1b[31m        {words}\x1b[0m\n"

    # The journal keeps it; the web timeline shows it in the tone of its severity.
    clock = SystemClock()
    with open_store(tmp_path / "state.db") as store:
        view = LiveView(Redactor(), stream=io.StringIO())
        with recording(view, store.location, "run-1", clock):
            view.emit(event)
            view.emit(Phase("container removed"))
        rows = store.conn.execute(
            "SELECT at, kind, item FROM run_events WHERE run_id = 'run-1' ORDER BY seq"
        ).fetchall()
    entries = journal_entries(
        [{"at": r["at"], "kind": r["kind"], "item": json.loads(r["item"])} for r in rows]
    )
    assert [(e.kind, e.title, e.tone) for e in entries] == [
        ("note", words, "bad"),
        ("phase", "container removed", "info"),
    ]


def test_a_phase_is_dim_and_timed_on_the_terminal_and_a_bullet_in_chat() -> None:
    event = progress.ContainerStarting("kagura/agent:0.1.0")
    shown = _shown(event, colour=True)
    assert shown.startswith("\x1b[2m") and shown.endswith(
        "s ● starting container from kagura/agent:0.1.0\x1b[0m\n"
    )
    [line] = _shown(event, as_json=True).splitlines()
    assert json.loads(line)["kind"] == "phase"
    assert chat_line(line) == "● starting container from kagura/agent:0.1.0"


def test_severity_is_the_types_or_an_explicit_field_never_a_colour() -> None:
    assert EgressDenied("example.com", 443, 3).severity is Severity.WARNING
    assert VerifyExited("make test", 0).severity is Severity.GOOD
    assert VerifyExited("make test", 2).severity is Severity.PROBLEM
    assert progress.RootFinding("moved aside x", Severity.WARNING).severity is Severity.WARNING


def _sample(hint: Any) -> Any:
    """A value of the type ``hint`` (a field of an event)."""
    if isinstance(hint, type) and issubclass(hint, Severity):
        return Severity.WARNING
    origin = typing.get_origin(hint)
    if origin is Literal:
        return typing.get_args(hint)[-1]
    if origin is not None and type(None) in typing.get_args(hint):
        return _sample(next(a for a in typing.get_args(hint) if a is not type(None)))
    if origin is not None:  # another union: its first
        return _sample(typing.get_args(hint)[0])
    return {str: "some words", int: 7, bool: True, float: 2.5}[hint]


@pytest.mark.parametrize("name", sorted(EVENTS))
def test_every_event_comes_back_from_its_json_as_it_was(name: str) -> None:
    cls = EVENTS[name]
    hints = typing.get_type_hints(cls)
    fields = {f.name: _sample(hints[f.name]) for f in progress.dataclasses.fields(cls)}
    event = cls(**fields)
    item = json.loads(json.dumps(to_json(event)))
    assert item["event"] == name and item["kind"] == cls.kind
    assert item["severity"] == event.severity and item["message"] == event.message
    assert "\n" not in event.message
    assert from_json(item) == event


def test_an_item_another_version_wrote_is_shown_by_its_words() -> None:
    unknown = {"kind": "note", "event": "from_the_future", "severity": "warning", "message": "m"}
    assert from_json(unknown) == Note("m", Severity.WARNING)
    # Fields that do not fit the type: its words, at its severity.
    misfit = {**to_json(EgressDenied("h", 1, 2)), "count": "two"}
    assert from_json(misfit) == Note("egress denied: h:1 (2 times)", Severity.WARNING)
    # What older applies printed: kind and message only.
    assert from_json({"kind": "phase", "message": "p"}) == Phase("p")
    assert from_json({"kind": "note", "message": "n", "severity": "loud"}) == Note("n")
    assert from_json({"kind": "brain", "type": "text"}) is None


def test_the_compatibility_path_reads_a_colour_back_as_a_severity() -> None:
    out = io.StringIO()
    view = LiveView(Redactor(), stream=out, as_json=True)
    view.note("disk almost full", "yellow")
    view.phase("verifying")
    first, second = (json.loads(line) for line in out.getvalue().splitlines())
    assert first["severity"] == "warning" and first["event"] == "note"
    assert second == {
        "kind": "phase",
        "event": "phase",
        "severity": "quiet",
        "message": "verifying",
        "text": "verifying",
    }


COLOURS = {"red", "green", "yellow", "blue", "magenta", "dim", "bold"}


def _untyped(tree: ast.AST, *, colours: bool = True) -> list[str]:
    """Where a module says something of the run in words (and, with ``colours``, where
    it names a colour)."""
    found = []
    for node in ast.walk(tree):
        # live.note(…), ctx.live.phase(…), self.ctx.live.note — called or passed on
        if (
            isinstance(node, ast.Attribute)
            and node.attr in ("note", "phase")
            and "live" in ast.unparse(node.value).split(".")[-1:]
        ):
            found.append(f"{node.lineno}: {ast.unparse(node)}")
        # The words-only events are the views' (an item they have no type for).
        if isinstance(node, ast.ImportFrom) and (node.module or "").endswith(".progress"):
            found += [f"{node.lineno}: {a.name}" for a in node.names if a.name in ("Note", "Phase")]
        if colours and isinstance(node, ast.Constant) and node.value in COLOURS:
            found.append(f"{node.lineno}: the colour {node.value!r}")
    return found


def test_no_step_of_the_run_says_how_its_words_look() -> None:
    """Outside the views (apply/records/), the run's steps emit typed events: nowhere a
    ``live.note``/``live.phase`` in words, and in the run (apply/) no colour standing for
    a severity (elsewhere a colour styles other things: a plan, doctor's checks)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel.startswith("apply/records/"):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        untyped = _untyped(tree, colours=rel.startswith("apply/"))
        if untyped:
            found[rel] = untyped
    assert found == {}


def test_the_check_sees_words_and_colours() -> None:
    tree = ast.parse(
        "ctx.live.note('x', 'red')\nlive.phase('y')\nf(note=self.ctx.live.note)\n"
        "lines = [(l, 'yellow') for l in x]\npacer.note(1)\n"
        "from kagura_agent.apply.records.progress import Note, Leasing\n"
    )
    assert sorted(_untyped(tree)) == [
        "1: ctx.live.note",
        "1: the colour 'red'",
        "2: live.phase",
        "3: self.ctx.live.note",
        "4: the colour 'yellow'",
        "6: Note",
    ]


@pytest.mark.usefixtures("without_docker")
def test_the_dead_run_sweep_tells_the_roots_aftercare_as_events(
    tmp_path: Path, state_dir: Path
) -> None:
    """What the sweep of a dead run repaired in its root reaches the next run's view as
    the same RootFinding events a run's own end emits (apply's _sweep passes live.emit)."""
    root = tmp_path / "root"
    root.mkdir()
    clock = FixedClock(datetime.now(UTC).replace(microsecond=0))
    with open_store() as store:
        open_run(store, plan_for_root(tmp_path, root), "run-dead", clock)
        with store.transaction() as conn:
            conn.execute("UPDATE runs SET pid_start = 'not-a-process-here'")
    (root / "tool").write_bytes(b"#!/bin/sh\n")
    (root / "tool").chmod(0o4755)
    found: list[ProgressEvent] = []
    with open_store() as store:
        swept = sweep_dead_runs(store, _NoContainers(), clock, on_event=found.append)  # type: ignore[arg-type]
    assert swept == ["run-dead"]
    assert found and all(isinstance(f, progress.RootFinding) for f in found), found
    assert [f.severity for f in found] == [Severity.WARNING]
    assert [f.message for f in found] == [
        "cleared setuid/setgid on 1 file(s): names withheld (the run was killed)"
    ]
    assert not (root / "tool").stat().st_mode & 0o4000


class _NoContainers:
    def list(self, labels: dict[str, str]) -> list[str]:
        return []

    def remove(self, container_id: str, *, force: bool = False) -> None:
        raise AssertionError("nothing to remove")
