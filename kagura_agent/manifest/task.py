"""Resolving a Task against the catalog: defaults, references, template, paths.

Everything here reads only the task file's surroundings (realpath of the project root
and mounts); the result is a plain value the pure planner compiles.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kagura_agent.errors import Diagnostic
from kagura_agent.inputfile import empty_folder
from kagura_agent.manifest.catalog import Catalog, Manifest
from kagura_agent.manifest.endpoint import INJECTED_MODES
from kagura_agent.manifest.gitinputs import git_metadata
from kagura_agent.manifest.template import TemplateLimit, render_prompt
from kagura_agent.manifest.toolservers import resolve_tool_servers
from kagura_agent.membrane.floor import normalise_target, target_problem
from kagura_agent.membrane.mounts import check_mount
from kagura_agent.membrane.roots import check_project_root
from kagura_agent.paths import sqlite_path, under
from kagura_agent.plan.model import BrainRuntime
from kagura_agent.units import parse_duration

MIN_TTL = 15 * 60
MAX_TTL = 60 * 60
DEFAULT_TTL = MIN_TTL
DEFAULT_BUDGET: dict[str, Any] = {"turns": 20, "wall_time": "10m", "disk": "1g"}


@dataclass(frozen=True)
class CredentialRequest:
    provider: Manifest
    scope: str
    ttl_seconds: int
    renewals: int
    budget_seconds: int


@dataclass(frozen=True)
class ResolvedTask:
    manifest: Manifest
    kind: str
    brain: Manifest
    image: Manifest
    memory: Manifest | None
    prompt: str | None
    steps: list[str] | None
    project_root: str
    mounts: list[dict[str, str]]
    egress: list[Manifest]
    credentials: list[CredentialRequest]
    budget: dict[str, Any]
    runtime: BrainRuntime
    session: str | None
    verify: list[str]
    context: dict[str, Any] = field(default_factory=dict)
    # The task file's absolute path (apply re-plans from it to check freshness). Resolved
    # here, not in a property: the planner must not touch the file system or the cwd.
    path: str = ""
    # A dispatched child: {"task": name, "context": [ids], "depth": int or None, "budget":
    # what the parent had left, {turns, wall_seconds, cost_usd} or None}.
    parent: dict[str, Any] | None = None
    tool_servers: tuple[Manifest, ...] = ()  # ToolServer manifests the task requested
    commits: str = "diff"  # "branch": the agent's commits come back as a branch

    @property
    def name(self) -> str:
        return self.manifest.name


def resolve_task(task: Manifest, catalog: Catalog) -> tuple[ResolvedTask | None, list[Diagnostic]]:
    spec = task.spec
    problems: list[Diagnostic] = []
    brain = _ref(task, catalog, "Brain", "brain", problems)
    image = _ref(task, catalog, "Image", "image", problems)
    runtime: BrainRuntime = spec.get("runtime") or (
        brain.spec.get("runtime", "container") if brain else "container"
    )
    tools = resolve_tool_servers(task, catalog, brain=brain, runtime=runtime, problems=problems)
    if tools.image is not None:  # stdio servers run in their image: the task runs there too
        image = tools.image
    memory = _ref(task, catalog, "Memory", "memory", problems, required=False)
    egress = []
    for index, name in enumerate(spec.get("egress", [])):
        found = catalog.get("EgressPolicy", name)
        if found is None:
            problems.append(
                task.diag(
                    ("spec", "egress", index),
                    f"unknown EgressPolicy {name!r}",
                    hint=_names(catalog, "EgressPolicy"),
                )
            )
        else:
            egress.append(found)
    credentials = _credentials(task, catalog, problems)
    prompt = _render_prompt(task, problems) if "prompt" in spec else None
    steps = list(spec["steps"]) if "steps" in spec else None
    if brain is not None:
        engine = brain.spec["engine"]
        if steps is not None and engine != "script":
            problems.append(
                task.diag(
                    ("spec", "steps"), f"steps need the script brain, {brain.name!r} is {engine}"
                )
            )
        if prompt is not None and engine == "script":
            problems.append(
                task.diag(
                    ("spec", "prompt"),
                    f"brain {brain.name!r} is the script engine: give steps, not a prompt",
                )
            )
    project_root, mounts = _paths(task, catalog, problems)
    budget = dict(DEFAULT_BUDGET)
    if brain is not None:
        budget.update(brain.spec.get("budget", {}))
    budget.update(spec.get("budget", {}))
    if brain is not None:
        wall = parse_duration(str(budget.get("wall_time") or DEFAULT_BUDGET["wall_time"]))
        credentials.extend(_brain_key(brain, catalog, credentials, wall))
    if problems or brain is None or image is None or project_root is None:
        return None, problems
    return (
        ResolvedTask(
            manifest=task,
            kind=task_kind(spec, task.name),
            brain=brain,
            image=image,
            memory=memory,
            prompt=prompt,
            steps=steps,
            project_root=project_root,
            path=str(Path(task.file).resolve()),
            mounts=mounts,
            egress=egress,
            credentials=credentials,
            budget=budget,
            runtime=runtime,
            session=spec.get("session"),
            verify=list(spec.get("verify", [])),
            context=dict(spec.get("context", {})),
            parent=_parent(spec),
            tool_servers=tools.servers,
            commits=str(spec.get("commits", "diff")),
        ),
        [],
    )


def task_kind(spec: dict[str, Any], name: str) -> str:
    """What memory files the task's runs under (failures, fixes, costs, sessions).

    A dispatched child's task (``spec.parent``) is written by its parent's agent, name
    and kind included: its kind lives under the parent task's, so no name the agent picks
    is a kind the operator's own tasks learn from.
    """
    kind = str(spec.get("kind", name))
    parent = spec.get("parent")
    return f"{parent['task']}/sub-agent/{kind}" if parent is not None else kind


def _parent(spec: dict[str, Any]) -> dict[str, Any] | None:
    parent = spec.get("parent")
    if parent is None:
        return None
    bound = parent.get("budget")
    return {
        "task": parent["task"],
        "context": list(parent.get("context", [])),
        "depth": parent.get("depth"),  # how deep the dispatching host says it nests
        # What the parent had left when it dispatched (plan/budget.py cuts to it).
        "budget": None
        if bound is None
        else {
            "turns": bound.get("turns"),
            "wall_seconds": parse_duration(bound["wall_time"]) if "wall_time" in bound else None,
            "cost_usd": bound.get("cost_usd"),
        },
    }


def _ref(
    task: Manifest,
    catalog: Catalog,
    kind: str,
    key: str,
    problems: list[Diagnostic],
    *,
    required: bool = True,
) -> Manifest | None:
    name = task.spec.get(key)
    if name is None:
        found = catalog.default(kind)
        if found is None and required:
            problems.append(
                task.diag(
                    ("spec",),
                    f"no {key} given and no default {kind} in the manifests",
                    hint=f"set spec.{key} or mark one {kind} default: true",
                )
            )
        return found
    found = catalog.get(kind, name)
    if found is None:
        problems.append(
            task.diag(("spec", key), f"unknown {kind} {name!r}", hint=_names(catalog, kind))
        )
    return found


def _credentials(
    task: Manifest, catalog: Catalog, problems: list[Diagnostic]
) -> list[CredentialRequest]:
    requests = []
    for index, grant in enumerate(task.spec.get("credentials", [])):
        at = ("spec", "credentials", index)
        provider = catalog.get("CredentialProvider", grant["provider"])
        if provider is None:
            problems.append(
                task.diag(
                    (*at, "provider"),
                    f"unknown CredentialProvider {grant['provider']!r}",
                    hint=_names(catalog, "CredentialProvider"),
                )
            )
            continue
        scopes = provider.spec["scopes"]
        scope = scopes.get(grant["scope"])
        if scope is None:
            problems.append(
                task.diag(
                    (*at, "scope"),
                    f"provider {provider.name!r} has no scope {grant['scope']!r}",
                    hint="known: " + (", ".join(sorted(scopes)) or "(none)"),
                )
            )
            continue
        ttl = parse_duration(grant.get("ttl") or provider.spec.get("ttl") or "15m")
        cap = min(MAX_TTL, parse_duration(scope["max_ttl"])) if "max_ttl" in scope else MAX_TTL
        if not MIN_TTL <= ttl <= cap:
            problems.append(
                task.diag(
                    (*at, "ttl"),
                    f"lease ttl must be between 15m and {cap // 60}m",
                    hint="renewals extend a run past one lease, inside the budget",
                )
            )
            continue
        renewals = int(grant.get("renewals", 0))
        budget = parse_duration(grant["budget"]) if "budget" in grant else ttl * (renewals + 1)
        # A budget shorter than one lease is one shorter lease (the broker ends a lease at
        # its budget's end); one shorter than its provider can mint is refused by the plan
        # (membrane/lifetimes.py: lease-lifetime), which knows a dispatched child's too.
        requests.append(CredentialRequest(provider, grant["scope"], ttl, renewals, budget))
    return requests


def _brain_key(
    brain: Manifest, catalog: Catalog, requested: list[CredentialRequest], wall_seconds: int
) -> list[CredentialRequest]:
    """The credential of a brain in a container is leased like any other (the proxy injects
    it): a static key or subscription token for the run's first hour, as before; a cloud
    credential (AWS STS, GCP) for the provider's lease time, renewed to cover the run's
    wall time."""
    auth = brain.spec.get("auth", {})
    if auth.get("mode") not in INJECTED_MODES or brain.spec.get("runtime", "container") == "host":
        return []
    provider = catalog.get("CredentialProvider", auth.get("credential", ""))
    if provider is None or not provider.spec["scopes"]:
        return []
    scope = auth.get("scope") or sorted(provider.spec["scopes"])[0]
    if scope not in provider.spec["scopes"]:
        return []  # validate says so
    if any(r.provider.name == provider.name and r.scope == scope for r in requested):
        return []
    if provider.spec["type"] == "static":
        return [CredentialRequest(provider, scope, MAX_TTL, 0, MAX_TTL)]
    settings = provider.spec["scopes"][scope]
    cap = min(MAX_TTL, parse_duration(settings["max_ttl"])) if "max_ttl" in settings else MAX_TTL
    ttl = min(cap, max(MIN_TTL, parse_duration(provider.spec.get("ttl") or "15m")))
    leases = max(1, -(-wall_seconds // ttl))  # enough leases to cover the wall time
    return [CredentialRequest(provider, scope, ttl, leases - 1, ttl * leases)]


def _render_prompt(task: Manifest, problems: list[Diagnostic]) -> str | None:
    from jinja2 import TemplateError, UndefinedError

    at = ("spec", "prompt")
    try:
        return render_prompt(task.spec["prompt"], task.spec.get("vars", {}))
    except UndefinedError as exc:
        problems.append(task.diag(at, f"template: {exc.message}", hint="define it under spec.vars"))
    except TemplateLimit as exc:
        problems.append(task.diag(at, f"template refused: {exc}"))
    except TemplateError as exc:
        problems.append(task.diag(at, f"template error: {exc}"))
    except (ArithmeticError, LookupError, TypeError, ValueError, RecursionError) as exc:
        # Raised by the template's own expressions (1/0, a wrong type, a missing key).
        problems.append(task.diag(at, f"template error: {type(exc).__name__}: {exc}"))
    except MemoryError:
        problems.append(task.diag(at, "template refused: rendering ran out of memory"))
    return None


def _paths(
    task: Manifest, catalog: Catalog, problems: list[Diagnostic]
) -> tuple[str | None, list[dict[str, str]]]:
    base = Path(task.file).resolve().parent
    written = task.spec.get("project_root", ".")
    try:
        # realpath raises on a link it may not read (/proc/1/root as a non-owner).
        root = os.path.realpath(base / os.path.expanduser(written))
        _ = [os.path.realpath(base / os.path.expanduser(m["source"])) for m in mounts_of(task)]
    except OSError as exc:
        problems.append(
            task.diag(
                ("spec", "project_root"),
                f"project root or a mount source cannot be resolved: {exc.strerror}"
                f" ({exc.filename})",
            )
        )
        return None, []
    if not os.path.isdir(root):
        problems.append(
            task.diag(("spec", "project_root"), f"project root {root} is not a directory")
        )
        return None, []
    problem = check_project_root(
        os.path.normpath(base / os.path.expanduser(written)),
        allowed=workspace_roots(catalog),
        extra=_memory_files(catalog) + _secret_folders(catalog),
    ) or check_mount(root, root, writable=True)
    if problem:
        problems.append(task.diag(("spec", "project_root"), problem))
        return None, []
    mounts = []
    targets: set[str] = set()
    for index, mount in enumerate(mounts_of(task)):
        at = ("spec", "mounts", index)
        source = str(base / os.path.expanduser(mount["source"]))
        problem = check_mount(source, root, writable=False)
        real = os.path.realpath(source)
        if problem is None and not (real + "/").startswith(root.rstrip("/") + "/"):
            problem = f"mount source {source} is outside the project root {root}"
        if problem:
            problems.append(task.diag((*at, "source"), problem))
            continue
        target = normalise_target(mount["target"])
        problem = target_problem(mount["target"])
        if problem is None and target in targets:
            problem = f"mount target {mount['target']} is already the target of another mount"
        if problem:
            hint = "mount it at a path of its own, such as /data/NAME"
            problems.append(task.diag((*at, "target"), problem, hint=hint))
            continue
        targets.add(target)
        mounts.append({"kind": "extra", "source": real, "target": target, "mode": "ro"})
    protected, problem = protected_inputs(
        root,
        host_inputs(task, catalog)
        + git_metadata(root, catalog)
        + implicit_manifests(root, catalog),
    )
    if problem:
        problems.append(task.diag(("spec", "project_root"), problem))
        return None, []
    return root, mounts + protected


def host_inputs(task: Manifest, catalog: Catalog) -> list[tuple[str, str]]:
    """Files the host trusts on the next plan: this task file, every manifest folder and
    every file read as part of one (a symlink in the folder may lead elsewhere)."""
    found = [(str(Path(task.file).resolve()), "this task file")]
    for info in catalog.layers:
        what = f"the {info['layer']} manifest folder"
        found.append((str(info["path"]), what))
        found += [(real, f"a file of {what}") for real in info["reads"]]
    return found


def implicit_manifests(root: str, catalog: Catalog) -> list[tuple[str, str]]:
    """``manifests`` at the top of the root, when the catalog has no operator folder.

    Run from the root with no operator folder (``run "TEXT"`` in a project, ``apply
    task.yml`` beside it), the next invocation reads ``./manifests`` as the operator's
    folder: a folder the agent created there would grant the next run whatever it says.
    """
    if any(info["layer"] == "operator" for info in catalog.layers):
        return []
    return [(os.path.join(root, "manifests"), "the operator manifest folder ./manifests")]


def protected_inputs(
    root: str, inputs: list[tuple[str, str]]
) -> tuple[list[dict[str, str]], str | None]:
    """Read-only mounts over the host's inputs that lie inside the project root.

    An input that does not exist yet (no ``.git``, no ``./manifests``) is protected all
    the same, as an empty read-only placeholder for the run (``placeholder`` in the
    mount): what the agent could create there the host would trust next time.

    The agent writes anything under its root; a task file or manifest folder in there
    would let it grant itself capabilities for the next run (a baseline EgressPolicy, a
    graduated category). Each such input's top-level entry under the root is mounted
    read-only over the writable root: a mount point cannot be written, renamed or removed
    from inside the container (EROFS/EBUSY), and nothing above it but the root itself,
    which is a mount point too. A root that is (inside) such an input is refused.
    """
    tops: dict[str, str] = {}
    for path, what in inputs:
        real = os.path.realpath(path)
        if under(root, real):
            return [], f"project root {root} is inside {what} ({real}); the agent could rewrite it"
        if under(real, root):  # (real == root returned above)
            top = os.path.join(root, os.path.relpath(real, root).split(os.sep)[0])
            tops.setdefault(top, what)
    mounts: list[dict[str, str]] = []
    for top, what in sorted(tops.items()):
        mount = {
            "kind": "protected",
            "source": top,
            "target": "/workspace/" + os.path.relpath(top, root),
            "mode": "ro",
            "protects": what,
        }
        if not os.path.lexists(top) or empty_folder(top):
            # Not there yet: apply holds it empty and read-only for the run (the agent
            # cannot create it) and removes it after (membrane/placeholders.py). An empty
            # folder holds nothing either: it is what another run of this root holds right
            # now (or a kill -9 left), and a plan made meanwhile must be the plan made
            # before or after it, not one called stale when that run ends.
            mount["placeholder"] = "absent"
        mounts.append(mount)
    return mounts, None


def mounts_of(task: Manifest) -> list[dict[str, str]]:
    mounts: list[dict[str, str]] = task.spec.get("mounts", [])
    return mounts


def workspace_roots(catalog: Catalog) -> list[str]:
    """Workspace roots the operator's manifests declare (a task file cannot carry one)."""
    found: list[str] = []
    for manifest in catalog.of("Workspace"):
        if manifest.layer in ("packaged", "operator"):
            found.extend(str(root["path"]) for root in manifest.spec.get("roots", []))
    return found


def _memory_files(catalog: Catalog) -> list[tuple[str, str]]:
    found = []
    for manifest in catalog.of("Memory"):
        if manifest.spec.get("backend", "sqlite") == "sqlite":
            path = str(sqlite_path({"location": manifest.spec.get("path", "state-dir")}))
            found.append((path, f"the memory store of Memory {manifest.name!r}"))
    return found


def _secret_folders(catalog: Catalog) -> list[tuple[str, str]]:
    """Every Policy's ``secret_dirs``: the root secrets the host reads to mint leases. A
    root at, inside or above one would hand them to the agent whole (no lease, scope or
    expiry) and let it rewrite what the host reads next."""
    return [
        (os.path.expanduser(entry), f"the secret folder of Policy {policy.name!r}")
        for policy in catalog.of("Policy")
        for entry in policy.spec.get("secret_dirs", [])
    ]


def _names(catalog: Catalog, kind: str) -> str:
    return f"known {kind} names: " + (", ".join(catalog.names(kind)) or "(none)")
