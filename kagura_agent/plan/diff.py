"""What changed between two plans, per capability, computed on the plan data."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kagura_agent.hygiene import neutralise
from kagura_agent.manifest.scopes import is_full_access
from kagura_agent.plan.admission import admit
from kagura_agent.plan.model import DiffOp, Plan
from kagura_agent.units import format_duration, parse_duration


@dataclass(frozen=True)
class Change:
    """One change between two plans. ``widens``: the new plan grants more than the old
    (a destination, a credential or a longer hold of one, a mount, a tool server, a larger
    budget, another image, weaker hardening, a capability that needs less approval), so a
    reviewer must look at it first."""

    op: DiffOp
    section: str
    text: str
    widens: bool = False

    def render(self) -> str:
        # The text quotes plan values (paths, hosts): shown without control characters.
        mark = "  (widens)" if self.widens else ""
        return neutralise(f"{self.op} {self.section} {self.text}{mark}", newlines=False)

    def to_json(self) -> dict[str, Any]:
        return {"op": self.op, "section": self.section, "text": self.text, "widens": self.widens}


# Approval classes, from the one that needs the most to the one that needs nothing.
_CLASS_ORDER = {"denied": 0, "needs-approval": 1, "approved": 2, "graduated": 2, "baseline": 3}


def diff_plans(old: Mapping[str, Any] | None, new: Plan) -> list[Change]:
    """Changes from ``old`` to ``new``, the ones that widen a grant first; with no old plan
    everything is new (the plan itself lists what it grants: nothing is marked)."""
    changes = _changes(old, new)
    if old is None:
        return [Change(c.op, c.section, c.text) for c in changes]
    return sorted(changes, key=lambda change: not change.widens)  # stable: widened first


def _changes(old: Mapping[str, Any] | None, new: Plan) -> list[Change]:
    base: Mapping[str, Any] = old or {}
    changes: list[Change] = []
    changes += _widening(_keyed("egress", _egress(base), _egress(new)), added=True)
    changes += _widening(
        _keyed("provider egress", _provider_egress(base), _provider_egress(new)), added=True
    )
    # A new endpoint is where the run's prompts and code go: a grant that widens.
    changes += _widening(
        _keyed("model endpoint", _endpoint(base), _endpoint(new)), added=True, changed=True
    )
    changes += _widening(
        _keyed("credential", _creds(base), _creds(new), absent="narrowed"),
        added=True,
        longer=("ttl", "renewals", "budget", "access"),
    )
    changes += _widening(_scope_changes(base, new), changed=True)
    changes += _widening(_keyed("mount", _mounts(base), _mounts(new)), added=True, rw=True)
    changes += _widening(
        _keyed("tool server", _tool_servers(base), _tool_servers(new)), added=True, changed=True
    )
    changes += _widening(
        _fields("image", base.get("image", {}), new["image"], ("ref", "digest", "recipe_digest")),
        changed=True,
    )
    changes += _brain(
        _fields(
            "brain",
            base.get("brain", {}),
            new["brain"],
            ("engine", "model", "permission_mode", "runtime"),
        )
    )
    if base:
        changes += _widening(
            _fields("hardening", base["hardening"], new["hardening"], tuple(new["hardening"])),
            changed=True,
        )
        changes += _budget(base["budget"], new["budget"])
    changes += _class_changes(_keyed("class", _classes(base), _classes(new)))
    # The verdict apply gives each plan, not the one a (saved, perhaps edited) plan carries.
    was, now = (admit(base).applyable, admit(new).applyable) if base else (None, None)
    if was != now:
        changes.append(Change("~", "applyable", f"{was} → {now}"))
    return changes


def _budget(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[Change]:
    """Budget limits that moved (a larger one, or none any more, widens); a limit the
    history moved says so, with its basis."""
    dimensions = ("turns", "tokens", "wall_seconds", "cost_usd", "disk_bytes")
    changes = []
    forecast = new["forecast"]
    learnt = set(forecast["learnt"]) if forecast else set()
    for change in _fields("budget", old, new, dimensions):
        dimension = change.text.split(" ", 1)[0]
        text = change.text
        if dimension in learnt:
            text = f"{text} (learnt: {forecast['basis']})"
        before, after = old.get(dimension), new.get(dimension)
        grows = after is None or (before is not None and after > before)
        changes.append(Change(change.op, change.section, text, widens=grows))
    return changes


def _widening(
    changes: list[Change],
    *,
    added: bool = False,
    changed: bool = False,
    longer: tuple[str, ...] = (),
    rw: bool = False,
) -> list[Change]:
    """``changes`` with ``widens`` set: an added entry (``added``), any change of an entry
    kept (``changed``), a kept entry whose ``longer`` field grew, a mount made writable."""
    marked = []
    for change in changes:
        widens = (added and change.op == "+") or (changed and change.op == "~")
        if change.op == "~" and longer:
            widens = widens or _grew(change.text, longer)
        if rw and change.op == "~" and change.text.endswith("→ rw"):
            widens = True
        marked.append(Change(change.op, change.section, change.text, widens))
    return marked


def _grew(text: str, fields: tuple[str, ...]) -> bool:
    """``KEY FIELD BEFORE → AFTER`` (a ``_keyed`` line) where FIELD is one of ``fields``
    and AFTER is more than BEFORE (durations and counts; access narrowed → FULL)."""
    head, _, after = text.rpartition(" → ")
    parts = head.split(" ")
    if len(parts) < 3 or parts[-2] not in fields:
        return False
    before = parts[-1]
    if parts[-2] == "access":
        return after == "FULL"
    return _amount(after) > _amount(before)


def _amount(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        pass
    try:
        return float(parse_duration(text))
    except ValueError:
        return 0.0


def _brain(changes: list[Change]) -> list[Change]:
    """A brain that leaves the sandbox, skips its permission prompts or becomes an LLM
    (a script brain holds no model key and calls nothing) widens."""
    marked = []
    for change in changes:
        head, _, after = change.text.rpartition(" → ")
        field, _, before = head.partition(" ")
        widens = change.op == "~" and (
            (field == "runtime" and after == "host")
            or (field == "permission_mode" and after == "bypassPermissions")
            or (field == "engine" and before == "script")
        )
        marked.append(Change(change.op, change.section, change.text, widens))
    return marked


def _class_changes(changes: list[Change]) -> list[Change]:
    """A capability that needs less approval than before widens; a new one widens unless
    it is denied or waits for an approval."""
    marked = []
    for change in changes:
        if change.op == "+":
            klass = change.text.rsplit("(", 1)[-1].rstrip(")")
            widens = klass in ("baseline", "graduated", "approved")
        elif change.op == "~":
            before, _, after = change.text.rpartition(" → ")
            was = _CLASS_ORDER.get(before.rsplit(" ", 1)[-1], 0)
            widens = _CLASS_ORDER.get(after, 0) > was
        else:
            widens = False
        marked.append(Change(change.op, change.section, change.text, widens))
    return marked


def _egress(plan: Mapping[str, Any]) -> dict[str, dict[str, str]]:
    out = {}
    for entry in plan.get("egress", {}).get("allow", []):
        scheme = "" if entry["scheme"] == "https" else f"{entry['scheme']}://"
        key = f"{scheme}{entry['host']}:{entry['port']}"
        out[key] = {"policy": entry["policy"]}
    return out


def _provider_egress(plan: Mapping[str, Any]) -> dict[str, dict[str, str]]:
    """What model calls may ask the provider to reach, each with the policy that allows it
    (the key-injecting port's model-call policy, egress.model_calls)."""
    calls = plan.get("egress", {}).get("model_calls") or {}
    out = {}
    for grant in calls.get("grants", []):
        for what in grant["allows"]:
            out[what] = {"policy": grant["policy"]}
    return out


def _endpoint(plan: Mapping[str, Any]) -> dict[str, dict[str, str]]:
    """Where the brain's model calls go, and with which credential how (plan/endpoint.py):
    the prompts and code of the run go there."""
    found = plan.get("brain", {}).get("model_endpoint")
    if not found:
        return {}
    where = ", ".join(str(p) for p in (found["region"], found["project"]) if p)
    local = found.get("local")
    return {
        found["url"]: {
            "api": found["api"] + (f" {where}" if where else ""),
            "auth": f"{found['auth']} {found['credential']}/{found['scope']}",
            # Only a local endpoint carries the field: the network the proxy joins.
            **({"network": local["network"]} if local else {}),
            # Only an endpoint behind a private authority: whom the proxy trusts for it.
            **({"ca": " ".join(found["ca"]["sha256"])} if found.get("ca") else {}),
        }
    }


def _creds(plan: Mapping[str, Any]) -> dict[str, dict[str, str]]:
    return {
        f"{c['provider']}:{c['scope']}": {
            "ttl": format_duration(c["ttl_seconds"]),
            "renewals": str(c["renewals"]),
            "budget": format_duration(c["budget_seconds"]),
            # Only a full-access scope carries the field: its arrival or departure shows.
            **({"access": "FULL"} if is_full_access(c.get("scope_spec", {})) else {}),
        }
        for c in plan.get("credentials", [])
    }


def _scope_changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[Change]:
    """A credential kept in both plans whose scope says something else now (a session
    policy, OAuth scopes, permissions, repositories, an endpoint): named by key, since
    what a lease may do is in these, not in its lifetime."""
    before = {f"{c['provider']}:{c['scope']}": c for c in old.get("credentials", [])}
    changes = []
    for cred in new.get("credentials", []):
        key = f"{cred['provider']}:{cred['scope']}"
        was = before.get(key)
        if was is None:
            continue
        spec, old_spec = cred.get("scope_spec", {}), was.get("scope_spec", {})
        # full_access has its own line (access narrowed → FULL).
        moved = [
            name
            for name in sorted(spec.keys() | old_spec.keys())
            if name != "full_access" and spec.get(name) != old_spec.get(name)
        ]
        if moved:
            changes.append(Change("~", "credential", f"{key} scope changed: {', '.join(moved)}"))
    return changes


def _tool_servers(plan: Mapping[str, Any]) -> dict[str, dict[str, str]]:
    """Each tool server with what it runs or where it connects (a plan may have none)."""
    return {
        s["name"]: {
            "transport": s["transport"],
            "where": " ".join(s["command"]) + f" in {s['image']}" if s["image"] else s["url"],
        }
        for s in plan.get("tool_servers", [])
    }


def _mounts(plan: Mapping[str, Any]) -> dict[str, dict[str, str]]:
    return {f"{m['source']} -> {m['target']}": {"mode": m["mode"]} for m in plan.get("mounts", [])}


def _classes(plan: Mapping[str, Any]) -> dict[str, dict[str, str]]:
    return {a["category"]: {"": a["class"]} for a in plan.get("approvals", [])}


def _keyed(
    section: str,
    old: dict[str, dict[str, str]],
    new: dict[str, dict[str, str]],
    absent: str | None = None,
) -> list[Change]:
    changes = []
    for key in sorted(new.keys() - old.keys()):
        detail = _detail(new[key])
        changes.append(Change("+", section, f"{key}{detail}"))
    for key in sorted(old.keys() - new.keys()):
        changes.append(Change("-", section, f"{key}{_detail(old[key])}"))
    for key in sorted(old.keys() & new.keys()):
        for field in dict.fromkeys([*new[key], *old[key]]):
            before, value = old[key].get(field, absent), new[key].get(field, absent)
            if before != value:
                label = f" {field}" if field else ""
                changes.append(Change("~", section, f"{key}{label} {before} → {value}"))
    return changes


def _detail(values: dict[str, str]) -> str:
    if "policy" in values:
        return f" (policy {values['policy']})"
    shown = [f"{k} {v}" if k else v for k, v in values.items()]
    return f" ({', '.join(shown)})" if shown else ""


def _fields(
    section: str, old: Mapping[str, Any], new: Mapping[str, Any], keys: tuple[str, ...]
) -> list[Change]:
    changes = []
    for key in keys:
        before, after = old.get(key), new.get(key)
        if old and before != after:
            changes.append(Change("~", section, f"{key} {_fmt(before)} → {_fmt(after)}"))
        elif not old and key == keys[0]:
            changes.append(Change("+", section, f"{key} {_fmt(after)}"))
    return changes


def _fmt(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, list):
        return "[" + ", ".join(map(str, value)) + "]"
    return str(value)
