"""docs/scale-out.md's Kubernetes Pod is checked against a plan the planner compiles.

Each ```kubernetes block parses as YAML; the Pod's security settings, limits and memory
volumes must say what the plan of examples/hello says, so the page cannot drift from the
membrane it describes.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from kagura_agent.facts import Facts
from kagura_agent.manifest.workspace import load_workspace
from kagura_agent.plan.planner import compile_plan

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "scale-out.md"
BLOCK = re.compile(r"^```kubernetes\n(.*?)^```", re.M | re.S)
UNITS = {"Mi": 2**20, "Gi": 2**30}


def _bytes(text: str) -> int:
    return int(text[:-2]) * UNITS[text[-2:]]


def _pod() -> dict[str, Any]:
    (block,) = BLOCK.findall(PAGE.read_text(encoding="utf-8"))
    (pod,) = list(yaml.safe_load_all(block))
    assert (pod["apiVersion"], pod["kind"]) == ("v1", "Pod")
    return pod  # type: ignore[no-any-return]


def _plan() -> Any:
    workspace = load_workspace(str(ROOT / "manifests"), [str(ROOT / "examples/hello/task.yml")])
    (task,) = workspace.tasks
    return compile_plan(workspace.catalog, task, Facts())


def test_the_pod_says_what_the_plan_says() -> None:
    pod, plan = _pod(), _plan()
    hardening = plan["hardening"]
    spec = pod["spec"]
    (agent,) = spec["containers"]
    uid, gid = (int(part) for part in hardening["user"].split(":"))
    assert (spec["securityContext"]["runAsUser"], spec["securityContext"]["runAsGroup"]) == (
        uid,
        gid,
    )
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert hardening["seccomp"] == "default"
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert spec["terminationGracePeriodSeconds"] == hardening["stop_timeout"]
    context = agent["securityContext"]
    assert context["allowPrivilegeEscalation"] is not hardening["no_new_privileges"]
    assert context["readOnlyRootFilesystem"] is hardening["read_only_rootfs"]
    assert context["privileged"] is hardening["privileged"]
    assert context["capabilities"] == {"drop": hardening["cap_drop"]}
    assert hardening["cap_add"] == []
    limits = agent["resources"]["limits"]
    assert _bytes(limits["memory"]) == hardening["memory_bytes"]
    assert float(limits["cpu"]) * 1e9 == hardening["nano_cpus"]
    assert agent["resources"]["requests"] == limits
    # Memory volumes at exactly the plan's tmpfs mounts, with the plan's sizes.
    by_name = {volume["name"]: volume for volume in spec["volumes"]}
    mounted = {m["mountPath"]: by_name[m["name"]] for m in agent["volumeMounts"]}
    assert set(mounted) == {*hardening["tmpfs"], "/workspace"}
    for target, options in hardening["tmpfs"].items():
        size = int(re.search(r"size=(\d+)", options).group(1))  # type: ignore[union-attr]
        volume = mounted[target]["emptyDir"]
        assert volume["medium"] == "Memory" and _bytes(volume["sizeLimit"]) == size, target
    assert "persistentVolumeClaim" in mounted["/workspace"]


def test_nothing_of_the_host_reaches_the_pod() -> None:
    spec = _pod()["spec"]
    assert spec["automountServiceAccountToken"] is False
    assert spec["hostUsers"] is False
    assert not {"hostNetwork", "hostPID", "hostIPC"} & set(spec)
    assert all("hostPath" not in volume for volume in spec["volumes"])
    (agent,) = spec["containers"]
    assert "env" not in agent and "envFrom" not in agent  # credentials come over stdin
    assert agent["stdin"] is True and agent["stdinOnce"] is True
    assert "@sha256:" in agent["image"]  # by digest, never a tag
