"""``compile(catalog, task, facts) -> plan``: pure. No I/O, no clock, no environment.

The plan is a plain JSON-serialisable dict in the layout of docs/plan-format.md. The
same inputs always give the same plan and the same fingerprint.
"""

from __future__ import annotations

import hashlib
import json
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kagura_agent import __version__
from kagura_agent.facts import Facts
from kagura_agent.graduation.classify import classify
from kagura_agent.graduation.settings import graduation_settings
from kagura_agent.manifest.catalog import Catalog, Manifest
from kagura_agent.manifest.egresspool import egress_pool_knobs
from kagura_agent.manifest.endpoint import read_endpoint
from kagura_agent.manifest.gitinputs import writable_git
from kagura_agent.manifest.hosts import normalize_host
from kagura_agent.manifest.proxyimage import proxy_image
from kagura_agent.manifest.schema import schema_version
from kagura_agent.manifest.scopes import is_full_access
from kagura_agent.manifest.task import ResolvedTask
from kagura_agent.membrane.floor import floor_violations
from kagura_agent.membrane.isolation import user_namespace_refusals, user_namespaces_required
from kagura_agent.membrane.lifetimes import lifetime_refusals
from kagura_agent.memory.factory import section_from_manifest
from kagura_agent.patterns.dispatch import narrowing_violations
from kagura_agent.patterns.failure_learning import failure_trust
from kagura_agent.plan import commits, resume
from kagura_agent.plan.budget import budget_approvals, ceiling_refusals, plan_budget
from kagura_agent.plan.conversation import conversation
from kagura_agent.plan.endpoint import endpoint_baseline, model_endpoint
from kagura_agent.plan.injection import CLI_ENVIRONMENT, brain_injection
from kagura_agent.plan.intent import intent_fingerprint
from kagura_agent.plan.model import (
    Approval,
    BrainSection,
    Classified,
    CredentialBase,
    DaemonFacts,
    EgressMode,
    EgressRule,
    EgressSection,
    Hardening,
    ImageBase,
    Inputs,
    KnownFailure,
    Layer,
    MemorySection,
    Mount,
    ParentLink,
    Plan,
    PolicyResult,
    ProxyPin,
    Refusal,
    Scheme,
    TaskSection,
    Tenancy,
    applyable,
)
from kagura_agent.plan.modelcalls import model_calls
from kagura_agent.plan.policy import RuleChecker, evaluate_policies, policy_denials
from kagura_agent.plan.toolservers import (
    category,
    rule_category,
    tool_server_rules,
    tool_server_sections,
)
from kagura_agent.units import parse_duration, parse_size

FORMAT_VERSION = 1
SHARED_RUNTIMES = ("runsc", "kata", "kata-runtime")
HARDENING_DEFAULTS: dict[str, Any] = {
    "pids_limit": 256,
    "memory": "2g",
    "cpus": 1.0,
    "nofile": 1024,
    "cap_add": [],
    "runtime": "runc",
    "stop_timeout": 10,
    "tmpfs_size": "256m",
}
DEFAULT_USER = "1000:1000"
# /run/kagura receives the run's short-lived credentials (a few KiB): small, and never
# executable. Not an Image knob: no image needs more room for credentials.
RUN_KAGURA_TMPFS_BYTES = 16 * 1024 * 1024
# Every tmpfs states the flags the container gets. Docker adds noexec,nosuid,nodev to a
# tmpfs unless an option says otherwise, so the plan writes them out rather than rely on it.
TMPFS_FLAGS = "rw,noexec,nosuid,nodev"
# The hijack canary: a decoy credentials file in the agent's home (a tmpfs in the
# container) that no tool reads unless told to (git only with credential.helper=store).
REFUSED = "refused: "  # _unwritable_project's prefix for a refusal rather than a warning


def compile_plan(
    catalog: Catalog, task: ResolvedTask, facts: Facts, *, check_rule: RuleChecker | None = None
) -> Plan:
    """Compile a resolved task into a launch plan.

    ``check_rule`` evaluates one policy rule on the plan; it must be a pure function of
    its arguments (the default runs jsonschema; ``plan.build`` passes a memoised one).
    """
    tenancy = _tenancy(catalog)
    egress = _egress(
        task.egress, tool_server_rules(task.tool_servers), egress_pool_knobs(catalog).size > 0
    )
    credentials = [_credential(request) for request in task.credentials]
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
    hardening = commits.hardening(_hardening(task, tenancy, facts, egress["mode"]), commits_section)
    brain = _brain(task, facts)
    # A proxy that injects the brain's key is configured at its start: never a pooled one.
    egress["pool"] = egress["pool"] and brain_injection(brain) is None
    model_warnings: list[str] = []
    if endpoint is not None:
        egress, model_warnings = model_calls(egress, task.egress, endpoint)
    egress["proxy"] = _proxy(catalog, facts) if egress["mode"] == "proxy" else None
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
        "memory": _memory(task, facts, catalog),
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
    denials = _denied_categories(draft, policy_denials(policy))
    approvals = _classify_all(catalog, task, draft, facts, denials)
    by_category = {a["category"]: a for a in approvals}
    if endpoint is not None:
        brain["model_endpoint"] = {**endpoint, **_classified(by_category[endpoint["category"]])}
    unwritable = _unwritable_project(brain, hardening, mounts, facts)
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


def layer_of(layer: str) -> Layer:
    """The plan's name for a manifest's layer (only the two layers grant anything)."""
    return "packaged" if layer == "packaged" else "operator"


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


def _proxy(catalog: Catalog, facts: Facts) -> ProxyPin:
    """The egress proxy image, pinned as the agent image is (``_image``)."""
    proxy = proxy_image(catalog)
    digest = facts.image_digests.get(proxy.tag)
    pull = facts.image_pulls.get(proxy.tag) if proxy.repository and digest else None
    return {"ref": proxy.tag, "digest": digest, "pull": pull}


def _egress(policies: list[Manifest], tool_rules: list[EgressRule], pool: bool) -> EgressSection:
    """The allowlist: every entry of the task's policies, then its http tool servers'."""
    allow: list[EgressRule] = []
    seen: set[tuple[str, int, str]] = set()
    addresses: list[str] = []
    for policy in policies:
        for entry in policy.spec.get("allow", []):
            host, _ = normalize_host(entry["host"])
            assert host is not None  # validated before planning
            schemes: list[Scheme] = ["https", "http"] if entry.get("http") else ["https"]
            for port in entry.get("ports", [443]):
                for scheme in schemes:
                    key = (host, port, scheme)
                    if key in seen:
                        continue
                    seen.add(key)
                    allow.append(
                        {
                            "host": host,
                            "port": port,
                            "scheme": scheme,
                            "allow_addresses": list(entry.get("allow_addresses", [])),
                            "policy": policy.name,
                            "source": policy.file,
                            "layer": layer_of(policy.layer),
                        }
                    )
            for cidr in entry.get("allow_addresses", []):
                if cidr not in addresses:
                    addresses.append(cidr)
    for rule in tool_rules:
        key = (rule["host"], rule["port"], rule["scheme"])
        if key not in seen:
            seen.add(key)
            allow.append(rule)
        for cidr in rule["allow_addresses"]:
            if cidr not in addresses:
                addresses.append(cidr)
    allow.sort(key=lambda e: (e["host"], e["port"], e["scheme"]))
    # A policy of model calls needs the proxy (its key-injecting port) even with no host.
    calls = any(p.spec.get("model_calls") is not None for p in policies)
    return {
        "mode": "proxy" if allow or calls else "none",
        "allow": allow,
        "allow_addresses": addresses,
        "policies": [p.name for p in policies],
        # Whether apply may hand this run a pooled (warm) proxy session if one is idle.
        "pool": bool(allow) and pool,
    }


def _credential(request: Any) -> CredentialBase:
    provider: Manifest = request.provider
    spec = provider.spec
    return {
        "name": f"{provider.name}-{request.scope}",
        "provider": provider.name,
        "type": spec["type"],
        "scope": request.scope,
        # Provider settings (endpoint, region, app id…) then the scope's own keys: what the
        # provider needs to mint, and nothing secret (the root secret is a reference).
        "scope_spec": {
            **spec.get(_settings_key(spec["type"]), {}),
            **{k: v for k, v in spec["scopes"][request.scope].items() if k != "description"},
        },
        "ttl_seconds": request.ttl_seconds,
        "renewals": request.renewals,
        "budget_seconds": request.budget_seconds,
        "secret_ref": spec["secret"],
        "standing": bool(spec.get("standing", False)),
        "category": f"credential:{provider.name}/{request.scope}",
        "source": provider.file,
        "layer": layer_of(provider.layer),
    }


def _settings_key(kind: str) -> str:
    return {"aws-sts": "aws", "github-app": "github"}.get(kind, kind)


def _unwritable_project(
    brain: BrainSection, hardening: Hardening, mounts: list[Mount], facts: Facts
) -> str:
    """Why the container user cannot write the project root ("" when it can).

    The agent never runs as root, so a project root the container user may not write (a
    root-owned checkout; one the agent itself left ``chmod 000``) is refused up front with
    the command that fixes it, rather than failing mid-run. Without the mode fact (older
    facts files) a root owner is only a warning.
    """
    owner = facts.project_owner
    if owner is None or brain["runtime"] != "container":
        return ""
    user = hardening["user"]
    mode = facts.project_mode
    if mode is None:
        if owner[0] != 0:
            return ""
        return (
            f"the project root is owned by root; the agent runs as {user} and cannot"
            " write it (chown it to a non-root user)"
        )
    root = next((m["source"] for m in mounts if m["kind"] == "project"), "")
    access = root_access(owner, mode, root)
    if access.writable:
        return ""
    who = "root" if owner[0] == 0 else f"uid {owner[0]}"
    return (
        f"{REFUSED}the project root is owned by {who} (mode {mode:o}) and the agent, which"
        f" never runs as root, runs as {user} and could not write it; fix: {access.fix}"
    )


@dataclass(frozen=True)
class RootAccess:
    """What the agent can do with a project root of some owner and mode: the container
    user it runs as, whether that user can create and change entries in it, and the
    command that makes it so (run as the root's owner or root; "" when it can)."""

    user: str
    writable: bool
    fix: str


def root_access(owner: list[int], mode: int, root: str) -> RootAccess:
    """The container user's access to ``root`` (owned by ``owner``, with ``mode``).

    Writing entries of a directory takes its write *and* search bits, from the one class
    the kernel picks: the owner's when the user is the owner, else the group's when its
    group is the directory's, else the others'. The fix, followed as written, makes the
    next plan pass: ``chmod u+rwx`` when the agent is the owner (it may have taken its own
    bits away: ``chmod 000 /workspace``), else ``chown -R`` to the user the agent will then
    run as (the new owner), with ``chmod u+rwx`` when the owner's bits lack it.
    """
    user = _container_user(Facts(project_owner=owner, project_mode=mode))
    uid, gid = (int(part) for part in user.split(":"))
    if uid == owner[0]:
        bits = mode >> 6
    elif gid == owner[1]:
        bits = mode >> 3
    else:
        bits = mode
    if bits & 0o3 == 0o3:
        return RootAccess(user, True, "")
    quoted = shlex.quote(root)
    owner_ok = (mode >> 6) & 0o7 == 0o7
    if uid == owner[0]:
        return RootAccess(user, False, f"chmod u+rwx {quoted}")
    chown = f"chown -R {user} {quoted}"
    return RootAccess(user, False, chown if owner_ok else f"{chown} && chmod u+rwx {quoted}")


def _container_user(facts: Facts) -> str:
    """The project root's owner, so the agent can write it — but never root."""
    owner = facts.project_owner
    if owner and owner[0] != 0 and owner[1] != 0:
        return f"{owner[0]}:{owner[1]}"
    return DEFAULT_USER


def _hardening(
    task: ResolvedTask, tenancy: Tenancy, facts: Facts, egress_mode: EgressMode
) -> Hardening:
    knobs = {**HARDENING_DEFAULTS, **task.image.spec.get("hardening", {})}
    user = _container_user(facts)
    return {
        "user": user,
        "cap_drop": ["ALL"],
        "cap_add": sorted(knobs["cap_add"]),
        "no_new_privileges": True,
        "seccomp": "default",
        "read_only_rootfs": True,
        "tmpfs": tmpfs_mounts(user, parse_size(knobs["tmpfs_size"])),
        "pids_limit": knobs["pids_limit"],
        "memory_bytes": parse_size(knobs["memory"]),
        "nano_cpus": round(float(knobs["cpus"]) * 1e9),
        "nofile": knobs["nofile"],
        "init": True,
        "stop_timeout": knobs["stop_timeout"],
        # Always none: with egress the agent still has no interface but loopback and
        # reaches its proxy through a Unix socket (membrane/egress/session.py).
        "network": "none",
        "pid_mode": "private",
        "ipc_mode": "private",
        "privileged": False,
        "devices": [],
        "runtime": knobs["runtime"],
        "log_driver": "none",
        "tenancy": tenancy,
        "workdir": "/workspace",
    }


def tmpfs_mounts(user: str, scratch_bytes: int) -> dict[str, str]:
    """The tmpfs mounts with the exact options the container gets (checked against its
    /proc/mounts in tests/test_membrane_container.py).

    Owned by the agent user: the root file system is read-only, so these are the only
    places it can write besides the project root. /tmp is world-writable and sticky like
    any /tmp; the agent's home and /run/kagura (its credentials) are owner-only.
    """
    uid, _, gid = user.partition(":")
    owner = f"uid={uid},gid={gid or uid}"
    return {
        "/tmp": f"{TMPFS_FLAGS},size={scratch_bytes},mode=1777,{owner}",
        "/home/agent": f"{TMPFS_FLAGS},size={scratch_bytes},mode=0700,{owner}",
        "/run/kagura": f"{TMPFS_FLAGS},size={RUN_KAGURA_TMPFS_BYTES},mode=0700,{owner}",
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


def _memory(task: ResolvedTask, facts: Facts, catalog: Catalog) -> MemorySection:
    memory = task.memory
    section = section_from_manifest(*((memory.name, memory.spec) if memory else (None, None)))
    settings = graduation_settings(catalog)
    half_life = settings.failure_half_life
    runs = (facts.cost_history or {}).get("runs") or []
    successes = sum(1 for run in runs if run.get("outcome") == "success")
    ages = [float(a) for f in facts.known_failures for a in f.get("ages_seconds") or []]
    return {
        "name": section["name"],
        "backend": section["backend"],
        "location": section["location"],
        "token_ref": section["token_ref"],
        "untrusted_inputs": untrusted_inputs(task, facts),
        "known_failures": [_known_failure(f, half_life) for f in facts.known_failures],
        "failure_trust": {
            "score": failure_trust(successes, ages, half_life),
            "successes": successes,
            "weighted_failures": round(sum(float(0.5 ** (age / half_life)) for age in ages), 3),
            "half_life_seconds": half_life,
            "min_trust": settings.min_trust,
        },
    }


def _known_failure(found: Mapping[str, Any], half_life: int) -> KnownFailure:
    """A known failure and its fix, with their memory ids when the store gave them
    (``memory show`` follows them), when it last happened, its recency weight and what
    the fixing run changed."""
    # A failure whose tier is not stated is untrusted: it reaches the brain quoted either way.
    trust = "trusted" if found.get("trust") == "trusted" else "untrusted"
    known: KnownFailure = {
        "failure": str(found["failure"]),
        "fix": found.get("fix"),
        "trust": trust,
    }
    if found.get("failure_id"):
        known["failure_id"] = str(found["failure_id"])
    if "fix_id" in found:
        known["fix_id"] = found["fix_id"]
    if "last_failed" in found:
        ages = [float(a) for a in found.get("ages_seconds") or []]
        known["last_failed"] = found.get("last_failed")
        known["occurrences"] = int(found.get("occurrences") or 1)
        known["weight"] = round(sum(float(0.5 ** (age / half_life)) for age in ages), 3)
        known["fix_changes"] = [
            {"change": str(c["change"]), "op": str(c["op"]), "value": str(c["value"])}
            for c in found.get("fix_changes") or []
        ]
    return known


def untrusted_inputs(task: ResolvedTask, facts: Facts) -> list[str]:
    """The run's untrusted inputs: untrusted context memories, and recall of untrusted ones.

    ``include_untrusted`` lets the brain recall untrusted memories during the run, so it is
    an untrusted input whatever the store holds today.
    """
    found = list(facts.untrusted_inputs)
    if task.context.get("include_untrusted"):
        found.append("context.include_untrusted")
    return found


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


def _denied_categories(plan: Mapping[str, Any], by_path: dict[str, str]) -> dict[str, str]:
    """Turn policy violations at indexed plan paths into denied capability categories."""
    denied: dict[str, str] = {}
    for path, policy in by_path.items():
        section, _, index = path.rstrip("]").partition("[")
        if section == "egress.allow":
            entry = plan["egress"]["allow"][int(index)]
            denied.setdefault(rule_category(entry["policy"]), policy)
        elif section == "tool_servers":
            denied.setdefault(plan["tool_servers"][int(index)]["category"], policy)
        elif section == "credentials":
            denied.setdefault(plan["credentials"][int(index)]["category"], policy)
        elif section == "mounts" and "category" in plan["mounts"][int(index)]:
            denied.setdefault(plan["mounts"][int(index)]["category"], policy)
    return denied


def _classify_all(
    catalog: Catalog,
    task: ResolvedTask,
    draft: Mapping[str, Any],
    facts: Facts,
    denials: dict[str, str],
) -> list[Approval]:
    settings = graduation_settings(catalog)
    graduation_baseline = settings.baseline
    # The graduation gate weighs this task kind's recent failures (memory.failure_trust).
    trust = draft["memory"]["failure_trust"]["score"]
    requested: list[tuple[str, bool]] = [
        (draft["image"]["category"], bool(task.image.spec.get("baseline", False)))
    ]
    for policy in task.egress:
        requested.append((f"egress:{policy.name}", bool(policy.spec.get("baseline", False))))
    for cred in draft["credentials"]:
        provider = catalog.get("CredentialProvider", cred["provider"])
        base = provider is not None and cred["scope"] in provider.spec.get("baseline_scopes", [])
        requested.append((cred["category"], base))
    for mount in draft["mounts"][1:]:
        if mount["kind"] == "extra":
            requested.append((mount["category"], False))
    if "model_endpoint" in draft["brain"]:
        requested.append(
            (draft["brain"]["model_endpoint"]["category"], endpoint_baseline(task.brain))
        )
    for server in task.tool_servers:
        requested.append((category(server.name), bool(server.spec.get("baseline", False))))
    untrusted = untrusted_inputs(task, facts)
    full = {c["category"] for c in draft["credentials"] if is_full_access(c["scope_spec"])}
    approvals = []
    for asked, baseline in requested:
        approval = classify(
            asked,
            baseline=baseline or asked in graduation_baseline,
            state=facts.graduation,
            untrusted_inputs=untrusted,
            denied_by_policy=denials.get(asked),
            trust=trust,
            min_trust=settings.min_trust,
        ).to_json()
        if asked in full:
            # Whoever approves (or reads why it needs no approval) sees the whole power.
            approval["reason"] += "; FULL ACCESS: the scope narrows nothing (full_access: true)"
        approvals.append(approval)
    # A learnt budget above the default is more than the operator's manifests gave.
    for asked, why in budget_approvals(draft["budget"]):
        approval = classify(
            asked,
            baseline=asked in graduation_baseline,
            state=facts.graduation,
            untrusted_inputs=untrusted,
            denied_by_policy=denials.get(asked),
            trust=trust,
            min_trust=settings.min_trust,
        ).to_json()
        approval["reason"] = f"{why}; {approval['reason']}"
        approvals.append(approval)
    return approvals
