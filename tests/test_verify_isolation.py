"""Verify runs where the agent cannot reach, and the entrypoint is out of its tools' reach.

One real run (the agent image with this checkout's source, egress through the run's
proxy, a leased canary credential as a file and an environment variable) whose tools
try what a hijacked agent would: leave a ``setsid`` process behind that keeps rewriting a
file verify looks at, and ptrace / read / write the entrypoint that holds the brain
channel. Verify then probes its own container from inside and reports what it sees.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from apply_helpers import (
    AGENT_UID,
    cli_env,
    json_lines,
    kagura,
    last_json,
    leftovers,
    live_leases,
    make_project,
    manifest_set,
    run_ids,
    write_task,
)

from testing.agent_test_image import ensure_agent_test_image

# Every test reads the one apply of the module's ``run`` fixture: one worker runs them all.
pytestmark = [pytest.mark.usefixtures("docker_client"), pytest.mark.xdist_group("verify-isolation")]

PROBES = Path(__file__).parent / "probes"
CANARY_PREFIX = "kagura-verify-canary-"
TOKEN = CANARY_PREFIX + "v" * 24

LINGERER = (
    # Written to a temporary file and renamed: the lingerer may be killed at any instant,
    # and a kill between '>' truncating and date writing would leave watched empty.
    "setsid bash -c 'while :; do date +%s%N > watched.new && mv watched.new watched;"
    " sleep 0.05; done'"
    " </dev/null >/dev/null 2>&1 & sleep 0.5; test -s watched"
)
STEPS = [
    'echo "$HOSTNAME" > agent-host; echo "${HTTP_PROXY:-$http_proxy}" > agent-proxy',
    # Sanity: the agent did hold the credential, as a file and in its environment.
    'test -n "$TEST_TOKEN" && test -s /run/kagura/creds/token',
    LINGERER,
    "python3 ptrace_probe.py ptrace.json",
]
VERIFY = [f"python3 verify_probe.py verify.json {CANARY_PREFIX}", "test -s watched"]


@pytest.fixture(scope="module")
def image(docker_client: Any) -> str:
    return ensure_agent_test_image(docker_client)


def _manifests(tmp_path: Path, image: str) -> Path:
    return manifest_set(
        tmp_path,
        {
            "kind": "Image",
            "metadata": {"name": "agent-test"},
            "spec": {"recipe": "images/agent", "tag": image, "baseline": True},
        },
        {
            "kind": "CredentialProvider",
            "metadata": {"name": "token"},
            "spec": {
                "type": "static",
                "standing": True,
                "secret": "env:KAGURA_TEST_TOKEN",
                "static": {"env": "TEST_TOKEN", "file": "token"},
                "baseline_scopes": ["use"],
                "scopes": {"use": {"description": "a canary token"}},
            },
        },
        {
            "kind": "EgressPolicy",
            "metadata": {"name": "nowhere"},
            "spec": {"baseline": True, "allow": [{"host": "nowhere.test"}]},
        },
    )


def _project(tmp_path: Path) -> Path:
    project = make_project(tmp_path)
    for name in ("ptrace_probe.py", "verify_probe.py"):
        shutil.copy(PROBES / name, project / name)
        os.chown(project / name, AGENT_UID, AGENT_UID)
    return project


@pytest.fixture(scope="module")
def run(image: str, docker_client: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One apply; the probes' reports and the run's result."""
    tmp_path = tmp_path_factory.mktemp("verify-isolation")
    state_dir = tmp_path / "state"
    project = _project(tmp_path)
    spec = {
        "image": "agent-test",
        "egress": ["nowhere"],
        "credentials": [{"provider": "token", "scope": "use"}],
        "steps": STEPS,
        "verify": VERIFY,
    }
    task = write_task(project, "verify-isolation", spec)
    env = cli_env(state_dir, KAGURA_TEST_TOKEN=TOKEN)
    manifests = _manifests(tmp_path, image)
    done = kagura(["apply", "--yes", "--json", "--manifests", str(manifests), str(task)], env)
    [run_id] = run_ids(state_dir)
    assert leftovers(docker_client, run_id) == []
    assert live_leases(env) == []
    assert TOKEN not in done.stdout + done.stderr
    for report in ("ptrace.json", "verify.json"):
        assert (project / report).exists(), done.stderr[-3000:]
    return {
        "code": done.returncode,
        "output": done.stderr[-4000:],
        "result": last_json(done.stdout) if done.stdout.strip() else {},
        "events": json_lines(done.stderr),
        "ptrace": json.loads((project / "ptrace.json").read_text()),
        "verify": json.loads((project / "verify.json").read_text()),
        "agent_host": (project / "agent-host").read_text().strip(),
    }


def test_the_run_succeeds_on_verify_alone(run: dict[str, Any]) -> None:
    assert run["code"] == 0, run["output"]
    assert [v["exit_code"] for v in run["result"]["verify"]] == [0, 0]


def test_a_setsid_lingerer_is_gone_before_verify(run: dict[str, Any]) -> None:
    report = run["verify"]
    assert report["watched_changed"] is False, report["processes"]
    assert not [c for c in report["processes"].values() if "while" in c], report["processes"]


def test_verify_runs_in_a_fresh_container_without_network_credentials_or_channel(
    run: dict[str, Any],
) -> None:
    report = run["verify"]
    assert report["hostname"] != run["agent_host"]  # another container
    assert report["interfaces"] == ["lo"]
    assert report["proxy"] not in ("connected", "no proxy recorded")
    assert report["canary"] == []
    assert report["run_kagura"] == []
    assert report["pid1_stdin"] == "/dev/null"  # no brain channel attached
    commands = " ".join(report["processes"].values())
    assert "kagura_agent.brain.entrypoint" not in commands


def test_agent_tools_cannot_reach_the_entrypoint(run: dict[str, Any]) -> None:
    report = run["ptrace"]
    # The control: every probe works on a process of the tools' own.
    assert set(report["control"].values()) == {"ok"}, report["control"]
    entrypoints = report["entrypoints"]
    assert "1" in entrypoints and len(entrypoints) == 2, entrypoints  # init and server
    for pid, probes in entrypoints.items():
        refused = {name: result for name, result in probes.items() if result != "ok"}
        assert refused == probes, f"entrypoint {pid} reachable: {probes}"
