"""Latency of `status` on one serve while 10 runs stream their output through it.

One cockpit on the Slack transport (slack-bolt, against the fake Slack in testing/, over
a real Socket Mode WebSocket) launches ``--runs`` tasks, each in its own project root and
a real container, each a script of ``--steps`` tool calls that the cockpit relays to its
thread as they come. While every run is still streaming, an operator asks `status` again
and again; each sample is the time from the message's delivery to the cockpit's answer
arriving in Slack. Target: p95 < 200 ms.

    python bench/cockpit_status.py [--runs 10] [--steps 150] [--samples 60]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

ALICE, DM = "U0ALICE", "D0ALICE"
BOT, APP = "xoxb-bench", "xapp-bench"


def _project(base: Path, name: str, steps: int) -> Path:
    root = base / name
    root.mkdir(parents=True)
    if os.geteuid() == 0:
        os.chown(root, 1000, 1000)
    else:
        root.chmod(0o777)
    task = root / "task.yml"
    spec = {"steps": [f"echo line {i}; sleep 0.1" for i in range(steps)], "verify": ["true"]}
    document = {"apiVersion": "kagura.dev/v1", "kind": "Task", "metadata": {"name": name}}
    task.write_text(yaml.safe_dump({**document, "spec": spec}, sort_keys=False))
    return task


# KAGURA_BENCH_QUICK=1 (CI, tests/test_benches.py): one iteration at small sizes, to show
# the bench still runs and ends with its RESULT line; its numbers mean nothing then.
QUICK = os.environ.get("KAGURA_BENCH_QUICK") == "1"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=1 if QUICK else 10)
    parser.add_argument("--steps", type=int, default=40 if QUICK else 150)
    parser.add_argument(
        "--samples", type=int, default=10 if QUICK else 60
    )  # 10: the least it reports
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="kagura-bench-cockpit-"))
    os.environ["KAGURA_AGENT_STATE_DIR"] = str(base / "state")
    # Out of the checkout: planned from its root, the packaged layer is named "manifests"
    # (relative), and apply's freshness re-plan names it absolutely and calls it stale.
    os.chdir(base)

    from kagura_agent.cockpit.core import Cockpit, CockpitConfig
    from kagura_agent.cockpit.slack import SlackTransport
    from testing.fake_slack import FakeSlack

    tasks = [_project(base, f"bench-{i}", args.steps) for i in range(args.runs)]
    with FakeSlack(BOT, APP) as slack:
        transport = SlackTransport(BOT, APP, base_url=slack.base_url)
        cockpit = Cockpit(transport, CockpitConfig(operators=frozenset({ALICE})))
        serving = threading.Thread(target=cockpit.serve, daemon=True)
        serving.start()
        slack.wait_for_connection(timeout=30)
        for i, task in enumerate(tasks):
            slack.send_message(ALICE, DM, f"launch {task}", ts=f"1700000000.{i:06d}")
        threads = {f"1700000000.{i:06d}" for i in range(args.runs)}

        def streaming() -> set[str]:
            return {
                str(p.payload.get("thread_ts"))
                for p in list(slack.posts)
                if "▸ bash: echo line" in str(p.payload.get("text", ""))
            }

        deadline = time.monotonic() + 600
        while streaming() != threads:
            if time.monotonic() > deadline:
                print("the runs never all streamed", file=sys.stderr)
                return 1
            time.sleep(0.2)
        samples: list[float] = []
        serial = 0
        while len(samples) < args.samples:
            running = [s for s in cockpit.registry.open_sessions() if s.state == "running"]
            if len(running) < args.runs:
                break  # a run ended: the rest would not be "10 runs streaming"
            serial += 1
            ts = f"1800000000.{serial:06d}"
            started = time.perf_counter()
            slack.send_message(ALICE, DM, "status", ts=ts)
            while not any(
                p.payload.get("thread_ts") == ts and "phase:" in str(p.payload.get("text", ""))
                for p in list(slack.posts)
            ):
                if time.perf_counter() - started > 30:
                    print("status never answered", file=sys.stderr)
                    return 1
                time.sleep(0.002)
            samples.append((time.perf_counter() - started) * 1000)
            time.sleep(0.1)
        transport.stop()
        serving.join(300)  # interrupts what still runs; each apply cleans up
    if len(samples) < 10:
        print(f"only {len(samples)} samples while all runs streamed", file=sys.stderr)
        return 1
    ordered = sorted(samples)
    p50 = statistics.median(ordered)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    relayed = sum(1 for p in slack.posts if "▸ bash: echo line" in str(p.payload.get("text", "")))
    print(
        f"{len(samples)} status samples while {args.runs} runs streamed"
        f" ({relayed} relayed posts); max {ordered[-1]:.1f} ms"
    )
    print(f"RESULT cockpit_status p95_ms={p95:.1f} p50_ms={p50:.1f} runs={args.runs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
