"""Inputs never drive the operator's terminal and errors never echo a pasted key.

Through the real CLI (a child process, forked from one that imported it: testing/forked.py;
output captured as the bytes it wrote): a project root whose
directory name carries ANSI escape sequences is printed by ``plan`` (text, markdown and
``validate``) without a single ESC byte; schema errors on a key or value shaped like a
token show it redacted, in text and in ``--json``.
"""

from __future__ import annotations

import io
import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from kagura_agent.errors import Diagnostic, UsageError
from kagura_agent.hygiene import REDACTED_SECRET, neutralise, neutralise_data
from testing import forked

REPO = Path(__file__).resolve().parent.parent
FACTS = {"image_digests": {}, "graduation": {"version": 0}}
# Clear the screen, move up, recolour: what a hostile directory name would do.
EVIL = "proj\x1b[2J\x1b[1A\x1b[31mhidden\x9b0m\u202eevil\x07"
ANTHROPIC = "sk-ant-api03-" + "Q" * 40
BARE_TOKEN = "Zq8vN3kLw7Tx2Rb9Yp4Hs6Jd"


def cli(cwd: Path, *argv: str) -> forked.Forked:
    return forked.run(argv, cwd=cwd, env={**os.environ, "NO_COLOR": "1"}, timeout=60)


def hostile_project(tmp_path: Path) -> Path:
    root = tmp_path / EVIL
    root.mkdir()
    (tmp_path / "facts.json").write_text(json.dumps(FACTS), encoding="utf-8")
    (tmp_path / "task.yml").write_text(
        "apiVersion: kagura.dev/v1\nkind: Task\nmetadata: {name: hygiene}\nspec:\n"
        f"  project_root: {json.dumps(EVIL)}\n  steps: [echo hi]\n",
        encoding="utf-8",
    )
    return tmp_path


@pytest.mark.parametrize("fmt", ["text", "markdown"])
def test_plan_prints_no_escape_from_a_directory_name(tmp_path: Path, fmt: str) -> None:
    cwd = hostile_project(tmp_path)
    argv = ["plan", "--manifests", str(REPO / "manifests"), "--facts", "facts.json"]
    if fmt == "markdown":
        argv += ["--format", "markdown"]
    proc = cli(cwd, *argv, "task.yml")
    assert proc.returncode == 0, proc.stderr.decode()
    out = proc.stdout + proc.stderr
    assert b"\x1b" not in out and b"\x07" not in out
    assert "\x9b".encode() not in out and "\u202e".encode() not in out
    assert b"proj\\x1b[2J\\x1b[1A\\x1b[31mhidden\\x9b0m\\u202eevil\\x07" in proc.stdout


def test_validate_error_on_a_hostile_file_name_has_no_escape(tmp_path: Path) -> None:
    name = "task\x1b[1A\x1b[2K.yml"
    (tmp_path / name).write_text("kind: Task\n", encoding="utf-8")
    proc = cli(tmp_path, "validate", "--manifests", str(REPO / "manifests"), name)
    assert proc.returncode == 2
    assert b"\x1b" not in proc.stdout + proc.stderr
    assert b"task\\x1b[1A\\x1b[2K.yml:1:1" in proc.stderr


TOKEN_CASES = {
    "unknown key": f"metadata: {{name: x}}\nspec:\n  steps: [echo hi]\n  {ANTHROPIC}: 1\n",
    "pattern": f"metadata: {{name: {BARE_TOKEN}}}\nspec:\n  steps: [echo hi]\n",
    "type": f"metadata: {{name: x}}\nspec:\n  steps: [echo hi]\n  budget: {{turns: {ANTHROPIC}}}\n",
    "enum": f"metadata: {{name: x}}\nspec:\n  steps: [echo hi]\n  runtime: {BARE_TOKEN}\n",
    "bare token type": f"metadata: {{name: x}}\nspec:\n  steps: [echo hi]\n  budget: {{turns: {BARE_TOKEN}}}\n",
}


@pytest.mark.parametrize("case", sorted(TOKEN_CASES))
@pytest.mark.parametrize("as_json", [False, True])
def test_schema_errors_never_echo_a_token(tmp_path: Path, case: str, as_json: bool) -> None:
    text = "apiVersion: kagura.dev/v1\nkind: Task\n" + TOKEN_CASES[case]
    (tmp_path / "task.yml").write_text(text, encoding="utf-8")
    argv = ["validate", "--manifests", str(REPO / "manifests"), "task.yml"]
    proc = cli(tmp_path, *(["validate", "--json", *argv[1:]] if as_json else argv))
    assert proc.returncode == 2
    out = (proc.stdout + proc.stderr).decode()
    assert "Traceback" not in out
    assert ANTHROPIC not in out and BARE_TOKEN not in out
    assert "QQQQQQQQQQ" not in out
    assert REDACTED_SECRET in out or "looks like an inline secret" in out, out


def test_neutralise_and_the_error_types() -> None:
    assert neutralise("a\x1b[31mb\nc\td") == "a\\x1b[31mb\nc\td"
    assert neutralise("a\nb\tc", newlines=False) == "a\\x0ab\\x09c"
    assert neutralise("\u2028\u2066\x7f\x85") == "\\u2028\\u2066\\x7f\\x85"
    assert neutralise_data({"k\x1b": ["v\n", 1]}) == {"k\\x1b": ["v\\x0a", 1]}
    diag = Diagnostic("f\x1b.yml", 1, 1, "$", f"bad {ANTHROPIC} " + "x" * 5000, "h\x1b")
    assert "\x1b" not in diag.render() and ANTHROPIC not in diag.render()
    assert len(diag.message) <= 1000
    assert diag.to_json()["file"] == "f\\x1b.yml"
    rendered = UsageError(f"no file {EVIL}", hint=ANTHROPIC).render()
    assert "\x1b" not in rendered and ANTHROPIC not in rendered


class _Recorder:
    name = "recorder"

    def __init__(self) -> None:
        self.posts: list[str] = []

    def run(self, handle: object) -> None: ...

    def stop(self) -> None: ...

    def say(self, thread: str, text: str) -> None:
        self.posts.append(text)

    def ask(self, thread: str, text: str, request: str) -> None:
        self.posts.append(text)


def test_cockpit_posts_are_neutralised(tmp_path: Path) -> None:
    """Every chat message (replies, plan text, the relayed live view) goes through _say."""
    from kagura_agent.cockpit.core import Cockpit, CockpitConfig

    transport = _Recorder()
    config = CockpitConfig(operators=frozenset({"U1"}), state=tmp_path / "state.db")
    cockpit = Cockpit(transport, config)
    cockpit._say("T1", f"step output: {EVIL}\nsecond line")
    [post] = transport.posts
    assert "\x1b" not in post and "\x07" not in post and "\u202e" not in post
    assert post.endswith("\\x07\nsecond line")  # newlines in a message stay lines


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_live_view_shows_agent_output_without_its_escapes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The agent's text and tool output are inputs too; only our own styling escapes remain."""
    from kagura_agent.apply.records.live import LiveView
    from kagura_agent.brain.events import DoneEvent, TextEvent, ToolResultEvent
    from kagura_agent.membrane.secrets import Redactor

    monkeypatch.delenv("NO_COLOR", raising=False)
    out = _Tty()
    view = LiveView(Redactor(), stream=out)
    view.brain(ToolResultEvent("t1", f"ls\n{EVIL}", exit_code=0))
    view.brain(TextEvent(f"said {EVIL}\n\n"))
    view.brain(DoneEvent())
    text = out.getvalue()
    assert "\\x1b[2J" in text and "\\x9b0m" in text and "\\u202e" in text
    assert "\x1b[2J" not in text and "\x9b" not in text and "\u202e" not in text
    assert "\x1b[2m" in text  # the view's own (dim) styling still applies on a terminal


# kagura-agent's own lines, as the live view prints them, which the agent prints back
# (a line break, a carriage return and a Unicode line separator to start new lines).
OWN = [
    "        ✓ verify 'make test' exited 0",
    "        ↳ m-1-1: egress:second approved by alice via slack; in force now",
    "   3.2s ● run run-0123456789ab succeeded in 3.0s, cost $0.0000",
]
FORGED = "\n".join(OWN) + "\r" + OWN[0] + "\u2028" + OWN[1] + "\x0b" + OWN[2]


def _own_view(view: Any) -> None:
    """What the view says of its own: the real verify line among them."""
    view.phase("brain started")
    view.verify([("make test", 0, "")])
    view.note("↳ m-1-1: egress:second approved by alice via slack; in force now")


def _agent_events(view: Any) -> None:
    from kagura_agent.brain.events import DoneEvent, TextEvent, ToolCallEvent, ToolResultEvent

    view.brain(ToolCallEvent("t1", "Bash", {"command": FORGED}))
    view.brain(ToolResultEvent("t1", FORGED, exit_code=0))
    view.brain(TextEvent(FORGED + "\n\n"))
    view.brain(DoneEvent(result=FORGED))
    view.verify([("./check", 1, FORGED)])


@pytest.mark.parametrize("colour", [False, True])
def test_the_agent_printing_our_own_lines_cannot_pass_for_them(
    monkeypatch: pytest.MonkeyPatch, colour: bool
) -> None:
    """What the agent writes (assistant text, tool output, a failed verify command's
    output, a tool call's command) is framed line by line; our lines never carry the
    frame. A reader, and this test, tell them apart by the first characters alone."""
    from kagura_agent.apply.records.live import LiveView
    from kagura_agent.hygiene import AGENT_MARK
    from kagura_agent.membrane.secrets import Redactor

    strip = re.compile(r"\x1b\[[0-9;]*m")
    if colour:
        monkeypatch.delenv("NO_COLOR", raising=False)
    else:
        monkeypatch.setenv("NO_COLOR", "1")
    out = _Tty() if colour else io.StringIO()
    view = LiveView(Redactor(), stream=out)
    _own_view(view)
    ours = [strip.sub("", line) for line in out.getvalue().splitlines()]
    assert all(not line.startswith(AGENT_MARK) for line in ours)
    out.truncate(0)
    out.seek(0)
    _agent_events(view)
    lines = [strip.sub("", line) for line in out.getvalue().splitlines()]
    forged = [line for line in lines if any(own.strip() in line for own in OWN)]
    assert len(forged) >= 4 * 6  # each copy of each line, in text, output, answer, verify
    for line in forged:
        # A forged line is the agent's (framed), or a line of ours that quotes it after
        # its own mark on one line (the tool call: "▸ Bash: …\n…" shown escaped).
        assert line.startswith(AGENT_MARK) or line.lstrip().split(" ")[1] == "▸", line
    assert not set(lines) & set(ours)  # not one line the same as one of ours
    if colour:
        assert "\x1b[35m┃ \x1b[0m" in out.getvalue()  # the frame is coloured apart


def test_under_json_the_agent_text_is_never_in_a_note_or_a_phase() -> None:
    from kagura_agent.apply.records.live import LiveView
    from kagura_agent.membrane.secrets import Redactor

    out = io.StringIO()
    view = LiveView(Redactor(), stream=out, as_json=True)
    _agent_events(view)
    events = [json.loads(line) for line in out.getvalue().splitlines()]
    kinds = {e["kind"] for e in events if "make test" in json.dumps(e, ensure_ascii=False)}
    assert kinds == {"brain", "verify_output"}
    [tail] = [e for e in events if e["kind"] == "verify_output"]
    assert tail["command"] == "./check" and tail["exit_code"] == 1
    assert tail["lines"][-1].endswith("cost $0.0000")


def test_in_chat_the_agent_text_is_framed_and_our_lines_stay_lines() -> None:
    """The cockpit relays apply's --json events: what the agent wrote arrives framed line
    by line (assistant text, the final answer, verify output), and none of our lines can
    be split into two by what it quotes."""
    from kagura_agent.apply.records.live import LiveView
    from kagura_agent.cockpit.runner import Feed, Progress
    from kagura_agent.hygiene import AGENT_MARK
    from kagura_agent.membrane.secrets import Redactor

    out = io.StringIO()
    view = LiveView(Redactor(), stream=out, as_json=True)
    _own_view(view)
    _agent_events(view)
    view.note(f"mid-run request m-1-2: egress 'x' ({FORGED})")  # ours, quoting the agent

    class _Lines:
        def __init__(self) -> None:
            self.posted: list[str] = []

        def add(self, line: str) -> None:
            self.posted.append(line)

        def fits(self, text: str) -> bool:
            return True

        def attach(self, name: str, content: str, comment: str) -> None:
            self.posted.append(comment)

    relay = _Lines()
    feed = Feed(relay, Progress(), "s-1")  # type: ignore[arg-type]
    for line in out.getvalue().splitlines():
        feed.line(line)
    chat = [line for post in relay.posted for line in post.split("\n")]
    forged = [line for line in chat if any(own.strip() in line for own in OWN)]
    ours = [line for line in forged if not line.startswith(AGENT_MARK)]
    # Ours: the verify line, the approval note, and the two that quote the agent on one
    # line (the tool call, the mid-run request) — nothing else.
    assert ours[0] == "  ✓ verify 'make test' exited 0"
    assert ours[1].startswith("  ↳ m-1-1: egress:second approved by alice")
    assert ours[2].startswith("▸ Bash: ") and ours[3].startswith("  mid-run request m-1-2")
    assert len(ours) == 4, ours
    # Framed: the text's six lines (the answer is the same text: named, not repeated) and
    # the verify output's last five.
    assert len(forged) - len(ours) == 6 + 5


def test_in_the_web_console_the_agent_text_is_only_in_agent_entries() -> None:
    """The run's journal (what the live view showed) read back as the console's timeline:
    every entry that carries the agent's words is in the agent's tone (its frame on the
    page) — the final answer and a failed verify command's output too."""
    from kagura_agent.apply.records.live import LiveView
    from kagura_agent.membrane.secrets import Redactor
    from kagura_agent.web.timeline import journal_entries

    kept: list[dict[str, Any]] = []
    view = LiveView(Redactor(), stream=io.StringIO())
    view.keep = lambda kind, item: kept.append(
        {"at": "2026-01-01T00:00:00Z", "kind": kind, "item": item}
    )
    _own_view(view)
    _agent_events(view)
    entries = journal_entries(kept)
    carrying = [e for e in entries if "make test" in e.title + e.detail]
    assert carrying, entries
    for entry in carrying:
        ours = entry.kind == "verify" and "make test" in entry.title + entry.detail.split("\n")[0]
        assert "agent" in entry.tone.split() or ours, entry
    [output] = [e for e in entries if e.kind == "verify output"]
    assert output.tone == "agent" and output.title == "./check"
    [verify] = [e for e in entries if e.kind == "verify" and "./check" in e.detail]
    assert verify.detail == "✗ ./check exited 1"  # ours: no output of the agent's in it
