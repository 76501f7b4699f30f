"""The turn budget held to the model calls the host counts at the proxy
(apply/guards/modelcalls.py).

Unit part: which lines of squid's access log are model calls. Docker part: ``apply_plan``
in-process with the run's key injected towards a fake Anthropic API
(testing/fake_anthropic.py); the fake claude (testing/fake_claude) reports one turn while
its Bash tool makes more model calls through the injecting port than the turn budget
allows, so the run stops at the budget and its record shows what was counted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from apply_helpers import leftovers, make_project, manifest_set, run_row, write_task

from kagura_agent.apply.guards.modelcalls import ModelCalls, is_model_call, mismatch
from kagura_agent.apply.guards.tripwire import Tripwire
from kagura_agent.apply.run.executor import ApplyOptions, apply_plan
from kagura_agent.membrane.egress import audit
from kagura_agent.membrane.egress.policy import load_policy
from kagura_agent.plan.build import plan_tasks
from testing.agent_test_image import ensure_agent_test_image
from testing.egress_images import ensure_egress_images
from testing.fake_anthropic import FakeAnthropicRuntime, fake_anthropic

API_KEY = "sk-ant-kagura-count-" + "c" * 30
TEST_LABEL = {"dev.kagura.test": "model-calls"}
# Lines as squid writes them (squid.LOG_FORMAT): ... server reason inport path.
LINE = "KAGURA1 1767225600.000 127.0.0.1 {method} http api.anthropic.com 80 {status} {squid}"
LINE += " 300 900 {server} {reason} {inport} {path}"


def _line(
    method: str = "POST",
    path: str = "/v1/messages",
    inport: int = 3129,
    server: str = "172.30.0.2",
    status: int = 200,
    squid: str = "TCP_MISS",
    reason: str = "-",
) -> str:
    fields = dict(method=method, path=path, inport=inport, server=server, status=status)
    return LINE.format(**fields, squid=squid, reason=reason)


def _events(*lines: str) -> list[dict[str, Any]]:
    policy = load_policy({"mode": "proxy", "allow": [{"host": "api.anthropic.com"}]})
    found = audit.events_from_log("\n".join(lines), policy, "r1")
    return [{"type": "egress.decision", **event.to_json()} for event in found]


def test_model_calls_are_posts_through_the_injecting_port_that_reached_the_upstream() -> None:
    lines = {
        "a model call": _line(),
        "a query is dropped": _line(path="/v1/messages%3Fbeta=true"),
        "any other POST": _line(path="/v1/messages/batches"),
        "a path dressed as free": _line(path="/v1/messages/count_tokens/"),
        "token counting (free)": _line(path="/v1/messages/count_tokens"),
        "free with a query": _line(path="/v1/messages/count_tokens?beta=true"),
        "a GET": _line(method="GET", path="/v1/models"),
        "the forward proxy's port": _line(inport=3128),
        "never reached the upstream": _line(server="-", status=503, squid="TCP_MISS"),
        "refused by squid": _line(server="-", status=403, squid="TCP_DENIED", reason="client"),
    }
    events = _events(*lines.values())
    assert [e["path"] for e in events][:2] == ["/v1/messages", "/v1/messages"]
    # The audit trail names where an injected request went; the forward port's stays loud.
    assert events[0]["reason"] == "injected"
    assert events[7]["reason"] == "allowed-without-matching-entry"
    counted = {what for what, event in zip(lines, events, strict=True) if is_model_call(event)}
    assert counted == {
        "a model call",
        "a query is dropped",
        "any other POST",
        "a path dressed as free",
    }
    calls = ModelCalls()
    for event in events:
        calls.feed(event)
    assert calls.count == 4


def test_a_line_without_port_and_path_still_parses_and_is_never_a_model_call() -> None:
    old = "KAGURA1 1767225600.000 127.0.0.1 POST http api.anthropic.com 80 200 TCP_MISS 3 9 10.0.0.2 -"
    [event] = _events(old)
    assert (event["inport"], event["path"], event["decision"]) == (0, "", "allow")
    assert not is_model_call(event)


def test_the_ports_budget_refusals_are_quiet_its_policy_refusals_trip() -> None:
    """The budget stop and the retry deal with a cap reached; a call that asks the provider
    to reach out, or for a path that is no model call, is an agent trying a way out (an
    honest CLI, its optional traffic off, makes none)."""
    trips: list[str] = []
    tripwire = Tripwire({"denied_egress": 3, "window_seconds": 60}, trips.append)
    refused = {"type": "egress.decision", "decision": "deny", "inport": 3129}
    for reason in ["budget", "concurrency"] * 5:
        tripwire.egress({**refused, "reason": reason})
    assert trips == []
    for reason in ("server-tool", "not-model-call", "mcp"):
        tripwire.egress({**refused, "reason": reason})
    assert len(trips) == 1


def test_a_large_gap_between_counted_calls_and_reported_turns_is_a_mismatch() -> None:
    assert not mismatch(counted=8, reported=3)
    assert mismatch(counted=9, reported=3)
    assert mismatch(counted=6, reported=0) and not mismatch(counted=2, reported=0)


# --- through apply, in real containers --------------------------------------------------

CALLS = 6  # model calls the agent makes; the engine reports 1 turn
TOKENS = 2  # token counting calls (free): never counted


CALLS_SCRIPT = """\
import os, sys, urllib.request as u
base = os.environ["ANTHROPIC_BASE_URL"]
body = b'{"model": "m", "max_tokens": 8, "messages": [], "tools": [{"name": "t"}]}'
for path in ["/v1/messages"] * int(sys.argv[1]) + ["/v1/messages/count_tokens"] * int(sys.argv[2]):
    try:
        u.urlopen(u.Request(base + path, data=body, method="POST")).read()
    except Exception as exc:  # refused past the budget: the next call is still tried
        print(path, exc)
"""


def _posts(calls: int) -> str:
    """The command the agent runs: ``calls`` model calls with tools (turns, as the CLI
    makes them), then the free token counting calls, through ANTHROPIC_BASE_URL (the
    injecting port) with no key of its own; a refused call does not stop the next."""
    return f"python3 calls.py {calls} {TOKENS}"


@pytest.fixture(scope="module")
def images(docker_client: Any) -> tuple[str, str]:
    return ensure_agent_test_image(docker_client), ensure_egress_images(docker_client)["base"]


def _apply(tmp_path: Path, images: tuple[str, str], calls: int, turns: int, after: str) -> Any:
    agent_image, base_image = images
    folder = manifest_set(
        tmp_path,
        {
            "kind": "Image",
            "metadata": {"name": "agent-test"},
            "spec": {"recipe": "images/agent", "tag": agent_image, "baseline": True},
        },
    )
    project = make_project(tmp_path)
    (project / "calls.py").write_text(CALLS_SCRIPT)
    prompt = f"run: {_posts(calls)}\nafter: {after}\nusage: 1 10 10 0.001"
    spec = {"image": "agent-test", "brain": "claude", "prompt": prompt}
    task = write_task(
        project, "counted", {**spec, "egress": ["anthropic"], "budget": {"turns": turns}}
    )
    (plan,) = plan_tasks(str(folder), [str(task)])
    return plan, base_image


def test_a_brain_that_under_reports_its_turns_is_stopped_at_the_proxy_count(
    docker_client: Any,
    images: tuple[str, str],
    tmp_path: Path,
    state_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", API_KEY)
    plan, base_image = _apply(tmp_path, images, CALLS, turns=3, after="sleep 90")
    with fake_anthropic(docker_client, base_image, TEST_LABEL) as fake:
        result = apply_plan(plan, ApplyOptions(as_json=True), FakeAnthropicRuntime(fake))
        requests = fake.requests()
    # No more model calls reached the model than the budget allows: the port counted
    # each when it started and refused the rest (the free token counts pass).
    turns = [line for line in requests if line.endswith(" /v1/messages")]
    assert len(turns) == 3 and len(requests) == 3 + TOKENS, requests
    assert all(f'KEYS ["{API_KEY}"] /v1/messages' in line for line in requests), requests
    # The engine said one turn (or nothing yet); the host counted three and stopped it.
    assert result.outcome == "failed"
    assert result.brain_error == (
        "budget: 3 model calls counted at the proxy of a 3-turn budget, not extended"
    ), result.brain_error
    assert result.model_calls == 3 and result.turns < 3
    assert result.wall_seconds < 60  # stopped, not waited out (the engine sleeps 90 s)
    row = run_row(state_dir, result.run_id)
    assert (row["outcome"], row["model_calls"], row["turns"]) == ("failed", 3, result.turns)
    assert leftovers(docker_client, result.run_id) == []


def test_a_brain_within_its_turn_budget_is_untouched_and_both_figures_are_kept(
    docker_client: Any,
    images: tuple[str, str],
    tmp_path: Path,
    state_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", API_KEY)
    plan, base_image = _apply(tmp_path, images, 1, turns=3, after="true")
    with fake_anthropic(docker_client, base_image, TEST_LABEL) as fake:
        result = apply_plan(plan, ApplyOptions(as_json=True), FakeAnthropicRuntime(fake))
    assert result.outcome == "success", result.brain_error
    assert (result.model_calls, result.turns) == (1, 1)
    assert run_row(state_dir, result.run_id)["model_calls"] == 1


# --- each of the turn budget's three checks, on the proxy's count alone ------------------


def _port_line(status: str, reason: str = "-", server: str = "172.30.0.2") -> str:
    """A line as the injecting port writes it (modelport.py): its class in the status field."""
    code = 200 if status != "MODEL_DENIED" else 403
    return (
        f"KAGURA1 1767225600.000 127.0.0.1 POST http api.anthropic.com 443 {code} {status}"
        f" 300 900 {server} {reason} 3129 /v1/messages"
    )


def _fed(*lines: str) -> ModelCalls:
    calls = ModelCalls()
    for event in _events(*lines):
        calls.feed(event)
    return calls


class _Limits:
    """The run's proxy as MidRun sees it: what the turn cap was set to."""

    def __init__(self) -> None:
        self.turns: list[int | None] = []

    def reload(self, egress: dict[str, Any]) -> None:
        raise AssertionError("no egress grant here")

    def limit_model_calls(self, turns: int | None) -> None:
        self.turns.append(turns)


def test_the_port_counts_turns_side_calls_and_refusals_apart() -> None:
    calls = _fed(
        *[_port_line("MODEL_TURN")] * 3,
        _port_line("MODEL_SIDE"),
        _port_line("MODEL_FREE"),
        _port_line("MODEL_DENIED", "budget", "-"),
        _port_line("MODEL_DENIED", "server-tool", "-"),
    )
    assert (calls.count, calls.of("side"), calls.of("free"), calls.refused_at) == (3, 1, 1, 3)


@pytest.mark.usefixtures("without_docker")
def test_each_turn_budget_check_holds_on_the_proxy_count_alone(
    tmp_path: Path, state_dir: Path
) -> None:
    import asyncio

    from test_brain_budget import _midrun

    ceiling = {"kind": "Policy", "metadata": {"name": "cap"}, "spec": {"ceilings": {"turns": 5}}}
    midrun, _, _ = _midrun(tmp_path, "approved", ceiling, turns=3)
    # The engine reports nothing; the proxy counted 3 turn calls of a 3-turn budget.
    midrun.calls = _fed(*[_port_line("MODEL_TURN")] * 3)
    counted = "3 model calls counted at the proxy of a 3-turn budget"
    # 1. the live check on the brain's next tool call: the tools of the last allowed call
    #    are that turn's own (the real CLI runs them, then stops at --max-turns and the
    #    engine asks for more); past the budget (a proxy that did not cap) it stops.
    assert midrun.past_budget() is None
    midrun.calls = _fed(*[_port_line("MODEL_TURN")] * 4)
    assert midrun.past_budget() == "4 model calls counted at the proxy of a 3-turn budget"
    midrun.calls = _fed(*[_port_line("MODEL_TURN")] * 3)
    # 2. the watch of the count: at the cap the brain may end its turn; once the port
    #    refuses it a call past the cap, it is stopped whatever its engine says.
    assert midrun.past_counted() is None
    midrun.calls = _fed(*[_port_line("MODEL_TURN")] * 3, _port_line("MODEL_DENIED", "budget"))
    assert midrun.past_counted() == counted
    # 3. an extension is reckoned from the proxy's count: 5 turns granted, 2 left; the
    #    port's cap moves to 5 before the grant is in force.
    midrun.egress = _Limits()
    answer = asyncio.run(midrun.extend_budget("turns", 0, 0.0, "Reached maximum turns (3)"))
    assert answer["granted"] and answer["turns"] == 2, answer
    assert midrun.egress.turns == [5]
    # A refusal from before the extension is no reason to stop under the new cap.
    assert midrun.past_counted() is None
