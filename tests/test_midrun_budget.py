"""Turn and dollar budgets extended mid-run, through ``kagura-agent apply`` in real
containers, the fake claude CLI driving the sdk engine and keeping its limits as the real
CLI does (a query that runs out ends ``error_max_turns`` / ``error_max_budget_usd``).

The engine asks the host; apply asks the operator (the terminal, or the cockpit — played
here by the test, as in test_midrun_apply), bounded by the Policy ceilings; on approval
the same session carries on in the same container. Silence stops the run with the reason;
past the ceiling nobody is asked. Everything is in run_amendments and the approval log.
"""

from __future__ import annotations

import json
import os
import pty
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from apply_helpers import REPO, cli_env, leftovers, make_project, manifest_set, run_ids, write_task
from test_midrun_apply import API_KEY, Decide, Operator, finish

from kagura_agent.apply.midrun.grants import amendments
from kagura_agent.approvals import history
from kagura_agent.state import StateStore, open_store
from testing.agent_test_image import ensure_agent_test_image

pytestmark = pytest.mark.usefixtures("docker_client")


@pytest.fixture(scope="module")
def agent_image(docker_client: Any) -> str:
    return ensure_agent_test_image(docker_client)


def _task(
    tmp_path: Path, image: str, prompt: str, budget: dict[str, Any], *extra: Any
) -> tuple[Path, Path]:
    folder = manifest_set(
        tmp_path,
        {
            "kind": "Image",
            "metadata": {"name": "agent-test"},
            "spec": {"recipe": "images/agent", "tag": image, "baseline": True},
        },
        *extra,
    )
    project = make_project(tmp_path)
    spec = {"image": "agent-test", "brain": "claude", "prompt": prompt, "budget": budget}
    task = write_task(project, "budgeted", {**spec, "egress": ["anthropic"]})
    return folder, task


def launch(
    tmp_path: Path,
    state_dir: Path,
    image: str,
    prompt: str,
    decide: Decide,
    budget: dict[str, Any],
    *extra: Any,
    approval_timeout: float = 60,
) -> tuple[subprocess.Popen[str], Operator]:
    """apply as serve runs it (--steer-stdin): the test answers each ask like the cockpit."""
    folder, task = _task(tmp_path, image, prompt, budget, *extra)
    argv = [sys.executable, "-m", "kagura_agent", "apply", "--yes", "--json", "--steer-stdin"]
    argv += ["--approval-timeout", str(approval_timeout), "--manifests", str(folder), str(task)]
    proc = subprocess.Popen(
        argv,
        env=cli_env(state_dir, ANTHROPIC_API_KEY=API_KEY),
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    return proc, Operator(proc, state_dir, decide)


def records(state_dir: Path) -> list[dict[str, Any]]:
    [run_id] = run_ids(state_dir)
    with StateStore(state_dir / "state.db") as store:
        return amendments(store, run_id)


def test_a_turn_budget_extended_at_the_terminal_and_the_same_session_finishes(
    docker_client: Any, agent_image: str, tmp_path: Path, state_dir: Path
) -> None:
    """Plain apply on a terminal: the question is asked there and answered ``y``."""
    # 3 Bash turns and the answer: 4 turns, on a 2-turn budget.
    folder, task = _task(tmp_path, agent_image, "turns: 3", {"turns": 2})
    argv = [sys.executable, "-m", "kagura_agent", "apply", "--yes", "--json"]
    argv += ["--approval-timeout", "60", "--manifests", str(folder), str(task)]
    leader, follower = pty.openpty()  # apply asks mid-run only on a terminal
    chunks: list[bytes] = []
    try:
        proc = subprocess.Popen(
            argv,
            env=cli_env(state_dir, ANTHROPIC_API_KEY=API_KEY),
            cwd=REPO,
            stdin=follower,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )

        def read() -> None:  # raw: the prompt ends without a newline
            assert proc.stderr is not None
            while chunk := os.read(proc.stderr.fileno(), 65536):
                chunks.append(chunk)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        deadline = time.monotonic() + 240
        while b"[y/N]" not in b"".join(chunks):
            assert proc.poll() is None, b"".join(chunks).decode()
            assert time.monotonic() < deadline, b"".join(chunks).decode()
            time.sleep(0.05)
        os.write(leader, b"y\n")
        assert proc.stdout is not None
        result = json.loads(proc.stdout.read())
        proc.wait(60)
        reader.join(10)
    finally:
        os.close(leader)
        os.close(follower)
    lines = b"".join(chunks).decode().splitlines(keepends=True)
    err = "".join(lines)
    assert result["outcome"] == "success", err
    assert "The brain ran out of its turn budget (2 turns;" in err, err
    assert "Extend it to 4 turns? Silence stops the run." in err and "~ budget turns 2 → 4" in err
    assert "turn budget extended to 4 turns (approved by" in err and "via cli" in err, err
    outputs = [json.loads(x) for x in lines if x.startswith("{")]
    results = [o for o in outputs if o.get("kind") == "brain" and o.get("type") == "tool_result"]
    assert [str(o.get("output", "")).strip() for o in results] == [
        f"turn {k} of 3" for k in range(1, 4)
    ]
    done = [o for o in outputs if o.get("kind") == "brain" and o.get("type") == "done"]
    assert "Finished all 3 turns (resumed " in str(done[-1].get("result")), done
    [row] = records(state_dir)
    assert (row["category"], row["kind"], row["name"], row["outcome"]) == (
        "budget:turns",
        "budget",
        "turns",
        "granted",
    )
    with StateStore(state_dir / "state.db") as store:
        decided = [d for d in history(store) if d.fingerprint == row["fingerprint"]]
    assert [(d.outcome, d.via) for d in decided] == [("approved", "cli")]
    # One container for the whole run: the same session went on inside it.
    [run_id] = run_ids(state_dir)
    assert leftovers(docker_client, run_id) == []


def test_a_dollar_budget_extended_by_the_cockpit(
    docker_client: Any, agent_image: str, tmp_path: Path, state_dir: Path
) -> None:
    prompt = "turns: 3\nturn cost: 0.01"
    proc, operator = launch(
        tmp_path, state_dir, agent_image, prompt, lambda ask: "approve", {"cost_usd": 0.025}
    )
    result = finish(proc, operator)
    err = "".join(operator.raw)
    assert result.get("outcome") == "success", err
    [ask] = operator.asks
    assert ask["category"] == "budget:cost_usd"
    assert "The brain ran out of its dollar budget ($0.025;" in ask["text"], ask["text"]
    assert "Reached maximum budget ($0.025)" in ask["text"] and "Extend it to $0.05?" in ask["text"]
    assert "dollar budget extended to $0.05 (approved by test:operator via test)" in err
    assert result.get("cost_usd") == pytest.approx(0.04), result  # 3 + 1 turns, $0.01 each
    [row] = records(state_dir)
    assert (row["category"], row["outcome"]) == ("budget:cost_usd", "granted")
    assert row["fingerprint"] == ask["fingerprint"]


def test_an_unanswered_turn_extension_stops_the_run_saying_why(
    agent_image: str, tmp_path: Path, state_dir: Path
) -> None:
    proc, operator = launch(
        tmp_path,
        state_dir,
        agent_image,
        "turns: 4",
        lambda ask: "silence",
        {"turns": 2},
        approval_timeout=5,
    )
    result = finish(proc, operator)
    err = "".join(operator.raw)
    assert result.get("outcome") == "failed", err
    error = str(result.get("brain_error"))
    assert error.startswith("budget: claude reported an error: Reached maximum number of turns (2)")
    assert "the turn budget was not extended: not approved: no answer within 5s" in error, error
    assert "turn 3 of 4" not in err
    [row] = records(state_dir)
    assert (row["category"], row["outcome"]) == ("budget:turns", "timeout")


def test_past_the_ceiling_the_extension_is_capped_then_refused_unasked(
    agent_image: str, tmp_path: Path, state_dir: Path
) -> None:
    ceiling = {"kind": "Policy", "metadata": {"name": "cap"}, "spec": {"ceilings": {"turns": 3}}}
    proc, operator = launch(
        tmp_path, state_dir, agent_image, "turns: 6", lambda ask: "approve", {"turns": 2}, ceiling
    )
    result = finish(proc, operator)
    err = "".join(operator.raw)
    assert result.get("outcome") == "failed", err
    [ask] = operator.asks  # 2 → 4 asked for, cut to the ceiling; the second never asked
    assert "Extend it to 3 turns?" in ask["text"] and "~ budget turns 2 → 3" in ask["text"]
    error = str(result.get("brain_error"))
    assert "not extended: budget turns is at its ceiling 3 (Policy cap (operator))" in error, error
    rows = records(state_dir)
    assert [(r["category"], r["outcome"], r["who"]) for r in rows] == [
        ("budget:turns", "granted", "test:operator"),
        ("", "refused", "manifests"),
    ]
    assert "turn 3 of 6" in err and "turn 4 of 6" not in err


def test_a_turn_budget_extended_from_the_cockpit_under_serve(
    docker_client: Any, tmp_path: Path, state_dir: Path
) -> None:
    """serve on the terminal transport: the question is posted in the session's thread
    with its m-… request; ``approve m-…`` extends it and the run finishes."""
    from chat_helpers import session_world
    from test_cockpit_midrun import Terminal
    from test_cockpit_midrun import _task as cockpit_task

    argv, env, _ = session_world(tmp_path, docker_client, None)
    task = cockpit_task(tmp_path, "budgeted", {"prompt": "turns: 3", "budget": {"turns": 2}})
    serve = subprocess.Popen(
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=REPO,
    )
    term = Terminal(serve)
    try:
        term.until("kagura-agent serve: type `help`")
        mark = len(term.lines)
        term.type_in(f"launch {task}")
        request = term.question(mark)
        term.type_in(f"approve {request}")
        term.until(f"{request} budget:turns approved by terminal:")
        assert "(exit 0)" in term.until("(exit ", since=mark), "".join(term.lines[mark:])
        serve.stdin.close()  # type: ignore[union-attr]
        assert serve.wait(60) == 0
        term._reader.join(10)
    finally:
        if serve.poll() is None:
            serve.kill()
    out = "".join(term.lines)
    for line in documented_transcript():
        pattern = ".*".join(re.escape(part) for part in line.split("…"))
        assert re.search(pattern, out), line
    assert "turn budget extended to 4 turns (approved by terminal:" in out, out
    assert "Finished all 3 turns (resumed " in out, out
    [run_id] = run_ids(state_dir)
    with open_store() as store:
        [row] = amendments(store, run_id)
        decided = [d for d in history(store) if d.fingerprint == row["fingerprint"]]
    assert (row["category"], row["outcome"]) == ("budget:turns", "granted")
    assert [(d.outcome, d.via) for d in decided] == [("approved", "terminal")]
    assert leftovers(docker_client, run_id) == []


def documented_transcript() -> list[str]:
    """docs/cockpit.md's turn-budget transcript (the ``text`` block of "Mid-run
    questions"); … stands for ids, hashes and names."""
    text = (REPO / "docs" / "cockpit.md").read_text(encoding="utf-8")
    section = text.split("## Mid-run questions", 1)[1].split("\n## ", 1)[0]
    [block] = re.findall(r"^```text\n(.*?)^```$", section, re.M | re.S)
    return str(block).rstrip("\n").splitlines()
