"""Turn and dollar budgets in the sdk engine, the fake claude CLI keeping them as the real
one does: a query that runs out ends with ``error_max_turns`` / ``error_max_budget_usd``
(and the CLI exits 1); the engine asks the host (here a stand-in for the channel) and,
when granted, carries on in the same session with what the host says is left."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import pytest
from resources import require_extra

from kagura_agent.brain.engines.sdk import SdkBrain
from kagura_agent.brain.events import (
    BrainEvent,
    CheckpointEvent,
    CostEvent,
    DoneEvent,
    ErrorEvent,
    TextEvent,
    ToolResultEvent,
)
from kagura_agent.brain.protocol import Budget, Turn
from testing.cli_options import option
from testing.fake_claude import FAKE_CLAUDE, FAKE_DIR

require_extra("claude_agent_sdk", "claude")


class Host:
    """The host's side of budget requests: answers each with ``answers`` in order."""

    def __init__(self, *answers: dict[str, Any]) -> None:
        self.answers = list(answers)
        self.asked: list[tuple[str, int, float, str]] = []

    async def request(self, kind: str, name: str, reason: str) -> dict[str, Any]:
        return {"granted": False, "message": "not here"}

    async def extend_budget(
        self, limit: str, turns: int, cost_usd: float, reason: str
    ) -> dict[str, Any]:
        self.asked.append((limit, turns, cost_usd, reason))
        return self.answers.pop(0)


@pytest.fixture()
def fake_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    log = tmp_path / "fake.log"
    monkeypatch.setenv("PATH", f"{FAKE_DIR}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("KAGURA_FAKE_LOG", str(log))
    monkeypatch.setenv("KAGURA_FAKE_SESSIONS", str(tmp_path / "sessions"))
    return log


def run(brain: SdkBrain, turn: Turn) -> list[BrainEvent]:
    async def go() -> list[BrainEvent]:
        return [event async for event in brain.run(turn)]

    return asyncio.run(go())


def argvs(log: Path) -> list[list[str]]:
    return [json.loads(line)["argv"] for line in log.read_text().splitlines()]


def outputs(events: list[BrainEvent]) -> list[str]:
    return [e.output.strip() for e in events if isinstance(e, ToolResultEvent)]


def test_a_turn_budget_that_runs_out_is_extended_and_the_same_session_goes_on(
    tmp_path: Path, fake_log: Path
) -> None:
    host = Host({"granted": True, "message": "turn budget extended to 6 turns", "turns": 3})
    turn = Turn(engine="sdk", prompt="turns: 5", cwd=str(tmp_path), budget=Budget(turns=3))
    events = run(SdkBrain(cli_path=str(FAKE_CLAUDE), capabilities=host), turn)
    # The CLI stopped after 3 turns; the host was asked with what was spent.
    [(limit, turns, usd, reason)] = host.asked
    assert (limit, turns) == ("turns", 3) and usd == pytest.approx(0.03)
    assert "Reached maximum number of turns (3)" in reason
    assert outputs(events) == [f"turn {k} of 5" for k in range(1, 6)]
    assert any(isinstance(e, TextEvent) and "extended to 6 turns" in e.text for e in events)
    costs = [e for e in events if isinstance(e, CostEvent)]
    # The host sees the whole turn: 3 turns, then 3 + 3 (two more tool turns, the answer).
    assert [c.turns for c in costs] == [3, 6]
    assert costs[-1].usd == pytest.approx(0.06)
    done = events[-1]
    assert isinstance(done, DoneEvent) and done.session_id
    assert done.result == f"Finished all 5 turns (resumed {done.session_id})."
    first, second = argvs(fake_log)
    assert option(first, "--max-turns") == "3"
    assert option(second, "--resume") == done.session_id and option(second, "--max-turns") == "3"
    assert not any(isinstance(e, ErrorEvent) for e in events)


def test_a_message_steered_in_before_the_budget_ran_out_is_not_lost(
    tmp_path: Path, fake_log: Path
) -> None:
    host = Host({"granted": True, "message": "turn budget extended to 6 turns", "turns": 3})
    brain = SdkBrain(cli_path=str(FAKE_CLAUDE), capabilities=host)
    turn = Turn(engine="sdk", prompt="turns: 3", cwd=str(tmp_path), budget=Budget(turns=2))

    async def go() -> list[BrainEvent]:
        events: list[BrainEvent] = []
        async for event in brain.run(turn):
            events.append(event)
            if len(events) == 1:  # the first tool call: the CLI is busy with the task
                assert brain.steer("also say hello") == (True, "")
        return events

    events = asyncio.run(go())
    done = events[-1]
    assert isinstance(done, DoneEvent), done
    assert done.result and done.result.endswith("Heard mid-run: also say hello"), done.result


def test_a_dollar_budget_is_extended_with_what_the_host_says_is_left(
    tmp_path: Path, fake_log: Path
) -> None:
    host = Host({"granted": True, "message": "dollar budget extended to $0.05", "cost_usd": 0.02})
    turn = Turn(
        engine="sdk",
        prompt="turns: 3\nturn cost: 0.01",
        cwd=str(tmp_path),
        budget=Budget(cost_usd=0.025),
    )
    events = run(SdkBrain(cli_path=str(FAKE_CLAUDE), capabilities=host), turn)
    [(limit, turns, usd, reason)] = host.asked
    assert (limit, turns) == ("cost_usd", 3) and usd == pytest.approx(0.03)
    assert "Reached maximum budget ($0.025)" in reason
    assert isinstance(events[-1], DoneEvent), events[-1]
    assert [c.usd for c in events if isinstance(c, CostEvent)] == [
        pytest.approx(0.03),
        pytest.approx(0.04),
    ]
    _, second = argvs(fake_log)
    assert option(second, "--max-budget-usd") == "0.02"


def test_a_refused_extension_ends_the_turn_with_the_cli_error_and_why(
    tmp_path: Path, fake_log: Path
) -> None:
    host = Host({"granted": False, "message": "not approved: no answer within 5s"})
    turn = Turn(engine="sdk", prompt="turns: 5", cwd=str(tmp_path), budget=Budget(turns=2))
    events = run(SdkBrain(cli_path=str(FAKE_CLAUDE), capabilities=host), turn)
    error = events[-1]
    assert isinstance(error, ErrorEvent) and error.code == "budget"
    assert "Reached maximum number of turns (2)" in error.message
    assert "turn budget was not extended: not approved: no answer within 5s" in error.message
    assert outputs(events) == ["turn 1 of 5", "turn 2 of 5"]
    assert len(argvs(fake_log)) == 1  # no second CLI
    # The conversation so far is the session's, for its next run to resume within what
    # is left (the error carries no session id).
    checkpoint = events[-2]
    assert isinstance(checkpoint, CheckpointEvent) and checkpoint.session_id, events[-3:]


def test_without_a_host_to_ask_the_turn_ends_saying_so(tmp_path: Path, fake_log: Path) -> None:
    turn = Turn(engine="sdk", prompt="turns: 4", cwd=str(tmp_path), budget=Budget(turns=1))
    events = run(SdkBrain(cli_path=str(FAKE_CLAUDE)), turn)
    error = events[-1]
    assert isinstance(error, ErrorEvent) and error.code == "budget"
    assert "this run takes no mid-run requests" in error.message


def test_a_task_within_its_budget_is_untouched(tmp_path: Path, fake_log: Path) -> None:
    host = Host()
    turn = Turn(engine="sdk", prompt="turns: 2", cwd=str(tmp_path), budget=Budget(turns=3))
    events = run(SdkBrain(cli_path=str(FAKE_CLAUDE), capabilities=host), turn)
    assert host.asked == [] and isinstance(events[-1], DoneEvent)
    assert events[-1].result == "Finished all 2 turns."


# --- the host decides ---------------------------------------------------------------------


def _midrun(tmp_path: Path, outcome: str, *documents: dict[str, Any], **budget: Any) -> Any:
    from apply_helpers import make_project, manifest_set, write_task
    from test_midrun_units import StubAsker

    from kagura_agent.apply.midrun.amend import Amender
    from kagura_agent.apply.midrun.grants import GrantTerms, MidRun
    from kagura_agent.apply.records.live import LiveView
    from kagura_agent.clock import SystemClock
    from kagura_agent.membrane.secrets import Redactor
    from kagura_agent.plan.build import compile_tasks
    from kagura_agent.state import open_store

    folder = manifest_set(tmp_path, *documents)
    project = make_project(tmp_path)
    task = write_task(project, "t", {"brain": "script", "steps": ["true"], "budget": budget})
    [c] = compile_tasks(str(folder), [str(task)])
    asker = StubAsker(outcome)
    live = LiveView(Redactor(), stream=__import__("io").StringIO(), as_json=True)
    store = open_store()
    midrun = MidRun(
        store=store,
        run_id="run-budget",
        live=live,
        clock=SystemClock(),
        terms=GrantTerms(asker=asker, amender=Amender(c, c.plan), timeout=30),
    )
    return midrun, asker, store


CEILING = {"kind": "Policy", "metadata": {"name": "cap"}, "spec": {"ceilings": {"turns": 5}}}


@pytest.mark.usefixtures("without_docker")
def test_the_host_doubles_a_turn_budget_to_the_ceiling_then_refuses(
    tmp_path: Path, state_dir: Path
) -> None:
    from kagura_agent.apply.midrun.grants import amendments

    midrun, asker, store = _midrun(tmp_path, "approved", CEILING, turns=3)
    # The engine says 2 turns; the host counted 3 from the events: the host's count wins.
    midrun.counted(3, 0.03)
    answer = asyncio.run(midrun.extend_budget("turns", 2, 0.01, "Reached maximum turns (3)"))
    assert answer["granted"] and answer["turns"] == 2 and answer["cost_usd"] is None  # no $ limit
    [question] = asker.asked
    assert question.category == "budget:turns"
    assert "ran out of its turn budget (3 turns; Reached maximum turns (3))" in question.text
    assert "Extend it to 5 turns?" in question.text  # 6 asked, cut to the ceiling
    assert "~ budget turns 3 → 5" in question.text
    assert midrun.plan["budget"]["turns"] == 5 and midrun.past_budget() is None
    midrun.counted(5, 0.05)
    assert midrun.past_budget() == "5 turns spent of a 5-turn budget"
    again = asyncio.run(midrun.extend_budget("turns", 5, 0.05, "Reached maximum turns (2)"))
    assert not again["granted"] and "at its ceiling 5" in again["message"]
    assert len(asker.asked) == 1  # the refusal asked nobody
    rows = amendments(store, "run-budget")
    assert [(r["category"], r["outcome"]) for r in rows] == [
        ("budget:turns", "granted"),
        ("", "refused"),
    ]
    assert rows[0]["fingerprint"] == question.fingerprint
    store.close()


@pytest.mark.usefixtures("without_docker")
def test_the_host_extends_a_dollar_budget_and_silence_refuses(
    tmp_path: Path, state_dir: Path
) -> None:
    from kagura_agent.approvals import history

    midrun, asker, store = _midrun(tmp_path, "approved", cost_usd=0.05)
    answer = asyncio.run(midrun.extend_budget("cost_usd", 4, 0.06, "Reached maximum budget"))
    assert answer["granted"] and answer["cost_usd"] == pytest.approx(0.04)
    assert "Extend it to $0.1?" in asker.asked[0].text
    assert midrun.plan["budget"]["cost_usd"] == pytest.approx(0.1)
    store.close()
    silent, asker, store = _midrun(tmp_path / "b", "timeout", cost_usd=0.05)
    answer = asyncio.run(silent.extend_budget("cost_usd", 4, 0.05, "Reached maximum budget"))
    assert not answer["granted"] and answer["message"].startswith("not approved")
    assert silent.plan["budget"]["cost_usd"] == pytest.approx(0.05)
    outcomes = [(d.category, d.outcome) for d in history(store)]
    assert ("budget:cost_usd", "timeout") in outcomes and len(outcomes) == 2, outcomes
    store.close()


@pytest.mark.usefixtures("without_docker")
def test_a_budget_the_run_does_not_have_is_refused(tmp_path: Path, state_dir: Path) -> None:
    midrun, asker, store = _midrun(tmp_path, "approved", turns=3)
    answer = asyncio.run(midrun.extend_budget("cost_usd", 3, 1.0, "Reached maximum budget"))
    assert not answer["granted"] and "no dollar budget" in answer["message"]
    answer = asyncio.run(midrun.extend_budget("tokens", 3, 1.0, "?"))
    assert not answer["granted"] and asker.asked == []
    store.close()
