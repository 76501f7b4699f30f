"""Mid-run grants through ``kagura-agent apply`` in real containers, the fake claude CLI
driving the sdk engine: the brain calls its ``request_access`` tool; apply compiles the
amended plan from the operator's manifests and asks; an answer is a decision in the
approval log plus a nudge on apply's stdin (what ``serve`` does — here the test plays
the cockpit). Approved egress reloads the run's proxy and the agent reaches the new host
through it; a denied one stays unreachable; a host no manifest allows is refused without
asking; a credential is leased and pushed into the container; the wall budget is
extended when approved and the run stops when nobody answers. Everything is recorded.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from apply_helpers import (
    REPO,
    TEST_LABEL,
    cli_env,
    leftovers,
    live_leases,
    make_project,
    manifest_set,
    run_ids,
    wait_for_run,
    write_task,
)

from kagura_agent.apply.midrun.grants import amendments
from kagura_agent.approvals import Verdict, history, record_decision
from kagura_agent.clock import SystemClock
from kagura_agent.membrane import images
from kagura_agent.membrane.egress.owner import COMPONENT_OUTBOUND, LABEL_COMPONENT
from kagura_agent.membrane.hardening import LABEL_RUN
from kagura_agent.state import StateStore
from testing.agent_test_image import ensure_agent_test_image

pytestmark = pytest.mark.usefixtures("docker_client")

API_KEY = "sk-ant-kagura-midrun-" + "m" * 30
TOKEN = "kagura-midrun-token-" + "t" * 24
PRIVATE = ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"]
UPSTREAM = """
import http.server
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = ("hello from " + self.headers.get("Host", "?")).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body)))
        self.end_headers(); self.wfile.write(body)
    def log_message(self, *args): pass
print("ready", flush=True)
http.server.ThreadingHTTPServer(("", 8080), H).serve_forever()
"""
WAIT_UPSTREAM = "for i in $(seq 600); do test -e .upstream-ready && break; sleep 0.1; done"


def fetch(host: str) -> str:
    """A command for the agent: GET http://HOST:8080/ through the run's proxy."""
    code = (
        "import urllib.request as u;"
        f" print(u.urlopen('http://{host}:8080/', timeout=10).read().decode())"
    )
    return f'python3 -c "{code}" 2>&1 | tail -1'


def access(kind: str, name: str, reason: str) -> str:
    return "access: " + json.dumps({"kind": kind, "name": name, "reason": reason})


def policy(name: str, host: str) -> dict[str, Any]:
    allow = [{"host": host, "ports": [8080], "http": True, "allow_addresses": PRIVATE}]
    return {"kind": "EgressPolicy", "metadata": {"name": name}, "spec": {"allow": allow}}


@pytest.fixture(scope="module")
def agent_image(docker_client: Any) -> str:
    return ensure_agent_test_image(docker_client)


@pytest.fixture()
def upstream(docker_client: Any) -> Iterator[Any]:
    network = docker_client.networks.create(
        f"kagura-midrun-{uuid.uuid4().hex[:8]}", driver="bridge", internal=True, labels=TEST_LABEL
    )
    container = docker_client.containers.run(
        images.image_ref("base"),
        ["python3", "-c", UPSTREAM],
        detach=True,
        labels=TEST_LABEL,
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


def manifests(tmp_path: Path, image: str) -> Path:
    return manifest_set(
        tmp_path,
        {
            "kind": "Image",
            "metadata": {"name": "agent-test"},
            "spec": {"recipe": "images/agent", "tag": image, "baseline": True},
        },
        policy("second", "second.test"),
        policy("third", "third.test"),
        {
            "kind": "CredentialProvider",
            "metadata": {"name": "token"},
            "spec": {
                "type": "static",
                "standing": True,
                "secret": "env:KAGURA_MIDRUN_TOKEN",
                # A file: a process already running (the CLI) never sees new env.
                "static": {"file": "token"},
                "scopes": {"use": {"description": "a canary token"}},
            },
        },
    )


Decide = Callable[[dict[str, Any]], str]  # an ask event -> "approve" | "deny" | "silence" | …


class Operator:
    """The test as the cockpit: reads apply's live events, answers each ``ask`` the way
    ``decide`` says by recording a decision and nudging apply's stdin."""

    def __init__(self, proc: subprocess.Popen[str], state_dir: Path, decide: Decide) -> None:
        self.proc = proc
        self.state_dir = state_dir
        self.decide = decide
        self.lines: list[dict[str, Any]] = []
        self.asks: list[dict[str, Any]] = []
        self.raw: list[str] = []
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.raw.append(line)
            try:
                item = json.loads(line)
            except ValueError:
                continue
            if not isinstance(item, dict):
                continue
            self.lines.append(item)
            if item.get("kind") == "ask":
                self.asks.append(item)
                self._answer(item, self.decide(item))

    def _answer(self, ask: dict[str, Any], how: str) -> None:
        if how == "silence":
            return
        fingerprint = ask["fingerprint"]
        if how == "forge":  # an approval for another plan, then the nudge: must not count
            fingerprint = "sha256:" + "0" * 64
        with StateStore(self.state_dir / "state.db") as store:
            record_decision(
                store,
                Verdict(
                    category=ask["category"],
                    fingerprint=fingerprint,
                    outcome="denied" if how == "deny" else "approved",
                    who="test:operator",
                    via="test",
                    reason="answered by the test",
                    request=ask["request"],
                ),
                clock=SystemClock(),
            )
        self.nudge(ask["request"])

    def nudge(self, request: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"answered": request}) + "\n")
        self.proc.stdin.flush()

    def notes(self) -> list[str]:
        return [str(i.get("message")) for i in self.lines if i.get("kind") in ("note", "phase")]

    def outputs(self) -> list[str]:
        """What each Bash call printed, in order."""
        brain = [i for i in self.lines if i.get("kind") == "brain"]
        return [str(i.get("output", "")).strip() for i in brain if i.get("type") == "tool_result"]

    def texts(self) -> str:
        return "\n".join(
            str(i.get("text") or i.get("result") or "")
            for i in self.lines
            if i.get("kind") == "brain"
        )


def start(
    tmp_path: Path,
    state_dir: Path,
    image: str,
    prompt: str,
    decide: Decide,
    *,
    budget: dict[str, Any] | None = None,
    approval_timeout: float = 60,
) -> tuple[subprocess.Popen[str], Operator, Path]:
    folder = manifests(tmp_path, image)
    project = make_project(tmp_path)
    spec: dict[str, Any] = {
        "image": "agent-test",
        "brain": "claude",
        "prompt": prompt,
        "egress": ["anthropic"],
    }
    if budget:
        spec["budget"] = budget
    task = write_task(project, "midrun", spec)
    env = cli_env(state_dir, ANTHROPIC_API_KEY=API_KEY, KAGURA_MIDRUN_TOKEN=TOKEN)
    argv = [sys.executable, "-m", "kagura_agent", "apply", "--yes", "--json", "--steer-stdin"]
    argv += ["--approval-timeout", str(approval_timeout), "--manifests", str(folder), str(task)]
    proc = subprocess.Popen(
        argv,
        env=env,
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    return proc, Operator(proc, state_dir, decide), project


def attach_upstream(client: Any, upstream: Any, state_dir: Path, proc: Any, project: Path) -> None:
    """The upstream joins this run's outbound network as second.test and third.test."""
    run_id = wait_for_run(state_dir, proc)
    labels = [f"{LABEL_RUN}={run_id}", f"{LABEL_COMPONENT}={COMPONENT_OUTBOUND}"]
    deadline = time.monotonic() + 60
    while not (nets := client.networks.list(filters={"label": labels})):
        assert proc.poll() is None, "apply ended before its outbound network existed"
        assert time.monotonic() < deadline, "apply never created its outbound network"
        time.sleep(0.05)
    nets[0].connect(upstream, aliases=["second.test", "third.test"])
    (project / ".upstream-ready").write_text("go\n")


def finish(proc: subprocess.Popen[str], operator: Operator, timeout: float = 240) -> dict[str, Any]:
    # Not communicate(): it would close apply's stdin, which means "the cockpit is gone".
    assert proc.stdout is not None
    out = proc.stdout.read()
    proc.wait(timeout)
    operator.thread.join(10)
    return json.loads(out) if out.strip() else {}


def test_egress_granted_denied_refused_and_a_credential_pushed_mid_run(
    docker_client: Any, agent_image: str, upstream: Any, tmp_path: Path, state_dir: Path
) -> None:
    answers = {
        "egress:second": "approve",
        "egress:third": "deny",
        "credential:token/use": "approve",
    }
    prompt = "\n".join(
        [
            f"run: {WAIT_UPSTREAM}; {fetch('second.test')}",
            access("egress", "second.test", "the data lives on second.test"),
            access("egress", "third", "and a bit on third.test"),
            access("egress", "elsewhere.test", "no manifest allows this one"),
            access("credential", "token/use", "the API needs its token"),
            f"after: {fetch('second.test')}",
            f"after: {fetch('third.test')}",
            "after: test -s /run/kagura/creds/token && echo token-delivered || echo no-token",
        ]
    )
    proc, operator, project = start(
        tmp_path, state_dir, agent_image, prompt, lambda ask: answers[ask["category"]]
    )
    try:
        attach_upstream(docker_client, upstream, state_dir, proc, project)
        result = finish(proc, operator)
    finally:
        if proc.poll() is None:
            proc.kill()
    err = "".join(operator.raw)
    assert result.get("outcome") == "success", err
    said = operator.texts()
    # Before the grant second.test is refused by the proxy; after it, reached through it;
    # third.test (denied) stays refused; the granted credential's file is there.
    before, second, third, token = operator.outputs()
    assert "403" in before and "hello from second.test" in second, (before, second)
    assert "403" in third and token == "token-delivered", (third, token)
    assert "Access said: granted: egress:second approved by test:operator" in said, said
    assert "Access said: [error] refused: denied by test:operator" in said, said
    assert "nobody was asked, the operator's manifests do not allow it: no EgressPolicy" in said
    assert TOKEN not in err and API_KEY not in err
    # Asked: exactly the three the manifests allow, each with the plan diff, each bound
    # to its own amended plan.
    assert [a["category"] for a in operator.asks] == list(answers), operator.asks
    assert "+ egress second.test:8080 (policy second)" in operator.asks[0]["text"], operator.asks[
        0
    ]["text"]
    assert len({a["fingerprint"] for a in operator.asks}) == 3
    assert any("egress proxy reloaded" in n for n in operator.notes()), operator.notes()
    # The run's record and the approval log.
    [run_id] = run_ids(state_dir)
    with StateStore(state_dir / "state.db") as store:
        rows = amendments(store, run_id)
        log = history(store)
    assert [(r["category"], r["outcome"]) for r in rows] == [
        ("egress:second", "granted"),
        ("egress:third", "denied"),
        ("", "refused"),
        ("credential:token/use", "granted"),
    ], rows
    assert rows[2]["name"] == "elsewhere.test" and "no EgressPolicy" in rows[2]["detail"]
    decided = {(d.category, d.fingerprint): d.outcome for d in reversed(log)}
    for ask, row in zip(operator.asks, [rows[0], rows[1], rows[3]], strict=True):
        assert row["fingerprint"] == ask["fingerprint"]
        assert decided[(ask["category"], ask["fingerprint"])] == (
            "denied" if ask["category"] == "egress:third" else "approved"
        )
    assert leftovers(docker_client, run_id) == []
    assert live_leases(cli_env(state_dir)) == []


def test_a_forged_approval_for_another_plan_is_ignored_and_silence_denies(
    docker_client: Any, agent_image: str, upstream: Any, tmp_path: Path, state_dir: Path
) -> None:
    prompt = "\n".join(
        [
            f"run: {WAIT_UPSTREAM}",
            access("egress", "second", "please"),
            f"after: {fetch('second.test')}",
        ]
    )
    proc, operator, project = start(
        tmp_path, state_dir, agent_image, prompt, lambda ask: "forge", approval_timeout=6
    )
    try:
        attach_upstream(docker_client, upstream, state_dir, proc, project)
        result = finish(proc, operator)
    finally:
        if proc.poll() is None:
            proc.kill()
    said = operator.texts()
    assert result.get("outcome") == "success", "".join(operator.raw)
    assert "Access said: [error] refused: not approved: no answer within 6s" in said, said
    assert "hello from second.test" not in said, said
    [run_id] = run_ids(state_dir)
    with StateStore(state_dir / "state.db") as store:
        [row] = amendments(store, run_id)
        log = history(store)
    assert row["outcome"] == "timeout"
    # The forged approval is in the log, for another fingerprint; the request's own
    # fingerprint has only the timeout.
    mine = [d for d in log if d.fingerprint == row["fingerprint"]]
    assert [d.outcome for d in mine] == ["timeout"], mine
    assert any(d.outcome == "approved" and d.fingerprint != row["fingerprint"] for d in log)


def test_identical_requests_ask_once_and_a_denied_one_is_not_asked_again(
    docker_client: Any, agent_image: str, upstream: Any, tmp_path: Path, state_dir: Path
) -> None:
    """25 identical request_access calls (the red team's: 27 questions), then the same
    policy asked for by its host: one question, denied; every other call is refused
    without asking, saying why, and recorded as refused."""
    prompt = "\n".join(
        [
            f"run: {WAIT_UPSTREAM}",
            *[access("egress", "second", f"please ({n})") for n in range(25)],
            access("egress", "second.test", "by its host this time"),
            f"after: {fetch('second.test')}",
        ]
    )
    proc, operator, project = start(tmp_path, state_dir, agent_image, prompt, lambda ask: "deny")
    try:
        attach_upstream(docker_client, upstream, state_dir, proc, project)
        result = finish(proc, operator)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert result.get("outcome") == "success", "".join(operator.raw)
    assert [a["category"] for a in operator.asks] == ["egress:second"], operator.asks
    said = "\n".join(  # what the brain said (its final answer repeats it)
        str(i.get("text")) for i in operator.lines if i.get("type") == "text"
    )
    assert said.count("Access said: [error] refused: denied by test:operator") == 1, said
    assert (
        said.count(
            "Access said: [error] refused: nobody was asked: egress:second was denied by"
            " test:operator via test (answered by the test) earlier in this run: not asked again"
        )
        == 25
    ), said
    assert "hello from second.test" not in said
    [run_id] = run_ids(state_dir)
    with StateStore(state_dir / "state.db") as store:
        rows = amendments(store, run_id)
    assert [r["outcome"] for r in rows] == ["denied"] + ["refused"] * 25, rows
    assert rows[-1]["name"] == "second.test" and "not asked again" in rows[-1]["detail"]


def test_the_wall_budget_is_extended_when_approved(
    agent_image: str, tmp_path: Path, state_dir: Path
) -> None:
    prompt = "run: sleep 15 && echo slept > slept.txt"
    proc, operator, _ = start(
        tmp_path,
        state_dir,
        agent_image,
        prompt,
        lambda ask: "approve",
        budget={"wall_time": "12s"},
    )
    result = finish(proc, operator)
    assert result.get("outcome") == "success", "".join(operator.raw)
    # Asked before the 12 s ran out (again before 24 s when the machine is slow).
    ask = operator.asks[0]
    assert ask["category"] == "budget:wall_seconds"
    assert "~ budget wall_seconds 12 → 24" in ask["text"], ask["text"]
    assert any("wall budget extended to 24s" in n for n in operator.notes()), operator.notes()
    [run_id] = run_ids(state_dir)
    with StateStore(state_dir / "state.db") as store:
        row = amendments(store, run_id)[0]
    assert (row["category"], row["outcome"]) == ("budget:wall_seconds", "granted")
    assert row["fingerprint"] == ask["fingerprint"]


def test_an_unanswered_wall_extension_stops_the_run_saying_why(
    agent_image: str, tmp_path: Path, state_dir: Path
) -> None:
    prompt = "run: sleep 15 && echo slept > slept.txt"
    proc, operator, project = start(
        tmp_path,
        state_dir,
        agent_image,
        prompt,
        lambda ask: "silence",
        budget={"wall_time": "12s"},
    )
    result = finish(proc, operator)
    assert result.get("outcome") == "failed", "".join(operator.raw)
    assert "wall" in str(result.get("brain_error")), result
    assert not (project / "slept.txt").exists()
    notes = operator.notes()
    assert any("wall budget not extended (not approved: no answer" in n for n in notes), notes
    [run_id] = run_ids(state_dir)
    with StateStore(state_dir / "state.db") as store:
        [row] = amendments(store, run_id)
    assert (row["category"], row["outcome"]) == ("budget:wall_seconds", "timeout")
