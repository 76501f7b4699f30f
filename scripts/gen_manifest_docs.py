#!/usr/bin/env python3
"""Generate docs/manifests.md from schemas/*.json, the single source of truth.

    python scripts/gen_manifest_docs.py          # rewrite docs/manifests.md
    python scripts/gen_manifest_docs.py --check  # exit 1 when it is out of date

Every kind gets a table with one row per field (nested objects flattened to dotted
paths, list items as ``[]``, free-named map entries as ``<name>``): its type with
bounds, whether it is required, allowed values, the default and the description.
Defaults come from a schema ``default`` keyword, else from a "(default …)" phrase in
the description. Conditional rules (oneOf, if/then) are listed under the table.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kagura_agent.manifest.schema import KINDS  # noqa: E402 - after the path is set

SCHEMAS = ROOT / "schemas"
OUTPUT = ROOT / "docs" / "manifests.md"
_DEFAULT = re.compile(r"\(default:? ([^)]+)\)")

Row = tuple[str, str, str, str, str, str]


def load(kind: str) -> dict[str, Any]:
    schema: dict[str, Any] = json.loads((SCHEMAS / f"{kind.lower()}.json").read_text("utf-8"))
    return schema


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _code(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value)
    return "`" + text.replace("|", "\\|") + "`"  # GFM tables split cells on any bare |


def _resolve(node: dict[str, Any], defs: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """Follow a local $ref; return the merged node and the definition's name."""
    ref = node.get("$ref", "")
    if not ref.startswith("#/$defs/"):
        return node, ""
    name = ref.rsplit("/", 1)[1]
    merged = {**defs[name], **{k: v for k, v in node.items() if k != "$ref"}}
    return merged, name


def _plain_type(node: dict[str, Any]) -> str:
    kind = node.get("type")
    if isinstance(kind, list):
        return " or ".join(kind)
    if kind is None and node.get("enum"):
        # An enum without a type: name the type of its values.
        names = {"str": "string", "int": "integer", "bool": "boolean", "float": "number"}
        found = sorted({names.get(type(v).__name__, "any") for v in node["enum"]})
        return " or ".join(found)
    return str(kind or "any")


def _bounds(node: dict[str, Any]) -> str:
    parts = []
    low = node.get("minimum", node.get("exclusiveMinimum"))
    high = node.get("maximum")
    if low is not None or high is not None:
        left = "" if low is None else ("> " if "exclusiveMinimum" in node else "") + str(low)
        parts.append(f"{left}..{'' if high is None else high}")
    if "minItems" in node or "maxItems" in node:
        parts.append(f"{node.get('minItems', 0)}..{node.get('maxItems', '')} items")
    if node.get("minLength"):
        parts.append(f"min length {node['minLength']}")
    if node.get("uniqueItems"):
        parts.append("unique")
    return f" ({', '.join(parts)})" if parts else ""


def _type(node: dict[str, Any], defs: dict[str, Any]) -> str:
    node, ref = _resolve(node, defs)
    if "const" in node:
        kind = "constant"
    elif node.get("type") == "array":
        item, item_ref = _resolve(node.get("items", {}), defs)
        inner = f"[{item_ref}](#{item_ref.lower()})" if item_ref else _plain_type(item)
        kind = f"list of {inner}"
    else:
        kind = _plain_type(node)
    if ref:
        kind = f"{kind} ([{ref}](#{ref.lower()}))"
    return kind + _bounds(node)


def _allowed(original: dict[str, Any], defs: dict[str, Any]) -> str:
    node, ref = _resolve(original, defs)
    if "const" in node:
        return _code(node["const"])
    if "enum" in node:
        return ", ".join(_code(v) for v in node["enum"])
    items = node.get("items")
    if isinstance(items, dict):
        inner, _ = _resolve(items, defs)
        if "enum" in inner:
            return "each: " + ", ".join(_code(v) for v in inner["enum"])
        if "pattern" in inner and "$ref" not in items:
            return f"each matches {_code(inner['pattern'])}"
    if "pattern" in node and not ref:  # a shared type's pattern is under "Value types"
        return f"matches {_code(node['pattern'])}"
    return ""


def _default(node: dict[str, Any], defs: dict[str, Any]) -> str:
    node, _ = _resolve(node, defs)
    if "default" in node:
        return _code(node["default"])
    found = _DEFAULT.search(node.get("description", ""))
    return found.group(1) if found else ""


def rows(node: dict[str, Any], defs: dict[str, Any], prefix: str = "") -> list[Row]:
    """One row per field below ``node`` (an object schema), depth first."""
    out: list[Row] = []
    required = set(node.get("required", []))
    for name, child in node.get("properties", {}).items():
        path = f"{prefix}{name}"
        resolved, ref = _resolve(child, defs)
        out.append(
            (
                f"`{path}`",
                _type(child, defs),
                "yes" if name in required else "",
                _allowed(child, defs),
                _default(child, defs),
                _cell(resolved.get("description", "")),
            )
        )
        if ref:
            continue  # shared value types are described once, under "Value types"
        out.extend(_nested(resolved, defs, path))
    return out


def _nested(node: dict[str, Any], defs: dict[str, Any], path: str) -> list[Row]:
    if node.get("type") == "array" and isinstance(node.get("items"), dict):
        item, ref = _resolve(node["items"], defs)
        if not ref and item.get("type") == "object":
            return rows(item, defs, f"{path}[].")
        return []
    out = rows(node, defs, f"{path}.") if "properties" in node else []
    extra = node.get("additionalProperties")
    if isinstance(extra, dict):
        entry, ref = _resolve(extra, defs)
        key = f"{path}.<name>"
        if entry.get("type") == "object" and not ref:
            out.append((f"`{key}`", "object", "", "", "", _cell(entry.get("description", ""))))
            out.extend(_nested(entry, defs, key))
        else:
            about = _cell(entry.get("description", "")) or "any key"
            out.append((f"`{key}`", _type(extra, defs), "", _allowed(extra, defs), "", about))
    return out


def rules(spec: dict[str, Any]) -> list[str]:
    """Conditional rules of a spec in words: oneOf of required sets, if/then."""
    out = []
    choices = [branch.get("required", []) for branch in spec.get("oneOf", [])]
    if choices and all(len(c) == 1 for c in choices):
        names = ", ".join(f"`spec.{c[0]}`" for c in choices)
        out.append(f"exactly one of {names}")
    for clause in spec.get("allOf", []):
        condition = clause.get("if", {}).get("properties", {})
        then = clause.get("then", {})
        when = " and ".join(
            f"`spec.{key}` is {_code(value.get('const'))}" for key, value in condition.items()
        )
        needs = [f"`spec.{name}` is required" for name in then.get("required", [])]
        for key, value in then.get("properties", {}).items():
            if "const" in value:
                needs.append(f"`spec.{key}` must be {_code(value['const'])}")
        if when and needs:
            out.append(f"when {when}: " + ", ".join(needs))
    return out


def table(body: list[Row]) -> list[str]:
    lines = [
        "| field | type | required | allowed values | default | description |",
        "|---|---|---|---|---|---|",
    ]
    lines += ["| " + " | ".join(row) + " |" for row in body]
    return lines


def render() -> str:
    """The whole reference page."""
    schemas = {kind: load(kind) for kind in KINDS}
    out = [
        "# Manifest reference",
        "",
        "<!-- Generated by scripts/gen_manifest_docs.py from schemas/*.json; do not edit."
        " A test fails when this file is out of date. -->",
        "",
        "Every document has `apiVersion: kagura.dev/v1`, a `kind`, `metadata.name` and a"
        " `spec`; a file may hold several documents separated by `---`. Unknown keys are"
        " errors at every level. `kagura-agent schema KIND` prints a kind's JSON Schema for"
        " editors (yaml-language-server).",
        "",
        "Kinds: " + ", ".join(f"[{kind}](#{kind.lower()})" for kind in KINDS) + ".",
        "",
        "## Layers and singleton kinds",
        "",
        "A manifest set has two layers: the packaged defaults, and over them the operator's"
        " folder (`--manifests DIR`, else `$KAGURA_AGENT_MANIFESTS`, else `./manifests`). An"
        " operator document of the same kind and name replaces the packaged one; an identical"
        " copy of a packaged document is the packaged one.",
        "",
        "Graduation and State are singleton kinds: the operator's folder holds at most one"
        " document of each, under any name, and a second is an error located at it. The"
        " operator's Graduation merges over the packaged one key by key: a key of its `spec`"
        " replaces the packaged value whole (`tripwires`, `baseline` and `budget_floors`"
        " included), a key it leaves out keeps the packaged value, and a knob neither sets"
        " has its default. Every command reads the same merged settings: `plan` (baseline,"
        " tripwires, failure half-life, budget), `graduation`, `serve` and `web`.",
        "",
    ]
    for kind, schema in schemas.items():
        defs = schema.get("$defs", {})
        out += [f"## {kind}", "", schema.get("description", ""), ""]
        out.append(f"Schema: `schemas/{kind.lower()}.json`.")
        out.append("")
        out += table(rows(schema, defs))
        conditions = rules(schema["properties"]["spec"])
        if conditions:
            out += ["", "Rules:", ""] + [f"- {rule}" for rule in conditions]
        out.append("")
    out += ["## Value types", ""]
    shown: dict[str, dict[str, Any]] = {}
    for schema in schemas.values():
        for name, definition in schema.get("$defs", {}).items():
            shown.setdefault(name, definition)
    for name, definition in shown.items():
        out += [f"### {name}", "", _cell(definition.get("description", "")), ""]
        if "pattern" in definition:
            out += [f"Pattern: `{definition['pattern']}`", ""]  # not in a table: no escaping
        if definition.get("type") == "object":
            out += [*table(rows(definition, shown)), ""]
    return "\n".join(out).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when out of date")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = OUTPUT.read_text("utf-8") if OUTPUT.exists() else ""
        if current != text:
            print(f"{OUTPUT.relative_to(ROOT)} is out of date; run {Path(__file__).name}")
            return 1
        return 0
    OUTPUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUTPUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
