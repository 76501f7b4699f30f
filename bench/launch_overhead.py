"""Launch overhead: a no-op task through DockerRuntime vs a raw ``docker run --rm``.

Both launch ``true`` in kagura/base (built if missing), interleaved, median of N each.
The runtime path includes everything apply does per container: tenancy gate, image digest
check, mount re-check, hardened create, start, wait, remove.

    python bench/launch_overhead.py [--runs 12]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import yaml

from kagura_agent.membrane import build, images
from kagura_agent.membrane.runtime import DockerRuntime, connect
from kagura_agent.plan.build import plan_tasks
from kagura_agent.plan.model import Plan

# KAGURA_BENCH_QUICK=1 (CI, tests/test_benches.py): one iteration at small sizes, to show
# the bench still runs and ends with its RESULT line; its numbers mean nothing then.
QUICK = os.environ.get("KAGURA_BENCH_QUICK") == "1"


def _plan(base: Path) -> Plan:
    """The no-op task's plan, compiled by the planner from the packaged manifests plus an
    Image for kagura/base: the hardening is the planner's, floor included."""
    manifests = base / "manifests"
    manifests.mkdir()
    image = {
        "apiVersion": "kagura.dev/v1",
        "kind": "Image",
        "metadata": {"name": "bench-base"},
        "spec": {"recipe": "images/base", "tag": images.image_ref("base"), "baseline": True},
    }
    task = {
        "apiVersion": "kagura.dev/v1",
        "kind": "Task",
        "metadata": {"name": "bench-noop"},
        "spec": {"image": "bench-base", "brain": "script", "steps": ["true"]},
    }
    (manifests / "bench.yml").write_text(yaml.safe_dump(image, sort_keys=False))
    project = base / "project"
    project.mkdir()
    (project / "task.yml").write_text(yaml.safe_dump(task, sort_keys=False))
    # The container runs as the project root's owner, never root.
    if os.geteuid() == 0:
        os.chown(project, 1000, 1000)
    else:
        project.chmod(0o777)
    [plan] = plan_tasks(str(manifests), [str(project / "task.yml")])
    return plan


def kagura_launch(rt: DockerRuntime, plan: Plan) -> float:
    started = time.perf_counter()
    container_id = rt.create(plan, "bench-" + uuid.uuid4().hex[:8], command=["true"])
    try:
        rt.start(container_id)
        status = rt.wait(container_id, timeout=60)
    finally:
        rt.remove(container_id)
    elapsed = time.perf_counter() - started
    assert status["exit_code"] == 0, status
    return elapsed


def docker_run(ref: str) -> float:
    started = time.perf_counter()
    subprocess.run(
        ["docker", "run", "--rm", "--network", "none", "--label", "dev.kagura.run=bench",
         ref, "true"],
        check=True,
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1 if QUICK else 12)
    args = parser.parse_args()
    client = connect()
    ref = images.image_ref("base")
    if images.local_image_digest(ref) is None:
        build.build(client, ["base"], log=lambda name, line: None)
    rt = DockerRuntime(client)
    with tempfile.TemporaryDirectory(prefix="kagura-bench-") as tmp:
        os.environ["KAGURA_AGENT_STATE_DIR"] = str(Path(tmp, "state").resolve())
        plan = _plan(Path(tmp).resolve())
        kagura_launch(rt, plan)  # warm-up both paths (page cache, first-use costs)
        docker_run(ref)
        ours, theirs = [], []
        for _ in range(args.runs):
            ours.append(kagura_launch(rt, plan))
            theirs.append(docker_run(ref))
    kagura_ms = statistics.median(ours) * 1000
    docker_ms = statistics.median(theirs) * 1000
    print(f"kagura runtime  median {kagura_ms:7.1f} ms  (n={len(ours)})")
    print(f"docker run --rm median {docker_ms:7.1f} ms  (n={len(theirs)})")
    print(
        f"RESULT launch_overhead ratio={kagura_ms / docker_ms:.3f}"
        f" kagura_ms={kagura_ms:.1f} docker_run_ms={docker_ms:.1f}"
    )


if __name__ == "__main__":
    main()
