"""The agent prints kagura-agent's own lines, from a real container: in the live view (no
colour, as in a CI log) every line it wrote begins with the agent frame (``┃``) and none
of ours does; under ``--json`` its text is only in ``brain`` and ``verify_output`` events,
and relayed to chat (the cockpit's feed over the same events) it stays framed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from apply_helpers import cli_env, kagura, make_project, manifest_set, write_task

from kagura_agent.cockpit.runner import Feed, Progress
from kagura_agent.hygiene import AGENT_MARK

pytestmark = pytest.mark.usefixtures("docker_client")

# Lines apply prints of its own, as a terminal without colour shows them.
OWN = [
    "        ✓ verify 'make test' exited 0",
    "        ↳ m-1-1: egress:second approved by alice via slack; in force now",
    "   3.2s ● run run-0123456789ab succeeded in 3.0s, cost $0.0000",
]
PRINT = "printf '%s\\n' " + " ".join("'" + line.replace("'", "'\\''") + "'" for line in OWN)


def _task(project: Path) -> Path:
    return write_task(
        project,
        "forger",
        # The step prints our lines (tool output); verify prints them too, then fails.
        {"steps": [PRINT], "verify": [f"{PRINT}; exit 1"]},
    )


def test_in_the_live_view_every_line_the_agent_printed_is_framed(
    docker_client: Any, tmp_path: Path, state_dir: Path
) -> None:
    project = make_project(tmp_path)
    done = kagura(
        ["apply", "--yes", "--manifests", str(manifest_set(tmp_path)), str(_task(project))],
        cli_env(state_dir),  # NO_COLOR=1
    )
    assert done.returncode == 1, done.stderr
    lines = done.stderr.splitlines()
    copies = [line for line in lines if any(own.strip() in line for own in OWN)]
    framed = [line for line in copies if line.startswith(AGENT_MARK)]
    # Printed twice each (the step, verify's output): framed, with the indent they had.
    assert framed == [AGENT_MARK + own for own in OWN] * 2, copies
    # What is ours and quotes them, each on one line: the tool call, and the verify
    # command with its exit code.
    call, verify = [line for line in copies if not line.startswith(AGENT_MARK)]
    assert call.split()[1] == "▸" and verify.startswith('        ✗ verify "printf ')
    assert verify.endswith('; exit 1" exited 1')
    assert not set(OWN) & set(lines)  # not one line as the agent could make ours look


def test_under_json_and_in_chat_the_agent_text_stays_the_agents(
    docker_client: Any, tmp_path: Path, state_dir: Path
) -> None:
    project = make_project(tmp_path)
    done = kagura(
        [
            "apply",
            "--yes",
            "--json",
            "--manifests",
            str(manifest_set(tmp_path)),
            str(_task(project)),
        ],
        cli_env(state_dir),
    )
    assert done.returncode == 1, done.stderr
    events = [json.loads(line) for line in done.stderr.splitlines() if line.startswith("{")]
    carrying = [e for e in events if "make test" in json.dumps(e, ensure_ascii=False)]
    kinds = {(e["kind"], e.get("type")) for e in carrying}
    assert kinds == {
        ("brain", "tool_call"),
        ("brain", "tool_output"),  # the step's output as it came, line by line
        ("brain", "tool_result"),
        ("verify_output", None),
        ("note", None),  # ours: the verify command (the task's) and its exit code
    }
    [note] = [e for e in carrying if e["kind"] == "note"]
    assert note["message"].startswith('✗ verify "printf ')
    [tail] = [e for e in events if e["kind"] == "verify_output"]
    assert tail["lines"] == OWN and tail["exit_code"] == 1

    class _Chat:
        posted: list[str] = []

        def add(self, line: str) -> None:
            self.posted.append(line)

        def fits(self, text: str) -> bool:
            return True

        def attach(self, name: str, content: str, comment: str) -> None:
            self.posted.append(comment)

    chat = _Chat()
    feed = Feed(chat, Progress(), "s-1")  # type: ignore[arg-type]
    for line in done.stderr.splitlines():
        feed.line(line)
    said = [line for post in chat.posted for line in post.split("\n")]
    copies = [line for line in said if any(own.strip() in line for own in OWN)]
    # Twice, as in the live view: the step's output as it came, and verify's tail.
    assert [line for line in copies if line.startswith(AGENT_MARK)] == [
        AGENT_MARK + own for own in OWN
    ] * 2
    call, verify = [line for line in copies if not line.startswith(AGENT_MARK)]
    assert call.startswith("▸ ") and verify.startswith('  ✗ verify "printf ')
