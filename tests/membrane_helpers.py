"""Plan dicts and container helpers for the membrane tests (docs/plan-format.md, v1)."""

from __future__ import annotations

import copy
import os
import uuid
from pathlib import Path
from typing import Any

from kagura_agent.membrane import images


def make_plan(
    project_root: Path | str,
    *,
    image_name: str = "base",
    digest: str | None = None,
    egress: str = "none",
    extra_mounts: list[tuple[str, str]] | None = None,
    **hardening: Any,
) -> dict[str, Any]:
    """A format_version 1 plan with only what the membrane reads filled in realistically."""
    root = os.path.realpath(project_root)
    ref = images.image_ref(image_name)
    mounts: list[dict[str, Any]] = [
        {"kind": "project", "source": root, "target": "/workspace", "mode": "rw"}
    ]
    for source, target in extra_mounts or []:
        real = os.path.realpath(source)
        mounts.append(
            {
                "kind": "extra",
                "source": real,
                "target": target,
                "mode": "ro",
                "category": f"mount:{real}",
            }
        )
    plan: dict[str, Any] = {
        "format_version": 1,
        "fingerprint": "sha256:" + uuid.uuid4().hex * 2,
        "task": {
            "name": "membrane-test",
            "file": "task.yml",
            "project_root": root,
            "session": None,
            "prompt": None,
            "steps": [["true"]],
            "verify": [],
            "parent": None,
        },
        "image": {
            "name": image_name,
            "ref": ref,
            "recipe": f"images/{image_name}",
            "recipe_digest": "sha256:" + "0" * 64,
            "digest": digest if digest is not None else images.local_image_digest(ref),
            "resolved": True,
            "source": "manifests/images.yml",
        },
        "mounts": mounts,
        "egress": {"mode": egress, "allow": [], "allow_addresses": [], "policies": []},
        "hardening": {
            "user": "1000:1000",
            "cap_drop": ["ALL"],
            "cap_add": [],
            "no_new_privileges": True,
            "seccomp": "default",
            "read_only_rootfs": True,
            "tmpfs": {
                "/tmp": "rw,nosuid,nodev,size=268435456",
                "/home/agent": "rw,nosuid,nodev,size=268435456",
            },
            "pids_limit": 256,
            "memory_bytes": 512 * 1024 * 1024,
            "nano_cpus": 1_000_000_000,
            "nofile": 1024,
            "init": True,
            "stop_timeout": 10,
            "network": "none",
            "pid_mode": "private",
            "ipc_mode": "private",
            "privileged": False,
            "devices": [],
            "runtime": "runc",
            "tenancy": "self-host",
            "workdir": "/workspace",
        },
    }
    plan["hardening"].update(hardening)
    return copy.deepcopy(plan)


def new_run_id() -> str:
    return "test-" + uuid.uuid4().hex[:12]
