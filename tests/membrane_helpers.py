"""Plans and container helpers for the membrane tests.

Every plan here is compiled by the planner (``compile_plan``) from a real task file and
manifest set written to a temporary folder: a test never builds a plan by hand, so the
plan the membrane sees is the plan an operator would review. Settings an Image manifest
can carry (``pids_limit``, ``memory``, ``cap_add``, ``runtime`` …) go through that
manifest; a test that needs a plan *weaker* than the planner would ever write (a
hand-edited saved plan) compiles one and edits it with ``edited``.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any

from kagura_agent.facts import Facts
from kagura_agent.manifest.workspace import load_workspace
from kagura_agent.membrane import images
from kagura_agent.plan.model import Plan
from kagura_agent.plan.planner import compile_plan


def make_plan(
    project_root: Path | str,
    *,
    image_name: str = "base",
    digest: str | None = None,
    egress: str = "none",
    extra_mounts: list[tuple[str, str]] | None = None,
    tenancy: str = "self-host",
    **knobs: Any,
) -> Plan:
    """Compile a plan for a script task in ``project_root`` on the ``image_name`` image.

    ``knobs`` are the Image manifest's ``spec.hardening`` keys (``memory="64m"``);
    ``extra_mounts`` are (source inside the project root, target) read-only mounts;
    ``egress="proxy"`` asks for one allowed host; ``digest`` fixes the image digest fact
    (default: the local image's, looked up in Docker).
    """
    root = os.path.realpath(project_root)
    ref = images.image_ref(image_name)
    with tempfile.TemporaryDirectory(prefix="kagura-membrane-plan-") as temp:
        return _compile(
            Path(temp), root, ref, image_name, digest, egress, extra_mounts, tenancy, knobs
        )


def _compile(
    folder: Path,
    root: str,
    ref: str,
    image_name: str,
    digest: str | None,
    egress: str,
    extra_mounts: list[tuple[str, str]] | None,
    tenancy: str,
    knobs: dict[str, Any],
) -> Plan:
    manifests = folder / "manifests"
    manifests.mkdir()
    hardening = {"pids_limit": 256, "memory": "512m", "cpus": 1, "nofile": 1024, **knobs}
    docs: list[dict[str, Any]] = [
        _doc(
            "Image",
            image_name,
            {
                "recipe": f"images/{image_name}",
                "tag": ref,
                "default": True,
                "baseline": True,
                "hardening": hardening,
            },
        ),
        _doc("EgressPolicy", "membrane-test", {"allow": [{"host": "example.com"}]}),
    ]
    if tenancy == "shared":
        docs.append(_doc("Policy", "membrane-test-tenancy", {"tenancy": "shared", "rules": []}))
    (manifests / "membrane.yml").write_text("---\n".join(json.dumps(d) + "\n" for d in docs))
    spec: dict[str, Any] = {"project_root": root, "image": image_name, "steps": ["true"]}
    if egress == "proxy":
        spec["egress"] = ["membrane-test"]
    if extra_mounts:
        spec["mounts"] = [{"source": s, "target": t} for s, t in extra_mounts]
    task = folder / "task.yml"
    task.write_text(json.dumps(_doc("Task", "membrane-test", spec)))
    workspace = load_workspace(str(manifests), [str(task)])
    facts = Facts(
        image_digests={ref: digest if digest is not None else images.local_image_digest(ref)}
    )
    return compile_plan(workspace.catalog, workspace.tasks[0], facts)


def copied_into(project_root: Path, source: Path) -> str:
    """A copy of the folder ``source`` inside the project root, to mount read-only (the
    planner accepts extra mounts from the project root only)."""
    target = Path(project_root) / ".mounts" / source.name
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
    return str(target)


def edited(plan: Plan, **hardening: Any) -> Plan:
    """A copy of ``plan`` with ``hardening`` keys replaced, as a hand-edited saved plan."""
    copied = copy.deepcopy(plan)
    copied["hardening"].update(hardening)  # type: ignore[typeddict-item]
    return copied


def _doc(kind: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "kagura.dev/v1", "kind": kind, "metadata": {"name": name}, "spec": spec}


def new_run_id() -> str:
    return "test-" + uuid.uuid4().hex[:12]
