"""Brain conformance on the real Claude Code CLI: sessions, budgets, steering, kill.

Mirrors test_run_repl (a named session resumed by a later apply), test_midrun_budget
(turn and dollar budgets that run out and are extended), the cockpit's steering
(test_cockpit::test_a_reply_in_a_running_sessions_thread_reaches_its_brain_mid_run) and
test_apply_signals (a killed apply leaves nothing) with the CLI claude-agent-sdk bundles
(tests/conformance.py).
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from apply_helpers import leftovers, live_leases, run_ids, run_row, wait_for_container, write_task
from conformance import (
    BYPASS,
    agent_calls,
    apply,
    apply_argv,
    bash,
    brain,
    brain_events,
    dump,
    env,
    launch,
    model,
    task,
)
from test_midrun_apply import Operator, finish

from kagura_agent.apply.midrun.grants import amendments
from kagura_agent.state import StateStore
from testing.agent_test_image import ensure_agent_test_image
from testing.egress_images import ensure_egress_images

pytestmark = [pytest.mark.usefixtures("docker_client"), pytest.mark.conformance]


@pytest.fixture(scope="module")
def images(docker_client: Any) -> tuple[str, str]:
    real = ensure_agent_test_image(docker_client, real_cli=True)
    return real, ensure_egress_images(docker_client)["base"]


RESUME_SCRIPT = {
    "conversations": [
        {
            "match": "TASK-RESUME",
            "turns": [
                {
                    "tools": [
                        {
                            "name": "Write",
                            "input": {"file_path": "/workspace/first.txt", "content": "one\n"},
                        }
                    ]
                },
                {"text": "first part done"},
                {"text": "resumed; you said: {last_user}"},
            ],
        }
    ]
}


def test_a_named_session_is_resumed_by_the_next_apply(
    docker_client: Any, images: tuple[str, str], tmp_path: Path, state_dir: Path
) -> None:
    """test_run_repl::test_repl_continues_one_session on the real CLI: the second apply of
    a task naming the same session gives the CLI the first one's session id, and the model
    sees the whole conversation again."""
    real, base = images
    with model(docker_client, base, RESUME_SCRIPT) as fake:
        spec = {"prompt": "TASK-RESUME: start", "session": "talk"}
        folder, task_file, project = task(tmp_path, real, spec)
        code, first, lines, err = apply(apply_argv(folder, task_file), env(state_dir, fake))
        assert code == 0, err[-5000:]
        assert brain_events(lines)[-1]["result"] == "first part done"
        write_task(project, "conformance", {**_spec(real), **spec, "prompt": "and now the rest"})
        code, second, lines, err = apply(apply_argv(folder, task_file), env(state_dir, fake))
        calls = agent_calls(fake)
    assert code == 0, err[-5000:]
    assert "resuming session 'talk'" in err, err[-3000:]
    assert second["brain_session_id"] == first["brain_session_id"]
    done = brain_events(lines)[-1]
    assert done["type"] == "done" and done["result"].startswith("resumed; you said:"), dump(done)
    assert "and now the rest" in done["result"]
    # The second run's first call carried the first run's conversation.
    assert [c["turn"]["index"] for c in calls] == [0, 1, 2]
    history = calls[2]["body"]["messages"]
    assert "TASK-RESUME: start" in str(history[0]) and "first part done" in str(history)


def _spec(image: str) -> dict[str, Any]:
    return {"image": "agent-real", "brain": "claude", "egress": ["anthropic"]}


def _rows(state_dir: Path) -> list[dict[str, Any]]:
    [run_id] = run_ids(state_dir)
    with StateStore(state_dir / "state.db") as store:
        return amendments(store, run_id)


TURNS_SCRIPT = {
    "conversations": [
        {
            "match": "TASK-TURNS",
            "turns": [
                bash("echo turn 1 of 3"),
                bash("echo turn 2 of 3"),
                bash("echo turn 3 of 3"),
                {"text": "Finished all 3 turns"},
            ],
        }
    ]
}


def test_a_turn_budget_stops_the_cli_and_an_extension_goes_on_in_the_same_session(
    docker_client: Any, images: tuple[str, str], tmp_path: Path, state_dir: Path
) -> None:
    """test_midrun_budget's turn budget on the real CLI: 3 tool turns and an answer on a
    2-turn budget. The CLI stops itself after 2 (error_max_turns, saying 3: it counts the
    turn it refused), the operator extends to 4, and a new CLI resumes the session with
    the 2 turns left, once (before: 1 left, so a second stop and a second question).

    The CLI runs the tool calls of the last turn its --max-turns allows, then stops: those
    are that turn's own, whether the proxy's log line of the call reaches the host before
    the tool call or after it (apply/midrun/grants.py past_budget stops a tool call only past the
    budget). Before, with the log line first, the run failed ("went on past its budget")
    where the operator would have been asked: 2 runs in 5."""
    real, base = images
    with model(docker_client, base, TURNS_SCRIPT) as fake:
        spec = {"prompt": "TASK-TURNS", "budget": {"turns": 2}}
        folder, task_file, _ = task(tmp_path, real, spec)
        proc = launch(folder, task_file, env(state_dir, fake))
        operator = Operator(proc, state_dir, lambda ask: "approve")
        result = finish(proc, operator)
        calls = agent_calls(fake)
    err = "".join(operator.raw)
    assert result.get("outcome") == "success", err[-5000:]
    [ask] = operator.asks
    assert ask["category"] == "budget:turns"
    assert "The brain ran out of its turn budget (2 turns;" in ask["text"], ask["text"]
    assert (
        "Reached maximum number of turns (2)" in ask["text"]
        and "Extend it to 4 turns?" in ask["text"]
    )
    assert operator.outputs() == [f"turn {k} of 3" for k in (1, 2, 3)]
    assert brain_events(operator.lines)[-1]["result"] == "Finished all 3 turns"
    # Two calls, then the resumed session's two: its history intact (every tool_use
    # answered, or the fake would have refused it with a 400) and the continuation asked.
    assert [c["turn"]["index"] for c in calls] == [0, 1, 2, 3]
    assert "The operator extended your budget" in json.dumps(calls[2]["body"]["messages"][-1])
    assert result["turns"] == 4
    assert [(r["category"], r["outcome"]) for r in _rows(state_dir)] == [
        ("budget:turns", "granted")
    ]


# What a turn costs on claude-sonnet-4-5 ($3 per million input tokens): $0.03.
COSTLY = {"usage": {"input_tokens": 10_000, "output_tokens": 1}}
USD_SCRIPT = {
    "conversations": [
        {
            "match": "TASK-USD",
            "turns": [
                bash("echo spent 1", **COSTLY),
                bash("echo spent 2", **COSTLY),  # past $0.05: the CLI stops before running it
                bash("echo spent 2 again", **COSTLY),
                {"text": "paid up"},
            ],
        }
    ]
}


def test_a_dollar_budget_stops_the_cli_and_an_extension_goes_on(
    docker_client: Any, images: tuple[str, str], tmp_path: Path, state_dir: Path
) -> None:
    """test_midrun_budget::test_a_dollar_budget_extended_by_the_cockpit on the real CLI.

    The CLI prices the fake's usage itself ($0.03 a turn) and stops once past $0.05, with
    the second tool call not run; approved, the extension to $0.10 resumes the session in a
    new CLI, which tells the model that call was interrupted. That CLI reports the session's
    cost (what it cost before the resume and its own), so the run costs what the model
    was paid for, not the first part twice."""
    real, base = images
    with model(docker_client, base, USD_SCRIPT) as fake:
        spec = {"prompt": "TASK-USD", "budget": {"cost_usd": 0.05}}
        folder, task_file, _ = task(tmp_path, real, spec)
        proc = launch(folder, task_file, env(state_dir, fake))
        operator = Operator(proc, state_dir, lambda ask: "approve")
        result = finish(proc, operator)
        calls = agent_calls(fake)
    err = "".join(operator.raw)
    assert result.get("outcome") == "success", err[-5000:]
    [ask] = operator.asks
    assert ask["category"] == "budget:cost_usd"
    assert "The brain ran out of its dollar budget ($0.05;" in ask["text"], ask["text"]
    assert "Reached maximum budget ($0.05)" in ask["text"], ask["text"]
    assert "Extend it to $0.1?" in ask["text"], ask["text"]
    assert operator.outputs() == ["spent 1", "spent 2 again"]
    assert brain_events(operator.lines)[-1]["result"] == "paid up"
    assert [c["turn"]["index"] for c in calls] == [0, 1, 2, 3]
    resumed = json.dumps(calls[2]["body"]["messages"][-3:])
    assert "interrupted" in resumed and "The operator extended your budget" in resumed
    # Three turns at $0.03 and two cheap answers (the CLI's own pricing of the fake's usage).
    assert result["cost_usd"] == pytest.approx(0.09, abs=0.002), result
    costs = [e["usd"] for e in brain_events(operator.lines) if e["type"] == "cost"]
    assert costs[0] == pytest.approx(0.06, abs=0.001) and costs[-1] == result["cost_usd"]
    rows = [(r["category"], r["outcome"]) for r in _rows(state_dir)]
    assert rows == [("budget:cost_usd", "granted")]


STEER_SCRIPT = {
    "conversations": [
        {
            "match": "TASK-STEER",
            "turns": [
                bash(
                    "for i in $(seq 300); do test -e steered && break; sleep 0.1; done; echo worked"
                ),
                {"text": "Ran the command."},
            ],
        }
    ]
}


def test_a_message_steered_in_mid_run_reaches_the_cli_within_its_running_turn(
    docker_client: Any, images: tuple[str, str], tmp_path: Path, state_dir: Path
) -> None:
    """The cockpit's steering on the real CLI: a line on apply's stdin while the CLI runs a
    tool reaches the model with that tool's result (the CLI's "the user sent a new message
    while you were working"), and the one result of the turn answers both messages: the
    run ends there (before: the engine waited for a second result until its idle timeout)."""
    real, base = images
    with model(docker_client, base, STEER_SCRIPT) as fake:
        spec = {"prompt": "TASK-STEER", "brain": BYPASS}
        folder, task_file, project = task(tmp_path, real, spec, brain("bypassPermissions"))
        proc = launch(folder, task_file, env(state_dir, fake))
        operator = Operator(proc, state_dir, lambda ask: "approve")
        deadline = time.monotonic() + 120
        while not any(e.get("type") == "tool_call" for e in brain_events(operator.lines)):
            assert proc.poll() is None and time.monotonic() < deadline, "".join(operator.raw)
            time.sleep(0.05)
        assert proc.stdin is not None
        proc.stdin.write(json.dumps({"text": "also say hello"}) + "\n")
        proc.stdin.flush()
        while not any("message 1 reached" in str(n) for n in operator.notes()):
            assert proc.poll() is None and time.monotonic() < deadline, "".join(operator.raw)
            time.sleep(0.05)
        time.sleep(1)  # the CLI has it queued; now let the tool call end
        (project / "steered").write_text("go\n")
        result = finish(proc, operator)
        calls = agent_calls(fake)
    err = "".join(operator.raw)
    assert result.get("outcome") == "success", err[-5000:]
    assert result["wall_seconds"] < 120, result
    [tool_result] = [e for e in brain_events(operator.lines) if e["type"] == "tool_result"]
    assert tool_result["output"].startswith("worked"), tool_result
    # The model got it with the tool's result, in the same turn, and answered once.
    assert [c["turn"]["index"] for c in calls] == [0, 1]
    assert "also say hello" in json.dumps(calls[1]["body"]["messages"][-1])
    assert brain_events(operator.lines)[-1]["result"] == "Ran the command."


HANG_SCRIPT = {
    "conversations": [
        {
            "match": "TASK-HANG",
            "turns": [bash("echo started > started.txt"), {"text": "never", "hang": True}],
        }
    ]
}


@pytest.mark.parametrize(
    ("signum", "exit_code", "outcome"),
    [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")],
)
def test_a_kill_while_the_cli_waits_on_the_model_cleans_up(
    docker_client: Any,
    images: tuple[str, str],
    tmp_path: Path,
    state_dir: Path,
    signum: signal.Signals,
    exit_code: int,
    outcome: str,
) -> None:
    """test_apply_signals::test_signal_mid_run_cleans_up on the real CLI, stopped while its
    model stream is open (the fake holds it, pinging): nothing of the run is left."""
    real, base = images
    with model(docker_client, base, HANG_SCRIPT) as fake:
        folder, task_file, project = task(tmp_path, real, {"prompt": "TASK-HANG"})
        environment = env(state_dir, fake)
        proc = launch(folder, task_file, environment)
        operator = Operator(proc, state_dir, lambda ask: "silence")
        deadline = time.monotonic() + 120
        while len(agent_calls(fake)) < 2:  # the second call is the one held open
            assert proc.poll() is None and time.monotonic() < deadline, "".join(operator.raw)
            time.sleep(0.2)
        [run_id] = run_ids(state_dir)
        wait_for_container(docker_client, run_id)
        proc.send_signal(signum)
        assert proc.stdout is not None
        proc.stdout.read()
        proc.wait(90)
        operator.thread.join(10)
    assert proc.returncode == exit_code, "".join(operator.raw)[-5000:]
    assert (project / "started.txt").exists()
    assert leftovers(docker_client, run_id) == []
    assert live_leases(environment) == []
    assert run_row(state_dir, run_id)["outcome"] == outcome
