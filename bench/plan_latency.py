"""How fast `plan` and `validate` start and finish, next to a bare interpreter.

Runs, in one process and one session:
  - `python -c pass`                               (the floor every command pays)
  - `kagura-agent plan examples/hello/task.yml`    (target: median <= 150 ms)
  - `kagura-agent validate` over 1,000 generated manifest documents (target <= 1 s)
and prints the medians, ending with one line:
  RESULT plan_latency plan_ms=… python_ms=… validate_1000_ms=… plan_cold_ms=…
         validate_1000_cold_ms=… ratio=…
where ratio = plan_ms / python_ms. The *_cold figures run with the check cache disabled
(every schema check and policy rule evaluated afresh, jsonschema imported).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# KAGURA_BENCH_QUICK=1 (CI, tests/test_benches.py): one iteration at small sizes, to show
# the bench still runs and ends with its RESULT line; its numbers mean nothing then.
QUICK = os.environ.get("KAGURA_BENCH_QUICK") == "1"
RUNS = 1 if QUICK else int(os.environ.get("BENCH_RUNS", "15"))


# As root the checkout is root's and hello is not applyable there (plan exits 6): the
# bench times planning, whatever the verdict.
HELLO = ("--allow-unapplyable", "examples/hello/task.yml")


def median_ms(argv: list[str], *, cwd: Path, env: dict[str, str], runs: int = RUNS) -> float:
    """Median wall time of ``argv`` after one untimed warm-up run (which writes bytecode)."""
    subprocess.run(argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        done = subprocess.run(
            argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        times.append((time.perf_counter() - start) * 1000)
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(argv)} failed: {done.stderr.decode()}")
    return statistics.median(times)


def generate_documents(folder: Path, count: int) -> None:
    kinds = [
        "apiVersion: kagura.dev/v1\nkind: EgressPolicy\nmetadata: {{name: egress-{i}}}\n"
        "spec:\n  allow:\n    - host: api{i}.example.com\n      ports: [443, 8443]\n    - host: '*.svc{i}.example.org'\n",
        "apiVersion: kagura.dev/v1\nkind: Image\nmetadata: {{name: image-{i}}}\n"
        "spec:\n  recipe: images/agent\n  tag: kagura/agent-{i}:0.1.0\n  hardening: {{pids_limit: 128, memory: 1g}}\n",
        "apiVersion: kagura.dev/v1\nkind: CredentialProvider\nmetadata: {{name: cf-{i}}}\n"
        "spec:\n  type: cloudflare\n  secret: env:CF_TOKEN_{i}\n  scopes:\n    dns-read: {{permission_groups: [82e64a83756745bbbb1c9c2701bf816b], resources: {{com.cloudflare.api.account.zone.0123456789abcdef: '*'}}}}\n",
        "apiVersion: kagura.dev/v1\nkind: Brain\nmetadata: {{name: brain-{i}}}\n"
        "spec:\n  engine: sdk\n  model: claude-sonnet-4-5\n  permission_mode: acceptEdits\n",
    ]
    per_file = 50
    for start in range(0, count, per_file):
        docs = [
            kinds[i % len(kinds)].format(i=i) for i in range(start, min(count, start + per_file))
        ]
        (folder / f"generated-{start:05d}.yml").write_text("---\n".join(docs))


def main() -> None:
    env = {**os.environ, "NO_COLOR": "1"}
    # Measure what an installed kagura-agent does: Python writes and reuses bytecode. Some
    # shells export PYTHONDONTWRITEBYTECODE, which would recompile every module on every run.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    with tempfile.TemporaryDirectory() as temp:
        work = Path(temp)
        env["KAGURA_AGENT_STATE_DIR"] = str(work / "state")
        manifests = work / "manifests"
        manifests.mkdir()
        generate_documents(manifests, 50 if QUICK else 1000)
        python_ms = median_ms([sys.executable, "-c", "pass"], cwd=ROOT, env=env)
        cli = [sys.executable, "-m", "kagura_agent"]
        plan_ms = median_ms([*cli, "plan", *HELLO], cwd=ROOT, env=env)
        validate_ms = median_ms(
            [*cli, "validate", "--manifests", str(manifests)], cwd=ROOT, env=env, runs=min(RUNS, 5)
        )
        # Cold: the check cache (kagura_agent.manifest.cache) cannot be read or written,
        # so every document is schema-checked and every policy rule evaluated afresh.
        cold = {**env, "KAGURA_AGENT_CACHE_DIR": "/dev/null/no-cache"}
        plan_cold_ms = median_ms([*cli, "plan", *HELLO], cwd=ROOT, env=cold)
        validate_cold_ms = median_ms(
            [*cli, "validate", "--manifests", str(manifests)], cwd=ROOT, env=cold, runs=min(RUNS, 5)
        )
    print(f"python -c pass        median {python_ms:7.1f} ms")
    print(f"plan examples/hello   median {plan_ms:7.1f} ms   (target <= 150 ms)")
    print(f"  without check cache median {plan_cold_ms:7.1f} ms")
    print(f"validate 1,000 docs   median {validate_ms:7.1f} ms   (target <= 1000 ms)")
    print(f"  without check cache median {validate_cold_ms:7.1f} ms")
    print(
        f"RESULT plan_latency plan_ms={plan_ms:.1f} python_ms={python_ms:.1f}"
        f" validate_1000_ms={validate_ms:.1f} plan_cold_ms={plan_cold_ms:.1f}"
        f" validate_1000_cold_ms={validate_cold_ms:.1f} ratio={plan_ms / python_ms:.2f}"
    )


if __name__ == "__main__":
    main()
