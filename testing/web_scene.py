"""A state store with runs in it, written by the real components: apply's whole sequence
against the in-memory runtime (testing/memory_runtime.py: leases, journal, verify,
memory, graduation and cost are the real code), and the proxy's decisions through the
real log parser and writer (membrane/egress/audit.py) from lines shaped as squid writes
them. What the web console's browser tests and bench/web.py look at.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import yaml

from kagura_agent.apply.run.context import RunResult
from kagura_agent.apply.run.executor import ApplyOptions, apply_plan
from kagura_agent.brain.events import (
    BrainEvent,
    CostEvent,
    DoneEvent,
    ErrorEvent,
    TextEvent,
    ToolCallEvent,
    ToolResultEvent,
)
from kagura_agent.clock import SystemClock, iso
from kagura_agent.graduation.ledger import record_outcome
from kagura_agent.membrane.egress.audit import events_from_log, record_events, record_run
from kagura_agent.membrane.egress.audit import open_store as open_egress
from kagura_agent.membrane.egress.policy import load_policy
from kagura_agent.plan.build import plan_tasks
from kagura_agent.plan.model import Plan
from kagura_agent.state import StateStore, open_store
from testing.memory_runtime import BrainScript, MemoryRuntime

REPO = Path(__file__).resolve().parents[1]
AGENT_UID = 1000
VERIFY = "test -s out.txt"
EXAMPLE_POLICY: dict[str, Any] = {
    "apiVersion": "kagura.dev/v1",
    "kind": "EgressPolicy",
    "metadata": {"name": "docs-site"},
    "spec": {"baseline": True, "allow": [{"host": "docs.example.test"}]},
}


@dataclass(frozen=True)
class Scene:
    """Manifests and project roots under ``base``; the state directory is the caller's
    (``KAGURA_AGENT_STATE_DIR``)."""

    base: Path

    def manifests(self) -> Path:
        folder = self.base / "manifests"
        if not folder.exists():
            shutil.copytree(REPO / "manifests", folder)
            (folder / "zz-web.yml").write_text(yaml.safe_dump(EXAMPLE_POLICY, sort_keys=False))
        return folder

    def plan(self, name: str, kind: str, steps: list[str] | None = None) -> Plan:
        """A fresh plan of task ``name`` (of ``kind``): compiled now, so it carries the
        forecast the cost history so far teaches."""
        root = self.base / "roots" / name
        if not root.exists():
            root.mkdir(parents=True)
            if os.geteuid() == 0:
                os.chown(root, AGENT_UID, AGENT_UID)
        spec = {
            "kind": kind,
            "brain": "script",
            "egress": ["docs-site"],
            "steps": steps or ["echo hi > out.txt"],
            "verify": [VERIFY],
        }
        task = {"apiVersion": "kagura.dev/v1", "kind": "Task", "metadata": {"name": name}}
        path = root / "task.yml"
        path.write_text(yaml.safe_dump({**task, "spec": spec}, sort_keys=False))
        if os.geteuid() == 0:
            os.chown(path, AGENT_UID, AGENT_UID)
        (plan,) = plan_tasks(str(self.manifests()), [str(path)])
        return plan


def apply_run(plan: Plan, events: list[BrainEvent], *, verify_code: int = 0) -> RunResult:
    """``plan`` applied for real against the in-memory runtime, its brain saying ``events``."""
    runtime = MemoryRuntime(BrainScript(events), verify={VERIFY: (verify_code, "")})
    return apply_plan(plan, ApplyOptions(clock=SystemClock()), runtime)


def squid_line(
    at: float,
    method: str,
    host: str,
    port: int,
    *,
    status: int = 200,
    squid_status: str = "TCP_TUNNEL",
    reason: str = "",
    path: str = "",
    scheme: str = "https",
) -> str:
    """One KAGURA1 access-log line as the run's squid writes it (squid.LOG_FORMAT)."""
    server = "-" if "DENIED" in squid_status else "192.0.2.10"
    note = reason or "-"
    fields = [
        "KAGURA1", f"{at:.3f}", "172.30.0.2", quote(method), quote(scheme), quote(host),
        str(port), str(status), squid_status, "120", "4096", server, note, "3128",
        quote(path) if path else "-",
    ]  # fmt: skip
    return " ".join(fields)


def proxy_decisions(
    store: StateStore, plan: Plan, run_id: str, started: str, lines: list[str]
) -> int:
    """Store the decisions of ``lines`` for ``run_id`` as the run's collector does."""
    open_egress(store)
    record_run(store, run_id, started, plan["egress"])
    events = events_from_log("\n".join(lines), load_policy(plan["egress"]), run_id)
    return len(record_events(store, events))


# What an agent could write, shown on a run's page: markup, a terminal escape, a key.
HOSTILE = (
    '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2">'
    " \x1b[2J\x1b[31mred and cleared\x1b[0m sk-ant-api03-" + "k" * 40
)


def seed_demo(base: Path) -> dict[str, str]:
    """The console's demo store (in ``KAGURA_AGENT_STATE_DIR``): five runs of task kind
    ``docs`` (each with a denied egress request; each planned after the last, so each
    carries the forecast its predecessors taught), a failed ``release`` run whose agent
    wrote markup, a terminal escape and a key, and graduation evidence with a demotion.
    Returns the run ids by name."""
    scene = Scene(base)
    runs: dict[str, str] = {}
    plan = scene.plan("docs-refresh", "docs")
    for number in range(5):
        plan = scene.plan("docs-refresh", "docs")
        result = apply_run(
            plan,
            [
                TextEvent("Reading the page list.\n\n"),
                ToolCallEvent(id="t1", name="bash", input={"argv": ["bash", "-c", "ls docs"]}),
                ToolResultEvent(id="t1", output="index.md\nweb.md\n", exit_code=0),
                CostEvent(usd=0.04 + 0.01 * number, turns=3 + number % 3),
                DoneEvent(result="refreshed 2 pages"),
            ],
        )
        runs[f"docs-{number}"] = result.run_id
        now = time.time()
        with open_store() as store:
            proxy_decisions(
                store,
                plan,
                result.run_id,
                iso(SystemClock().now()),
                [
                    squid_line(now, "CONNECT", "docs.example.test", 443),
                    squid_line(now + 0.2, "CONNECT", "exfil.example.net", 443, status=403,
                               squid_status="TCP_DENIED"),
                ],
            )  # fmt: skip
    failed = apply_run(
        scene.plan("release-notes", "release"),
        [
            TextEvent(HOSTILE + "\n\n"),
            ToolCallEvent(id="t1", name="bash", input={"argv": ["bash", "-c", "make notes"]}),
            ToolResultEvent(id="t1", output="make: *** no rule", exit_code=2, is_error=True),
            ErrorEvent(message="gave up", code="engine"),
        ],
        verify_code=1,
    )
    runs["hostile"] = failed.run_id
    with open_store() as store:
        for number, code in enumerate((0, 0, 0, 1, 0)):
            record_outcome(
                store,
                ["egress:github", "credential:github/read"],
                runs[f"docs-{number}"],
                f"task-{number % 3}",
                plan["fingerprint"],
                [("pytest -q", code)],
                SystemClock(),
            )
    return runs


if __name__ == "__main__":
    # python -m testing.web_scene BASE: seed the demo store, print the run ids as JSON.
    print(json.dumps(seed_demo(Path(sys.argv[1]))))
