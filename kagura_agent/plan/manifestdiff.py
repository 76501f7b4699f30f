"""What changed in the manifest set between two catalogs (a git base and the work tree).

A plan diff shows what one task's run would get; a manifest can change what *any* task
may get (a new egress policy, a scope that now writes, a lowered graduation knob) before
a task uses it. ``diff_catalogs`` compares every document by kind and name, leaf by leaf,
and marks the changes that widen what may be granted, so a review shows them first:

- a new document of a kind that grants (egress, credentials, images, tool servers,
  brains, graduation, memory, transports);
- a Policy removed (its rules stop applying) or one of its rules or entries removed;
- a value added under a granting kind (an allow entry, a scope, a permission);
- a switch turned on (``baseline``, ``standing``, ``full_access``, ``http``, ``tunnel``…);
- a limit raised (a budget, a ttl, a ceiling, a hardening limit), or a graduation knob
  lowered (fewer successes or a shorter cooldown earn a grant).

Pure: two catalogs in, a list of ``Change`` out.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from kagura_agent.manifest.catalog import Catalog, Manifest
from kagura_agent.plan.diff import Change
from kagura_agent.units import parse_duration, parse_size

GRANTING = frozenset(
    {
        "EgressPolicy",
        "CredentialProvider",
        "Image",
        "ToolServer",
        "Brain",
        "Graduation",
        "Memory",
        "Transport",
    }
)
SWITCHES = frozenset({"baseline", "standing", "full_access", "http", "tunnel", "default"})
# Knobs where a smaller value grants sooner (Graduation).
LOWER_WIDENS = frozenset({"min_successes", "min_distinct_tasks", "cooldown", "max_failure_rate"})
SHOWN_PATHS = 6  # per document; the rest are counted


def diff_catalogs(old: Catalog, new: Catalog) -> list[Change]:
    """Every manifest added, removed or changed from ``old`` to ``new``; widening first."""
    changes: list[Change] = []
    before, after = _documents(old), _documents(new)
    for key in sorted(after.keys() - before.keys()):
        manifest = after[key]
        widens = manifest.kind in GRANTING
        changes.append(Change("+", "manifest", f"{_name(manifest)} ({manifest.file})", widens))
    for key in sorted(before.keys() - after.keys()):
        manifest = before[key]
        widens = manifest.kind == "Policy"
        changes.append(Change("-", "manifest", f"{_name(manifest)} ({manifest.file})", widens))
    for key in sorted(before.keys() & after.keys()):
        was, now = before[key], after[key]
        moved = list(_leaves_changed(was.spec, now.spec))
        if not moved:
            continue
        widening = [
            path
            for path, old_value, new_value in moved
            if _widens(now.kind, path, old_value, new_value)
        ]
        shown = [path for path, _, _ in moved][:SHOWN_PATHS]
        more = len(moved) - len(shown)
        text = (
            f"{_name(now)} ({now.file}): "
            + ", ".join(shown)
            + (f" and {more} more" if more > 0 else "")
        )
        if widening:
            text += "; widens: " + ", ".join(widening[:SHOWN_PATHS])
        changes.append(Change("~", "manifest", text, bool(widening)))
    return sorted(changes, key=lambda change: not change.widens)


def _documents(catalog: Catalog) -> dict[tuple[str, str], Manifest]:
    return {
        (kind, name): manifest
        for kind, by_name in catalog.by_kind.items()
        for name, manifest in by_name.items()
    }


def _name(manifest: Manifest) -> str:
    return f"{manifest.kind} {manifest.name}"


def _leaves_changed(old: Any, new: Any, path: str = "spec") -> Iterator[tuple[str, Any, Any]]:
    """(dotted path, old, new) of every leaf that differs; a missing side is ``None``.
    Lists are compared by item (an entry added at the end shows as that index)."""
    if isinstance(old, Mapping) and isinstance(new, Mapping):
        for key in sorted(set(old) | set(new), key=str):
            if key == "description":
                continue
            yield from _leaves_changed(old.get(key), new.get(key), f"{path}.{key}")
        return
    if isinstance(old, list) and isinstance(new, list):
        if old == new:
            return
        if all(not isinstance(item, Mapping | list) for item in [*old, *new]):
            # A list of names or hosts: what was added and removed, not index by index.
            added = [item for item in new if item not in old]
            removed = [item for item in old if item not in new]
            for item in added:
                yield (f"{path}[+{item}]", None, item)
            for item in removed:
                yield (f"{path}[-{item}]", item, None)
            return
        for index in range(max(len(old), len(new))):
            yield from _leaves_changed(
                old[index] if index < len(old) else None,
                new[index] if index < len(new) else None,
                f"{path}[{index}]",
            )
        return
    if (old is None or new is None) and isinstance(old or new, Mapping | list):
        # A whole section added or removed: each of its leaves.
        yield from _whole(new if old is None else old, path, added=old is None)
        return
    if old != new:
        yield (path, old, new)


def _whole(value: Any, path: str, *, added: bool) -> Iterator[tuple[str, Any, Any]]:
    if isinstance(value, Mapping):
        for key in sorted(value, key=str):
            if key != "description":
                yield from _whole(value[key], f"{path}.{key}", added=added)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _whole(item, f"{path}[{index}]", added=added)
    else:
        yield (path, None, value) if added else (path, value, None)


def _widens(kind: str, path: str, old: Any, new: Any) -> bool:
    leaf = path.rsplit(".", 1)[-1].split("[", 1)[0]
    if kind == "Policy":
        # A rule or a ceiling gone, or a ceiling raised: the policy holds less.
        return new is None or (leaf != "name" and _more(old, new))
    if kind not in GRANTING:
        return False
    if leaf in SWITCHES:
        return new is True and old is not True
    if leaf in LOWER_WIDENS:
        return _more(new, old)
    if old is None:
        return new is not None  # something added: an entry, a scope, a permission
    if new is None:
        return False  # something removed from a grant narrows it
    return _more(old, new) or _level_up(old, new)


def _more(old: Any, new: Any) -> bool:
    """``new`` is a larger quantity than ``old`` (numbers, durations such as 45m, sizes
    such as 2g); False when either is no quantity."""
    a, b = _quantity(old), _quantity(new)
    return a is not None and b is not None and b > a


def _quantity(value: Any) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        for parse in (parse_duration, parse_size):
            try:
                return float(parse(value))
            except ValueError:
                continue
    return None


_LEVELS = {"none": 0, "read": 1, "write": 2, "admin": 3}


def _level_up(old: Any, new: Any) -> bool:
    """An access level raised (read → write)."""
    return (
        isinstance(old, str)
        and isinstance(new, str)
        and _LEVELS.get(new, -1) > _LEVELS.get(old, 99)
    )
