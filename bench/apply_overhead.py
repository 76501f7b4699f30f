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
agent is up, behind its proxy, and working); ``warm`` says whether the runs got a
pre-started egress session from the warm pool (``kagura-agent egress pool serve``,
started by the bench for the warm rounds; before each warm apply the bench waits, off
the clock, until the keeper has an idle session ready — a pool that keeps up).

By default cold and warm applies are interleaved with the ``docker run`` baseline and the
RESULT line is the warm one (``cold_ratio`` beside it); ``--cold`` measures cold only.
Apply's own files are byte-compiled first (as a wheel install does): with
PYTHONDONTWRITEBYTECODE set, an editable checkout recompiles every module on each start
(~170 ms here), which is not what an installed kagura-agent does.

    python bench/apply_overhead.py [--runs 7] [--cold]
"""

from __future__ import annotations

import argparse
import compileall
import json
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

# KAGURA_BENCH_QUICK=1 (CI, tests/test_benches.py): one iteration at small sizes, to show
# the bench still runs and ends with its RESULT line; its numbers mean nothing then.
QUICK = os.environ.get("KAGURA_BENCH_QUICK") == "1"
REPO = Path(__file__).resolve().parents[1]
POLICY = {
    "apiVersion": "kagura.dev/v1",
    "kind": "EgressPolicy",
    "metadata": {"name": "bench-egress"},
    "spec": {"baseline": True, "allow": [{"host": "bench.test"}]},
}
# One leased credential: a static, standing token (baseline scope, so no approval).
PROVIDER = {
    "apiVersion": "kagura.dev/v1",
    "kind": "CredentialProvider",
    "metadata": {"name": "bench-token"},
    "spec": {
        "type": "static",
        "standing": True,
        "secret": "env:KAGURA_BENCH_TOKEN",
        "static": {"env": "BENCH_TOKEN"},
        "baseline_scopes": ["use"],
        "scopes": {"use": {"description": "a bench token"}},
    },
}
TASK = {
    "apiVersion": "kagura.dev/v1",
    "kind": "Task",
    "metadata": {"name": "bench-noop"},
    "spec": {
        "egress": ["bench-egress"],
        "credentials": [{"provider": "bench-token", "scope": "use"}],
        "steps": ["true"],
    },
}
# (phase, the line that ends it); each phase starts where the previous one ended.
MARKS = [
    ("start-up, plan, approvals, sweeps, run row", "starting this run's egress proxy"),
    ("egress networks + proxy start", "starting container from"),
    ("container create/start/attach", "first brain event"),
    ("brain (one step)", "brain finished"),
    ("record outcome", "run "),
    ("remove container", "container removed"),
    ("remove proxy + networks (warm: hand back)", "egress proxy and networks removed"),
    ("process exit", "exit"),
]


def _setup(base: Path) -> tuple[Path, Path]:
    manifests = base / "manifests"
    manifests.mkdir()
    for source in (REPO / "manifests").glob("*.yml"):
        (manifests / source.name).write_text(source.read_text())
    (manifests / "zz-bench.yml").write_text(yaml.safe_dump_all([POLICY, PROVIDER], sort_keys=False))
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
    try:
        item = json.loads(line)
    except ValueError:
        return None
    if item.get("kind") == "brain":
        return "brain finished" if item.get("type") == "done" else "first brain event"
    message = str(item.get("message", ""))
    if message.startswith("egress proxy of the warm session handed"):
        return "egress proxy and networks removed"  # the warm session's end of the phase
    for _phase, mark in MARKS:
        if message.startswith(mark):
            return mark
    return None


def apply_once(
    manifests: Path, task: Path, env: dict[str, str], *, want_warm: bool | None = False
) -> tuple[float, dict[str, float]]:
    """One apply; (total seconds, seconds per phase). ``want_warm``: whether the run must
    have got a warm session (None: either)."""
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
    warm = any("warm session" in line for line in lines)
    if want_warm is not None and warm != want_warm:
        raise SystemExit(f"wanted a {'warm' if want_warm else 'cold'} session:\n{''.join(lines)}")
    seen["exit"] = total
    phases, previous = {}, 0.0
    for phase, mark in MARKS:
        if mark in seen:
            phases[phase] = seen[mark] - previous
            previous = seen[mark]
    return total, phases


def _idle(state: Path) -> int:
    try:
        return len(list((state / "egress-pool" / "idle").glob("*.json")))
    except OSError:
        return 0


def _wait_idle(state: Path, keeper: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 120
    while _idle(state) < 1:
        if keeper.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("the pool keeper has no idle session")
        time.sleep(0.05)


def docker_run_once(ref: str) -> float:
    started = time.perf_counter()
    subprocess.run(
        ["docker", "run", "--rm", "--network", "none", "--entrypoint", "bash", ref, "-c", "true"],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return time.perf_counter() - started


def _summary(
    name: str, applies: list[float], phases: dict[str, list[float]]
) -> tuple[float, float]:
    first = [a + b + c for a, b, c in zip(*(phases[p] for p, _m in MARKS[:3]), strict=True)]
    apply_ms = statistics.median(applies) * 1000
    first_ms = statistics.median(first) * 1000 if first else float("nan")
    print(f"-- {name}")
    print(f"{'phase':<40} {'median ms':>10}")
    for phase, _mark in MARKS:
        if phases.get(phase):
            print(f"{phase:<40} {statistics.median(phases[phase]) * 1000:>10.0f}")
    print(f"{'apply total':<40} {apply_ms:>10.0f}   (n={len(applies)})")
    if first:
        print(
            f"ranges: apply {min(applies) * 1000:.0f}-{max(applies) * 1000:.0f} ms,"
            f" first event {min(first) * 1000:.0f}-{max(first) * 1000:.0f} ms"
        )
    return apply_ms, first_ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1 if QUICK else 7)
    parser.add_argument("--cold", action="store_true", help="cold applies only (no pool)")
    args = parser.parse_args()
    ref = images.image_ref("agent")
    if (
        images.local_image_digest(ref) is None
        or images.local_image_digest(images.image_ref("egress-proxy")) is None
    ):
        raise SystemExit("build the images first: python -m kagura_agent images build")
    compileall.compile_dir(str(REPO / "kagura_agent"), quiet=1)
    with tempfile.TemporaryDirectory(prefix="kagura-bench-apply-") as tmp:
        manifests, task = _setup(Path(tmp))
        state = Path(tmp) / "state"
        env = {**os.environ, "KAGURA_AGENT_STATE_DIR": str(state)}
        env["KAGURA_BENCH_TOKEN"] = "bench-token-value-0123456789"
        keeper = None
        if not args.cold:
            keeper = subprocess.Popen(
                [sys.executable, "-m", "kagura_agent", "egress", "pool", "serve", "--size", "2"],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                text=True,
            )
        try:
            # Warm-up (state store, page cache): a keeper may already have a session ready.
            apply_once(manifests, task, env, want_warm=None)
            docker_run_once(ref)
            cold, warm, runs = [], [], []
            cold_phases: dict[str, list[float]] = defaultdict(list)
            warm_phases: dict[str, list[float]] = defaultdict(list)
            for _ in range(args.runs if QUICK else max(5, args.runs)):
                if keeper is not None:
                    # Off the clock: the keeper has an idle session (a pool that keeps up).
                    _wait_idle(state, keeper)
                    total, split = apply_once(manifests, task, env, want_warm=True)
                    warm.append(total)
                    for phase, seconds in split.items():
                        warm_phases[phase].append(seconds)
                    with_pool_off = {**env, "KAGURA_AGENT_STATE_DIR": str(state) + "-cold"}
                else:
                    with_pool_off = env
                total, split = apply_once(manifests, task, with_pool_off)
                cold.append(total)
                for phase, seconds in split.items():
                    cold_phases[phase].append(seconds)
                runs.append(docker_run_once(ref))
        finally:
            if keeper is not None:
                keeper.terminate()
                keeper.wait(timeout=120)
    docker_ms = statistics.median(runs) * 1000
    cold_ms, cold_first = _summary("cold (no pool)", cold, cold_phases)
    print(f"{'docker run --rm --network none':<40} {docker_ms:>10.0f}   (n={len(runs)})")
    print(f"ranges: docker run {min(runs) * 1000:.0f}-{max(runs) * 1000:.0f} ms")
    print(f"load average: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    cold_part = f" cold_ratio={cold_ms / docker_ms:.2f} cold_apply_ms={cold_ms:.0f}"
    if warm:
        warm_ms, warm_first = _summary("warm (pooled egress session)", warm, warm_phases)
        print(
            f"RESULT apply_overhead ratio={warm_ms / docker_ms:.2f} first_event_ms={warm_first:.0f}"
            f" first_event_ratio={warm_first / docker_ms:.2f}"
            f" apply_ms={warm_ms:.0f} docker_run_ms={docker_ms:.0f} warm=warm" + cold_part
        )
    else:
        print(
            f"RESULT apply_overhead ratio={cold_ms / docker_ms:.2f} first_event_ms={cold_first:.0f}"
            f" first_event_ratio={cold_first / docker_ms:.2f}"
            f" apply_ms={cold_ms:.0f} docker_run_ms={docker_ms:.0f} warm=cold"
        )


if __name__ == "__main__":
    main()
