"""Apply overhead: a no-op script task through ``kagura-agent apply`` vs a raw ``docker run``.

The apply side is the whole product path, as an operator runs it: ``python -m
kagura_agent apply --yes --json task.yml`` for a task with one step (``true``) and one
egress policy (baseline, so no approval prompt), in kagura/agent. That is: start-up,
plan, lease and container sweeps, this run's egress networks and proxy, the hardened
container, the brain over the attached channel, recording the outcome, teardown. The
baseline is ``docker run --rm --network none --entrypoint bash kagura/agent -c true``.
Both are interleaved in one run; medians of N each, after one warm-up of each.

Where the time goes comes from the live view's JSON lines, stamped as they arrive on
the pipe (the live view flushes every line), so each phase is the gap between the lines
that open and close it.

``first_event_ms`` is from the apply command's start to its first brain event (the
agent is up, behind its proxy, and working); ``warm`` says whether the run got a
pre-started egress session (there is no pool yet: always ``cold``).

    python bench/apply_overhead.py [--runs 7]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import yaml

from kagura_agent.membrane import images

REPO = Path(__file__).resolve().parents[1]
POLICY = {
    "apiVersion": "kagura.dev/v1",
    "kind": "EgressPolicy",
    "metadata": {"name": "bench-egress"},
    "spec": {"baseline": True, "allow": [{"host": "bench.test"}]},
}
TASK = {
    "apiVersion": "kagura.dev/v1",
    "kind": "Task",
    "metadata": {"name": "bench-noop"},
    "spec": {"egress": ["bench-egress"], "steps": ["true"]},
}
# (phase, the line that ends it); each phase starts where the previous one ended.
MARKS = [
    ("start-up, plan, approvals, sweeps, run row", "starting this run's egress proxy"),
    ("egress networks + proxy start", "starting container from"),
    ("container create/start/attach", "first brain event"),
    ("brain (one step)", "brain finished"),
    ("record outcome", "run "),
    ("remove container", "container removed"),
    ("remove proxy + networks", "egress proxy and networks removed"),
    ("process exit", "exit"),
]


def _setup(base: Path) -> tuple[Path, Path]:
    manifests = base / "manifests"
    manifests.mkdir()
    for source in (REPO / "manifests").glob("*.yml"):
        (manifests / source.name).write_text(source.read_text())
    (manifests / "zz-bench.yml").write_text(yaml.safe_dump(POLICY, sort_keys=False))
    project = base / "project"
    project.mkdir()
    (project / "task.yml").write_text(yaml.safe_dump(TASK, sort_keys=False))
    # The container runs as the project root's owner, never root.
    if os.geteuid() == 0:
        os.chown(project, 1000, 1000)
    else:
        project.chmod(0o777)
    return manifests, project / "task.yml"


def _label(line: str) -> str | None:
    import json

    try:
        item = json.loads(line)
    except ValueError:
        return None
    if item.get("kind") == "brain":
        return "brain finished" if item.get("type") == "done" else "first brain event"
    message = str(item.get("message", ""))
    for _phase, mark in MARKS:
        if message.startswith(mark):
            return mark
    return None


def apply_once(manifests: Path, task: Path, env: dict[str, str]) -> tuple[float, dict[str, float]]:
    """One apply; (total seconds, seconds per phase)."""
    argv = [sys.executable, "-m", "kagura_agent", "apply", "--yes", "--json"]
    argv += ["--manifests", str(manifests), str(task)]
    started = time.perf_counter()
    proc = subprocess.Popen(
        argv,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    seen: dict[str, float] = {}
    lines: list[str] = []
    for line in proc.stderr:
        lines.append(line)
        label = _label(line)
        if label and label not in seen:
            seen[label] = time.perf_counter() - started
    code = proc.wait()
    total = time.perf_counter() - started
    if code != 0:
        raise SystemExit(f"apply failed with exit {code}:\n{''.join(lines[-20:])}")
    seen["exit"] = total
    phases, previous = {}, 0.0
    for phase, mark in MARKS:
        if mark in seen:
            phases[phase] = seen[mark] - previous
            previous = seen[mark]
    return total, phases


def docker_run_once(ref: str) -> float:
    started = time.perf_counter()
    subprocess.run(
        ["docker", "run", "--rm", "--network", "none", "--entrypoint", "bash", ref, "-c", "true"],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    ref = images.image_ref("agent")
    if (
        images.local_image_digest(ref) is None
        or images.local_image_digest(images.image_ref("egress-proxy")) is None
    ):
        raise SystemExit("build the images first: python -m kagura_agent images build")
    with tempfile.TemporaryDirectory(prefix="kagura-bench-apply-") as tmp:
        manifests, task = _setup(Path(tmp))
        env = {**os.environ, "KAGURA_AGENT_STATE_DIR": str(Path(tmp) / "state")}
        apply_once(manifests, task, env)  # warm-up: state store, page cache
        docker_run_once(ref)
        applies, runs = [], []
        phases: dict[str, list[float]] = defaultdict(list)
        for _ in range(max(5, args.runs)):
            total, split = apply_once(manifests, task, env)
            applies.append(total)
            for phase, seconds in split.items():
                phases[phase].append(seconds)
            runs.append(docker_run_once(ref))
    apply_ms = statistics.median(applies) * 1000
    docker_ms = statistics.median(runs) * 1000
    first = [a + b + c for a, b, c in zip(*(phases[p] for p, _m in MARKS[:3]), strict=True)] or [
        float("nan")
    ]
    first_ms = statistics.median(first) * 1000
    print(f"{'phase':<40} {'median ms':>10}")
    for phase, _mark in MARKS:
        if phases.get(phase):
            print(f"{phase:<40} {statistics.median(phases[phase]) * 1000:>10.0f}")
    print(f"{'apply total':<40} {apply_ms:>10.0f}   (n={len(applies)})")
    print(f"{'docker run --rm --network none':<40} {docker_ms:>10.0f}   (n={len(runs)})")
    print(
        f"ranges: apply {min(applies) * 1000:.0f}-{max(applies) * 1000:.0f} ms,"
        f" docker run {min(runs) * 1000:.0f}-{max(runs) * 1000:.0f} ms,"
        f" first event {min(first) * 1000:.0f}-{max(first) * 1000:.0f} ms"
    )
    # No warm pool of egress sessions exists: every run starts its own proxy (cold).
    print(
        f"RESULT apply_overhead ratio={apply_ms / docker_ms:.2f} first_event_ms={first_ms:.0f}"
        f" first_event_ratio={first_ms / docker_ms:.2f}"
        f" apply_ms={apply_ms:.0f} docker_run_ms={docker_ms:.0f} warm=cold"
    )


if __name__ == "__main__":
    main()
