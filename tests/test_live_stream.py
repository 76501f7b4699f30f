"""The live view streams a step's output line by line, with real phases and timings.

Before: a step's output appeared only when the step ended (12 s of ticks at once, on the
terminal and never in ``serve``); ``serve status`` said "starting container" 26 s into a
run; a killed session said "killed in 0.0s"; ``queue follow`` printed ``brain: tool_call``
without the command and raw JSON for egress and end events; a mid-run budget question on
a 30 s budget gave the operator 8 s to answer.
"""

from __future__ import annotations

import json
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from apply_helpers import REPO, cli_env, last_json, make_project, manifest_set
from apply_helpers import write_task as write_task_file

from kagura_agent.apply.midrun.grants import ANSWER_MARGIN, lease_lead, wall_lead
from kagura_agent.apply.records.live import LiveView
from kagura_agent.brain.events import ToolCallEvent, ToolOutputEvent, ToolResultEvent
from kagura_agent.cli.queue import _line
from kagura_agent.cockpit.runner import Feed, Progress, chat_line
from kagura_agent.membrane.secrets import Redactor
from testing.agent_test_image import ensure_agent_test_image

# Three lines a second apart, then the step ends.
TICKS = "for i in 1 2 3; do echo tick $i; sleep 1; done"


def _manifests(tmp_path: Path, image_ref: str) -> Path:
    image = {
        "kind": "Image",
        "metadata": {"name": "agent-test"},
        "spec": {"recipe": "images/agent", "tag": image_ref, "baseline": True},
    }
    return manifest_set(tmp_path, image)


def _spawn(args: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "kagura_agent", *args],
        env=env,
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _timed_lines(stream: Any, proc: subprocess.Popen[str], limit: float) -> list[tuple[float, str]]:
    """Each line of ``stream`` with the moment it arrived, until ``proc`` ends."""
    got: list[tuple[float, str]] = []
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        ready, _, _ = select.select([stream], [], [], 0.5)
        if ready:
            line = stream.readline()
            if not line:
                break
            got.append((time.monotonic(), line.rstrip("\n")))
        elif proc.poll() is not None:
            break
    return got


def test_a_steps_output_reaches_the_terminal_line_by_line(
    docker_client: Any, tmp_path: Path, state_dir: Path
) -> None:
    manifests = _manifests(tmp_path, ensure_agent_test_image(docker_client))
    project = make_project(tmp_path)
    task = write_task_file(project, "ticks", {"image": "agent-test", "steps": [TICKS]})
    proc = _spawn(["apply", "--yes", "--manifests", str(manifests), str(task)], cli_env(state_dir))
    assert proc.stderr is not None
    lines = _timed_lines(proc.stderr, proc, 240)
    assert proc.wait(timeout=60) == 0, "\n".join(line for _, line in lines)
    text = [line for _, line in lines]
    when = {line.split("┃ ", 1)[1]: at for at, line in lines if "┃ tick " in line}
    assert list(when) == ["tick 1", "tick 2", "tick 3"], text
    [(ended, summary)] = [(at, line) for at, line in lines if "exit 0 (" in line]
    # Each line as it came: the first two well before the step ended, a second apart.
    assert ended - when["tick 1"] > 1.5 and ended - when["tick 2"] > 0.5, (when, ended)
    assert "(3 lines, shown above)" in summary
    phases = [line for line in text if "●" in line]
    started = next(i for i, line in enumerate(phases) if "starting container" in line)
    assert "brain script (script) running" in phases[started + 1], phases


def test_apply_json_streams_the_output_before_the_result_and_serve_relays_it(
    docker_client: Any, tmp_path: Path, state_dir: Path
) -> None:
    """serve relays what ``apply --json`` streams: the tool_output events, as they come,
    become framed lines of the agent's in the thread."""
    manifests = _manifests(tmp_path, ensure_agent_test_image(docker_client))
    project = make_project(tmp_path)
    task = write_task_file(project, "ticks", {"image": "agent-test", "steps": [TICKS]})
    args = ["apply", "--yes", "--json", "--manifests", str(manifests), str(task)]
    proc = _spawn(args, cli_env(state_dir))
    assert proc.stderr is not None
    lines = _timed_lines(proc.stderr, proc, 240)
    assert proc.wait(timeout=60) == 0
    events = [(at, json.loads(line)) for at, line in lines if line.startswith("{")]
    brain = [(at, e) for at, e in events if e.get("kind") == "brain"]
    outputs = [(at, e) for at, e in brain if e["type"] == "tool_output"]
    [(result_at, _)] = [(at, e) for at, e in brain if e["type"] == "tool_result"]
    assert [e["text"] for _, e in outputs] == ["tick 1\n", "tick 2\n", "tick 3\n"]
    assert result_at - outputs[0][0] > 1.5
    said = chat_line(json.dumps(outputs[0][1]))
    assert said is not None and said.endswith("tick 1") and said.startswith("┃")


def test_a_killed_run_says_how_long_it_ran(
    docker_client: Any, tmp_path: Path, state_dir: Path
) -> None:
    manifests = _manifests(tmp_path, ensure_agent_test_image(docker_client))
    project = make_project(tmp_path)
    task = write_task_file(project, "long", {"image": "agent-test", "steps": ["sleep 120"]})
    args = ["apply", "--yes", "--json", "--manifests", str(manifests), str(task)]
    proc = _spawn(args, cli_env(state_dir))
    assert proc.stderr is not None
    started = time.monotonic()
    deadline = started + 180
    while time.monotonic() < deadline and '"tool_call"' not in proc.stderr.readline():
        assert proc.poll() is None
    time.sleep(2)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130
    result = last_json(out)
    assert result["outcome"] == "interrupted"
    assert 2.0 < result["wall_seconds"] <= time.monotonic() - started, result


def test_the_live_view_shows_streamed_lines_once() -> None:
    import io

    out = io.StringIO()
    view = LiveView(Redactor(), stream=out)
    view.brain(ToolCallEvent(id="s1", name="bash", input={"argv": ["bash", "-c", "make"]}))
    view.brain(ToolOutputEvent(id="s1", text="compiling\n"))
    view.brain(ToolOutputEvent(id="s1", text="linking\n"))
    view.brain(ToolResultEvent(id="s1", output="compiling\nlinking", exit_code=0))
    shown = out.getvalue()
    assert shown.count("compiling") == 1 and shown.count("linking") == 1, shown
    assert "exit 0 (2 lines, shown above)" in shown


def test_serve_status_says_what_the_run_does_now_and_since_when() -> None:
    progress = Progress()
    feed = Feed(relay=_Relay(), progress=progress, session_id="s-1")
    feed.line(json.dumps({"kind": "phase", "message": "starting container from kagura/agent"}))
    feed.line(
        json.dumps(
            {
                "kind": "brain",
                "type": "tool_call",
                "id": "step-1",
                "name": "bash",
                "input": {"argv": ["bash", "-c", "make test"]},
            }
        )
    )
    assert progress.phase == "running bash: make test"
    assert time.monotonic() - progress.since < 5


class _Relay:
    def __init__(self) -> None:
        self.said: list[str] = []

    def add(self, text: str) -> None:
        self.said.append(text)

    def fits(self, text: str) -> bool:
        return True

    def attach(self, name: str, content: str, line: str) -> None:
        self.said.append(line)


def test_queue_follow_shows_items_in_words() -> None:
    import io

    out = io.StringIO()
    view = LiveView(Redactor(), stream=out)
    call = {
        "kind": "brain",
        "type": "tool_call",
        "id": "step-1",
        "name": "bash",
        "input": {"argv": ["bash", "-c", "pytest -q"]},
        "at": "2026-12-07T10:00:01+00:00",
    }
    assert view.replay(call, 1.0)
    egress = {
        "kind": "egress",
        "decision": "deny",
        "host": "evil.test",
        "port": 443,
        "reason": "host-not-listed",
        "entry": None,
    }
    assert view.replay(egress, 2.0)
    shown = out.getvalue()
    assert "▸ bash: pytest -q" in shown and "   1.0s" in shown
    assert "⊘ egress denied evil.test:443 (host-not-listed)" in shown
    assert "{" not in shown
    end = {"kind": "end", "status": "succeeded", "exit_code": 0, "message": ""}
    assert not view.replay(end)
    assert _line(end) == "  ended succeeded (exit 0)"
    assert "{" not in _line({"kind": "runner", "runner": "r1"})


def test_an_allowed_host_whose_upstream_failed_is_not_shown_as_denied() -> None:
    import io

    out = io.StringIO()
    view = LiveView(Redactor(), stream=out)
    view.egress(
        {
            "decision": "deny",
            "host": "api.github.com",
            "port": 443,
            "reason": "not-forwarded",
            "entry": "api.github.com:443 (github)",
        }
    )
    shown = out.getvalue()
    assert "egress denied" not in shown
    assert "egress to api.github.com:443 allowed (api.github.com:443 (github))" in shown
    assert "no upstream answered" in shown


def test_a_budget_question_leaves_the_operator_the_answer_floor() -> None:
    # A 30 s wall budget was asked about 10 s before its end: 8 s to answer.
    assert wall_lead(30, 30.0) == 30 and wall_lead(30, 30.0) - ANSWER_MARGIN >= 28
    assert wall_lead(3600, 30.0) == 300  # a long budget: asked 5 min ahead as before
    assert wall_lead(90, 60.0) == 62  # the knob: --answer-floor 60
    assert lease_lead(60, 30.0) == 32 and lease_lead(7200, 30.0) == 120


def test_the_answer_floor_is_a_knob(tmp_path: Path, state_dir: Path) -> None:
    env = cli_env(state_dir)
    done = subprocess.run(
        [sys.executable, "-m", "kagura_agent", "apply", "--answer-floor", "0", "x.yml"],
        env={**env, "DOCKER_HOST": "unix:///nonexistent"},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "--answer-floor" in done.stderr
    assert (
        "--answer-floor"
        in subprocess.run(
            [sys.executable, "-m", "kagura_agent", "apply", "--help"],
            env=env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout
    )
