"""Sub-agents dispatched at run time, end to end: the fake claude CLI drives the SDK engine
in the real agent container and calls its ``dispatch`` tool; the host plans each child
from the manifests under the running parent's plan, asks a human on the parent's terminal
when the child needs approval, runs it as its own apply (its own container, proxy and
leases) and answers with its output memory. A child asking for more than its parent is
refused with the reason; a killed parent stops its running child.
"""

from __future__ import annotations

import json
import os
import pty
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from apply_helpers import (
    AGENT_UID,
    REPO,
    all_leases,
    cli_env,
    json_lines,
    kagura,
    last_json,
    leftovers,
    make_project,
    manifest_set,
    run_ids,
    run_row,
    wait_for_container,
    write_task,
)

from kagura_agent.approvals import Verdict, record_decision
from kagura_agent.clock import SystemClock
from kagura_agent.state import StateStore
from testing.agent_test_image import ensure_agent_test_image

pytestmark = pytest.mark.usefixtures("docker_client")

API_KEY = "sk-ant-kagura-dispatch-" + "d" * 30


@pytest.fixture(scope="module")
def agent_test_image(docker_client: Any) -> tuple[Any, str]:
    return docker_client, ensure_agent_test_image(docker_client)


def _manifests(tmp_path: Path, image_ref: str) -> Path:
    image = {
        "kind": "Image",
        "metadata": {"name": "agent-test"},
        "spec": {"recipe": "images/agent", "tag": image_ref, "baseline": True},
    }
    return manifest_set(tmp_path, image)


def dispatch_line(child: dict[str, Any]) -> str:
    """One ``dispatch: {json}`` prompt line for the fake CLI. The child's own keywords are
    escaped so that the parent's fake does not act on them (it scans its whole prompt)."""
    text = json.dumps(child)
    for word in ("run:", "hang", "fail"):
        text = text.replace(word, "\\u00" + format(ord(word[0]), "02x") + word[1:])
    return f"dispatch: {text}"


def doc_examples(fence: str) -> list[str]:
    """The ```FENCE blocks of docs/dispatch.md: the tests run its examples."""
    text = (REPO / "docs" / "dispatch.md").read_text(encoding="utf-8")
    return re.findall(rf"^```{fence}\n(.*?)^```", text, re.M | re.S)


def _dispatches(state_dir: Path, parent_run: str) -> list[dict[str, Any]]:
    with sqlite3.connect(state_dir / "state.db") as conn:
        conn.row_factory = sqlite3.Row
        rows = conn.execute(
            "SELECT * FROM dispatches WHERE parent_run = ? ORDER BY number", (parent_run,)
        ).fetchall()
    return [dict(row) for row in rows]


class Terminal:
    """The parent's stdin is a terminal (a pty): apply asks there, as for an operator.
    Its stderr is read as it comes, so a question without a newline is seen."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.master, slave = pty.openpty()
        self.proc = subprocess.Popen(
            argv, env=env, cwd=REPO, stdin=slave, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        os.close(slave)
        self.err = b""
        self.out = b""
        self._threads = [
            threading.Thread(target=self._drain, args=(self.proc.stderr, "err"), daemon=True),
            threading.Thread(target=self._drain, args=(self.proc.stdout, "out"), daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def _drain(self, stream: Any, name: str) -> None:
        while chunk := os.read(stream.fileno(), 65536):
            setattr(self, name, getattr(self, name) + chunk)

    def answer_when(self, question: str, reply: str, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while question.encode() not in self.err:
            assert self.proc.poll() is None, self.err.decode(errors="replace")[-4000:]
            assert time.monotonic() < deadline, self.err.decode(errors="replace")[-4000:]
            time.sleep(0.1)
        os.write(self.master, reply.encode())

    def wait(self, timeout: float = 500) -> tuple[int, str, str]:
        code = self.proc.wait(timeout)
        for thread in self._threads:
            thread.join(10)
        os.close(self.master)
        return code, self.out.decode(errors="replace"), self.err.decode(errors="replace")


def test_a_parent_dispatches_two_children_and_refuses_a_wider_one(
    agent_test_image: tuple[Any, str], tmp_path: Path, state_dir: Path
) -> None:
    client, image_ref = agent_test_image
    manifests = _manifests(tmp_path, image_ref)
    project = make_project(tmp_path)
    # baseline: no egress beyond the parent's baseline (the brain's API), nothing to ask.
    writer = json.loads(doc_examples("json")[0])  # the tool's input, as the docs show it
    # pypi is the parent's (approved for it), but not baseline: the child's plan asks.
    fetcher = {
        "name": "fetcher",
        "prompt": "run: echo fetched > out.txt",
        "egress": ["anthropic", "pypi"],
        "verify": ["grep -q fetched out.txt"],
    }
    # github is not the parent's: refused, whatever a human would say.
    wider = {"name": "wider", "prompt": "run: true", "egress": ["anthropic", "github"]}
    prompt = "\n".join(
        ["run: echo parent > parent.txt", *(dispatch_line(c) for c in (writer, fetcher, wider))]
    )
    task = write_task(
        project,
        "parent",
        {
            "image": "agent-test",
            "brain": "claude",
            "prompt": prompt,
            "egress": ["anthropic", "pypi"],
            "verify": ["grep -q written writer/out.txt", "grep -q fetched fetcher/out.txt"],
        },
    )
    env = cli_env(state_dir, ANTHROPIC_API_KEY=API_KEY)
    argv = [sys.executable, "-m", "kagura_agent", "apply", "--yes", "--json"]
    argv += ["--approve", "egress:pypi", "--manifests", str(manifests), str(task)]
    parent = Terminal(argv, env)
    parent.answer_when("Grant egress:pypi to plan", "y\n")
    code, out, err = parent.wait()
    assert code == 0, err[-6000:]
    result = last_json(out)
    parent_run = result["run_id"]

    children = {c["task"]: c for c in result["children"]}
    assert set(children) == {"writer", "fetcher", "wider"}
    for name in ("writer", "fetcher"):
        child = children[name]
        assert child["outcome"] == "success", child
        assert child["run"] and child["output_memory"], child
        assert run_row(state_dir, child["run"])["outcome"] == "success"
        assert leftovers(client, child["run"]) == []
    spans = [
        (row["started_at"], row["ended_at"])
        for row in (run_row(state_dir, children[n]["run"]) for n in ("writer", "fetcher"))
    ]
    assert max(s for s, _ in spans) < min(e for _, e in spans)  # they ran at once
    assert (project / "writer" / "out.txt").read_text() == "written\n"
    assert (project / "fetcher" / "out.txt").read_text() == "fetched\n"
    refused = children["wider"]
    assert refused["outcome"] == "refused" and refused["run"] is None
    assert sorted(refused["reasons"]) == [
        f"the child asks for more than its parent: egress https://{host}:443"
        " is not allowed to the parent"
        for host in ("api.github.com", "codeload.github.com", "github.com")
    ]
    # Each answer reached the parent's brain as its tool's result (the fake echoes them).
    said = [
        json.loads(line.split("Dispatch said: ", 1)[1].removeprefix("[error] "))
        for event in json_lines(err)
        if event.get("kind") == "brain" and event.get("type") == "text"
        for line in str(event.get("text", "")).splitlines()
        if line.startswith("Dispatch said: ")
    ]
    by_task = {answer["task"]: answer for answer in said}
    assert by_task["writer"]["output_memory"] == children["writer"]["output_memory"]
    assert by_task["writer"]["summary"].startswith("writer succeeded: run: echo written")
    assert by_task["writer"]["answer"] == "Ran the command."
    assert by_task["fetcher"]["outcome"] == "success"
    assert by_task["wider"] == {
        "outcome": "refused",
        "task": "wider",
        "reasons": refused["reasons"],
    }
    shown_in_docs = json.loads(doc_examples("json")[1])
    assert shown_in_docs.keys() == by_task["wider"].keys()
    assert set(shown_in_docs["reasons"]) <= set(refused["reasons"])
    # Only the child that needed it was asked about, on the parent's terminal.
    assert err.count("Grant ") == 1

    # The links, both ways: the parent's record names its children; each child's plan and
    # output memory name the parent run.
    rows = {row["task"]: row for row in _dispatches(state_dir, parent_run)}
    assert rows["writer"]["child_run"] == children["writer"]["run"]
    assert rows["wider"]["outcome"] == "refused" and rows["wider"]["fingerprint"]
    plan_file = state_dir / "dispatch" / parent_run / "fetcher.plan.json"
    child_plan = json.loads(plan_file.read_text())
    assert child_plan["task"]["parent"] == {
        "task": "parent",
        "run": parent_run,
        "context_memories": [],
        "narrowing": [],
    }
    assert [a["category"] for a in child_plan["approvals"] if a["class"] == "needs-approval"] == [
        "egress:pypi"
    ]
    shown = kagura(["memory", "show", children["fetcher"]["output_memory"], "--json"], env)
    assert json.loads(shown.stdout)["details"]["parent_run"] == parent_run
    approvals = kagura(["graduation", "history", "--json"], env)
    assert approvals.returncode == 0, approvals.stderr
    assert child_plan["intent"] in approvals.stdout  # approvals bind to the plan's intent


@pytest.mark.parametrize(
    ("signum", "exit_code"),
    # Ctrl-C and the cockpit's kill; kill(1); kill -9, which the parent never sees
    [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGKILL, -9)],
    ids=["sigint", "sigterm", "sigkill"],
)
def test_killing_the_parent_stops_its_running_child(
    agent_test_image: tuple[Any, str],
    tmp_path: Path,
    state_dir: Path,
    signum: signal.Signals,
    exit_code: int,
) -> None:
    client, image_ref = agent_test_image
    manifests = _manifests(tmp_path, image_ref)
    project = make_project(tmp_path)
    sleeper = {"name": "sleeper", "prompt": "hang"}
    task = write_task(
        project,
        "parent",
        {
            "image": "agent-test",
            "brain": "claude",
            "prompt": "run: true\n" + dispatch_line(sleeper),
            "egress": ["anthropic"],
        },
    )
    env = cli_env(state_dir, ANTHROPIC_API_KEY=API_KEY)
    argv = [sys.executable, "-m", "kagura_agent", "apply", "--yes", "--json"]
    parent = subprocess.Popen(
        [*argv, "--manifests", str(manifests), str(task)],
        env=env,
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 300
    while len(ids := run_ids(state_dir)) < 2:
        assert parent.poll() is None, parent.communicate()[1][-4000:]
        assert time.monotonic() < deadline, "the child never started"
        time.sleep(0.2)
    parent_run, child_run = ids[0], ids[1]
    wait_for_container(client, child_run, timeout=300)
    parent.send_signal(signum)
    _, err = parent.communicate(timeout=300)
    assert parent.returncode == exit_code, err[-4000:]
    if signum == signal.SIGKILL:  # the child hears of it from Linux (parent-death signal)
        # Its clean-up is its own process's: wait until that has run (outcome recorded,
        # containers gone, leases closed), then the same checks as after SIGINT.
        while (
            run_row(state_dir, child_run)["outcome"] != "interrupted"
            or leftovers(client, child_run)
            or not _child_leases_closed(env, child_run)
        ):
            assert time.monotonic() < deadline + 300, run_row(state_dir, child_run)
            time.sleep(0.5)
        _remove_run_objects(client, parent_run)  # a next start's sweeps (tested elsewhere)
    kept = leftovers(client, parent_run)
    assert run_row(state_dir, child_run)["outcome"] == "interrupted"
    assert leftovers(client, child_run) == [] and kept == []
    assert _child_leases_closed(env, child_run)
    if signum == signal.SIGKILL:
        return  # the parent wrote nothing more: no dispatch outcome, no farewell
    [row] = _dispatches(state_dir, parent_run)
    assert (row["task"], row["child_run"], row["outcome"]) == ("sleeper", child_run, "interrupted")
    assert "stopping 1 sub-agent(s)" in err


def _child_leases_closed(env: dict[str, str], run_id: str) -> bool:
    leases = [lease for lease in all_leases(env) if lease["run_id"] == run_id]
    return bool(leases) and all(
        lease["closed_at"] and lease["state"] in ("released", "revoked") for lease in leases
    )


def _remove_run_objects(client: Any, run_id: str) -> None:
    """What a killed parent left: its containers, then its networks and volumes. Another
    test's apply may sweep them at the same moment (the parent is dead: they are orphans):
    gone already, or being removed, is fine."""
    import docker.errors

    def remove(call: Callable[..., object], **kwargs: bool) -> None:
        try:
            call(**kwargs)
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as exc:
            if exc.status_code != 409:  # 409: another sweep is removing it
                raise

    label = {"label": f"dev.kagura.run={run_id}"}
    for container in client.containers.list(all=True, filters=label):
        remove(container.remove, force=True)
    for network in client.networks.list(filters=label):
        remove(network.remove)
    for volume in client.volumes.list(filters=label):
        remove(volume.remove, force=True)


def test_a_script_step_dispatches_through_memtool(
    agent_test_image: tuple[Any, str], tmp_path: Path, state_dir: Path
) -> None:
    """Two dispatches at once under a Policy that allows one child at a time: the second
    waits for the first (the limit is the operator's, not the brain's)."""
    client, image_ref = agent_test_image
    one_at_a_time = {
        "kind": "Policy",
        "metadata": {"name": "one-child"},
        "spec": {"ceilings": {"children": 1}},
    }
    image = {
        "kind": "Image",
        "metadata": {"name": "agent-test"},
        "spec": {"recipe": "images/agent", "tag": image_ref, "baseline": True},
    }
    manifests = manifest_set(tmp_path, image, one_at_a_time)
    project = make_project(tmp_path)
    [line] = [b.strip() for b in doc_examples("sh") if "memtool dispatch" in b]
    other = line.replace("report", "summary").replace("write the", "sum up the")
    task = write_task(
        project,
        "parent",
        {
            "image": "agent-test",
            "brain": "script",
            "steps": [f"{line} > child.json & {other} > other.json & wait"],
            "verify": ["grep -q success child.json", "test -s report/report.txt"],
        },
    )
    env = cli_env(state_dir)
    done = kagura(["apply", "--yes", "--json", "--manifests", str(manifests), str(task)], env)
    assert done.returncode == 0, done.stderr[-4000:]
    children = {c["task"]: c for c in last_json(done.stdout)["children"]}
    assert {t: c["outcome"] for t, c in children.items()} == {
        "report": "success",
        "summary": "success",
    }
    answer = json.loads((project / "child.json").read_text())
    report = children["report"]
    assert answer["run"] == report["run"] and answer["output_memory"] == report["output_memory"]
    assert answer["summary"] == "report succeeded: echo done > report.txt"
    first, second = sorted(
        (run_row(state_dir, c["run"]) for c in children.values()), key=lambda r: r["started_at"]
    )
    assert first["ended_at"] <= second["started_at"]  # one at a time
    assert "waits: 1 already running" in done.stderr
    for child in children.values():
        assert leftovers(client, child["run"]) == []


def test_under_serve_a_child_is_approved_through_the_cockpits_question(
    agent_test_image: tuple[Any, str], tmp_path: Path, state_dir: Path
) -> None:
    """Under serve the parent's apply has no terminal: the child's approval is a mid-run
    question (an ``ask`` live event), answered as the cockpit answers one — a decision in
    the approval log for exactly the child plan's intent, then a nudge on apply's stdin.
    The test plays the cockpit."""
    client, image_ref = agent_test_image
    manifests = _manifests(tmp_path, image_ref)
    project = make_project(tmp_path)
    fetcher = {
        "name": "fetcher",
        "prompt": "run: echo fetched > out.txt",
        "egress": ["anthropic", "pypi"],
        "verify": ["grep -q fetched out.txt"],
    }
    task = write_task(
        project,
        "parent",
        {
            "image": "agent-test",
            "brain": "claude",
            "prompt": "run: true\n" + dispatch_line(fetcher),
            "egress": ["anthropic", "pypi"],
        },
    )
    env = cli_env(state_dir, ANTHROPIC_API_KEY=API_KEY)
    argv = [sys.executable, "-m", "kagura_agent", "apply", "--yes", "--json", "--steer-stdin"]
    argv += ["--approve", "egress:pypi", "--manifests", str(manifests), str(task)]
    parent = subprocess.Popen(
        argv, env=env, cwd=REPO, text=True,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    assert parent.stdin is not None and parent.stderr is not None and parent.stdout is not None
    asks = []
    lines = []
    for line in parent.stderr:
        lines.append(line)
        try:
            item = json.loads(line)
        except ValueError:
            continue
        if isinstance(item, dict) and item.get("kind") == "ask":
            asks.append(item)
            with StateStore(state_dir / "state.db") as store:
                record_decision(
                    store,
                    Verdict(
                        category=item["category"],
                        fingerprint=item["fingerprint"],
                        outcome="approved",
                        who="test:operator",
                        via="test",
                        reason="answered by the test, as the cockpit does",
                        request=item["request"],
                    ),
                    clock=SystemClock(),
                )
            parent.stdin.write(json.dumps({"answered": item["request"]}) + "\n")
            parent.stdin.flush()
        if isinstance(item, dict) and item.get("kind") == "brain" and item.get("type") == "done":
            break
    out = parent.stdout.read()  # not communicate(): a closed stdin means "the cockpit left"
    assert parent.wait(300) == 0, "".join(lines)[-4000:]
    [ask] = asks
    assert ask["category"] == "egress:pypi" and ask["request"].startswith("m-")
    assert "sub-agent fetcher: Grant egress:pypi" in ask["text"]
    [child] = last_json(out)["children"]
    assert child["outcome"] == "success", child
    plan_file = state_dir / "dispatch" / last_json(out)["run_id"] / "fetcher.plan.json"
    assert ask["fingerprint"] == json.loads(plan_file.read_text())["intent"]
    assert (project / "fetcher" / "out.txt").read_text() == "fetched\n"
    assert leftovers(client, child["run"]) == []


def test_a_parent_cannot_reach_through_a_child_what_it_may_not_write(
    agent_test_image: tuple[Any, str], tmp_path: Path, state_dir: Path
) -> None:
    """From inside a real parent container: dispatch a child rooted at the parent's own
    read-only ``.git`` (to plant a hook the operator's next git command runs), and one
    whose workdir goes through a symlink the parent planted to a folder outside its root
    (the host made and chowned folders wherever it pointed). Both are refused; the hooks
    stay empty and nothing appears outside."""
    _client, image_ref = agent_test_image
    image = {
        "kind": "Image",
        "metadata": {"name": "agent-test"},
        "spec": {"recipe": "images/agent", "tag": image_ref, "baseline": True},
    }
    manifests = manifest_set(tmp_path, image)
    project = make_project(tmp_path)
    (project / ".git" / "hooks").mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    if os.geteuid() == 0:
        for path in (project / ".git", project / ".git" / "hooks"):
            os.chown(path, AGENT_UID, AGENT_UID)
    dispatch = "python3 -m kagura_agent.brain.memtool dispatch"
    hook = "echo touch /tmp/owned > hooks/post-checkout"
    task = write_task(
        project,
        "parent",
        {
            "image": "agent-test",
            "brain": "script",
            "steps": [
                f"{dispatch} 'plant a hook' --name hook --workdir .git --step '{hook}'"
                " > hook.json; true",
                f"ln -s {outside} out && {dispatch} 'escape' --name away --workdir out/new"
                " --step true > away.json; true",
            ],
        },
    )
    env = cli_env(state_dir)
    done = kagura(["apply", "--yes", "--json", "--manifests", str(manifests), str(task)], env)
    assert done.returncode == 0, done.stderr[-4000:]
    children = {c["task"]: c for c in last_json(done.stdout)["children"]}
    assert {t: (c["outcome"], c["run"]) for t, c in children.items()} == {
        "hook": ("refused", None),
        "away": ("refused", None),
    }
    assert any("read-only in the parent" in r for r in children["hook"]["reasons"])
    assert any("is not a folder of the project" in r for r in children["away"]["reasons"])
    assert list((project / ".git" / "hooks").iterdir()) == []
    assert list(outside.iterdir()) == []


DISPATCH_CANARY = "Canary-Dispatch-3b8e1f9a2c7d"


def test_a_child_request_carrying_the_parents_credential_is_refused(
    agent_test_image: tuple[Any, str], tmp_path: Path, state_dir: Path
) -> None:
    """A credential travels to a sub-agent only as a lease of the child's own plan: the
    parent's agent writing the key it holds into a child's prompt, steps or verify is
    refused before the child's task is written (it would sit in the state directory and
    reach the child outside any lease)."""
    client, image_ref = agent_test_image
    image = {
        "kind": "Image",
        "metadata": {"name": "agent-test"},
        "spec": {"recipe": "images/agent", "tag": image_ref, "baseline": True},
    }
    canary = {
        "kind": "CredentialProvider",
        "metadata": {"name": "canary"},
        "spec": {
            "type": "static",
            "standing": True,
            "secret": "env:CANARY_ROOT",
            "static": {"env": "CANARY_KEY"},
            "baseline_scopes": ["api"],
            "scopes": {"api": {"description": "a canary"}},
        },
    }
    manifests = manifest_set(tmp_path, image, canary)
    project = make_project(tmp_path)
    dispatch = "python3 -m kagura_agent.brain.memtool dispatch"
    task = write_task(
        project,
        "parent",
        {
            "image": "agent-test",
            "brain": "script",
            "credentials": [{"provider": "canary", "scope": "api"}],
            "steps": [
                f'{dispatch} "use the key $CANARY_KEY" --name prompted --step true'
                " > prompted.json; true",
                f'{dispatch} "save it" --name stepped --step "echo $CANARY_KEY > got.txt"'
                " > stepped.json; true",
                f'{dispatch} "check it" --name verified --step true'
                ' --verify "test $(echo $CANARY_KEY | tr a-z A-Z) != x" > verified.json; true',
                f'{dispatch} "an honest child" --name honest --step true > honest.json; true',
            ],
        },
    )
    env = cli_env(state_dir, CANARY_ROOT=DISPATCH_CANARY)
    done = kagura(["apply", "--yes", "--json", "--manifests", str(manifests), str(task)], env)
    assert done.returncode == 0, done.stderr[-4000:]
    children = {c["task"]: c for c in last_json(done.stdout)["children"]}
    assert {t: c["outcome"] for t, c in children.items()} == {
        "prompted": "refused",
        "stepped": "refused",
        "verified": "refused",
        "honest": "success",
    }
    assert any("carries a credential" in r for r in children["stepped"]["reasons"])
    assert not (project / "stepped" / "got.txt").exists()
    for form in (DISPATCH_CANARY, DISPATCH_CANARY.upper(), "3b8e1f9a2c7d"):
        assert form not in done.stdout + done.stderr, form
        for stored in state_dir.rglob("*"):
            if stored.is_file():
                assert form.encode() not in stored.read_bytes(), (form, stored)
    for child in children.values():
        if child["run"]:
            assert leftovers(client, child["run"]) == []
