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
from typing import Any

from kagura_agent.membrane import build, images
from kagura_agent.membrane.runtime import DockerRuntime, connect


def _plan(project: str, digest: str) -> dict[str, Any]:
    return {
        "format_version": 1,
        "fingerprint": "sha256:bench",
        "task": {"name": "bench-noop", "project_root": project, "session": None},
        "image": {"name": "base", "ref": images.image_ref("base"), "digest": digest},
        "mounts": [{"kind": "project", "source": project, "target": "/workspace", "mode": "rw"}],
        "egress": {"mode": "none"},
        "hardening": {
            "user": "1000:1000", "cap_drop": ["ALL"], "cap_add": [],
            "no_new_privileges": True, "seccomp": "default", "read_only_rootfs": True,
            "tmpfs": {"/tmp": "rw,nosuid,nodev,size=268435456",
                      "/home/agent": "rw,nosuid,nodev,size=268435456"},
            "pids_limit": 256, "memory_bytes": 2147483648, "nano_cpus": 1000000000,
            "nofile": 1024, "init": True, "stop_timeout": 10, "network": "none",
            "pid_mode": "private", "ipc_mode": "private", "privileged": False,
            "devices": [], "runtime": "runc", "tenancy": "self-host", "workdir": "/workspace",
        },
    }  # fmt: skip


def kagura_launch(rt: DockerRuntime, plan: dict[str, Any]) -> float:
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
    parser.add_argument("--runs", type=int, default=12)
    args = parser.parse_args()
    client = connect()
    ref = images.image_ref("base")
    if images.local_image_digest(ref) is None:
        build.build(client, ["base"], log=lambda name, line: None)
    digest = images.local_image_digest(ref)
    assert digest
    rt = DockerRuntime(client)
    with tempfile.TemporaryDirectory(prefix="kagura-bench-") as tmp:
        project = str(Path(tmp).resolve())
        os.chmod(project, 0o777)
        plan = _plan(project, digest)
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
