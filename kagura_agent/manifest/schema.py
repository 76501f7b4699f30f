"""JSON Schema validation of manifest documents, with errors located in the YAML source."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from functools import cache
from typing import Any

from kagura_agent.errors import Diagnostic
from kagura_agent.hygiene import REDACTED_SECRET, looks_like_token, url_without_password
from kagura_agent.manifest.yamlpos import Path, YamlDoc, json_path
from kagura_agent.paths import resource_dir

API_VERSION = "kagura.dev/v1"
KINDS: tuple[str, ...] = (
    "Brain",
    "Image",
    "CredentialProvider",
    "EgressPolicy",
    "Graduation",
    "Transport",
    "Memory",
    "Policy",
    "Workspace",
    "ToolServer",
    "State",
    "Task",
)


@cache
def load_schema(kind: str) -> dict[str, Any]:
    path = resource_dir("schemas") / f"{kind.lower()}.json"
    schema: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return schema


@cache
def schema_version() -> str:
    """A digest over every schema file: plans record it so a schema change makes them stale."""
    digest = hashlib.sha256()
    for kind in KINDS:
        digest.update((resource_dir("schemas") / f"{kind.lower()}.json").read_bytes())
    return "sha256:" + digest.hexdigest()


@cache
def _validator(kind: str) -> Any:
    from jsonschema import Draft202012Validator

    return Draft202012Validator(load_schema(kind))


def validate_document(
    doc: YamlDoc, names: Mapping[str, Sequence[str]] | None = None
) -> list[Diagnostic]:
    """Check one document against the schema of its kind; every error, located.

    ``names`` (kind -> names of the manifest set) lets a task's reference to a manifest
    that is no name at all (``egress: [github.com]``) list the names it may take.
    """
    value = doc.value
    if not isinstance(value, dict):
        return [
            _diag(
                doc,
                (),
                "a manifest document must be a mapping with apiVersion, kind, metadata, spec",
            )
        ]
    kind = value.get("kind")
    if kind not in KINDS:
        where: Path = ("kind",) if "kind" in value else ()
        known = ", ".join(KINDS)
        message = f"unknown kind {kind!r}" if "kind" in value else "missing kind"
        return [_diag(doc, where, message, hint=f"kind is one of: {known}")]
    problems = [_translate(doc, error, names) for error in _validator(kind).iter_errors(value)]
    problems.sort(key=lambda d: (d.line, d.col, d.path))
    return problems


def _diag(
    doc: YamlDoc, path: Path, message: str, *, hint: str = "", key: bool = False
) -> Diagnostic:
    line, col = doc.where(path, key=key)
    return Diagnostic(doc.file, line, col, json_path(path), message, hint)


def _shown(value: Any) -> str:
    """How an offending value is quoted: never a value that looks like a pasted key, nor
    the password of a URL."""
    if isinstance(value, str) and looks_like_token(value):
        return REDACTED_SECRET
    if isinstance(value, str) and url_without_password(value) != value:
        return repr(url_without_password(value))
    return repr(value)


def _translate(
    doc: YamlDoc, error: Any, names: Mapping[str, Sequence[str]] | None = None
) -> Diagnostic:
    path: Path = tuple(error.absolute_path)
    validator = error.validator
    instance = error.instance
    if validator == "additionalProperties" and isinstance(instance, dict):
        schema = error.schema
        allowed = set(schema.get("properties", {}))
        extra = sorted(k for k in instance if k not in allowed)
        if extra:
            known = ", ".join(sorted(allowed)) or "(none)"
            key_path = (*path, extra[0])
            return _diag(
                doc,
                key_path,
                f"unknown key {_shown(extra[0])}"
                + (f" (and {', '.join(map(_shown, extra[1:]))})" if extra[1:] else ""),
                hint=f"known keys here: {known}",
                key=True,
            )
    if validator == "required":
        return _diag(doc, path, error.message.replace("is a required property", "is required"))
    if validator == "oneOf" and path == ("spec",) and isinstance(instance, dict):
        both = "prompt" in instance and "steps" in instance
        message = (
            "give either prompt or steps, not both" if both else "a task needs prompt or steps"
        )
        return _diag(doc, path, message)
    if validator == "enum":
        choices = ", ".join(str(c) for c in error.validator_value)
        return _diag(doc, path, f"{_shown(instance)} is not one of: {choices}")
    if validator == "const":
        return _diag(doc, path, f"must be {error.validator_value!r}, got {_shown(instance)}")
    if validator == "pattern" and (refers := _refers_to(doc, path)):
        message, hint = _not_a_name(path, instance, refers, names)
        return _diag(doc, path, message, hint=hint)
    if validator == "pattern":
        description = error.schema.get("description", "")
        return _diag(doc, path, f"{_shown(instance)} is not valid here", hint=description)
    if validator == "type":
        hint = _quote_hint(doc, path, instance, error.validator_value)
        if hint:
            return _diag(doc, path, str(error.message), hint=hint)
    message = str(error.message)
    if isinstance(instance, str) and _shown(instance) != repr(instance):
        message = message.replace(repr(instance), REDACTED_SECRET)
    return _diag(doc, path, message)


_READ_AS = {bool: "a boolean", int: "a number", float: "a number", type(None): "null"}


def _quote_hint(doc: YamlDoc, path: Path, instance: Any, expected: Any) -> str:
    """For text YAML read as something else (``- true``, ``1.0``, ``null``): quote it."""
    wanted = [expected] if isinstance(expected, str) else list(expected)
    read_as = _READ_AS.get(type(instance))
    if "string" not in wanted or read_as is None:
        return ""
    text = doc.plain.get(path, "")
    if not text:
        return "the value is empty (YAML reads that as null): write the text, quoted"
    return f"YAML read this as {read_as}; quote it: {json.dumps(text)}"


# Task fields that name a manifest of the set, by the kind they name ("*": any item).
_REFERENCES: dict[tuple[str, ...], str] = {
    ("spec", "brain"): "Brain",
    ("spec", "image"): "Image",
    ("spec", "memory"): "Memory",
    ("spec", "egress", "*"): "EgressPolicy",
    ("spec", "tool_servers", "*"): "ToolServer",
    ("spec", "credentials", "*", "provider"): "CredentialProvider",
}


def _refers_to(doc: YamlDoc, path: Path) -> str:
    """The kind a task field at ``path`` names, or "" when it names none."""
    if not isinstance(doc.value, dict) or doc.value.get("kind") != "Task":
        return ""
    shape = tuple("*" if isinstance(part, int) else part for part in path)
    return _REFERENCES.get(shape, "")


def _not_a_name(
    path: Path, instance: Any, kind: str, known: Mapping[str, Sequence[str]] | None
) -> tuple[str, str]:
    """What a reference that is no manifest name at all is told: what the field names,
    the names the manifest set has, and for egress, where a host goes instead."""
    field = json_path(tuple(p for p in path if not isinstance(p, int)))[2:]
    names = (known or {}).get(kind)
    if names is None:
        listed = "see them with `kagura-agent validate --manifests DIR`"
    else:
        listed = f"known {kind} names: " + (", ".join(names) or "(none)")
    hint = f"{field} names {kind} manifests; {listed}"
    if kind == "EgressPolicy":
        hint = (
            f"{field} names EgressPolicy manifests, not hosts; {listed}; a host goes into"
            " an EgressPolicy's spec.allow list"
        )
    article = "an" if kind[0] in "AEIOU" else "a"
    return f"{_shown(instance)} is not {article} {kind} name", hint
