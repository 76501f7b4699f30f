"""The launch plan's shape: one TypedDict per section, Literals for the closed sets.

The plan stays a plain JSON dict at runtime (the fingerprint, golden files and policies
see exactly what they saw before); these types let ``mypy --strict`` check every read,
``planfile.load`` check a saved plan's shape (``check_shape``), and
scripts/gen_plan_docs.py write the field table of docs/plan-format.md.
``DESCRIPTIONS`` (plan/fields.py) documents every field; a test fails when one is missing.
"""

import types
import typing
from typing import Any, Literal, NotRequired, TypedDict, Union

CapabilityClass = Literal["baseline", "graduated", "needs-approval", "denied"]
EgressMode = Literal["none", "proxy"]
Scheme = Literal["https", "http"]
BrainRuntime = Literal["container", "host"]
BrainEngine = Literal["script", "sdk", "kagura-brain"]
AuthMode = Literal["none", "api-key", "subscription", "cloud"]
EndpointApi = Literal["anthropic", "bedrock", "vertex"]
EndpointAuth = Literal["x-api-key", "bearer", "oauth", "sigv4"]
NetworkMode = Literal["none"]
Tenancy = Literal["self-host", "shared"]
MountKind = Literal["project", "extra", "protected"]
MountMode = Literal["ro", "rw"]
MemoryBackend = Literal["sqlite", "cloud", "postgres"]
BudgetSource = Literal["task", "brain", "default", "history", "parent", "session"]
ParentBound = Literal["remaining", "plan"]
PolicyEffect = Literal["deny", "warn"]
DiffOp = Literal["+", "-", "~"]
Layer = Literal["packaged", "operator"]
ToolTransport = Literal["stdio", "http"]


class DaemonFacts(TypedDict):
    userns_remap: bool
    rootless: bool
    runtimes: list[str]
    version: str | None


class FactInputs(TypedDict):
    graduation_version: int
    image_digest: str | None
    daemon: DaemonFacts | None
    project_owner: list[int] | None


class LayerInput(TypedDict):
    layer: Layer
    dir: str


class Inputs(TypedDict):
    manifests_dir: str
    layers: list[LayerInput]
    overrides: list[str]
    files: dict[str, str]
    tool_version: str
    schema_version: str
    facts: FactInputs


class TaskContext(TypedDict):
    memories: list[str]
    include_untrusted: bool


class ParentLink(TypedDict):
    task: str
    run: str | None
    context_memories: list[str]
    narrowing: list[str] | None


class TaskSection(TypedDict):
    name: str
    kind: str
    file: str
    path: str
    project_root: str
    session: str | None
    prompt: str | None
    steps: list[str] | None
    verify: list[str]
    context: TaskContext
    parent: NotRequired[ParentLink]


# ``class`` is a Python keyword, so the approval fields use the functional syntax.
Classified = TypedDict("Classified", {"class": CapabilityClass, "reason": str})


class ImageBase(TypedDict):
    name: str
    ref: str
    recipe: str
    recipe_digest: str | None
    digest: str | None
    pull: str | None
    resolved: bool
    software: dict[str, str]
    category: str
    source: str
    layer: Layer


class ImageSection(ImageBase, Classified):
    pass


Mount = TypedDict(
    "Mount",
    {
        "kind": MountKind,
        "source": str,
        "target": str,
        "mode": MountMode,
        "category": NotRequired[str],
        "class": NotRequired[CapabilityClass],
        "reason": NotRequired[str],
        "protects": NotRequired[str],
        "placeholder": NotRequired[bool],
    },
)


class EgressRule(TypedDict):
    host: str
    port: int
    scheme: Scheme
    allow_addresses: list[str]
    policy: str
    source: str
    layer: Layer


class ProxyPin(TypedDict):
    """The egress proxy image a plan runs: pinned like the agent image (``image``)."""

    ref: str
    digest: str | None
    pull: str | None


class ModelCallsSection(TypedDict):
    """The key-injecting port's model-call policy (present when the brain's key is
    injected): what a call may ask the provider to reach, and how calls are capped."""

    upstream: str  # https://host:port the calls go to, with the operator's key
    credential: str  # the credential provider whose key is injected
    paths: list[str]  # "METHOD /path" the port offers
    server_tools: list[str]  # server-side tool families allowed (web_search, ...)
    mcp_servers: list[str]  # hosts of MCP connectors the provider may reach
    url_sources: bool  # sources the provider fetches by URL
    files: bool  # the Files API and file references
    betas: list[str]  # anthropic-beta families (or exact names) allowed
    concurrency: int  # calls under way at once
    side_calls_per_turn: int  # calls without tools, per turn of the budget
    free_calls_per_turn: int  # token counts, per turn of the budget
    tunnel: list[str]  # policies that also allow the model host on the forward port
    grants: list[dict[str, Any]]  # what each policy allowed: {policy, allows, layer}


class EgressSection(TypedDict):
    mode: EgressMode
    allow: list[EgressRule]
    allow_addresses: list[str]
    policies: list[str]
    pool: NotRequired[bool]
    proxy: NotRequired[ProxyPin | None]  # None when mode is none
    model_calls: NotRequired[ModelCallsSection]


class CredentialBase(TypedDict):
    name: str
    provider: str
    type: str
    scope: str
    scope_spec: dict[str, Any]
    ttl_seconds: int
    renewals: int
    budget_seconds: int
    secret_ref: str
    standing: bool
    category: str
    source: str
    layer: Layer


class Credential(CredentialBase, Classified):
    pass


class ToolServerBase(TypedDict):
    name: str
    transport: ToolTransport
    image: str | None
    command: list[str] | None
    env: dict[str, str]
    url: str | None
    host: str | None
    port: int | None
    category: str
    source: str
    layer: Layer


class ToolServer(ToolServerBase, Classified):
    pass


class Hardening(TypedDict):
    user: str
    cap_drop: list[str]
    cap_add: list[str]
    no_new_privileges: bool
    seccomp: str
    read_only_rootfs: bool
    tmpfs: dict[str, str]
    pids_limit: int
    memory_bytes: int
    nano_cpus: int
    nofile: int
    init: bool
    stop_timeout: int
    network: NetworkMode
    pid_mode: str
    ipc_mode: str
    privileged: bool
    devices: list[str]
    runtime: str
    log_driver: str
    tenancy: Tenancy
    workdir: str


class BrainAuth(TypedDict):
    mode: AuthMode
    credential: str | None


class LocalEndpoint(TypedDict):
    """A model endpoint on this machine: a container on an internal Docker network that
    the run's proxy joins (the agent's container never does)."""

    network: str
    container: str
    port: int


class EndpointAuthorities(TypedDict):
    """The authorities the proxy trusts for the endpoint, in place of the system's."""

    pem: str
    sha256: list[str]  # of each certificate's DER form


class ModelEndpointBase(TypedDict):
    """Where the sdk brain's model calls go through the key-injecting port, and how the
    credential travels from there (manifest/endpoint.py)."""

    api: EndpointApi
    url: str  # https://host[:port][/base path]; a local endpoint: http://container:port
    region: str | None
    project: str | None
    auth: EndpointAuth
    credential: str  # the CredentialProvider whose credential the proxy adds
    scope: str
    environment: dict[str, str]  # the CLI's documented switches for it (no secret)
    category: str  # model-endpoint:HOST
    # only for an endpoint on this machine (the Brain's endpoint.local)
    local: NotRequired[LocalEndpoint]
    # only for a url endpoint behind a private authority (the Brain's endpoint.ca)
    ca: NotRequired[EndpointAuthorities]


class ModelEndpoint(ModelEndpointBase, Classified):
    pass


class BrainConversation(TypedDict):
    session: str
    max_bytes: int
    handed_back: int | None
    lost: bool


class BrainSection(TypedDict):
    name: str
    engine: BrainEngine
    model: str | None
    permission_mode: str | None
    runtime: BrainRuntime
    auth: BrainAuth
    backend: str | None
    local_provider: str | None
    endpoint: str | None
    max_line_bytes: int
    idle_timeout_seconds: int
    source: str
    layer: Layer
    # engine sdk: the Claude Code CLI's documented switches apply sets in its environment
    cli_environment: NotRequired[dict[str, str]]
    # engine sdk in the container with its credential injected at the proxy
    model_endpoint: NotRequired[ModelEndpoint]
    # engine sdk in a container, a named session: what the host keeps of its conversation
    conversation: NotRequired[BrainConversation]


class FixChange(TypedDict):
    change: str  # step | instruction | capability
    op: str  # + | - | ~
    value: str


class KnownFailure(TypedDict):
    failure: str
    fix: str | None
    failure_id: NotRequired[str]
    fix_id: NotRequired[str | None]
    trust: NotRequired[str]  # trusted | untrusted (the failure text's tier)
    last_failed: NotRequired[str | None]
    occurrences: NotRequired[int]
    weight: NotRequired[float]
    fix_changes: NotRequired[list[FixChange]]


class FailureTrust(TypedDict):
    score: float | None
    successes: int
    weighted_failures: float
    half_life_seconds: int
    min_trust: float


class MemorySection(TypedDict):
    name: str
    backend: MemoryBackend
    location: str
    token_ref: str | None
    untrusted_inputs: list[str]
    known_failures: list[KnownFailure]
    failure_trust: FailureTrust


class CostFigures(TypedDict):
    turns: int | None
    tokens: int | None
    wall_seconds: int | None
    cost_usd: float | None


class ReportedFigures(TypedDict):
    turns: int | None
    tokens: int | None
    cost_usd: float | None


class Forecast(TypedDict):
    basis: str
    runs: int
    quantile: float
    reserve: float
    expected: CostFigures
    limits: CostFigures
    reported: ReportedFigures
    retries: float
    min_runs: int
    learnt: list[str]
    step: float
    previous: CostFigures | None
    default: CostFigures
    over_default: list[str]


class ParentBudget(TypedDict):
    turns: int | None
    wall_seconds: int | None
    cost_usd: float | None
    bound: ParentBound


class SpentFigures(TypedDict):
    turns: int
    wall_seconds: int
    cost_usd: float


class ResumedLease(TypedDict):
    category: str
    spent_seconds: int
    spent_renewals: int
    budget_seconds: int
    renewals: int


class Resumed(TypedDict):
    session: str
    step: int
    saved: str | None
    spent: SpentFigures
    leases: list[ResumedLease]


class Budget(TypedDict):
    turns: int | None
    tokens: int | None
    wall_seconds: int
    cost_usd: float | None
    disk_bytes: int
    children: int  # sub-agents the run may have running at once (Policy ceilings.children)
    children_total: int  # sub-agents it may ask for in all (Policy ceilings.children_total)
    depth: int  # how deep this run nests below an operator's (0: it is the operator's)
    max_depth: int  # how deep sub-agents may nest (Policy ceilings.depth)
    source: BudgetSource
    forecast: Forecast | None
    parent: ParentBudget | None
    resumed: NotRequired[Resumed]  # only in the plan of a resumed session


Approval = TypedDict(
    "Approval",
    {
        "category": str,
        "class": CapabilityClass,
        "reason": str,
        "evidence": int,
        "unmet": list[str],
    },
)


class Violation(TypedDict):
    path: str
    message: str


class PolicyResult(TypedDict):
    policy: str
    effect: PolicyEffect
    message: str
    passed: bool
    violations: list[Violation]
    source: str
    layer: Layer


class Refusal(TypedDict):
    """Why apply refuses the plan: a stable ``code``, the operator-facing ``message`` and
    the ``source`` it comes from (a manifest file, a capability category, or a plan path)."""

    code: str
    message: str
    source: str


class Tripwires(TypedDict):
    denied_egress: int
    window_seconds: int
    canary_file: str | None
    creds_after_wipe: bool
    egress_log_bytes: int
    source: str


class CommitsSection(TypedDict):
    mode: Literal["branch"]
    branch: str
    git_dir: str
    seed: str | None
    head: str | None
    object_format: str
    repo_bytes: int
    bundle_bytes: int
    problem: str | None


class Plan(TypedDict):
    format_version: int
    inputs: Inputs
    task: TaskSection
    image: ImageSection
    mounts: list[Mount]
    egress: EgressSection
    credentials: list[Credential]
    tool_servers: NotRequired[list[ToolServer]]
    commits: NotRequired[CommitsSection]  # only when the task asks (spec.commits: branch)
    hardening: Hardening
    brain: BrainSection
    memory: MemorySection
    budget: Budget
    tripwires: Tripwires
    floor: list[str]
    policy: list[PolicyResult]
    approvals: list[Approval]
    warnings: list[str]
    refusals: list[Refusal]
    applyable: bool
    intent: str
    fingerprint: str


class ShapeError(ValueError):
    """A value does not have the shape its type says; ``path`` is a JSON path."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}  {message}")
        self.path = path
        self.message = message


def applyable(refusals: list[Refusal]) -> bool:
    """The one place ``applyable`` is derived: a plan runs when nothing refuses it."""
    return not refusals


def _is_typeddict(kind: Any) -> bool:
    return isinstance(kind, type) and typing.is_typeddict(kind)


def _type_name(kind: Any) -> str:
    """A short readable name for a type (used in errors and in docs)."""
    if kind is Any:
        return "any"
    if kind is type(None):
        return "null"
    if _is_typeddict(kind):
        return "object"
    origin = typing.get_origin(kind)
    if origin is Literal:
        return " or ".join(f"`{v}`" for v in typing.get_args(kind))
    if origin in (Union, types.UnionType):
        return " or ".join(_type_name(arg) for arg in typing.get_args(kind))
    if origin is list:
        return f"list of {_type_name(typing.get_args(kind)[0])}"
    if origin is dict:
        return f"map of {_type_name(typing.get_args(kind)[1])}"
    names = {str: "string", int: "integer", float: "number", bool: "boolean"}
    return names.get(kind, getattr(kind, "__name__", str(kind)))


def fields(kind: Any) -> list[tuple[str, Any, bool]]:
    """The (key, type, required) of a TypedDict, in declaration order."""
    hints = typing.get_type_hints(kind)
    required = kind.__required_keys__
    return [(key, hints[key], key in required) for key in hints]


def check_shape(value: object, kind: Any = Plan, path: str = "$") -> None:
    """Raise ``ShapeError`` at the first place ``value`` does not match ``kind``.

    Typed sections reject missing and unknown keys; free maps and ``Any`` accept any
    JSON value.
    """
    if kind is Any:
        return
    if _is_typeddict(kind):
        if not isinstance(value, dict):
            raise ShapeError(path, f"must be an object, not {_json_name(value)}")
        declared = fields(kind)
        names = {key for key, _, _ in declared}
        for key, sub, required in declared:
            if key in value:
                check_shape(value[key], sub, f"{path}.{key}")
            elif required:
                raise ShapeError(path, f"missing key {key!r}")
        unknown = sorted(str(k) for k in value if k not in names)
        if unknown:
            raise ShapeError(path, f"unknown key {unknown[0]!r}")
        return
    origin = typing.get_origin(kind)
    if origin is Literal:
        allowed = typing.get_args(kind)
        if value not in allowed or isinstance(value, bool):
            raise ShapeError(path, f"must be one of {', '.join(map(repr, allowed))}")
        return
    if origin in (Union, types.UnionType):
        errors: list[ShapeError] = []
        for arg in typing.get_args(kind):
            try:
                check_shape(value, arg, path)
                return
            except ShapeError as exc:
                errors.append(exc)
        # Report the deepest failure: it names the most precise place.
        deepest = max(errors, key=lambda e: len(e.path))
        if deepest.path != path:
            raise deepest
        raise ShapeError(path, f"must be {_type_name(kind)}, not {_json_name(value)}")
    if origin is list:
        if not isinstance(value, list):
            raise ShapeError(path, f"must be a list, not {_json_name(value)}")
        (item,) = typing.get_args(kind)
        for index, entry in enumerate(value):
            check_shape(entry, item, f"{path}[{index}]")
        return
    if origin is dict:
        if not isinstance(value, dict):
            raise ShapeError(path, f"must be an object, not {_json_name(value)}")
        _, item = typing.get_args(kind)
        for key, entry in value.items():
            check_shape(entry, item, f"{path}.{key}")
        return
    if kind is type(None):
        ok = value is None
    elif kind is bool:
        ok = isinstance(value, bool)
    elif kind is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif kind is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    elif kind is str:
        ok = isinstance(value, str)
    else:  # pragma: no cover - a type the model does not use
        raise TypeError(f"check_shape cannot check {kind!r}")
    if not ok:
        raise ShapeError(path, f"must be {_type_name(kind)}, not {_json_name(value)}")


def _json_name(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def rows(kind: Any = Plan, prefix: str = "") -> list[tuple[str, str, bool]]:
    """Every documented field as (dotted path, type name, required), depth first."""
    found: list[tuple[str, str, bool]] = []
    for key, sub, required in fields(kind):
        path = f"{prefix}{key}"
        found.append((path, _type_name(sub), required))
        inner = _inner(sub)
        if inner is not None:
            suffix = "[]." if typing.get_origin(_strip_none(sub)) is list else "."
            found += rows(inner, path + suffix)
    return found


def _strip_none(kind: Any) -> Any:
    if typing.get_origin(kind) in (Union, types.UnionType):
        args = [a for a in typing.get_args(kind) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return kind


def _inner(kind: Any) -> Any:
    """The TypedDict inside ``kind`` (itself, a list's item, an optional), or None."""
    kind = _strip_none(kind)
    if _is_typeddict(kind):
        return kind
    if typing.get_origin(kind) is list:
        item = typing.get_args(kind)[0]
        return item if _is_typeddict(item) else None
    return None
