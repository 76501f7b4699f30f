"""Cost forecast: does the plan's forecast predict the next run of a task kind?

A scripted history of 8 real runs of one task kind (``nightly-report``) with varying
cost, each through ``kagura-agent apply`` with the SDK engine driving the fake claude
CLI in the agent container (kagura/agent-test): per run a seeded draw of turns, input and
output tokens and dollars (``usage:``, reported in the CLI's result message) and a sleep
in the Bash tool call (wall time, centred on 20 s of work), each within ±20% of a centre. Then the 9th plan's
forecast is read before the 9th run (same distribution) is applied, and compared with what
it really took: the wall time the host measured (``budget.forecast.expected``, the median
of the 8 runs) and the turns and tokens the engine reported (``budget.forecast.reported``:
shown, never learnt — a limit is learnt only from what the host measured; the fake CLI
makes no model call, so the turn limit learnt from the proxy's count is the floor).

The baseline, measured on the same 9th run, is the budget a plan gives without history
(the claude brain's defaults: 30 turns, 30m wall; no token figure at all).

    python bench/cost_forecast.py [--seed 16]

Ends with ``RESULT cost_forecast err_turns=… err_tokens=… err_wall=…`` (relative
errors |forecast - actual| / actual), ``within_budget`` (the 9th run stayed inside every
learnt limit) and the baseline's errors.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import docker
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from testing.agent_test_image import ensure_agent_test_image  # noqa: E402 - after the path

# KAGURA_BENCH_QUICK=1 (CI, tests/test_benches.py): one iteration at small sizes, to show
# the bench still runs and ends with its RESULT line; its numbers mean nothing then.
QUICK = os.environ.get("KAGURA_BENCH_QUICK") == "1"
# The sleep is the task's own work, long enough that apply's fixed overhead (proxy,
# container, verify: ~10 s, noisy on a loaded machine) does not dominate the wall time.
CENTRE = {"turns": 12, "input_tokens": 40_000, "output_tokens": 6_000, "usd": 0.30, "sleep": 20.0}
if QUICK:  # the fewest runs that make a forecast (budget_min_runs), and little work
    CENTRE = {**CENTRE, "turns": 2, "sleep": 1.0}
SPREAD = 0.2
HISTORY = 3 if QUICK else 8


def _draw(rng: random.Random) -> dict[str, Any]:
    def vary(value: float) -> float:
        return value * rng.uniform(1 - SPREAD, 1 + SPREAD)

    return {
        "turns": round(vary(CENTRE["turns"])),
        "input_tokens": round(vary(CENTRE["input_tokens"])),
        "output_tokens": round(vary(CENTRE["output_tokens"])),
        "usd": round(vary(CENTRE["usd"]), 4),
        "sleep": round(vary(CENTRE["sleep"]), 2),
    }


def _setup(base: Path, image_ref: str) -> tuple[Path, Path]:
    manifests = base / "manifests"
    manifests.mkdir()
    for source in (REPO / "manifests").glob("*.yml"):
        (manifests / source.name).write_text(source.read_text())
    image = {
        "apiVersion": "kagura.dev/v1",
        "kind": "Image",
        "metadata": {"name": "agent-test"},
        "spec": {"recipe": "images/agent", "tag": image_ref, "baseline": True},
    }
    (manifests / "zz-bench.yml").write_text(yaml.safe_dump(image, sort_keys=False))
    project = base / "project"
    project.mkdir()
    if os.geteuid() == 0:  # the container runs as the project root's owner, never root
        os.chown(project, 1000, 1000)
    else:
        project.chmod(0o777)
    return manifests, project / "task.yml"


def _write_task(task: Path, run: dict[str, Any]) -> None:
    prompt = (
        f"run: sleep {run['sleep']} && echo report > report.txt\n"
        f"usage: {run['turns']} {run['input_tokens']} {run['output_tokens']} {run['usd']}"
    )
    document = {
        "apiVersion": "kagura.dev/v1",
        "kind": "Task",
        "metadata": {"name": "nightly-report"},
        "spec": {
            "kind": "nightly-report",
            "image": "agent-test",
            "brain": "claude",
            "prompt": prompt,
            "egress": ["anthropic"],
            "verify": ["grep -q report report.txt"],
        },
    }
    task.write_text(yaml.safe_dump(document, sort_keys=False))


def _kagura(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kagura_agent", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
        check=False,
    )


def _apply(manifests: Path, task: Path, env: dict[str, str]) -> dict[str, Any]:
    done = _kagura(["apply", "--yes", "--json", "--manifests", str(manifests), str(task)], env)
    if done.returncode != 0:
        raise SystemExit(f"apply failed ({done.returncode}):\n{done.stderr[-3000:]}")
    # The result object is printed last on stdout, indented.
    start = done.stdout.rfind("\n{\n")
    start = 0 if done.stdout.startswith("{\n") and start < 0 else start + 1
    result: dict[str, Any] = json.loads(done.stdout[start:])
    return result


def _plan(manifests: Path, task: Path, env: dict[str, str]) -> dict[str, Any]:
    done = _kagura(["plan", "--json", "--manifests", str(manifests), str(task)], env)
    if done.returncode != 0:
        raise SystemExit(f"plan failed ({done.returncode}):\n{done.stderr[-3000:]}")
    plan: dict[str, Any] = json.loads(done.stdout)["plans"][0]["plan"]
    return plan


def _err(forecast: float, actual: float) -> float:
    return abs(forecast - actual) / actual


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=16)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    client = docker.from_env()
    image_ref = ensure_agent_test_image(client)
    with tempfile.TemporaryDirectory(prefix="kagura-bench-forecast-") as tmp:
        base = Path(tmp)
        manifests, task = _setup(base, image_ref)
        env = {
            **os.environ,
            "KAGURA_AGENT_STATE_DIR": str(base / "state"),
            "NO_COLOR": "1",
            "ANTHROPIC_API_KEY": "sk-ant-bench-" + "b" * 30,
        }
        runs = [_draw(rng) for _ in range(HISTORY + 1)]
        print(f"{'run':>4} {'turns':>6} {'tokens':>8} {'usd':>7} {'wall s':>7}")
        for index, run in enumerate(runs[:HISTORY], start=1):
            _write_task(task, run)
            result = _apply(manifests, task, env)
            tokens = result["input_tokens"] + result["output_tokens"]
            print(
                f"{index:>4} {result['turns']:>6} {tokens:>8} {result['cost_usd']:>7.4f}"
                f" {result['wall_seconds']:>7.2f}"
            )
        _write_task(task, runs[HISTORY])
        budget = _plan(manifests, task, env)["budget"]
        forecast = budget["forecast"]
        expected, reported = forecast["expected"], forecast["reported"]
        actual = _apply(manifests, task, env)
        actual_tokens = actual["input_tokens"] + actual["output_tokens"]
        print(
            f"{HISTORY + 1:>4} {actual['turns']:>6} {actual_tokens:>8}"
            f" {actual['cost_usd']:>7.4f} {actual['wall_seconds']:>7.2f}  (the 9th run)"
        )
        print(
            f"forecast ({forecast['basis']}): {expected['wall_seconds']}s wall,"
            f" {expected['turns']} model calls; engines reported {reported['turns']} turns,"
            f" {reported['tokens']} tokens, ${reported['cost_usd']}"
        )
        print(
            f"learnt budget: {budget['turns']} turns, {budget['tokens']} tokens,"
            f" {budget['wall_seconds']}s wall, ${budget['cost_usd']}"
        )
        err_turns = _err(reported["turns"], actual["turns"])
        err_tokens = _err(reported["tokens"], actual_tokens)
        err_wall = _err(expected["wall_seconds"], actual["wall_seconds"])
        within = (
            actual["model_calls"] <= budget["turns"]
            and actual["wall_seconds"] <= budget["wall_seconds"]
            and actual["cost_usd"] <= budget["cost_usd"]
        )
        # Without history: the claude brain's defaults (30 turns, 30m wall).
        base_turns = _err(30, actual["turns"])
        base_wall = _err(30 * 60, actual["wall_seconds"])
        print(
            f"RESULT cost_forecast err_turns={err_turns:.3f} err_tokens={err_tokens:.3f}"
            f" err_wall={err_wall:.3f} within_budget={'yes' if within else 'no'}"
            f" baseline_err_turns={base_turns:.2f} baseline_err_wall={base_wall:.1f}"
            f" runs={HISTORY}"
        )


if __name__ == "__main__":
    main()
