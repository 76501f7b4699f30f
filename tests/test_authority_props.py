"""Property: a task file cannot grant itself anything.

For random task files — random requests, plus random self-granting documents of every
manifest kind, with names that may collide with the manifest set's — combined with the
example manifest set (the packaged defaults under examples/denied-paste/manifests), no
compiled plan has a lower approval class, a wider hardening or a secret reference that
the manifest set alone would not give it. A task file carrying anything but Task
documents is refused outright.
"""

from __future__ import annotations

import functools
import os
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kagura_agent.errors import ValidationError
from kagura_agent.facts import Facts
from kagura_agent.manifest.catalog import Catalog
from kagura_agent.manifest.workspace import load_workspace
from kagura_agent.plan.hardening import HARDENING_DEFAULTS
from kagura_agent.plan.planner import compile_plan
from kagura_agent.units import parse_size

ROOT = Path(__file__).resolve().parent.parent
OPERATOR = ROOT / "examples" / "denied-paste" / "manifests"
FACTS = Facts.from_json(
    {"image_digests": {"kagura/agent:0.1.0": "sha256:" + "a" * 64}, "graduation": {"version": 0}}
)
RANK = {"denied": 0, "needs-approval": 1, "graduated": 2, "baseline": 3}

names = st.sampled_from(
    [
        "agent",
        "script",
        "claude",
        "anthropic",
        "cloudflare",
        "aws",
        "github",
        "pypi",
        "paste",
        "cloudflare-api",
        "embedded",
        "default",
        "membrane",
        "evil",
    ]
)
scopes = st.sampled_from(["api", "dns-read", "dns-write", "deployer", "readonly", "all"])
secrets = st.sampled_from(
    ["env:CLOUDFLARE_ROOT_TOKEN", "file:/proc/self/environ", "env:KAGURA_AWS_ROOT_KEY"]
)


def _doc(kind: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "kagura.dev/v1", "kind": kind, "metadata": {"name": name}, "spec": spec}


@st.composite
def self_grants(draw: st.DrawFn) -> dict[str, Any]:
    """One document a task file might carry to grant itself something."""
    name = draw(names)
    return draw(
        st.sampled_from(
            [
                _doc(
                    "CredentialProvider",
                    name,
                    {
                        "type": "static",
                        "standing": True,
                        "secret": draw(secrets),
                        "static": {"env": "TOKEN"},
                        "baseline_scopes": ["all"],
                        "scopes": {"all": {"description": "x"}},
                    },
                ),
                _doc(
                    "EgressPolicy",
                    name,
                    {
                        "baseline": True,
                        "allow": [
                            {"host": "pastebin.com", "allow_addresses": ["169.254.169.254/32"]}
                        ],
                    },
                ),
                _doc(
                    "Image",
                    name,
                    {
                        "recipe": "images/agent",
                        "tag": "kagura/agent:0.1.0",
                        "baseline": True,
                        "default": True,
                        "hardening": {"cap_add": ["SYS_ADMIN"], "pids_limit": 65536},
                    },
                ),
                _doc("Graduation", name, {"baseline": [f"credential:cloudflare/{draw(scopes)}"]}),
                _doc("Memory", name, {"backend": "sqlite", "default": True, "path": "/etc/x.db"}),
                _doc("Policy", name, {"rules": []}),
            ]
        )
    )


@st.composite
def task_files(draw: st.DrawFn) -> list[dict[str, Any]]:
    spec: dict[str, Any] = {"steps": ["true"]}
    if draw(st.booleans()):
        spec["image"] = draw(names)
    if draw(st.booleans()):
        spec["egress"] = draw(st.lists(names, max_size=3, unique=True))
    if draw(st.booleans()):
        spec["credentials"] = [
            {"provider": p, "scope": s}
            for p, s in draw(st.lists(st.tuples(names, scopes), max_size=2, unique=True))
        ]
    extra = draw(st.lists(self_grants(), max_size=2))
    return [*extra, _doc("Task", "prop", spec)]


@functools.cache
def alone() -> Catalog:
    """The example manifest set on its own (no task file)."""
    return load_workspace(str(OPERATOR), []).catalog


def _alone_class(category: str, catalog: Catalog) -> str:
    """The best class the manifest set alone gives ``category`` (no graduation evidence)."""
    kind, _, name = category.partition(":")
    baseline_list: set[str] = set()
    for graduation in catalog.of("Graduation"):
        baseline_list.update(graduation.spec.get("baseline", []))
    if category in baseline_list:
        return "baseline"
    if kind == "image":
        found = catalog.get("Image", name)
        return "baseline" if found and found.spec.get("baseline") else "needs-approval"
    if kind == "egress":
        found = catalog.get("EgressPolicy", name)
        return "baseline" if found and found.spec.get("baseline") else "needs-approval"
    if kind == "credential":
        provider, _, scope = name.partition("/")
        found = catalog.get("CredentialProvider", provider)
        ok = found is not None and scope in found.spec.get("baseline_scopes", [])
        return "baseline" if ok else "needs-approval"
    return "needs-approval"


def _check_plan(plan: dict[str, Any], task_file: str) -> None:
    catalog = alone()
    # No manifest input but the manifest set's own files (and the task file itself).
    assert {k: v for k, v in plan["inputs"]["files"].items() if k != task_file} == dict(
        catalog.digests
    )
    for approval in plan["approvals"]:
        best = _alone_class(approval["category"], catalog)
        assert RANK[approval["class"]] <= RANK[best], (approval, best)
    image = catalog.get("Image", plan["image"]["name"])
    assert image is not None and plan["image"]["source"] == image.file
    knobs = {**HARDENING_DEFAULTS, **image.spec.get("hardening", {})}
    hard = plan["hardening"]
    assert set(hard["cap_add"]) <= set(knobs["cap_add"])
    assert hard["pids_limit"] <= knobs["pids_limit"]
    assert hard["memory_bytes"] <= parse_size(knobs["memory"])
    assert hard["privileged"] is False and hard["seccomp"] == "default"
    for cred in plan["credentials"]:
        provider = catalog.get("CredentialProvider", cred["provider"])
        assert provider is not None and cred["secret_ref"] == provider.spec["secret"]
    memory = catalog.get("Memory", plan["memory"]["name"])
    assert memory is not None and plan["memory"]["token_ref"] == memory.spec.get("token")
    for entry in plan["egress"]["allow"]:
        policy = catalog.get("EgressPolicy", entry["policy"])
        assert policy is not None
        allowed = {a for e in policy.spec["allow"] for a in e.get("allow_addresses", [])}
        assert set(entry["allow_addresses"]) <= allowed


@pytest.fixture(autouse=True)
def _state(state_dir: Path) -> None:
    del state_dir


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(task_files())
def test_a_task_file_never_grants_what_the_manifest_set_does_not(
    docs: list[dict[str, Any]],
) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "task.yml"
        path.write_text(yaml.safe_dump_all(docs, sort_keys=False), encoding="utf-8")
        os.chmod(folder, 0o755)
        try:
            workspace = load_workspace(str(OPERATOR), [str(path)])
        except ValidationError as refused:
            carried = [d for d in docs if d["kind"] != "Task"]
            if carried:
                messages = [d.message for d in refused.diagnostics]
                assert sum("may only hold Task documents" in m for m in messages) == len(carried)
            return
        assert all(d["kind"] == "Task" for d in docs), "a self-granting document was accepted"
        for task in workspace.tasks:
            plan = compile_plan(workspace.catalog, task, FACTS)
            _check_plan(dict(plan), task.manifest.file)
