"""The catalog: every valid manifest by kind and name, immutable once built."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from kagura_agent.errors import Diagnostic
from kagura_agent.manifest.loader import Sources
from kagura_agent.manifest.schema import KINDS, schema_version, validate_document
from kagura_agent.manifest.yamlpos import Path, YamlDoc, json_path


@dataclass(frozen=True)
class Manifest:
    kind: str
    name: str
    spec: dict[str, Any]
    doc: YamlDoc

    @property
    def file(self) -> str:
        return self.doc.file

    def diag(self, path: Path, message: str, *, hint: str = "", key: bool = False) -> Diagnostic:
        """A diagnostic located at ``path`` (relative to the document root)."""
        line, col = self.doc.where(path, key=key)
        return Diagnostic(self.doc.file, line, col, json_path(path), message, hint)


@dataclass(frozen=True)
class Catalog:
    by_kind: MappingProxyType[str, MappingProxyType[str, Manifest]]
    digests: MappingProxyType[str, str] = field(default_factory=lambda: MappingProxyType({}))
    origin: str = ""  # the manifest directory (absolute), or "<dir>@<git rev>"

    def get(self, kind: str, name: str) -> Manifest | None:
        return self.by_kind.get(kind, MappingProxyType({})).get(name)

    def of(self, kind: str) -> list[Manifest]:
        return list(self.by_kind.get(kind, MappingProxyType({})).values())

    def names(self, kind: str) -> list[str]:
        return sorted(self.by_kind.get(kind, MappingProxyType({})))

    def default(self, kind: str) -> Manifest | None:
        for manifest in self.of(kind):
            if manifest.spec.get("default") is True:
                return manifest
        found = self.of(kind)
        return found[0] if len(found) == 1 else None


def schema_valid(
    docs: Iterable[YamlDoc], digests: Mapping[str, str] | None = None
) -> tuple[list[Manifest], list[Diagnostic]]:
    """Schema-check documents; the valid ones become manifests.

    A document whose file digest (``digests``) passed this exact check before is not
    checked again (see kagura_agent.manifest.cache).
    """
    from kagura_agent.manifest.cache import PassCache, key

    manifests: list[Manifest] = []
    problems: list[Diagnostic] = []
    passed = PassCache("schema-pass")
    version = schema_version()
    for doc in docs:
        file_digest = (digests or {}).get(doc.file)
        doc_key = key(version, file_digest, str(doc.index)) if file_digest else None
        if doc_key is None or doc_key not in passed:
            found = validate_document(doc)
            if found:
                problems.extend(found)
                continue
            if doc_key is not None:
                passed.add(doc_key)
        value = doc.value
        manifests.append(Manifest(value["kind"], value["metadata"]["name"], value["spec"], doc))
    passed.save()
    return manifests, problems


def build_catalog(sources: Sources) -> tuple[Catalog, list[Manifest], list[Diagnostic]]:
    """Split manifests from tasks and index manifests by kind and name.

    Returns the catalog, the task manifests, and every problem (schema errors, duplicate
    names). Invalid documents are left out of the catalog so later checks do not cascade.
    """
    manifests, problems = schema_valid(sources.docs, sources.digests)
    index: dict[str, dict[str, Manifest]] = {kind: {} for kind in KINDS if kind != "Task"}
    tasks: list[Manifest] = []
    seen_tasks: dict[str, Manifest] = {}
    for manifest in manifests:
        if manifest.kind == "Task":
            first = seen_tasks.get(manifest.name)
            if first is not None:
                problems.append(_duplicate(manifest, first))
                continue
            seen_tasks[manifest.name] = manifest
            tasks.append(manifest)
            continue
        bucket = index[manifest.kind]
        if manifest.name in bucket:
            problems.append(_duplicate(manifest, bucket[manifest.name]))
            continue
        bucket[manifest.name] = manifest
    catalog = Catalog(
        MappingProxyType({k: MappingProxyType(v) for k, v in index.items()}),
        MappingProxyType(dict(sources.digests)),
    )
    return catalog, tasks, problems


def _duplicate(manifest: Manifest, first: Manifest) -> Diagnostic:
    line, _ = first.doc.where(("metadata", "name"))
    return manifest.diag(
        ("metadata", "name"),
        f"duplicate {manifest.kind} name {manifest.name!r}",
        hint=f"first defined at {first.file}:{line}",
    )
