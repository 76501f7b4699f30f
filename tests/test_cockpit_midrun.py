"""Mid-run questions in the cockpit, driven for real: `kagura-agent serve` on the terminal
transport (its stdin and stdout), real containers, the fake claude driving the sdk engine.

A launched session's brain asks for a second egress host (approved from the terminal: the
agent then reaches it through its reloaded proxy), a third (denied), one no manifest
allows (refused with the reason, nobody asked) and a credential (approved: the lease is
pushed into the container). Then a session whose wall budget runs short is extended when
approved, and one whose question nobody answers stops, saying why. Every answer is in the
approval log as the terminal's operator's, bound to the amended plan's fingerprint.
The same questions answered with the buttons of the fake Slack and Discord are part of
each transport's scripted session (test_cockpit_script.py).
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from apply_helpers import REPO, cli_env, leftovers, live_leases, make_project, run_ids
from chat_helpers import API_KEY, CANARY, session_world
from test_midrun_apply import UPSTREAM, WAIT_UPSTREAM, access, fetch, policy

from kagura_agent.apply.midrun.grants import amendments
from kagura_agent.approvals import history
from kagura_agent.membrane import images
from kagura_agent.membrane.egress.owner import COMPONENT_OUTBOUND, LABEL_COMPONENT
from kagura_agent.membrane.hardening import LABEL_RUN
from kagura_agent.state import open_store

pytestmark = pytest.mark.usefixtures("docker_client")

MIDTOKEN = "kagura-cockpit-midrun-token-" + "q" * 20
FILE_TOKEN = {
    "kind": "CredentialProvider",
    "metadata": {"name": "filetoken"},
    "spec": {
        "type": "static",
        "standing": True,
        "secret": "env:KAGURA_MIDRUN_TOKEN",
        "static": {"file": "filetoken"},
        "scopes": {"use": {"description": "a canary token, as a file"}},
    },
}


@pytest.fixture()
def upstream(docker_client: Any) -> Iterator[Any]:
    import uuid

    network = docker_client.networks.create(
        f"kagura-cockpit-midrun-{uuid.uuid4().hex[:8]}",
        driver="bridge",
        internal=True,
        labels={"dev.kagura.test": "apply"},
    )
    container = docker_client.containers.run(
        images.image_ref("base"),
        ["python3", "-c", UPSTREAM],
        detach=True,
        labels={"dev.kagura.test": "apply"},
        network=network.name,
        user="1000:1000",
    )
    try:
        deadline = time.monotonic() + 15
        while b"ready" not in container.logs():
            assert time.monotonic() < deadline, "upstream never started"
            time.sleep(0.05)
        yield container
    finally:
        container.remove(force=True)
        network.remove()


def _doc_section() -> str:
    text = (REPO / "docs" / "cockpit.md").read_text(encoding="utf-8")
    return text.split("## Mid-run questions", 1)[1].split("\n## ", 1)[0]


def _blocks(lang: str) -> list[str]:
    found = re.findall(r"^```(\w*)\n(.*?)^```$", _doc_section(), re.M | re.S)
    return [body for kind, body in found if kind == lang]


# The documented request_access arguments: what this test's brain sends first.
DOC_REQUEST = json.loads(_blocks("json")[0])


def _documented_transcript() -> list[str]:
    [block] = _blocks("")
    return block.rstrip("\n").splitlines()


def _task(folder: Path, name: str, spec: dict[str, Any]) -> Path:
    project = make_project(folder, name)
    document = {"apiVersion": "kagura.dev/v1", "kind": "Task", "metadata": {"name": name}}
    base = {"image": "agent-test", "brain": "claude", "egress": ["anthropic"]}
    path = project / "task.yml"
    path.write_text(yaml.safe_dump({**document, "spec": {**base, **spec}}, sort_keys=False))
    return path


class Terminal:
    """serve on the terminal: what it printed (read by a thread), and typing into it."""

    def __init__(self, serve: subprocess.Popen[str]) -> None:
        self.serve = serve
        self.lines: list[str] = []
        self.seen: set[str] = set()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.serve.stdout:  # type: ignore[union-attr]
            self.lines.append(line)

    def until(self, needle: str, timeout: float = 240, since: int = 0) -> str:
        deadline = time.monotonic() + timeout
        while not (found := [x for x in self.lines[since:] if needle in x]):
            assert time.monotonic() < deadline, f"no {needle!r} in:\n" + "".join(self.lines)
            time.sleep(0.05)
        return found[0]

    def type_in(self, text: str) -> None:
        self.serve.stdin.write(text + "\n")  # type: ignore[union-attr]
        self.serve.stdin.flush()  # type: ignore[union-attr]

    def approve_all_until(self, needle: str, since: int, timeout: float = 240) -> None:
        answered: set[str] = set()
        deadline = time.monotonic() + timeout
        while not any(needle in x for x in self.lines[since:]):
            assert time.monotonic() < deadline, "".join(self.lines[since:])
            for line in list(self.lines[since:]):
                if "  answer: approve m-" in line and line.split()[2] not in answered:
                    answered.add(line.split()[2])
                    if f"{line.split()[2]} budget" not in "".join(self.lines[since:]):
                        self.type_in(f"approve {line.split()[2]}")
            time.sleep(0.1)

    def question(self, since: int, timeout: float = 240) -> str:
        """The request id of the next question not returned before (a question can be
        printed before the answer to the previous one: ``since`` is only a hint)."""
        deadline = time.monotonic() + timeout
        while True:
            for line in list(self.lines):
                if "  answer: approve m-" in line and line.split()[2] not in self.seen:
                    self.seen.add(line.split()[2])
                    return str(line.split()[2])
            assert time.monotonic() < deadline, "no new question in:\n" + "".join(self.lines)
            time.sleep(0.05)


def test_mid_run_questions_on_the_terminal(
    tmp_path: Path, state_dir: Path, docker_client: Any, upstream: Any
) -> None:
    argv, env, _ = session_world(tmp_path, docker_client, None)
    manifests = Path(argv[argv.index("--manifests") + 1])
    extra = [policy("second", "second.test"), policy("third", "third.test"), FILE_TOKEN]
    (manifests / "zz-midrun.yml").write_text(
        yaml.safe_dump_all([{"apiVersion": "kagura.dev/v1", **d} for d in extra])
    )
    env = {**env, "KAGURA_MIDRUN_TOKEN": MIDTOKEN}
    grants = _task(
        tmp_path,
        "grants",
        {
            "prompt": "\n".join(
                [
                    f"run: {WAIT_UPSTREAM}; {fetch('second.test')}",
                    "access: " + json.dumps(DOC_REQUEST),
                    access("egress", "third", "and a bit on third.test"),
                    access("egress", "elsewhere.test", "no manifest allows this one"),
                    access("credential", "filetoken/use", "the API needs its token"),
                    f"after: {fetch('second.test')}",
                    f"after: {fetch('third.test')}",
                    "after: test -s /run/kagura/creds/filetoken && echo token-pushed",
                ]
            )
        },
    )
    extended = _task(
        tmp_path, "extended", {"prompt": "run: sleep 15", "budget": {"wall_time": "12s"}}
    )
    lapsed = _task(tmp_path, "lapsed", {"prompt": "run: sleep 15", "budget": {"wall_time": "12s"}})
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
        start = len(term.lines)
        term.type_in(f"launch {grants}")
        _attach(docker_client, upstream, state_dir, serve, grants.parent)
        second = term.question(start)
        assert "+ egress second.test:8080 (policy second)" in "".join(term.lines[start:])
        term.type_in(f"approve {second}")
        term.until(f"{second} egress:second approved by terminal:")
        mark = len(term.lines)
        third = term.question(mark)
        term.type_in(f"deny {third}")
        term.until(f"{third} egress:third denied by terminal:")
        mark = len(term.lines)
        token = term.question(mark)
        assert "+ credential filetoken" in "".join(term.lines), "".join(term.lines)
        term.type_in(f"approve {token}")
        term.until("(exit 0)", since=mark)
        # The wall budget: extended when approved; silence stops the run.
        mark = len(term.lines)
        term.type_in(f"launch {extended}")
        wall = term.question(mark)
        assert "~ budget wall_seconds 12 → 24" in "".join(term.lines[mark:])
        term.type_in(f"approve {wall}")
        term.until(f"{wall} budget:wall_seconds approved by terminal:")
        term.approve_all_until("(exit ", since=mark)  # a slow machine may need it again
        assert "(exit 0)" in term.until("(exit ", since=mark), "".join(term.lines[mark:])
        mark = len(term.lines)
        term.type_in(f"launch {lapsed}")
        term.question(mark)  # nobody answers
        term.until("(exit 1)", since=mark)
        serve.stdin.close()  # type: ignore[union-attr]
        assert serve.wait(60) == 0
        term._reader.join(10)
    finally:
        if serve.poll() is None:
            serve.kill()
    out = "".join(term.lines)
    # The transcript docs/cockpit.md shows is what the terminal printed (… stands for ids).
    for line in _documented_transcript():
        pattern = ".*".join(re.escape(part) for part in line.split("…"))
        assert re.search(pattern, out), line
    assert "Access said: granted: egress:second approved by terminal:" in out, out
    assert "hello from second.test:8080" in out, out
    assert "Access said: [error] refused: denied by terminal:" in out, out
    assert "nobody was asked, the operator's manifests do not allow it: no EgressPolicy" in out
    assert "token-pushed" in out, out
    assert "wall budget extended to 24s" in out, out
    assert "wall budget not extended (not approved: no answer within" in out, out
    assert "overran its" in out and "wall" in out
    assert MIDTOKEN not in out and CANARY not in out and API_KEY not in out
    ids = run_ids(state_dir)
    with open_store() as store:
        rows = [r for run_id in ids for r in amendments(store, run_id)]
        log = history(store)
    outcomes = [(r["category"], r["outcome"]) for r in rows]
    assert outcomes[:4] == [
        ("egress:second", "granted"),
        ("egress:third", "denied"),
        ("", "refused"),
        ("credential:filetoken/use", "granted"),
    ], outcomes
    assert ("budget:wall_seconds", "granted") in outcomes
    assert outcomes[-1] == ("budget:wall_seconds", "timeout"), outcomes
    mine = {(d.category, d.fingerprint): d for d in log if d.via == "terminal"}
    for row in rows:
        if row["outcome"] in ("granted", "denied"):
            decision = mine[(row["category"], row["fingerprint"])]
            assert decision.who.startswith("terminal:") and decision.via == "terminal"
    for run_id in ids:
        assert leftovers(docker_client, run_id) == []
    assert live_leases(cli_env(state_dir)) == []


def _attach(client: Any, upstream: Any, state_dir: Path, serve: Any, project: Path) -> None:
    deadline = time.monotonic() + 120
    while not (ids := run_ids(state_dir)):
        assert serve.poll() is None and time.monotonic() < deadline, "no run started"
        time.sleep(0.1)
    labels = [f"{LABEL_RUN}={ids[0]}", f"{LABEL_COMPONENT}={COMPONENT_OUTBOUND}"]
    while not (nets := client.networks.list(filters={"label": labels})):
        assert time.monotonic() < deadline, "the run never created its outbound network"
        time.sleep(0.05)
    nets[0].connect(upstream, aliases=["second.test", "third.test"])
    (project / ".upstream-ready").write_text("go\n")
