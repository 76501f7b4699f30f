"""Render a plan for people: terminal text and markdown, both from the plan JSON."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from kagura_agent.hygiene import neutralise_data
from kagura_agent.manifest.endpoint import API_NAMES
from kagura_agent.manifest.scopes import is_full_access
from kagura_agent.membrane.providers.traits import traits_of
from kagura_agent.plan import commits, conversation, resume
from kagura_agent.plan.admission import Admission, admit
from kagura_agent.plan.injection import injected_provider
from kagura_agent.plan.model import (
    Approval,
    Budget,
    Credential,
    EgressRule,
    Hardening,
    ModelEndpoint,
    Mount,
    Plan,
    TaskSection,
    ToolServer,
)
from kagura_agent.plan.toolservers import rule_category
from kagura_agent.ui import Style, quote
from kagura_agent.units import format_duration, format_size

if TYPE_CHECKING:
    from kagura_agent.plan.diff import Change

_CLASS_STYLE = {
    "baseline": ("green",),
    "graduated": ("blue",),
    "needs-approval": ("yellow", "bold"),
    "denied": ("red", "bold"),
}


def _short(digest: str | None) -> str:
    if not digest:
        return "unresolved"
    return digest[:19] + "…"


def _wildcard_cost(entry: EgressRule) -> str:
    """What a wildcard entry costs, or "" (the same words in text and markdown)."""
    host = str(entry["host"])
    if not host.startswith("*."):
        return ""
    # squid resolves whatever name the agent asks for under the domain: every lookup
    # reaches that domain's DNS servers, so a wildcard is a data channel to them.
    return (
        f"wildcard: the proxy resolves any name under {host[2:]}"
        " (a DNS data channel to that domain's servers)"
    )


def _may_resolve(entry: EgressRule) -> str:
    # A private range widens what this host (and only this host) may resolve to.
    private = entry["allow_addresses"]
    return f"this host only may resolve to {', '.join(private)}" if private else ""


def layers_line(plan: Plan) -> str:
    """The manifest layers in force, bottom first, and what the operator's folder replaced."""
    inputs = plan["inputs"]
    text = " + ".join(f"{info['layer']} {info['dir']}" for info in inputs["layers"])
    if inputs["overrides"]:
        text += "; your folder replaces " + ", ".join(inputs["overrides"])
    return text or inputs["manifests_dir"]


def _own(plan: Plan) -> Callable[[Mapping[str, Any]], str]:
    """A suffix marking values from the operator's folder (only when there is one)."""
    two = len(plan["inputs"]["layers"]) > 1

    def suffix(value: Mapping[str, Any]) -> str:
        return "  (from operator)" if two and value.get("layer") == "operator" else ""

    return suffix


def _cli_scratch(tmpfs: Mapping[str, str]) -> str:
    """Where the CLI writes in the container: its HOME and /tmp (tmpfs), the workspace."""

    def size(target: str) -> str:
        found = [o for o in tmpfs.get(target, "").split(",") if o.startswith("size=")]
        return format_size(int(found[0].removeprefix("size="))) if found else ""

    home, tmp = size("/home/agent"), size("/tmp")
    if not home or not tmp:
        return ""
    return (
        f"the CLI writes its HOME /home/agent (tmpfs {home}: ~/.claude, its session and"
        f" settings), /tmp (tmpfs {tmp}) and /workspace; the root is read-only"
    )


def model_call_lines(calls: Mapping[str, Any], turns: int | None) -> list[str]:
    """What the key-injecting port lets a model call do, and how calls are capped."""
    lines = [
        f"{calls['upstream']} through the key-injecting port only"
        f" (the {calls['credential']} key is added there): {', '.join(calls['paths'])}"
    ]
    reach = [
        f"{', '.join(g['allows'])} (policy {g['policy']})" for g in calls["grants"] if g["allows"]
    ]
    if reach:
        lines.append("the provider may reach for the agent: " + "; ".join(reach))
    else:
        lines.append(
            "the provider reaches nothing for the agent"
            " (no server-side tools, MCP servers, URL sources or files)"
        )
    if turns:
        side, free = turns * calls["side_calls_per_turn"], turns * calls["free_calls_per_turn"]
        caps = f"{turns} turn calls (the turn budget), {side} side calls, {free} token counts"
    else:
        caps = "no count cap (no turn budget)"
    lines.append(f"counted when they start: {caps}; {calls['concurrency']} at once")
    return lines


def _egress_lines(entry: EgressRule, style: Style, mine: str = "") -> list[str]:
    """One allowlist entry, with what it costs: address exceptions and wildcard reach."""
    also = f"; {_may_resolve(entry)}" if _may_resolve(entry) else ""
    lines = [
        f"                 {entry['scheme']}://{entry['host']}:{entry['port']}"
        f"  (policy {entry['policy']}{also}){mine}"
    ]
    if cost := _wildcard_cost(entry):
        lines.append(f"                   {style(cost, 'yellow')}")
    return lines


def _cred_line(cred: Credential, injected: str | None = None, budget: Budget | None = None) -> str:
    renew = f", {cred['renewals']} renewals" if cred["renewals"] else ""
    # A resumed session holds it under what is left of its lease budget.
    left = resume.lease_left(budget, cred["category"]) if budget is not None else None
    if left is not None and left != (cred["budget_seconds"], cred["renewals"]):
        plural = "" if left[1] == 1 else "s"
        standing_left = (
            f" (the session has {format_duration(left[0])} and {left[1]} renewal{plural} left)"
        )
    else:
        standing_left = ""
    standing = ", STANDING" if cred["standing"] else ""
    # A scope that narrows nothing, on the operator's word (manifest/scopes.py).
    standing += ", FULL ACCESS" if is_full_access(cred["scope_spec"]) else ""
    # The brain's API key never enters the container: the run's proxy adds it upstream.
    where = ", injected at the proxy" if cred["provider"] == injected else ""
    # How each credential ends: revoked at release, or only lapsing at its expiry.
    traits = traits_of(cred["type"])
    ends = f"; {traits.brief}" if traits is not None else ""
    return (
        f"{cred['provider']}/{cred['scope']} ({cred['type']}, {cred['secret_ref']})"
        f" lease {format_duration(cred['ttl_seconds'])}{renew},"
        f" budget {format_duration(cred['budget_seconds'])}{standing_left}{standing}{where}{ends}"
    )


def endpoint_lines(endpoint: ModelEndpoint) -> tuple[str, str]:
    """Where the brain's model calls go, and how their credential travels there."""
    where = ", ".join(str(p) for p in (endpoint["region"], endpoint["project"]) if p)
    api = API_NAMES[endpoint["api"]] + (f", {where}" if where else "")
    leased = f"{endpoint['credential']}/{endpoint['scope']}"
    auth = endpoint["auth"]
    if auth == "sigv4":
        how = (
            f"the proxy signs each call (AWS SigV4, service bedrock) with the leased {leased}"
            " key; the CLI sends its calls unsigned (CLAUDE_CODE_SKIP_BEDROCK_AUTH)"
        )
    elif endpoint["api"] == "vertex":
        how = (
            f"the proxy adds the leased {leased} token (Authorization: Bearer); the CLI"
            " sends none (CLAUDE_CODE_SKIP_VERTEX_AUTH)"
        )
    elif auth == "oauth":
        how = (
            f"the proxy adds the {leased} subscription token (Authorization: Bearer, oauth"
            " beta); the CLI holds a placeholder (CLAUDE_CODE_OAUTH_TOKEN)"
        )
    else:
        header = "x-api-key" if auth == "x-api-key" else "Authorization: Bearer"
        how = f"the proxy adds the {leased} key as {header}; the CLI holds a placeholder"
    local = endpoint.get("local")
    if local is not None:
        how += (
            f"; ON THIS MACHINE: container {local['container']} on Docker network"
            f" {local['network']}, which the proxy alone joins"
        )
    ca = endpoint.get("ca")
    if ca is not None:
        prints = ", ".join(f"sha256:{fingerprint[:16]}…" for fingerprint in ca["sha256"])
        how += f"; its certificate checked against the Brain's authorities only ({prints})"
    return f"{endpoint['url']} ({api}) through the key-injecting port only", how


def _tool_server_line(server: ToolServer) -> str:
    """``notes (stdio: python3 -m notes in image mcp-notes)`` or ``tickets (http: URL,
    through the proxy)``: what runs where, or where it connects."""
    if server["transport"] == "stdio":
        command = " ".join(server["command"] or [])
        return f"{server['name']} (stdio: {command} in image {server['image']})"
    return f"{server['name']} (http: {server['url']}, through the proxy)"


def _budget_line(budget: Budget) -> str:
    parts = []
    if budget.get("turns"):
        parts.append(f"{budget['turns']} turns")
    if budget["tokens"]:
        parts.append(f"{budget['tokens']:,} tokens")
    parts.append(f"{format_duration(budget['wall_seconds'])} wall")
    if budget.get("cost_usd") is not None:
        parts.append(f"${budget['cost_usd']}")
    if budget.get("disk_bytes"):
        parts.append(f"{format_size(budget['disk_bytes'])} disk")
    if budget["children"]:
        parts.append(f"{budget['children']} sub-agents at once, {budget['children_total']} in all")
    if budget["depth"]:
        parts.append(f"a sub-agent {budget['depth']} deep (at most {budget['max_depth']})")
    text = ", ".join(parts) + f" (from {budget['source']})"
    parent = budget["parent"]
    if parent is not None:
        most = [
            f"{parent['turns']} turns" if parent["turns"] is not None else "",
            f"{format_duration(parent['wall_seconds'])} wall"
            if parent["wall_seconds"] is not None
            else "",
            f"${parent['cost_usd']:g}" if parent["cost_usd"] is not None else "",
        ]
        whose = (
            "what its parent had left" if parent["bound"] == "remaining" else "its parent's plan"
        )
        text += f"; at most {whose}: {', '.join(m for m in most if m) or 'no limit'}"
    session = budget.get("resumed")
    if session is not None:
        text += "; " + resume.text(session)
    forecast = budget["forecast"]
    if forecast:
        text += "; " + forecast_text(forecast)
    return text


def _trust_text(memory: Mapping[str, Any]) -> str:
    """``; trust 0.82: 8 successes, failures weigh 1.76 (half-life 7d)`` or ""."""
    trust = memory["failure_trust"]
    if trust["score"] is None:
        return ""
    floor = trust.get("min_trust", 0)
    gate = (
        (
            f"; below min_trust {floor}: graduated capabilities are asked for again"
            if trust["score"] < floor
            else f"; graduation gate min_trust {floor}"
        )
        if floor
        else ""
    )
    return (
        f"; trust {trust['score']}: {trust['successes']} successes, failures weigh"
        f" {trust['weighted_failures']} (half-life {format_duration(trust['half_life_seconds'])})"
        f"{gate}"
    )


def _last_failed(failure: Mapping[str, Any]) -> str:
    """`` (2 times, last 2026-12-01T23:10:00Z, weight 0.93)`` or ""."""
    if not failure.get("last_failed"):
        return ""
    times = failure.get("occurrences") or 1
    return (
        f" ({times} time{'s' if times != 1 else ''}, last {failure['last_failed']},"
        f" weight {failure.get('weight', 0)})"
    )


def forecast_text(forecast: Mapping[str, Any]) -> str:
    """``forecast 12 model calls, 40s wall (median of 7 runs); engines reported 14 turns,
    $0.31 (not learnt); learnt turns, wall from p80 of 7 runs + 30%, host-measured`` —
    what the next run will probably take as the host measured the runs, what the engines
    claimed, and which limits the history set."""
    expected = forecast["expected"]
    shown = []
    if expected["turns"] is not None:
        shown.append(f"{expected['turns']} model calls")
    if expected["tokens"] is not None:
        shown.append(f"{expected['tokens']:,} tokens")
    if expected["wall_seconds"] is not None:
        shown.append(f"{format_duration(int(expected['wall_seconds']))} wall")
    if expected["cost_usd"] is not None:
        shown.append(f"${expected['cost_usd']}")
    runs = forecast["runs"]
    text = f"forecast {', '.join(shown) or 'nothing measured'}"
    text += f" (median of {runs} run{'s' if runs != 1 else ''}"
    if forecast["retries"]:
        text += f", {forecast['retries']} retries/run"
    text += ")"
    reported = forecast["reported"]
    claims = [
        claim
        for claim in (
            f"{reported['turns']} turns" if reported["turns"] is not None else "",
            f"{reported['tokens']:,} tokens" if reported["tokens"] is not None else "",
            f"${reported['cost_usd']:g}" if reported["cost_usd"] is not None else "",
        )
        if claim
    ]
    if claims:
        text += f"; engines reported {', '.join(claims)} (not learnt)"
    learnt = [("wall" if d == "wall_seconds" else d) for d in forecast["learnt"]]
    if learnt:
        text += f"; learnt {', '.join(learnt)} from {forecast['basis']}"
    elif runs < forecast["min_runs"]:
        text += f"; the budget is learnt from {forecast['min_runs']} runs on"
    over = forecast["over_default"]
    if over:
        text += "; over the default, approval: " + ", ".join(f"budget:{d}" for d in over)
    return text


# Refusals the renderers already show in their own lines (FLOOR, DENY, [denied], WIDENS).
_SHOWN_ABOVE = frozenset({"floor", "policy-deny", "capability-denied"})


def render_text(plan: Plan, style: Style) -> str:
    """The ten-second review: what runs, what it writes, where it connects, what it holds.

    Whether it may be applied is ``admit``'s verdict (the one apply refuses on), recomputed
    from what the plan says, never the verdict the plan file carries."""
    admission = _neutral_admission(admit(plan))
    plan = neutralise_data(plan)  # names and values from inputs: no control characters
    task = plan["task"]
    brain = plan["brain"]
    image = plan["image"]
    out: list[str] = []
    title = f"Plan for task {task['name']} ({task['file']})"
    out.append(style(title, "bold"))
    out.append(f"  fingerprint  {plan['fingerprint']}")
    out.append(f"  intent       {plan['intent']}  (what approvals bind to)")
    out.append(f"  manifests    {layers_line(plan)}")
    mine = _own(plan)
    model = f", model {brain['model']}" if brain.get("model") else ""
    mode = f", permissions {brain['permission_mode']}" if brain.get("permission_mode") else ""
    where = (
        "in the container"
        if brain["runtime"] == "container"
        else style("ON THE HOST, UNSANDBOXED", "red", "bold")
    )
    out.append(
        f"  brain        {brain['name']} ({brain['engine']}{model}{mode}) {where}{mine(brain)}"
    )
    if brain.get("cli_environment"):
        switches = " ".join(f"{k}={v}" for k, v in brain["cli_environment"].items())
        out.append(f"               the CLI's optional traffic off: {switches}")
        scratch = _cli_scratch(plan["hardening"]["tmpfs"])
        if brain["runtime"] == "container" and scratch:
            out.append(f"               {scratch}")
        out.extend(f"               {line}" for line in conversation.lines(plan))
    endpoint = brain.get("model_endpoint")
    if endpoint is not None:
        target, how = endpoint_lines(endpoint)
        out.append(f"  endpoint     {target}  {_tag(endpoint['class'], style)}")
        out.append(f"               {how}")
    out.append(
        f"  image        {image['ref']}  {_short(image['digest'])}  {_tag(image.get('class'), style)}"
        + mine(image)
    )
    if image.get("software"):
        baked = ", ".join(f"{name} {version}" for name, version in image["software"].items())
        out.append(f"               bakes {baked}")
    writable = sum(1 for mount in plan["mounts"] if mount["mode"] != "ro")
    for mount in plan["mounts"]:
        out.append(_mount_line(mount, style, only=writable == 1))
    egress = plan["egress"]
    if egress["mode"] == "none":
        out.append("  network      none (no interfaces but loopback)")
    else:
        out.append("  network      only through this run's proxy, default deny:")
        for entry in egress["allow"]:
            out.extend(_egress_lines(entry, style, mine(entry)))
        if egress.get("pool"):
            out.append(
                "               proxy: a warm pooled session if one is idle (used once), else cold"
            )
        proxy = egress.get("proxy")
        if proxy:
            out.append(f"               proxy image {proxy['ref']}  {_short(proxy['digest'])}")
        calls = egress.get("model_calls")
        if calls is not None:
            first, *rest = model_call_lines(calls, plan["budget"]["turns"])
            out.append(f"  model calls  {first}")
            out.extend(f"               {line}" for line in rest)
    if not plan["credentials"]:
        out.append("  credentials  none")
    for index, cred in enumerate(plan["credentials"]):
        label = "credentials" if index == 0 else ""
        out.append(
            f"  {label:<11}  {_cred_line(cred, injected_provider(plan), plan['budget'])}"
            f"  {_tag(cred['class'], style)}{mine(cred)}"
        )
    for index, server in enumerate(plan.get("tool_servers", [])):
        label = "tool servers" if index == 0 else ""
        out.append(
            f"  {label:<12} {_tool_server_line(server)}  {_tag(server['class'], style)}{mine(server)}"
        )
    if "commits" in plan:
        out.append(f"  commits      {commits.text(plan['commits'])}")
    out.append(f"  budget       {_budget_line(plan['budget'])}")
    trip = plan["tripwires"]
    extra = ""
    if trip["canary_file"]:
        extra += f", canary {trip['canary_file']}"
    if trip["creds_after_wipe"]:
        extra += ", creds after wipe"
    out.append(
        f"  tripwires    {trip['denied_egress']} denied egress in"
        f" {format_duration(trip['window_seconds'])}{extra} (from {trip['source']})"
    )
    memory = plan["memory"]
    out.append(f"  memory       {memory['name']} ({memory['backend']}){_trust_text(memory)}")
    opted_in = task["context"]["include_untrusted"]
    for failure in memory["known_failures"]:
        tier = "trusted" if failure.get("trust") == "trusted" else "untrusted"
        fix = failure["fix"]
        withheld = tier == "untrusted" and not opted_in
        out.append(
            f"  known failure  [{tier}] {quote(failure['failure'], 200)}"
            f"{_last_failed(failure)}"
            f"  -> fix: {quote(str(fix), 200) if fix else '(none yet)'}"
            + ("  (not sent to the brain)" if withheld else "")
        )
    out.extend(_parent_lines(task, style))
    out.append(f"  hardening    {_hardening_text(plan['hardening'], style)}")
    pending = [a for a in plan["approvals"] if a["class"] in ("needs-approval", "denied")]
    for approval in pending:
        # The reason already carries the evidence count and the unmet knobs (see
        # graduation.classify); repeating them made every line say it twice.
        out.append(
            f"  {_tag(approval['class'], style)} {approval['category']}: {approval['reason']}"
        )
    for broken in admission.floor:
        out.append("  " + style(f"FLOOR {broken}", "red", "bold"))
    if admission.edited:
        out.append("  " + style(f"EDITED {EDITED}", "red", "bold"))
    failed = [r for r in plan["policy"] if not r["passed"]]
    passed = len(plan["policy"]) - len(failed)
    recorded = " (as recorded, not re-evaluated)" if admission.edited else ""
    out.append(f"  policy       {passed}/{len(plan['policy'])} rules pass{recorded}")
    for result in failed:
        where_text = ", ".join(v["path"] for v in result["violations"])
        colour = ("red", "bold") if result["effect"] == "deny" else ("yellow",)
        out.append(
            "  "
            + style(
                f"{result['effect'].upper()} {result['policy']}: {result['message']} at {where_text}",
                *colour,
            )
        )
    for warning in plan["warnings"]:
        out.append("  " + style(f"warning: {warning}", "yellow"))
    for refusal in admission.refusals:
        if refusal["code"] not in _SHOWN_ABOVE:
            out.append("  " + style(f"refused: {refusal['message']}", "red", "bold"))
    verdict = style("yes", "green") if admission.applyable else style("NO", "red", "bold")
    out.append(f"  applyable    {verdict}")
    return "\n".join(out) + "\n"


def _parent_lines(task: TaskSection, style: Style) -> list[str]:
    """A dispatched child: its parent, the context memory ids, and whether it only narrows."""
    parent = task.get("parent")
    if not parent:
        return []
    run = f", run {parent['run']}" if parent["run"] else ""
    context = ", ".join(parent["context_memories"]) or "none"
    lines = [f"  parent       task {parent['task']}{run}; context memories: {context}"]
    if parent["narrowing"] is None:
        lines.append(
            "  " + style("narrowing    not checked: the parent never applied a plan", "red")
        )
    elif parent["narrowing"]:
        lines += [
            "  " + style(f"WIDENS the parent: {v}", "red", "bold") for v in parent["narrowing"]
        ]
    else:
        lines.append("  narrowing    ok: a subset of the parent's egress, credentials and mounts")
    return lines


def _tag(klass: str | None, style: Style) -> str:
    if not klass:
        return ""
    return style(f"[{klass}]", *_CLASS_STYLE.get(klass, ()))


# What a view says of a plan whose recorded floor check does not match its content.
EDITED = (
    "this plan was changed after it was planned: its recorded checks do not match what it"
    " says (the verdict here is recomputed; its policy results are as it records them)"
)


def _neutral_admission(admission: Admission) -> Admission:
    """``admission`` with its messages safe to print on one line (they quote plan values)."""
    return Admission(
        tuple(neutralise_data(list(admission.floor))),
        tuple(neutralise_data(list(admission.refusals))),
        admission.edited,
    )


def _mount_line(mount: Mount, style: Style, *, only: bool) -> str:
    """One mount as the container gets it: its mode as written in the plan."""
    where = f"{mount['source']} -> {mount['target']}"
    if mount["kind"] == "protected":
        held = ", held empty while absent" if mount.get("placeholder") else ""
        over = "over the project root" if mount["target"].startswith("/workspace/") else "aside"
        return (
            f"  protected    {where} (read-only {over}{held}:"
            f" {mount.get('protects', '')} stays the operator's)"
        )
    tag = f"  {_tag(mount.get('class'), style)}" if mount.get("class") else ""
    if mount["kind"] == "project" and mount["mode"] == "rw":
        return f"  writes       {where} ({'the only writable mount' if only else 'rw'})"
    if mount["mode"] != "ro":
        return "  " + style(f"WRITES       {where} ({mount['mode']})", "red", "bold") + tag
    return f"  reads        {where} (ro){tag}"


def _hardening_text(hard: Hardening, style: Callable[..., str]) -> str:
    """The hardening as the plan states it; anything weaker than the floor in capitals."""
    caps = ",".join(hard["cap_add"]) or "none"
    drop = ",".join(hard["cap_drop"]) or "nothing"
    loud: list[str] = []
    if hard["privileged"] is not False:
        loud.append("PRIVILEGED")
    if hard["no_new_privileges"] is not True:
        loud.append("NEW PRIVILEGES ALLOWED")
    if hard["read_only_rootfs"] is not True:
        loud.append("WRITABLE ROOT")
    for label, value, usual in (
        ("NETWORK", hard["network"], "none"),
        ("PID MODE", hard["pid_mode"], "private"),
        ("IPC MODE", hard["ipc_mode"], "private"),
    ):
        if value != usual:
            loud.append(f"{label} {value}")
    if hard["devices"]:
        loud.append(f"DEVICES {', '.join(map(str, hard['devices']))}")
    parts = [f"uid {hard['user']}", f"cap_drop {drop} (+{caps})"]
    parts += [style(text, "red", "bold") for text in loud]
    if hard["no_new_privileges"] is True:
        parts.append("no-new-privileges")
    parts.append(f"seccomp {hard['seccomp']}")
    if hard["read_only_rootfs"] is True:
        parts.append("read-only root")
    parts += [
        f"pids {hard['pids_limit']}",
        f"memory {hard['memory_bytes'] // 1048576}m",
        f"cpus {hard['nano_cpus'] / 1e9:g}",
        f"runtime {hard['runtime']} ({hard['tenancy']})",
    ]
    return ", ".join(parts)


def render_markdown(plan: Plan) -> str:
    """A pull-request comment; applyable as ``admit`` decides (see ``render_text``)."""
    admission = _neutral_admission(admit(plan))
    plan = neutralise_data(plan)
    task = plan["task"]
    mine = _own(plan)
    classes = {a["category"]: a["class"] for a in plan["approvals"]}
    lines = [
        f"### kagura-agent plan: `{task['name']}`",
        "",
        f"Applyable: **{'yes' if admission.applyable else 'NO'}** · fingerprint `{plan['fingerprint'][:19]}`",
        "",
        f"Manifests: {layers_line(plan)}",
        "",
        "| capability | detail | class |",
        "|---|---|---|",
        f"| brain | {plan['brain']['name']} ({plan['brain']['engine']}, runtime {plan['brain']['runtime']}){mine(plan['brain'])} | |",
        f"| image | `{plan['image']['ref']}` {_short(plan['image']['digest'])}{mine(plan['image'])} | {plan['image']['class']} |",
    ]
    endpoint = plan["brain"].get("model_endpoint")
    if endpoint is not None:
        target, how = endpoint_lines(endpoint)
        lines.insert(-1, f"| model endpoint | {target}: {how} | {endpoint['class']} |")
    for mount in plan["mounts"]:
        lines.append(
            f"| mount | `{mount['source']}` → `{mount['target']}` ({mount['mode']}) | {mount.get('class', {'project': 'baseline', 'protected': 'protected'}.get(mount['kind'], ''))} |"
        )
    classes = {a["category"]: a["class"] for a in plan["approvals"]}
    for entry in plan["egress"]["allow"]:
        notes = "".join(f"; {n}" for n in (_may_resolve(entry), _wildcard_cost(entry)) if n)
        lines.append(
            f"| egress | `{entry['scheme']}://{entry['host']}:{entry['port']}` (policy {entry['policy']}{notes}){mine(entry)} | {classes.get(rule_category(entry['policy']), '')} |"
        )
    proxy = plan["egress"].get("proxy")
    if proxy:
        lines.append(f"| egress proxy image | `{proxy['ref']}` {_short(proxy['digest'])} | |")
    calls = plan["egress"].get("model_calls")
    if calls is not None:
        shown = "; ".join(model_call_lines(calls, plan["budget"]["turns"]))
        lines.append(f"| model calls | {shown} | |")
    for cred in plan["credentials"]:
        line = _cred_line(cred, injected_provider(plan), plan["budget"])
        lines.append(f"| credential | {line}{mine(cred)} | {cred['class']} |")
    for server in plan.get("tool_servers", []):
        lines.append(
            f"| tool server | {_tool_server_line(server)}{mine(server)} | {server['class']} |"
        )
    if "commits" in plan:
        lines.append(f"| commits | {commits.text(plan['commits'])} | |")
    lines.append(f"| budget | {_budget_line(plan['budget'])} | |")
    lines.append(f"| hardening | {_hardening_text(plan['hardening'], _markdown_style)} | |")
    parent = task.get("parent")
    if parent:
        narrowing = parent["narrowing"]
        widens = (
            "not checked: the parent never applied a plan"
            if narrowing is None
            else "; ".join(narrowing) or "narrows the parent"
        )
        lines.append(f"| parent | task `{parent['task']}` ({widens}) | |")
    lines += _markdown_approvals(plan["approvals"])
    failed = [r for r in plan["policy"] if not r["passed"]]
    floor = admission.floor
    if failed or plan["warnings"] or floor or admission.edited:
        lines.append("")
        for broken in floor:
            lines.append(f"- **floor**: {broken}")
        if admission.edited:
            lines.append(f"- **edited**: {EDITED}")
        for result in failed:
            lines.append(f"- **{result['effect']}** `{result['policy']}`: {result['message']}")
        for warning in plan["warnings"]:
            lines.append(f"- warning: {warning}")
    refused = [r for r in admission.refusals if r["code"] not in _SHOWN_ABOVE]
    if refused:
        lines.append("")
        lines += [f"- **refused**: {r['message']}" for r in refused]
    return "\n".join(lines) + "\n"


def _markdown_style(text: str, *_styles: str) -> str:
    return f"**{text}**"


def markdown_with_changes(plan: Plan, changes: Sequence[Change], label: str) -> str:
    """The markdown plan plus its diff (a pull-request comment's section): what widens a
    grant shown open, first; the rest folded."""
    text = render_markdown(plan)
    wider = [change for change in changes if change.widens]
    rest = [change for change in changes if not change.widens]
    if wider:
        text += f"\n**Widens against {label}** ({len(wider)}):\n\n```diff\n"
        text += "".join(change.render() + "\n" for change in wider)
        text += "```\n"
    if rest:
        text += f"\n<details><summary>{len(rest)} {'other ' if wider else ''}changes against {label}</summary>\n\n```diff\n"
        text += "".join(change.render() + "\n" for change in rest)
        text += "```\n</details>\n"
    return text


def _markdown_approvals(approvals: list[Approval]) -> list[str]:
    """What a human must decide before apply, and what was earned or refused."""
    shown = [a for a in approvals if a["class"] != "baseline"]
    lines = ["", "#### Approvals", ""]
    if not shown:
        return [*lines, "Nothing to approve: every capability is baseline."]
    for approval in shown:
        lines.append(f"- **{approval['class']}** `{approval['category']}`: {approval['reason']}")
    needed = [a["category"] for a in shown if a["class"] == "needs-approval"]
    if needed:
        flags = " ".join(f"--approve {category}" for category in needed)
        lines += ["", f"To apply without being asked: `kagura-agent apply --yes {flags} …`"]
    return lines
