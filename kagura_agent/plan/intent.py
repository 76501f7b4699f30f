"""Intent and facts: what the operator approves, and what each host measures.

A plan is an intent (the manifests and the task, compiled) filled in with the facts of
the host that made it (image present, graduation state, memory, the project root's owner,
the Docker daemon). ``intent_fingerprint`` hashes the plan without the ``MEASURED`` paths:
approvals and graduation evidence bind to it, so one intent planned in CI, on the serve
host or on a runner is one plan to approve. The pinned image (``image.digest`` and
``image.pull``) is intent: the operator approves an image, not a tag.

``fact_changes(saved, here)`` compares a saved plan with the same intent compiled on this
host. Every difference is a ``FactChange``; it changes a capability (apply refuses, exit 6)
when the image, an approval class, the run's untrusted inputs or its refusals differ,
when a budget limit grows, when this daemon isolates less or lacks the plan's runtime.
Anything else (graduation version, known failures, the container uid that matches this
host's project owner, warnings) is shown and the run goes ahead with this host's plan.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kagura_agent.hygiene import neutralise

# Paths of the plan that the planning host measured (``[]`` walks a list). Everything
# else, including any section added later, is intent: unknown means approved-as-shown.
MEASURED: tuple[str, ...] = (
    "inputs.facts",
    "image.recipe_digest",
    "image.class",
    "image.reason",
    "mounts[].class",
    "mounts[].reason",
    "credentials[].class",
    "credentials[].reason",
    "tool_servers[].class",
    "tool_servers[].reason",
    "hardening.user",
    "hardening.tmpfs",
    "brain.conversation.handed_back",
    "brain.conversation.lost",
    "task.parent.run",
    "task.parent.narrowing",
    "memory.untrusted_inputs",
    "commits.seed",
    "commits.head",
    "commits.object_format",
    "commits.problem",
    "memory.known_failures",
    "memory.failure_trust",
    "budget",
    "floor",
    "policy",
    "approvals",
    "warnings",
    "refusals",
    "applyable",
    "intent",
    "fingerprint",
)
LIMITS = ("turns", "tokens", "wall_seconds", "cost_usd", "disk_bytes", "children")


def intent_view(plan: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``plan`` without the measured paths."""
    view: dict[str, Any] = json.loads(json.dumps(plan))
    for path in MEASURED:
        _drop(view, path.replace("[]", ".[]").split("."))
    return view


def _drop(value: Any, parts: list[str]) -> None:
    head, rest = parts[0], parts[1:]
    if head == "[]":
        for item in value if isinstance(value, list) else []:
            _drop(item, rest)
    elif isinstance(value, dict) and head in value:
        if rest:
            _drop(value[head], rest)
        else:
            del value[head]


def intent_fingerprint(plan: Mapping[str, Any]) -> str:
    """sha256 over the canonical JSON of ``intent_view(plan)``."""
    text = json.dumps(intent_view(plan), sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class FactChange:
    """One way this host's plan differs from the saved plan of the same intent."""

    what: str
    saved: Any
    here: Any
    capability: bool
    why: str = ""

    def render(self) -> str:
        text = f"{self.what}: {_fmt(self.saved)} → {_fmt(self.here)}"
        return neutralise(text + (f" ({self.why})" if self.why else ""), newlines=False)

    def to_json(self) -> dict[str, Any]:
        return {
            "what": self.what,
            "saved": self.saved,
            "here": self.here,
            "capability": self.capability,
            "why": self.why,
        }


def fact_changes(saved: Mapping[str, Any], here: Mapping[str, Any]) -> list[FactChange]:
    """Every difference between two plans of one intent; ``capability`` marks a refusal."""
    changes = _facts(saved["inputs"]["facts"], here["inputs"]["facts"])
    changes += _runtime(here)
    for key in ("digest", "pull"):
        old, new = saved["image"].get(key), here["image"].get(key)
        if old != new:
            changes.append(FactChange(f"image {key}", old, new, True, "another image"))
    old_classes, new_classes = _classes(saved), _classes(here)
    for category in sorted(set(old_classes) | set(new_classes)):
        old, new = old_classes.get(category), new_classes.get(category)
        if old != new:
            changes.append(FactChange(f"class of {category}", old, new, True))
    old_untrusted = sorted(saved["memory"]["untrusted_inputs"])
    new_untrusted = sorted(here["memory"]["untrusted_inputs"])
    if old_untrusted != new_untrusted:
        changes.append(FactChange("untrusted inputs", old_untrusted, new_untrusted, True))
    changes += _budget(saved["budget"], here["budget"])
    old_refusals = {r["message"] for r in saved["refusals"]}
    for refusal in here["refusals"]:
        if refusal["message"] not in old_refusals:
            changes.append(FactChange("refusal", None, refusal["message"], True))
    changes += _informational(saved, here)
    return changes


def _facts(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[FactChange]:
    changes = []
    for key in sorted(set(old) | set(new)):
        before, after = old.get(key), new.get(key)
        if key == "image_digest" or before == after:
            continue  # the image is judged against the pin, below
        if key == "daemon":
            changes += _daemon(before, after)
        else:
            changes.append(FactChange(key.replace("_", " "), before, after, False))
    return changes


def _daemon(old: Mapping[str, Any] | None, new: Mapping[str, Any] | None) -> list[FactChange]:
    """Weaker isolation than the plan was made with is a capability; the rest is shown."""
    before, after = dict(old or {}), dict(new or {})
    changes = []
    isolated_before = bool(before.get("userns_remap") or before.get("rootless"))
    isolated_after = bool(after.get("userns_remap") or after.get("rootless"))
    for key in sorted(set(before) | set(after)):
        if before.get(key) != after.get(key):
            weaker = key in ("userns_remap", "rootless") and isolated_before and not isolated_after
            why = "container root would be host root here" if weaker else ""
            changes.append(
                FactChange(f"daemon {key}", before.get(key), after.get(key), weaker, why)
            )
    return changes


def _runtime(here: Mapping[str, Any]) -> list[FactChange]:
    """The plan's OCI runtime must exist on this daemon (when the daemon was asked)."""
    daemon = here["inputs"]["facts"].get("daemon") or {}
    runtimes = daemon.get("runtimes")
    runtime = here["hardening"]["runtime"]
    if here["brain"]["runtime"] != "container" or not runtimes or runtime in runtimes:
        return []
    return [FactChange("runtime", runtime, runtimes, True, f"this daemon has no {runtime}")]


def _classes(plan: Mapping[str, Any]) -> dict[str, str]:
    return {a["category"]: a["class"] for a in plan["approvals"]}


def _budget(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[FactChange]:
    """A limit that grows here is a capability (more than was shown); a smaller one is not."""
    changes = []
    for key in LIMITS:
        before, after = old.get(key), new.get(key)
        if before == after:
            continue
        grows = after is None or (before is not None and after > before)
        why = "a larger limit than the saved plan shows" if grows else ""
        changes.append(FactChange(f"budget {key}", before, after, grows, why))
    # A resumed session's lease budgets are limits too (what apply mints under).
    old_leases, new_leases = _resumed_leases(old), _resumed_leases(new)
    for category in sorted(set(old_leases) | set(new_leases)):
        before, after = old_leases.get(category), new_leases.get(category)
        if before == after:
            continue
        grows = after is None or (before is not None and after > before)
        why = "more lease time left than the saved plan shows" if grows else ""
        changes.append(FactChange(f"lease budget left of {category}", before, after, grows, why))
    return changes


def _resumed_leases(budget: Mapping[str, Any]) -> dict[str, int]:
    """Lease seconds left per category of a resumed session's plan (none: no session)."""
    section = budget.get("resumed") or {}
    return {lease["category"]: lease["budget_seconds"] for lease in section.get("leases", [])}


def _informational(saved: Mapping[str, Any], here: Mapping[str, Any]) -> list[FactChange]:
    """Measured values that change no capability, shown so nothing differs silently."""
    changes = []
    if saved["hardening"]["user"] != here["hardening"]["user"]:
        changes.append(
            FactChange(
                "container user",
                saved["hardening"]["user"],
                here["hardening"]["user"],
                False,
                "this host's project owner",
            )
        )
    old_failures = [f["failure"] for f in saved["memory"]["known_failures"]]
    new_failures = [f["failure"] for f in here["memory"]["known_failures"]]
    if old_failures != new_failures:
        changes.append(FactChange("known failures", len(old_failures), len(new_failures), False))
    old_parent = saved["task"].get("parent", {}).get("run")
    new_parent = here["task"].get("parent", {}).get("run")
    if old_parent != new_parent:
        changes.append(FactChange("parent run", old_parent, new_parent, False))
    for warning in here["warnings"]:
        if warning not in saved["warnings"]:
            changes.append(FactChange("warning", None, warning, False))
    return changes


def _fmt(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, list):
        return "[" + ", ".join(str(v) for v in value) + "]"
    return str(value)
