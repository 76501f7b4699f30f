"""``compile(catalog, task, facts) -> plan``: pure. No I/O, no clock, no environment.

The plan is a plain JSON-serialisable dict in the layout of docs/plan-format.md. The
same inputs always give the same plan and the same fingerprint.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from kagura_agent import __version__
from kagura_agent.facts import Facts
from kagura_agent.graduation.settings import graduation_settings
from kagura_agent.manifest.catalog import Catalog, Manifest
from kagura_agent.manifest.egresspool import egress_pool_knobs
from kagura_agent.manifest.endpoint import read_endpoint
from kagura_agent.manifest.gitinputs import writable_git
from kagura_agent.manifest.schema import schema_version
from kagura_agent.manifest.task import ResolvedTask
from kagura_agent.membrane.floor import floor_violations
from kagura_agent.membrane.isolation import user_namespace_refusals, user_namespaces_required
from kagura_agent.membrane.lifetimes import lifetime_refusals
from kagura_agent.patterns.dispatch import narrowing_violations
from kagura_agent.plan import commits, resume
from kagura_agent.plan.approvals import classify_all, denied_categories
from kagura_agent.plan.budget import ceiling_refusals, plan_budget
from kagura_agent.plan.conversation import conversation
from kagura_agent.plan.endpoint import model_endpoint
from kagura_agent.plan.grants import credential_entry, egress_section, layer_of, proxy_pin
from kagura_agent.plan.hardening import REFUSED, hardening_section, unwritable_project
from kagura_agent.plan.injection import CLI_ENVIRONMENT, brain_injection
from kagura_agent.plan.intent import intent_fingerprint
from kagura_agent.plan.memory import memory_section
from kagura_agent.plan.model import (
    Approval,
    BrainSection,
    Classified,
    CredentialBase,
    DaemonFacts,
    Hardening,
    ImageBase,
    Inputs,
    Mount,
    ParentLink,
    Plan,
    PolicyResult,
    Refusal,
    TaskSection,
    Tenancy,
    applyable,
)
from kagura_agent.plan.modelcalls import model_calls
from kagura_agent.plan.policy import RuleChecker, evaluate_policies, policy_denials
from kagura_agent.plan.toolservers import (
    tool_server_rules,
    tool_server_sections,
)
from kagura_agent.units import parse_duration

FORMAT_VERSION = 1
SHARED_RUNTIMES = ("runsc", "kata", "kata-runtime")


def compile_plan(
    catalog: Catalog, task: ResolvedTask, facts: Facts, *, check_rule: RuleChecker | None = None
) -> Plan:
    """Compile a resolved task into a launch plan.

    ``check_rule`` evaluates one policy rule on the plan; it must be a pure function of
    its arguments (the default runs jsonschema; ``plan.build`` passes a memoised one).
    """
    tenancy = _tenancy(catalog)
    egress = egress_section(
        task.egress, tool_server_rules(task.tool_servers), egress_pool_knobs(catalog).size > 0
    )
    credentials = [credential_entry(request) for request in task.credentials]
    endpoint = model_endpoint(task.brain, task.runtime, credentials)
    if endpoint is not None:
        # The brain's only way to its model is the proxy's key-injecting port.
        egress["mode"] = "proxy"
    commits_section = (
        commits.section(
            task.name,
            task.project_root,
            facts.git_base,
            runtime=task.runtime,
            writable_git=writable_git(catalog),
        )
        if task.commits == "branch"
        else None
    )
    hardening = commits.hardening(
        hardening_section(task, tenancy, facts, egress["mode"]), commits_section
    )
    brain = _brain(task, facts)
    # A proxy that injects the brain's key is configured at its start: never a pooled one.
    egress["pool"] = egress["pool"] and brain_injection(brain) is None
    model_warnings: list[str] = []
    if endpoint is not None:
        egress, model_warnings = model_calls(egress, task.egress, endpoint)
    egress["proxy"] = proxy_pin(catalog, facts) if egress["mode"] == "proxy" else None
    image = _image(task.image, facts)
    mounts: list[Mount] = commits.mounts(
        [
            {"kind": "project", "source": task.project_root, "target": "/workspace", "mode": "rw"},
            *[_task_mount(m) for m in task.mounts],
        ],
        commits_section,
    )
    task_section = _task(task)
    parent, widened = _dispatch_check(task, facts)
    # Policies see every requested capability before it is classified (a deny of a
    # capability classifies it ``denied``), so they run on a draft without approvals.
    draft: dict[str, Any] = {
        "format_version": FORMAT_VERSION,
        "inputs": _inputs(catalog, task, facts),
        "task": task_section,
        "image": image,
        "mounts": mounts,
        "egress": egress,
        "credentials": credentials,
        "hardening": hardening,
        "brain": {**brain, "model_endpoint": endpoint} if endpoint else brain,
        "memory": memory_section(task, facts, catalog),
        "budget": plan_budget(task, facts, catalog),
    }
    tool_servers = tool_server_sections(task.tool_servers)
    if tool_servers:  # only then: plans without tool servers keep their shape
        draft["tool_servers"] = tool_servers
    if commits_section is not None:  # only when asked: other plans keep their shape
        draft["commits"] = commits_section
    # The membrane floor is code: it holds whatever the manifests and policies say.
    floor = floor_violations(draft)
    draft["floor"] = floor
    policy = evaluate_policies(catalog, draft, check_rule)
    if parent is not None:
        task_section = {**task_section, "parent": parent}
        if facts.parent_plan is not None:
            parent["narrowing"] = narrowing_violations(facts.parent_plan, draft)
            widened = _widened(parent)
    denials = denied_categories(draft, policy_denials(policy))
    approvals = classify_all(catalog, task, draft, facts, denials)
    by_category = {a["category"]: a for a in approvals}
    if endpoint is not None:
        brain["model_endpoint"] = {**endpoint, **_classified(by_category[endpoint["category"]])}
    unwritable = unwritable_project(brain, hardening, mounts, facts)
    warnings = (
        _warnings(
            tenancy,
            image,
            task.image.spec.get("repository"),
            credentials,
            hardening,
            brain,
            facts,
            unwritable,
        )
        + [
            f"context memory {memory_id} does not exist (forgotten?); the brain will not find it"
            for memory_id in facts.missing_memories
        ]
        + list(facts.state_notes)
        + model_warnings
    )
    refusals = _refusals(floor, policy, approvals, tenancy, hardening, unwritable, widened)
    refusals += ceiling_refusals(catalog, draft["budget"])
    refusals += commits.refusals(commits_section)
    refusals += resume.refusals(draft["budget"], {c["category"]: c["type"] for c in credentials})
    refusals += lifetime_refusals(list(credentials))
    refusals += user_namespace_refusals(
        user_namespaces_required(p.spec for p in catalog.of("Policy")), task.runtime, facts.daemon
    )
    refusals += _endpoint_refusals(task)
    plan: Plan = {
        "format_version": FORMAT_VERSION,
        "inputs": draft["inputs"],
        "task": task_section,
        "image": {**image, **_classified(by_category[image["category"]])},
        "mounts": [
            mounts[0],
            *[_classified_mount(m, by_category) if m["kind"] == "extra" else m for m in mounts[1:]],
        ],
        "egress": egress,
        "credentials": [
            {**cred, **_classified(by_category[cred["category"]])} for cred in credentials
        ],
        "hardening": hardening,
        "brain": brain,
        "memory": draft["memory"],
        "budget": draft["budget"],
        "tripwires": graduation_settings(catalog).tripwires,
        "floor": floor,
        "policy": policy,
        "approvals": approvals,
        "warnings": warnings,
        "refusals": refusals,
        "applyable": applyable(refusals),
        "intent": "",
        "fingerprint": "",
    }
    if commits_section is not None:
        plan["commits"] = commits_section
    if tool_servers:
        plan["tool_servers"] = [
            {**server, **_classified(by_category[server["category"]])} for server in tool_servers
        ]
    plan["intent"] = intent_fingerprint(plan)
    plan["fingerprint"] = fingerprint(plan)
    return plan


def _refusals(
    floor: list[str],
    policy: list[PolicyResult],
    approvals: list[Approval],
    tenancy: Tenancy,
    hardening: Hardening,
    unwritable: str,
    widened: list[str],
) -> list[Refusal]:
    """Everything that makes apply refuse the plan, as data (``applyable`` derives from it)."""
    found: list[Refusal] = [
        {"code": "floor", "message": f"membrane floor: {broken}", "source": "membrane floor"}
        for broken in floor
    ]
    found += [
        {
            "code": "policy-deny",
            "message": f"policy {r['policy']} ({r['message']})",
            "source": r["source"],
        }
        for r in policy
        if r["effect"] == "deny" and not r["passed"]
    ]
    found += [
        {
            "code": "capability-denied",
            "message": f"{a['category']} {a['reason']}",
            "source": a["category"],
        }
        for a in approvals
        if a["class"] == "denied"
    ]
    if tenancy == "shared" and hardening["runtime"] not in SHARED_RUNTIMES:
        found.append(
            {
                "code": "shared-tenancy",
                "message": "tenancy is shared but the runtime is not runsc/kata",
                "source": "$.hardening.runtime",
            }
        )
    if unwritable.startswith(REFUSED):
        found.append(
            {
                "code": "project-unwritable",
                "message": unwritable.removeprefix(REFUSED),
                "source": "$.task.project_root",
            }
        )
    for reason in widened:
        code = "parent-not-applied" if "has no applied plan" in reason else "child-widens-parent"
        found.append({"code": code, "message": reason, "source": "$.task.parent"})
    return found


def _warnings(
    tenancy: Tenancy,
    image: ImageBase,
    repository: str | None,
    credentials: list[CredentialBase],
    hardening: Hardening,
    brain: BrainSection,
    facts: Facts,
    unwritable: str,
) -> list[str]:
    warnings: list[str] = []
    if not image["resolved"]:
        warnings.append(
            f"image {image['ref']} is not built here (digest unresolved);"
            " run `kagura-agent images build` before apply"
        )
    elif repository and image["pull"] is None:
        warnings.append(
            f"image {image['ref']} is not pushed to {repository}: only a host that has"
            f" {str(image['digest'])[:19]}… can apply this plan;"
            f" run `kagura-agent images push {image['name']}` and plan again"
        )
    for cred in credentials:
        if cred["standing"]:
            warnings.append(
                f"credential {cred['provider']}/{cred['scope']} is a standing secret (static);"
                " it does not expire on its own"
            )
    if unwritable and not unwritable.startswith(REFUSED):
        warnings.append(unwritable)
    if brain["runtime"] == "host":
        warnings.append(
            "brain runtime is host: the brain runs UNSANDBOXED on this machine;"
            " apply needs --allow-host-runtime"
        )
    # A daemon without user namespaces is said once per daemon by the commands that
    # plan (membrane/isolation.notice_once) and by doctor every time, not in every plan;
    # a Policy that requires them refuses the plan instead (user_namespace_refusals).
    return warnings


def _classified(approval: Approval) -> Classified:
    return {"class": approval["class"], "reason": approval["reason"]}


def _task_mount(mount: Mapping[str, str]) -> Mount:
    if mount["kind"] == "protected":
        protected: Mount = {
            "kind": "protected",
            "source": mount["source"],
            "target": mount["target"],
            "mode": "ro",
            "protects": mount["protects"],
        }
        if mount.get("placeholder"):
            protected["placeholder"] = True
        return protected
    return _extra_mount(mount)


def _extra_mount(mount: Mapping[str, str]) -> Mount:
    return {
        "kind": "extra",
        "source": mount["source"],
        "target": mount["target"],
        "mode": "ro" if mount["mode"] == "ro" else "rw",
        "category": f"mount:{mount['source']}",
    }


def _classified_mount(mount: Mount, by_category: Mapping[str, Approval]) -> Mount:
    approval = by_category[mount.get("category", "")]
    return {**mount, "class": approval["class"], "reason": approval["reason"]}


def fingerprint(plan: Mapping[str, Any]) -> str:
    """sha256 over the canonical JSON of every key but the fingerprint itself."""
    body = {k: v for k, v in plan.items() if k != "fingerprint"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def _tenancy(catalog: Catalog) -> Tenancy:
    for policy in catalog.of("Policy"):
        if policy.spec.get("tenancy") == "shared":
            return "shared"
    return "self-host"


def _inputs(catalog: Catalog, task: ResolvedTask, facts: Facts) -> Inputs:
    return {
        "manifests_dir": catalog.origin,
        "layers": [
            {"layer": layer_of(info["layer"]), "dir": info["dir"]} for info in catalog.layers
        ],
        "overrides": list(catalog.overrides),
        "files": dict(sorted(catalog.digests.items())),
        "tool_version": __version__,
        "schema_version": schema_version(),
        "facts": {
            "graduation_version": facts.graduation.version,
            "image_digest": facts.image_digests.get(task.image.spec["tag"]),
            "daemon": _daemon_facts(facts),
            "project_owner": facts.project_owner,
        },
    }


def _daemon_facts(facts: Facts) -> DaemonFacts | None:
    daemon = facts.daemon
    if daemon is None:
        return None
    return {
        "userns_remap": bool(daemon.get("userns_remap")),
        "rootless": bool(daemon.get("rootless")),
        "runtimes": sorted(daemon.get("runtimes") or []),
        "version": daemon.get("version"),
    }


def _task(task: ResolvedTask) -> TaskSection:
    return {
        "name": task.name,
        "kind": task.kind,
        "file": task.manifest.file,
        "path": task.path,
        "project_root": task.project_root,
        "session": task.session,
        "prompt": task.prompt,
        "steps": task.steps,
        "verify": task.verify,
        "context": {
            "memories": list(task.context.get("memories", [])),
            "include_untrusted": bool(task.context.get("include_untrusted", False)),
        },
    }


def _image(image: Manifest, facts: Facts) -> ImageBase:
    ref = image.spec["tag"]
    digest = facts.image_digests.get(ref)
    pull = facts.image_pulls.get(ref) if image.spec.get("repository") and digest else None
    return {
        "name": image.name,
        "ref": ref,
        "recipe": image.spec["recipe"],
        "recipe_digest": facts.recipe_digests.get(image.spec["recipe"]),
        "digest": digest,
        "pull": pull,
        "resolved": digest is not None,
        "software": dict(facts.image_software.get(ref, {})) if digest else {},
        "category": f"image:{image.name}",
        "source": image.file,
        "layer": layer_of(image.layer),
    }


def _brain(task: ResolvedTask, facts: Facts) -> BrainSection:
    spec = task.brain.spec
    auth = spec.get("auth", {"mode": "none"})
    section: BrainSection = {
        "name": task.brain.name,
        "engine": spec["engine"],
        "model": spec.get("model"),
        "permission_mode": spec.get(
            "permission_mode", "default" if spec["engine"] == "sdk" else None
        ),
        "runtime": task.runtime,
        "auth": {"mode": auth["mode"], "credential": auth.get("credential")},
        "backend": spec.get("backend"),
        "local_provider": spec.get("local_provider"),
        "endpoint": _endpoint_url(spec),
        "max_line_bytes": spec.get("max_line_bytes", 1024 * 1024),
        "idle_timeout_seconds": parse_duration(spec.get("idle_timeout", "5m")),
        "source": task.brain.file,
        "layer": layer_of(task.brain.layer),
    }
    if spec["engine"] == "sdk":
        section["cli_environment"] = dict(CLI_ENVIRONMENT)
        if task.runtime == "container" and task.session:
            section["conversation"] = conversation(task.session, facts.checkpoint)
    return section


def _endpoint_url(spec: Mapping[str, Any]) -> str | None:
    """The endpoint URL a Brain names (an sdk brain's resolved from its object form)."""
    raw = spec.get("endpoint")
    if raw is None or isinstance(raw, str):
        return raw
    found, _ = read_endpoint(spec)
    return found.url if found is not None else None


def _endpoint_refusals(task: ResolvedTask) -> list[Refusal]:
    """A task that runs an endpoint brain on the host would bypass the endpoint's port."""
    spec = task.brain.spec
    if spec["engine"] != "sdk" or spec.get("endpoint") is None or task.runtime == "container":
        return []
    return [
        {
            "code": "endpoint-needs-container",
            "message": f"brain {task.brain.name} names a model endpoint, reached through the"
            " run's key-injecting port: it needs runtime container",
            "source": "$.brain.runtime",
        }
    ]


def _dispatch_check(task: ResolvedTask, facts: Facts) -> tuple[ParentLink | None, list[str]]:
    """A dispatched child's ``task.parent`` link, and why the plan cannot run yet.

    The child may only narrow its parent's last applied plan (egress, credential scopes,
    mounts; patterns.dispatch.narrowing_violations, filled in by ``compile_plan`` once the
    sections exist). A parent that never applied a plan bounds nothing, so that refuses
    the child too. Plans without a parent are unchanged.
    """
    if task.parent is None:
        return None, []
    parent: ParentLink = {
        "task": task.parent["task"],
        "run": facts.parent_run,
        "context_memories": list(task.parent["context"]),
        "narrowing": None,  # not checked: no parent plan to check against
    }
    return parent, _widened(parent)


def _widened(parent: ParentLink) -> list[str]:
    name = parent["task"]
    if parent["narrowing"] is None:
        return [
            f"parent task {name!r} has no applied plan; a child can only narrow a plan that ran"
        ]
    return [f"child widens parent {name!r}: {v}" for v in parent["narrowing"]]
