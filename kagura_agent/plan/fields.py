"""What each field of the plan means, by its path in the plan's JSON (``rows`` in
plan/model.py lists the paths): the text docs/plan-format.md is generated from
(scripts/gen_plan_docs.py), and tests/test_plan_model.py holds the two to the same set."""

from __future__ import annotations

DESCRIPTIONS: dict[str, str] = {
    "format_version": "Version of this layout; a reader refuses any other.",
    "inputs": "Digests of every input the plan was made from (the freshness check).",
    "inputs.manifests_dir": "The manifest folder the catalog was loaded from.",
    "inputs.layers": "The manifest layers in force, bottom first.",
    "inputs.layers[].layer": "`packaged` (the defaults shipped with the tool) or `operator`.",
    "inputs.layers[].dir": "The layer's folder (`<packaged>` for the defaults).",
    "inputs.overrides": "`Kind/name` of each packaged manifest the operator's folder replaced.",
    "inputs.files": "sha256 of each manifest file and the task file, by path.",
    "inputs.tool_version": "kagura-agent version that made the plan.",
    "inputs.schema_version": "Digest over the JSON Schemas.",
    "inputs.facts": (
        "What the planning host measured; never part of `intent`. Apply re-measures them"
        " and refuses only when a difference changes a capability."
    ),
    "inputs.facts.graduation_version": "Graduation state version when planned.",
    "inputs.facts.image_digest": "Local digest of the image (null: not built here).",
    "inputs.facts.daemon": "The Docker daemon that would run the container (null: none asked).",
    "inputs.facts.daemon.userns_remap": "Whether it remaps user namespaces.",
    "inputs.facts.daemon.rootless": "Whether it runs rootless.",
    "inputs.facts.daemon.runtimes": "OCI runtimes it offers (runc, runsc, kata…).",
    "inputs.facts.daemon.version": "Its version, or null.",
    "inputs.facts.project_owner": "[uid, gid] owning the project root here, or null.",
    "task": "The task as resolved.",
    "task.name": "Task name.",
    "task.kind": "Task kind (graduation evidence is counted per kind).",
    "task.file": "The task file.",
    "task.path": "The task's path as given.",
    "task.project_root": "Real path of the project root mounted at /workspace.",
    "task.session": "Session name, or null.",
    "task.prompt": "Rendered prompt, or null for a script task.",
    "task.steps": "Script steps, or null.",
    "task.verify": "Verify commands run after the agent, outside its reach.",
    "task.context": "Context handed to the brain.",
    "task.context.memories": "Memory ids given as context.",
    "task.context.include_untrusted": "Whether the brain may recall untrusted memories.",
    "task.parent": "Only for a dispatched child: its parent link.",
    "task.parent.task": "Parent task name.",
    "task.parent.run": "Parent's last run id, or null.",
    "task.parent.context_memories": "Memories the parent hands down.",
    "task.parent.narrowing": (
        "How the child widens its parent (null: parent never applied); anything refuses."
    ),
    "image": "The container image.",
    "image.name": "Image manifest name.",
    "image.ref": "Image tag.",
    "image.recipe": "Recipe folder it is built from.",
    "image.recipe_digest": "Digest of the recipe, or null.",
    "image.digest": (
        "Image ID the plan pins (null: not built here); apply runs exactly this image."
    ),
    "image.pull": (
        "`repository@sha256:…` a host without the pinned image pulls it from (null: the"
        " Image names no `repository`, or the image was not pushed there)."
    ),
    "image.resolved": "Whether the digest is known.",
    "image.software": (
        "The brain software the image bakes, read from its label (`claude-agent-sdk`,"
        " `claude-code` — the CLI the SDK bundles —, `kagura-brain`, `kagura-agent`): name"
        " to version; empty when the image carries none or is not built here."
    ),
    "image.category": "Capability category `image:<name>`.",
    "image.source": "Manifest file.",
    "image.layer": "Layer the manifest came from: `packaged` (the defaults) or `operator` (your folder).",
    "image.class": "Approval class of the image.",
    "image.reason": "Why it has that class.",
    "mounts": "Bind mounts; the first is always the project root.",
    "mounts[].kind": "`project`, `extra` (a task's read-only mount) or `protected` (a host input inside the project root, mounted read-only over it).",
    "mounts[].protects": "For `protected` mounts: what the host trusts there (this task file, a manifest folder).",
    "mounts[].placeholder": "For `protected` mounts: true when the path does not exist yet (no `.git`, no `./manifests`) or is an empty folder (one another run of the root holds meanwhile); apply holds it as an empty read-only folder for the run, so the agent cannot create it, and removes what it made after.",
    "mounts[].source": "Host path.",
    "mounts[].target": "Container path.",
    "mounts[].mode": "`ro` or `rw`.",
    "mounts[].category": "Capability category `mount:<abs path>` (extra mounts).",
    "mounts[].class": "Approval class (extra mounts).",
    "mounts[].reason": "Why it has that class (extra mounts).",
    "egress": "Network egress through the run's proxy.",
    "egress.mode": "`none` (no network) or `proxy`.",
    "egress.allow": "Allowed destinations, sorted.",
    "egress.allow[].host": "Host name (normalised) or wildcard.",
    "egress.allow[].port": "TCP port.",
    "egress.allow[].scheme": "`https` or `http`.",
    "egress.allow[].allow_addresses": "Private ranges this entry may resolve to.",
    "egress.allow[].policy": "EgressPolicy that allowed it, or `toolserver:<name>` for an http tool server's endpoint.",
    "egress.allow[].source": "Manifest file.",
    "egress.allow[].layer": "Layer the manifest came from: `packaged` (the defaults) or `operator` (your folder).",
    "egress.allow_addresses": "Union of the private ranges any entry allowed.",
    "egress.policies": "EgressPolicy names the task asked for.",
    "egress.pool": (
        "Whether apply may give the run a warm (pooled, never reused) proxy session when one"
        " is idle (Policy `spec.egress_pool`); the run's output says which it got."
    ),
    "egress.proxy": (
        "The egress proxy image the run uses, pinned like `image` (null when mode is `none`):"
        " an Image manifest built from `images/egress-proxy` names its tag and repository."
    ),
    "egress.model_calls": (
        "Present when the proxy injects the brain's key: the key-injecting port's model-call"
        " policy. Every model call goes through that port and is checked against it before"
        " anything is forwarded (docs/egress.md)."
    ),
    "egress.model_calls.upstream": "Where the calls go, with the operator's key.",
    "egress.model_calls.credential": "The credential provider whose key the proxy injects.",
    "egress.model_calls.paths": "`METHOD /path` the port offers; any other request is refused.",
    "egress.model_calls.server_tools": (
        "Server-side tools (by family: `web_search`, `web_fetch`, `code_execution`, ...) a call"
        " may ask the provider to run; none unless an EgressPolicy's `model_calls` allows it."
    ),
    "egress.model_calls.mcp_servers": "Hosts of MCP servers the provider may connect to.",
    "egress.model_calls.url_sources": "Whether the provider may fetch images and documents by URL.",
    "egress.model_calls.files": "Whether the Files API and file references are allowed.",
    "egress.model_calls.betas": (
        "`anthropic-beta` names or families (without their date) a call may carry; any other"
        " is refused."
    ),
    "egress.model_calls.concurrency": "Model calls under way at once; past it a call gets 429.",
    "egress.model_calls.side_calls_per_turn": (
        "Calls without tools (the CLI's side calls) allowed per turn of the budget, counted"
        " apart from the turns."
    ),
    "egress.model_calls.free_calls_per_turn": "Token counts allowed per turn of the budget.",
    "egress.model_calls.tunnel": (
        "Policies that also allow the model host on the forward port (a tunnel beside the"
        " port, unchecked); empty: an allowlist entry for it is left out, with a warning."
    ),
    "egress.model_calls.grants": "What each EgressPolicy's `model_calls` allowed: policy, allows, source, layer.",
    "egress.proxy.ref": "Proxy image tag.",
    "egress.proxy.digest": (
        "Proxy image ID when planned; apply starts the proxy from exactly this ID"
        " and refuses (exit 6) a host that has another."
    ),
    "egress.proxy.pull": (
        "`repository@sha256:…` to pull the proxy image from when a host lacks it"
        " (null: not pushed)."
    ),
    "credentials": "Lease requests (references only, never a secret value).",
    "credentials[].name": "`<provider>-<scope>`.",
    "credentials[].provider": "CredentialProvider name.",
    "credentials[].type": "Provider type.",
    "credentials[].scope": "Scope name.",
    "credentials[].scope_spec": "Provider settings and the scope's keys (nothing secret).",
    "credentials[].ttl_seconds": "Lease lifetime.",
    "credentials[].renewals": "How many renewals are allowed.",
    "credentials[].budget_seconds": "Total lease time budget.",
    "credentials[].secret_ref": "Reference to the root secret (env:, file:, keyring:).",
    "credentials[].standing": "A static secret that does not expire on its own.",
    "credentials[].category": "Capability category `credential:<provider>/<scope>`.",
    "credentials[].source": "Manifest file.",
    "credentials[].layer": "Layer the manifest came from: `packaged` (the defaults) or `operator` (your folder).",
    "credentials[].class": "Approval class.",
    "credentials[].reason": "Why it has that class.",
    "tool_servers": (
        "Only when the task requests tool servers: the MCP servers the sdk engine hands to its CLI."
    ),
    "tool_servers[].name": "ToolServer manifest name (its tools are `mcp__<name>__<tool>`).",
    "tool_servers[].transport": (
        "`stdio` (a command in the agent container) or `http` (through the run's proxy)."
    ),
    "tool_servers[].image": "stdio: the Image that carries the command (the run's image), else null.",
    "tool_servers[].command": "stdio: the argv the CLI starts, else null.",
    "tool_servers[].env": "stdio: extra environment of the server process (plain values).",
    "tool_servers[].url": "http: the MCP endpoint, else null.",
    "tool_servers[].host": "http: the endpoint's host (in `egress.allow`), else null.",
    "tool_servers[].port": "http: the endpoint's port, else null.",
    "tool_servers[].category": "Capability category `toolserver:<name>`.",
    "tool_servers[].source": "Manifest file.",
    "tool_servers[].layer": "Layer the manifest came from: `packaged` (the defaults) or `operator` (your folder).",
    "tool_servers[].class": "Approval class: a new tool server needs approval until it graduates.",
    "tool_servers[].reason": "Why it has that class.",
    "hardening": "Exactly what the container gets.",
    "hardening.user": "uid:gid the agent runs as (never root).",
    "hardening.cap_drop": "Capabilities dropped (ALL).",
    "hardening.cap_add": "Capabilities added back.",
    "hardening.no_new_privileges": "no-new-privileges security option.",
    "hardening.seccomp": "Seccomp profile.",
    "hardening.read_only_rootfs": "Read-only root filesystem.",
    "hardening.tmpfs": "tmpfs mounts with their exact mount options.",
    "hardening.pids_limit": "Process limit.",
    "hardening.memory_bytes": "Memory limit.",
    "hardening.nano_cpus": "CPU limit in 1e-9 CPUs.",
    "hardening.nofile": "Open-file limit.",
    "hardening.init": "Run an init process.",
    "hardening.stop_timeout": "Seconds between stop and kill.",
    "hardening.network": "Always `none`: with egress the agent reaches its proxy through a Unix socket, with no IP path.",
    "hardening.pid_mode": "PID namespace.",
    "hardening.ipc_mode": "IPC namespace.",
    "hardening.privileged": "Always false.",
    "hardening.devices": "Devices passed in (none).",
    "hardening.runtime": "OCI runtime (runc, runsc, kata).",
    "hardening.log_driver": "Docker log driver.",
    "hardening.tenancy": "`self-host` or `shared`.",
    "hardening.workdir": "The agent's working directory: its tools and the verify commands run there. The container's own processes start in `/` (read-only), never in it.",
    "brain": "The engine that drives the agentic loop.",
    "brain.name": "Brain manifest name.",
    "brain.engine": "`script`, `sdk` or `kagura-brain`.",
    "brain.model": "Model identifier, or null.",
    "brain.permission_mode": "SDK permission mode, or null.",
    "brain.runtime": "`container`, or `host` (unsandboxed).",
    "brain.auth": "How the engine authenticates.",
    "brain.auth.mode": "`none`, `api-key`, `subscription` or `cloud`.",
    "brain.auth.credential": "Credential reference name, or null.",
    "brain.backend": "kagura-brain backend, or null.",
    "brain.local_provider": "Local model provider, or null.",
    "brain.endpoint": "The endpoint URL the Brain names (kagura-brain: OpenAI-compatible; sdk: its model endpoint), or null.",
    "brain.model_endpoint": (
        "Engine sdk in the container: where its model calls go. The CLI talks to the run's"
        " key-injecting port only; the port forwards each call here with the credential,"
        " which never enters the container."
    ),
    "brain.model_endpoint.api": (
        "`anthropic` (the Messages API, directly or through a gateway), `bedrock` (Amazon"
        " Bedrock InvokeModel) or `vertex` (Google Vertex AI rawPredict)."
    ),
    "brain.model_endpoint.url": (
        "The endpoint: `https://host[:port][/base path]`; a local one: `http://container:port`."
    ),
    "brain.model_endpoint.local": (
        "Only for an endpoint on this machine (the Brain's `endpoint.local`): the run's proxy"
        " joins this internal Docker network, and only the proxy (never the agent's"
        " container), to send the model calls to the container over plain HTTP."
    ),
    "brain.model_endpoint.local.network": "The Docker network the proxy joins (internal).",
    "brain.model_endpoint.local.container": "The endpoint's container on that network.",
    "brain.model_endpoint.local.port": "The port it listens on.",
    "brain.model_endpoint.ca": (
        "Only for a url endpoint behind a private authority (the Brain's `endpoint.ca`): the"
        " proxy checks the endpoint's certificate against these authorities alone."
    ),
    "brain.model_endpoint.ca.pem": "The authorities' certificates, PEM.",
    "brain.model_endpoint.ca.sha256": "Each certificate's sha256 fingerprint (of its DER form).",
    "brain.model_endpoint.region": "Bedrock and Vertex: the region, else null.",
    "brain.model_endpoint.project": "Vertex: the Google Cloud project, else null.",
    "brain.model_endpoint.auth": (
        "How the credential travels from the port: `x-api-key`, `bearer` (`Authorization:"
        " Bearer`: a gateway's key or a leased GCP token), `oauth` (a subscription's token,"
        " `Authorization: Bearer` with the oauth beta) or `sigv4` (the port signs each call"
        " with the leased AWS key)."
    ),
    "brain.model_endpoint.credential": "The CredentialProvider whose credential the proxy adds.",
    "brain.model_endpoint.scope": "The provider scope leased for it (in `credentials`).",
    "brain.model_endpoint.environment": (
        "What the CLI is told in its environment: its documented switches for the endpoint"
        " (`CLAUDE_CODE_USE_BEDROCK`, `ANTHROPIC_VERTEX_PROJECT_ID`, ...), pointed at the"
        " port, and a placeholder where it expects a credential."
    ),
    "brain.model_endpoint.category": (
        "The capability a run asks for by sending its model calls there: `model-endpoint:HOST`."
    ),
    "brain.model_endpoint.class": "Approval class of the endpoint.",
    "brain.model_endpoint.reason": "Why it has that class.",
    "brain.max_line_bytes": "Largest IPC line accepted.",
    "brain.cli_environment": (
        "Engine sdk: the Claude Code CLI's documented switches apply sets in the brain's"
        " environment, turning off its optional traffic (telemetry, error reports, update"
        " checks, feature flags, surveys, title calls): its only way out is the model calls."
    ),
    "brain.conversation": (
        "Engine sdk in a container, a task naming a session: the host keeps the CLI's"
        " transcript of the session's conversation (~/.claude/projects/<workdir>/<id>.jsonl)"
        " after each run, scrubbed of the run's secrets, and hands it back to the next run's"
        " container before its CLI starts; nothing else of HOME is kept. Absent otherwise."
    ),
    "brain.conversation.session": "The session's name.",
    "brain.conversation.max_bytes": (
        "The most the host keeps of one transcript; a larger one is not kept at all (the"
        " next run starts a new conversation)."
    ),
    "brain.conversation.handed_back": (
        "Bytes of the transcript this run's container gets back (its CLI resumes that"
        " conversation), or null: the CLI starts a new conversation."
    ),
    "brain.conversation.lost": (
        "The session had a conversation and it was not kept (too large, not text, or the"
        " container did not give it back): this run's CLI starts a new one."
    ),
    "brain.idle_timeout_seconds": "Seconds without an event before the brain is stopped.",
    "brain.source": "Manifest file.",
    "brain.layer": "Layer the manifest came from: `packaged` (the defaults) or `operator` (your folder).",
    "memory": "Memory backend and what the plan learnt from it.",
    "memory.name": "Memory manifest name.",
    "memory.backend": "`sqlite`, `cloud` or `postgres`.",
    "memory.location": "`state-dir`, a path, the cloud URL, or `state-store` (postgres).",
    "memory.token_ref": "Token reference for the cloud backend, or null.",
    "memory.untrusted_inputs": "The run's untrusted inputs.",
    "memory.known_failures": "Past failures of this task kind and their fixes.",
    "memory.known_failures[].failure": "What failed.",
    "memory.known_failures[].fix": "What fixed it, or null.",
    "memory.known_failures[].failure_id": "The failure's memory id (`memory show`).",
    "memory.known_failures[].fix_id": "The fix's memory id, or null.",
    "memory.known_failures[].trust": "`trusted` or `untrusted`: the failure text's tier (untrusted text is quoted, never instructions).",
    "memory.known_failures[].last_failed": "When this failure last happened (UTC), or null.",
    "memory.known_failures[].occurrences": "How many recent runs failed this way.",
    "memory.known_failures[].weight": "Its recency weight now: sum of 0.5 ** (age / failure_half_life) over its occurrences.",
    "memory.known_failures[].fix_changes": "What the fixing run changed against the failed one (kept on the prevents edge).",
    "memory.known_failures[].fix_changes[].change": "`step`, `instruction` or `capability`.",
    "memory.known_failures[].fix_changes[].op": "`+` added, `-` removed, `~` changed.",
    "memory.known_failures[].fix_changes[].value": "The step, the new instruction (cut at 300 characters) or the capability category.",
    "memory.failure_trust": "How far this task kind's record is trusted: recent failures weigh more than old ones.",
    "memory.failure_trust.score": "successes / (successes + weighted_failures), or null without any run.",
    "memory.failure_trust.successes": "Verified successes among the task kind's recent runs.",
    "memory.failure_trust.weighted_failures": "Sum of every failure's weight 0.5 ** (age / half_life).",
    "memory.failure_trust.half_life_seconds": "Graduation `failure_half_life`: the age at which a failure weighs half.",
    "memory.failure_trust.min_trust": "Graduation `min_trust`: below this score a graduated capability needs approval again (0: the gate is off).",
    "commits": "How the agent's commits come back (only when the task asks, `spec.commits: branch`): a branch of the operator's repository, made by apply from a repository of the agent's own.",
    "commits.mode": "`branch`.",
    "commits.branch": "The branch the commits come back as: `kagura/<task>/<run>` (apply writes the run id).",
    "commits.git_dir": "The operator's `.git`: mounted read-only at /kagura/operator.git for its objects; the agent's repository is a tmpfs at /workspace/.git.",
    "commits.seed": "The commit at the operator's HEAD when planned: the agent's branch starts there (null: none).",
    "commits.head": "The branch HEAD named then (`refs/heads/…`), or null when detached.",
    "commits.object_format": "The repository's object format (`sha1` or `sha256`).",
    "commits.repo_bytes": "Size of the tmpfs holding the agent's repository (its new objects and index).",
    "commits.bundle_bytes": "The most the agent's commits may weigh (one git bundle) for apply to take them.",
    "commits.problem": "Why the branch cannot be made here (the plan is refused), or null.",
    "budget": "Turn, time, cost and disk budget.",
    "budget.turns": "Turn limit, or null.",
    "budget.wall_seconds": "Wall-time limit.",
    "budget.cost_usd": "Cost limit, or null.",
    "budget.disk_bytes": "Most the run may add to the project root; past it the run stops.",
    "budget.children": "Sub-agents the run's brain may have running at once (Policy `ceilings.children`; 0: it may not dispatch, also when the run is as deep as sub-agents may nest).",
    "budget.children_total": "Sub-agents the run's brain may ask for over the whole run, refused ones included (Policy `ceilings.children_total`; 0 when it may not dispatch).",
    "budget.depth": "How deep this run nests below an operator's: 0 for an operator's run, 1 for its child, and so on.",
    "budget.max_depth": "How deep sub-agents may nest (Policy `ceilings.depth`): a run this deep may not dispatch; a child planned deeper is refused (`dispatch-depth`).",
    "budget.tokens": "Input plus output tokens the run may use (learnt from history; no engine enforces it, the run notes an overrun), or null.",
    "budget.source": "`task`, `brain`, `default`, `history` (any dimension learnt from history), `parent` (a dispatched child's limit cut to what its parent had left) or `session` (a resumed session's limit cut to what it has left).",
    "budget.resumed": "A named session resumed from its checkpoint: what it spent since it last finished, and what is left (each limit of this budget is the task's less what was spent); absent from any other plan.",
    "budget.resumed.session": "The session's name.",
    "budget.resumed.step": "The step its checkpoint completed (the run resumes at the next).",
    "budget.resumed.saved": "When the checkpoint was saved (ISO 8601, UTC), or null.",
    "budget.resumed.spent": "What the session's earlier runs spent, by the host's count.",
    "budget.resumed.spent.turns": "Turns: the larger of those reported and the model calls counted at the proxy, plus its sub-agents'.",
    "budget.resumed.spent.wall_seconds": "Wall seconds from each brain start to the checkpoint (the host's clock).",
    "budget.resumed.spent.cost_usd": "Dollars reported, plus its sub-agents'.",
    "budget.resumed.leases": "Per credential of this plan: lease time and renewals spent, and the lease budget apply mints it under now.",
    "budget.resumed.leases[].category": "The credential's category, `credential:<provider>/<scope>`.",
    "budget.resumed.leases[].spent_seconds": "Seconds a lease of it was held by the session's earlier runs.",
    "budget.resumed.leases[].spent_renewals": "Renewals they used.",
    "budget.resumed.leases[].budget_seconds": "Lease seconds left: the credential's budget less those spent (what apply mints under).",
    "budget.resumed.leases[].renewals": "Renewals left.",
    "budget.parent": "A dispatched child: the most its parent lets it take, each limit of this budget cut to it; null for any other run.",
    "budget.parent.turns": "Turns the parent had left for it, or null (no turn limit).",
    "budget.parent.wall_seconds": "Wall seconds the parent had left, or null.",
    "budget.parent.cost_usd": "Dollars the parent had left for it, or null (no dollar limit).",
    "budget.parent.bound": "`remaining`: its share of what the running parent had left when it dispatched (the host wrote it into the child's task); `plan`: the parent's last applied plan's limits (a child task written by hand).",
    "budget.forecast": "The forecast from this task kind's cost history, or null without history.",
    "budget.forecast.basis": "How the limits were learnt, e.g. `p80 of 7 runs + 30%, host-measured`.",
    "budget.forecast.runs": "Runs of this task kind the forecast read (newest first, at most 20).",
    "budget.forecast.quantile": "The quantile of the runs a limit starts from (Graduation `budget_quantile`).",
    "budget.forecast.reserve": "Reserve added on top of that quantile (Graduation `reserve`).",
    "budget.forecast.expected": "What the next run will probably take, as the host measured the runs: the median.",
    "budget.forecast.expected.turns": "Expected model calls (counted at the injecting proxy), or null when no run's calls were counted.",
    "budget.forecast.expected.tokens": "Expected tokens as the host measured them: null (the host prices no tokens yet).",
    "budget.forecast.expected.wall_seconds": "Expected wall time in seconds (the host's clock), or null.",
    "budget.forecast.expected.cost_usd": "Expected dollars as the host measured them: null (the host prices no tokens yet).",
    "budget.forecast.limits": "Limits the host-measured runs support: max(floor, quantile * (1 + reserve)) per dimension, before the step and the ceiling.",
    "budget.forecast.limits.turns": "Turn limit from the model calls counted, or null.",
    "budget.forecast.limits.tokens": "Token limit, or null (never learnt from an engine's report).",
    "budget.forecast.limits.wall_seconds": "Wall-time limit from the host's clock, or null.",
    "budget.forecast.limits.cost_usd": "Dollar limit, or null (never learnt from an engine's report).",
    "budget.forecast.reported": "What the engines inside the containers reported (medians): shown, never learnt.",
    "budget.forecast.reported.turns": "Reported turns, or null.",
    "budget.forecast.reported.tokens": "Reported input plus output tokens, or null.",
    "budget.forecast.reported.cost_usd": "Reported dollars, or null.",
    "budget.forecast.step": "Most a learnt limit may grow in one run: this times the last run's limit (Graduation `budget_step`).",
    "budget.forecast.previous": "The limits the newest recorded run was held to (what the step grows from), or null for older records.",
    "budget.forecast.previous.turns": "Its turn limit, or null.",
    "budget.forecast.previous.tokens": "Its token limit, or null.",
    "budget.forecast.previous.wall_seconds": "Its wall-time limit, or null.",
    "budget.forecast.previous.cost_usd": "Its dollar limit, or null.",
    "budget.forecast.default": "The limits without history (the task's, else the brain's, else the defaults).",
    "budget.forecast.default.turns": "Default turn limit, or null.",
    "budget.forecast.default.tokens": "Default token limit: null.",
    "budget.forecast.default.wall_seconds": "Default wall-time limit.",
    "budget.forecast.default.cost_usd": "Default dollar limit, or null.",
    "budget.forecast.over_default": "Learnt dimensions above their default: each is a `budget:<dimension>` capability in `approvals`.",
    "budget.forecast.retries": "Mean re-attempts per run the engine or executor made.",
    "budget.forecast.min_runs": "Runs needed before the limits set the budget (Graduation `budget_min_runs`).",
    "budget.forecast.learnt": "The budget dimensions taken from the forecast (the task or brain set the others).",
    "tripwires": "What stops the run as hijacked (revoke, demote, incident).",
    "tripwires.denied_egress": "Denied egress requests within the window that trip.",
    "tripwires.window_seconds": "The window denials are counted in.",
    "tripwires.canary_file": "Where apply plants the run's decoy credentials file in the"
    " container (reading it trips), or null when off.",
    "tripwires.creds_after_wipe": "Whether touching /run/kagura/creds after the"
    " credentials are wiped (or at all, in a run given none) trips.",
    "tripwires.egress_log_bytes": "Bytes of its egress proxy's log past which the run is"
    " stopped as a flood.",
    "tripwires.source": "The Graduation manifest the knobs come from, or `default`.",
    "floor": "How the plan breaks the membrane floor (code, not policy); anything refuses.",
    "policy": "Policy rules evaluated on the plan.",
    "policy[].policy": "`<policy>/<rule>`.",
    "policy[].effect": "`deny` or `warn`.",
    "policy[].message": "The rule's message.",
    "policy[].passed": "Whether the plan passed.",
    "policy[].violations": "Where it failed.",
    "policy[].violations[].path": "JSON path in the plan.",
    "policy[].violations[].message": "What is wrong there.",
    "policy[].source": "Manifest file.",
    "policy[].layer": "Layer the manifest came from: `packaged` (the defaults) or `operator` (your folder).",
    "approvals": "Every requested capability with its approval class.",
    "approvals[].category": "Capability category.",
    "approvals[].class": "`baseline`, `graduated`, `needs-approval` or `denied`.",
    "approvals[].reason": "Why.",
    "approvals[].evidence": "Successful runs counted as evidence.",
    "approvals[].unmet": "Graduation conditions not met yet.",
    "warnings": "Things the operator should know.",
    "refusals": "Why apply refuses the plan; empty when it may run (warnings never refuse).",
    "refusals[].code": (
        "Stable code: `floor`, `policy-deny`, `capability-denied`, `shared-tenancy`, `userns-required`,"
        " `project-unwritable`, `parent-not-applied`, `child-widens-parent`, `budget-ceiling`,"
        " `dispatch-depth`, `lease-lifetime` (a credential's budget is shorter than anything"
        " its provider mints), …"
    ),
    "refusals[].message": "What is refused, for the operator.",
    "refusals[].source": "Where it comes from: manifest file, capability category or plan path.",
    "applyable": "Whether apply may run this plan: true exactly when `refusals` is empty.",
    "intent": (
        "sha256 of what the operator approves: the plan without what the planning host"
        " measured (inputs.facts, classes, the container user, memory facts, budget, policy"
        " results, approvals, warnings, refusals). Approvals and graduation evidence bind to it."
    ),
    "fingerprint": "sha256 of the canonical JSON of every other key.",
}
