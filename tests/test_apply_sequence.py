"""apply's sequence against an in-memory runtime (testing/memory_runtime.py): no Docker.

The real-Docker tests (test_apply_e2e.py, test_apply_signals.py, test_verify_isolation.py,
…) prove the containers; these prove the sequence around them, every branch of it, in
well under a second each: a success, a verify failure, a brain error, a brain crash, a
hijack tripwire, and every clean-up path — a Docker error, Ctrl-C or SIGTERM at each
point of the run leaves no container, network, volume, proxy or open lease behind, and
the run's row records how it ended. Plans come from the planner (``plan_tasks``), the
state store is the test's own, everything else (leases, memory, graduation, the brain
channel) is the real code.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from apply_helpers import NOWHERE, make_project, manifest_set, token_provider, write_task

from kagura_agent.apply.records.runs import open_run
from kagura_agent.apply.run import executor, steps
from kagura_agent.apply.run.context import (
    ApplyRuntime,
    BrainOutcome,
    RunReport,
    assemble,
    decide,
)
from kagura_agent.apply.run.executor import ApplyOptions, RunResult, apply_plan
from kagura_agent.brain.events import CostEvent, DoneEvent, ErrorEvent, TextEvent, ToolCallEvent
from kagura_agent.clock import SystemClock
from kagura_agent.errors import ExitCode, KaguraError, Terminated
from kagura_agent.membrane.leases import Ledger
from kagura_agent.membrane.runtime import ContainerError
from kagura_agent.plan.build import plan_tasks
from kagura_agent.plan.injection import PLACEHOLDER
from kagura_agent.plan.model import Plan
from kagura_agent.state import open_store
from testing.memory_runtime import BrainScript, MemoryRuntime

TOKEN = "kagura-sequence-canary-" + "s" * 24
VERIFY = "test -s out.txt"
MANIFESTS: tuple[dict[str, Any], ...] = (
    token_provider("KAGURA_SEQ_TOKEN"),
    NOWHERE,
    # The script engine, stopped by the host after 5 s without an event.
    {
        "kind": "Brain",
        "metadata": {"name": "quiet"},
        "spec": {"engine": "script", "idle_timeout": "5s"},
    },
)


@dataclass(frozen=True)
class Scene:
    plan: Plan
    state_dir: Path


@pytest.fixture()
def scene(tmp_path: Path, state_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Scene]:
    """A planned task with a leased credential, an egress proxy and one verify command."""
    monkeypatch.setenv("KAGURA_SEQ_TOKEN", TOKEN)
    plan = _plan(tmp_path)
    assert plan["egress"]["mode"] == "proxy" and len(plan["credentials"]) == 1
    yield Scene(plan, state_dir)


def _plan(tmp_path: Path, **changes: Any) -> Plan:
    """The planner's plan of the scene's task, with ``changes`` to its spec."""
    manifests = manifest_set(tmp_path, *MANIFESTS)
    project = make_project(tmp_path)
    spec = {
        "brain": "script",
        "egress": ["nowhere"],
        "credentials": [{"provider": "token", "scope": "use"}],
        "steps": ["echo hi > out.txt"],
        "verify": [VERIFY],
        **changes,
    }
    task = write_task(project, "sequence", spec)
    (plan,) = plan_tasks(str(manifests), [str(task)])
    assert plan["applyable"], plan["refusals"]
    return plan


def _apply(scene: Scene, runtime: MemoryRuntime) -> RunResult:
    checked: ApplyRuntime = runtime  # the fake is a real implementation of the Protocol
    return apply_plan(scene.plan, ApplyOptions(clock=SystemClock()), checked)


def _runs(state_dir: Path) -> list[tuple[str, int]]:
    with sqlite3.connect(state_dir / "state.db") as db:
        rows = db.execute("SELECT outcome, exit_code FROM runs WHERE ended_at IS NOT NULL")
        return [(str(o), int(c)) for o, c in rows.fetchall()]


def _open_leases() -> list[str]:
    with open_store() as store:
        return [row.name for row in Ledger(store, SystemClock()).open_rows()]


def _all_leases() -> list[str]:
    with open_store() as store:
        return [row.state for row in Ledger(store, SystemClock()).rows()]


def _assert_nothing_left(runtime: MemoryRuntime) -> None:
    """No container (agent, verify, proxy), network or volume; no open lease; proxy gone."""
    assert runtime.containers == {}, runtime.log
    assert runtime.networks == {} and runtime.volumes == {}, runtime.log
    assert all(egress.closed for egress in runtime.egress), runtime.log
    assert _open_leases() == []


def _index(runtime: MemoryRuntime, entry: tuple[str, str]) -> int:
    return runtime.log.index(entry)


# --- the outcome ----------------------------------------------------------------------


@pytest.mark.usefixtures("without_docker")
def test_success_runs_the_whole_sequence_in_order(scene: Scene) -> None:
    brain = BrainScript(
        [TextEvent("working\n\n"), CostEvent(usd=0.25, turns=2), DoneEvent(result="done")]
    )
    runtime = MemoryRuntime(brain, verify={VERIFY: (0, "fine")})
    result = _apply(scene, runtime)

    assert (result.outcome, result.exit_code) == ("success", 0)
    assert result.verify == ((VERIFY, 0, "fine"),)
    assert (result.brain_error, result.cost_usd, result.turns) == (None, 0.25, 2)
    assert _runs(scene.state_dir) == [("success", 0)]
    _assert_nothing_left(runtime)
    [agent] = runtime.agents
    # The credential went in over the channel before the turn, and was wiped after it.
    assert len(agent.delivered) == 1 and agent.revoked == agent.delivered
    assert TOKEN not in str(agent.environment)
    assert agent.environment["HTTP_PROXY"] and agent.network == "none"
    assert len(agent.turns) == 1
    assert _all_leases() and _open_leases() == []
    log = runtime.log
    # Proxy first, then the agent (attached before it starts), its forwarder, and verify
    # in a fresh container only after the agent's container stopped.
    order = [
        ("start_egress", result.run_id),
        ("create", "agent"),
        ("attach", "agent"),
        ("start", "agent"),
        ("exited", "agent"),
        ("create", "verify"),
        ("exec", VERIFY),
        ("remove", "verify"),
        ("remove", "agent"),
        ("egress_close", result.run_id),
    ]
    assert [_index(runtime, entry) for entry in order] == sorted(
        _index(runtime, entry) for entry in order
    ), log
    assert log.index(("start", "agent")) < [e[0] for e in log].index("start_forwarder")


@pytest.mark.usefixtures("without_docker")
def test_a_failing_verify_fails_the_run_whatever_the_brain_said(scene: Scene) -> None:
    runtime = MemoryRuntime(
        BrainScript([DoneEvent(result="success - all checks passed")]),
        verify={VERIFY: (1, "out.txt is empty")},
    )
    result = _apply(scene, runtime)
    assert (result.outcome, result.exit_code) == ("failed", 1)
    assert result.verify == ((VERIFY, 1, "out.txt is empty"),)
    assert result.brain_error is None
    assert _runs(scene.state_dir) == [("failed", 1)]
    _assert_nothing_left(runtime)


@pytest.mark.usefixtures("without_docker")
def test_a_brain_error_fails_the_run_even_when_verify_passes(scene: Scene) -> None:
    runtime = MemoryRuntime(BrainScript([ErrorEvent(message="gave up", code="engine")]))
    result = _apply(scene, runtime)
    assert (result.outcome, result.exit_code, result.brain_error) == (
        "failed",
        1,
        "engine: gave up",
    )
    assert result.verify == ((VERIFY, 0, ""),)  # verify still ran, independently
    _assert_nothing_left(runtime)


@pytest.mark.usefixtures("without_docker")
def test_a_brain_crash_fails_the_run_and_still_cleans_up(scene: Scene) -> None:
    runtime = MemoryRuntime(BrainScript([TextEvent("half a thought")], crash=True, exit_code=139))
    result = _apply(scene, runtime)
    assert (result.outcome, result.exit_code) == ("failed", 1)
    assert result.brain_error is not None and result.brain_error.startswith("crash:")
    assert _runs(scene.state_dir) == [("failed", 1)]
    [agent] = runtime.agents
    # The container was gone, so nothing could be wiped inside; the host revoked anyway.
    assert agent.exit_code == 139 and agent.revoked == []
    _assert_nothing_left(runtime)


@pytest.mark.usefixtures("without_docker")
def test_a_tripwire_stops_the_run_skips_verify_and_records_an_incident(scene: Scene) -> None:
    denied = {"decision": "deny", "host": "evil.test", "port": 443}
    runtime = MemoryRuntime(BrainScript(egress=[denied] * 5))
    result = _apply(scene, runtime)
    assert (result.outcome, result.exit_code) == ("failed", 1)
    assert result.brain_error is not None and result.brain_error.startswith("tripwire:")
    assert result.verify == ((VERIFY, -1, "not run: the run tripped a hijack tripwire"),)
    assert ("create", "verify") not in runtime.log and ("kill", "agent") in runtime.log
    assert result.denials == ({"host": "evil.test", "port": 443, "count": 5},)
    with sqlite3.connect(scene.state_dir / "state.db") as db:
        [(run_id,)] = db.execute("SELECT run_id FROM incidents").fetchall()
    assert run_id == result.run_id
    _assert_nothing_left(runtime)


def test_the_outcome_is_decided_before_recording() -> None:
    """decide() is the one place: brain error or any non-zero verify fails, fail closed."""
    ok = BrainOutcome()
    assert decide(RunReport(ok, ((VERIFY, 0, ""),))) == ("success", 0)
    assert decide(RunReport(ok)) == ("success", 0)
    assert decide(RunReport(ok, ((VERIFY, 0, ""), ("b", -1, "")))) == ("failed", 1)
    assert decide(RunReport(BrainOutcome(error="crash: x"), ((VERIFY, 0, ""),))) == ("failed", 1)
    stopped = RunReport(BrainOutcome(error="crash: x"), (), host_stop="disk: over")
    result = assemble("run-1", stopped, 1.0, ())
    assert (result.outcome, result.brain_error) == ("failed", "disk: over")
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.outcome = "success"  # type: ignore[misc]


# --- every clean-up path --------------------------------------------------------------

# Each point the run can fail at, in the order the run reaches them.
POINTS = (
    "start_egress",
    "create:agent",
    "attach",
    "start:agent",
    "start_forwarder",
    "credentials",
    "turn",
)


@pytest.mark.parametrize("point", POINTS)
@pytest.mark.usefixtures("without_docker")
def test_a_docker_error_at_each_point_leaves_nothing_behind(scene: Scene, point: str) -> None:
    runtime = MemoryRuntime(fail_at={point: ContainerError(f"{point}: the daemon said no")})
    with pytest.raises(KaguraError) as raised:
        _apply(scene, runtime)
    assert point in raised.value.message
    assert _runs(scene.state_dir) == [("failed", int(ExitCode.SETUP))]
    _assert_nothing_left(runtime)


@pytest.mark.parametrize("point", (*POINTS, "create:verify", "exec"))
@pytest.mark.parametrize(
    ("exc", "outcome", "code"),
    [(KeyboardInterrupt, "interrupted", 130), (Terminated, "terminated", 143)],
)
@pytest.mark.usefixtures("without_docker")
def test_ctrl_c_or_sigterm_at_each_point_leaves_nothing_behind(
    scene: Scene, point: str, exc: type[BaseException], outcome: str, code: int
) -> None:
    runtime = MemoryRuntime(fail_at={point: exc()})
    result = _apply(scene, runtime)
    assert (result.outcome, result.exit_code) == (outcome, code)
    assert ("fail", point) in runtime.log
    assert _runs(scene.state_dir) == [(outcome, code)]
    _assert_nothing_left(runtime)


@pytest.mark.usefixtures("without_docker")
def test_ctrl_c_as_the_brain_answers_its_turn_interrupts_the_run(
    tmp_path: Path, state_dir: Path
) -> None:
    """A real SIGINT (Ctrl-C; the cockpit's kill and a team runner's stop send the same)
    that lands while the turn is being sent, the brain's first event already on the stream
    when the loop next runs: the run is interrupted and cleaned up. Python 3.11's
    ``asyncio.wait_for`` returned that event and dropped the cancellation, and the turn
    went on to the brain's idle timeout (failed, exit 1)."""

    def interrupt() -> None:
        # The turn runs in asyncio.run's loop, whose handler takes SIGINT: it cancels the
        # apply's main task (else this would raise KeyboardInterrupt out of the test).
        assert signal.getsignal(signal.SIGINT) is not signal.default_int_handler
        os.kill(os.getpid(), signal.SIGINT)

    # No credential to deliver first: the turn is the first thing the channel sends, as for
    # the team runner's run that went on (the reader starts in the same pass of the loop).
    plan = _plan(tmp_path, brain="quiet", credentials=[])
    first = ToolCallEvent(id="1", name="bash", input={"command": "sleep 600"})
    runtime = MemoryRuntime(BrainScript([first], on_turn=interrupt))
    result = apply_plan(plan, ApplyOptions(clock=SystemClock()), runtime)
    assert (result.outcome, result.exit_code) == ("interrupted", 130), result.brain_error
    assert runtime.agents[0].turns  # the turn was sent: the signal came mid-run
    assert _runs(state_dir) == [("interrupted", 130)]
    _assert_nothing_left(runtime)


@pytest.mark.parametrize("point", ["create:verify", "start:verify", "exec"])
@pytest.mark.usefixtures("without_docker")
def test_verify_that_cannot_run_fails_closed_and_is_recorded(scene: Scene, point: str) -> None:
    runtime = MemoryRuntime(fail_at={point: ContainerError(f"{point}: no")})
    result = _apply(scene, runtime)
    assert (result.outcome, result.exit_code) == ("failed", 1)
    [(command, exit_code, output)] = result.verify
    assert (command, exit_code) == (VERIFY, -1) and "verify could not run" in output
    assert _runs(scene.state_dir) == [("failed", 1)]
    _assert_nothing_left(runtime)


@pytest.mark.usefixtures("without_docker")
def test_a_failing_teardown_is_an_error_but_the_rest_is_still_cleaned(scene: Scene) -> None:
    """The proxy that will not go: the run was recorded, leases and containers are gone,
    and the error reaches the operator (the next start's sweep removes the proxy)."""
    runtime = MemoryRuntime(fail_at={"egress_close": ContainerError("proxy stuck")})
    with pytest.raises(ContainerError):
        _apply(scene, runtime)
    assert _runs(scene.state_dir) == [("failed", int(ExitCode.SETUP))]
    assert [c.role for c in runtime.containers.values()] == ["proxy"]
    assert _open_leases() == []
    with sqlite3.connect(scene.state_dir / "memory.db") as db:
        assert db.execute("SELECT COUNT(*) FROM memories").fetchone()[0] >= 1


@pytest.mark.usefixtures("without_docker")
def test_an_agent_container_that_will_not_go_is_an_error_after_the_rest(scene: Scene) -> None:
    runtime = MemoryRuntime(fail_at={"remove:agent": ContainerError("remove: device busy")})
    with pytest.raises(ContainerError):
        _apply(scene, runtime)
    assert _runs(scene.state_dir) == [("failed", int(ExitCode.SETUP))]
    # Only the agent's container stayed (labelled with its run, for the sweep); the proxy,
    # its network and volume and the leases are gone.
    assert [c.role for c in runtime.containers.values()] == ["agent"]
    assert runtime.networks == {} and all(e.closed for e in runtime.egress)
    assert _open_leases() == []


@pytest.mark.usefixtures("without_docker")
def test_a_run_over_its_disk_budget_is_stopped_by_the_host(tmp_path: Path, state_dir: Path) -> None:
    """The brain writes past ``budget.disk`` and then stays silent: the host's disk watch
    kills its container, the run fails with the reason, and verify still decides nothing
    in its favour."""
    manifests = manifest_set(tmp_path)
    project = make_project(tmp_path)
    spec = {"steps": ["true"], "verify": [VERIFY], "budget": {"disk": "1m"}}
    (plan,) = plan_tasks(str(manifests), [str(write_task(project, "disk", spec))])
    assert plan["budget"]["disk_bytes"] == 1024 * 1024

    def fill() -> None:
        (project / "big.bin").write_bytes(b"\1" * (32 * 1024 * 1024))

    runtime = MemoryRuntime(BrainScript(events=[], on_turn=fill))
    result = apply_plan(plan, ApplyOptions(clock=SystemClock()), runtime)
    assert (result.outcome, result.exit_code) == ("failed", 1)
    assert result.brain_error is not None and result.brain_error.startswith("disk: ")
    assert "past its disk budget of 1 MiB" in result.brain_error
    assert ("kill", "agent") in runtime.log
    assert runtime.containers == {}
    assert _runs(state_dir) == [("failed", 1)]


@pytest.mark.usefixtures("without_docker")
def test_the_next_apply_removes_what_a_dead_run_left(scene: Scene) -> None:
    """A run whose applying process died (its row open, its owner gone) still had its
    container: the next apply removes it and closes the row as crashed, before it starts."""
    runtime = MemoryRuntime()
    with open_store() as store:
        open_run(store, scene.plan, "run-dead", SystemClock())
        with store.transaction() as conn:
            conn.execute("UPDATE runs SET pid_start = 'not this process' WHERE run_id = 'run-dead'")
    leftover = runtime.create(scene.plan, "run-dead")
    runtime.start(leftover)
    result = _apply(scene, runtime)
    assert result.outcome == "success"
    assert runtime.log.index(("remove", "agent")) < runtime.log.index(
        ("start_egress", result.run_id)
    )
    with sqlite3.connect(scene.state_dir / "state.db") as db:
        rows = dict(db.execute("SELECT run_id, outcome FROM runs").fetchall())
    assert rows == {"run-dead": "crashed", result.run_id: "success"}
    _assert_nothing_left(runtime)


@pytest.mark.usefixtures("without_docker")
def test_a_verify_container_that_would_not_go_gets_a_second_try(scene: Scene) -> None:
    runtime = MemoryRuntime(fail_at={"remove:verify": ContainerError("remove: device busy")})
    result = _apply(scene, runtime)
    assert (result.outcome, result.exit_code) == ("success", 0)
    assert ("fail", "remove:verify") in runtime.log and ("remove", "verify") in runtime.log
    _assert_nothing_left(runtime)


@pytest.mark.usefixtures("without_docker")
def test_the_brains_api_key_stays_with_the_host_and_the_proxy(
    tmp_path: Path, state_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    """An sdk brain with api-key auth (the golden sdk-api-key manifests): its key is leased
    like any credential but handed to the proxy to inject, never delivered into the
    container, whose environment holds only the placeholder."""
    key = "sk-ant-sequence-canary-" + "k" * 30
    monkeypatch.setenv("ANTHROPIC_API_KEY", key)
    case = Path(__file__).parent / "plans" / "sdk-api-key"
    project = make_project(tmp_path)
    (project / "task.yml").write_text((case / "task.yml").read_text())
    (plan,) = plan_tasks(str(case / "manifests"), [str(project / "task.yml")])
    assert plan["brain"]["auth"] == {"mode": "api-key", "credential": "anthropic"}

    runtime = MemoryRuntime(verify={"test -s SUMMARY.md": (0, "")})
    result = apply_plan(plan, ApplyOptions(clock=SystemClock()), runtime)
    assert (result.outcome, result.exit_code) == ("success", 0)
    [agent] = runtime.agents
    assert agent.delivered == [] and agent.credentials == {}
    assert agent.environment["ANTHROPIC_API_KEY"] == PLACEHOLDER
    assert key not in str(agent.environment)
    [egress] = runtime.egress
    assert egress.injection is not None and egress.injection_secret == key
    assert _open_leases() == [] and _all_leases()
    _assert_nothing_left(runtime)
    assert key not in capsys.readouterr().err


# --- the chain: each step undone in the reverse order ----------------------------------

# The run's steps (apply/run/steps.py, and the held inputs), in the order executor._run
# opens them.
CHAIN = (
    "leased",
    "held_absent",
    "verify_leftovers",
    "egress",
    "agent_container",
    "agent_branch",
    "disk_watch",
    "attached",
    "traps",
    "children",
)


def _traced(monkeypatch: pytest.MonkeyPatch, runtime: MemoryRuntime) -> None:
    """Each step of the chain logs its opening and its closing into the runtime's log,
    beside what the runtime itself did."""
    for name in CHAIN:
        module: Any = executor if name == "held_absent" else steps
        original = getattr(module, name)

        def traced(*args: Any, __original: Any = original, __name: str = name, **kw: Any) -> Any:
            @contextlib.contextmanager
            def step() -> Iterator[Any]:
                runtime.log.append(("open", __name))
                try:
                    with __original(*args, **kw) as value:
                        yield value
                finally:
                    runtime.log.append(("close", __name))

            return step()

        monkeypatch.setattr(module, name, traced)


def _steps(runtime: MemoryRuntime, what: str) -> list[str]:
    return [name for kind, name in runtime.log if kind == what]


def _between(
    log: list[Any], entry: tuple[str, str], after: tuple[str, str], before: tuple[str, str]
) -> bool:
    return log.index(after) < log.index(entry) < log.index(before)


@pytest.mark.usefixtures("without_docker")
def test_the_teardown_is_the_chain_reversed(scene: Scene, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run opens its steps in the order of time and closes them in the reverse order,
    each undoing what it made: the container goes before the proxy, verify runs while the
    disk watch still watches and after the agent's traps are disarmed, the agent stops
    before its traps are disarmed."""
    runtime = MemoryRuntime(verify={VERIFY: (0, "fine")})
    _traced(monkeypatch, runtime)
    result = _apply(scene, runtime)
    assert result.outcome == "success"
    log = runtime.log
    assert _steps(runtime, "open") == list(CHAIN), log
    assert _steps(runtime, "close") == list(reversed(CHAIN)), log
    run = result.run_id
    assert _between(log, ("start_egress", run), ("open", "egress"), ("open", "agent_container"))
    assert _between(log, ("create", "agent"), ("open", "agent_container"), ("open", "agent_branch"))
    assert _between(log, ("start", "agent"), ("open", "attached"), ("open", "traps"))
    assert _between(log, ("exited", "agent"), ("open", "children"), ("close", "traps"))
    assert _between(log, ("create", "verify"), ("close", "traps"), ("close", "disk_watch"))
    assert _between(
        log, ("remove", "agent"), ("close", "agent_branch"), ("close", "agent_container")
    )
    assert _between(log, ("egress_close", run), ("close", "agent_container"), ("close", "egress"))
    _assert_nothing_left(runtime)


@pytest.mark.parametrize("point", ["start_egress", "attach", "start_forwarder", "turn", "exec"])
@pytest.mark.parametrize("exc", [KeyboardInterrupt, Terminated, ContainerError])
@pytest.mark.usefixtures("without_docker")
def test_the_teardown_is_the_chain_reversed_wherever_the_run_stops(
    scene: Scene, monkeypatch: pytest.MonkeyPatch, point: str, exc: type[BaseException]
) -> None:
    """Stopped at any point (Ctrl-C, SIGTERM, a Docker error), the steps opened so far
    close in the reverse order, and nothing is left."""
    runtime = MemoryRuntime(fail_at={point: exc(f"{point}: stopped here")})
    _traced(monkeypatch, runtime)
    with contextlib.suppress(KaguraError):
        _apply(scene, runtime)
    assert ("fail", point) in runtime.log
    opened = _steps(runtime, "open")
    assert opened == list(CHAIN[: len(opened)]), runtime.log
    assert _steps(runtime, "close") == list(reversed(opened)), runtime.log
    _assert_nothing_left(runtime)
