"""The catalog: every valid manifest by kind and name, immutable once built.

Who may grant what: the catalog is built from the operator's manifest set only — the
packaged defaults (layer ``packaged``) with the operator's folder (layer ``operator``)
on top. Task files (layer ``task``) may hold ``Task`` documents and nothing else, so a
task can only request, by name, what the manifest set defines.

Layering: an operator document with the kind and name of a packaged one replaces it
(a brain, an image, an egress policy…), except a ``Policy``: the packaged policies are
the membrane floor and always apply; an operator Policy may not reuse a packaged
policy's name unless it is an identical copy.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from kagura_agent.errors import Diagnostic
from kagura_agent.manifest.cache import PassCache, key
from kagura_agent.manifest.loader import Sources
from kagura_agent.manifest.schema import KINDS, schema_version, validate_document
from kagura_agent.manifest.yamlpos import Path, YamlDoc, json_path

LAYERS = ("packaged", "operator", "task")
MOVE_HINT = (
    "move it to the operator's manifest folder (--manifests DIR); a task may only"
    " request, by name, what the manifest set defines"
)


@dataclass(frozen=True)
class Manifest:
    kind: str
    name: str
    spec: dict[str, Any]
    doc: YamlDoc
    layer: str = "operator"  # packaged | operator (a task file never defines a manifest)

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
    # The layers in force, bottom first: {"layer", "dir", "files"}; set by load_workspace.
    layers: tuple[MappingProxyType[str, Any], ...] = ()
    # "Kind/name" of every packaged manifest an operator document replaced.
    overrides: tuple[str, ...] = ()
    # "Kind/name" of every operator document that is an identical copy of a packaged one
    # (it replaces nothing: readers merging layers take it as the packaged document).
    copies: tuple[str, ...] = ()

    def get(self, kind: str, name: str) -> Manifest | None:
        return self.by_kind.get(kind, MappingProxyType({})).get(name)

    def of(self, kind: str) -> list[Manifest]:
        return list(self.by_kind.get(kind, MappingProxyType({})).values())

    def names(self, kind: str) -> list[str]:
        return sorted(self.by_kind.get(kind, MappingProxyType({})))

    def default(self, kind: str) -> Manifest | None:
        """The operator's default of ``kind``, else the operator's only one, else the
        packaged default, else the only one there is."""
        found = self.of(kind)
        own = [m for m in found if m.layer != "packaged"]
        for manifest in own:
            if manifest.spec.get("default") is True:
                return manifest
        if len(own) == 1:
            return own[0]
        for manifest in found:
            if manifest.spec.get("default") is True:
                return manifest
        return found[0] if len(found) == 1 else None


def schema_valid(
    docs: Iterable[YamlDoc],
    digests: Mapping[str, str] | None = None,
    digests_layers: Mapping[str, str] | None = None,
    known: Mapping[str, list[str]] | None = None,
) -> tuple[list[Manifest], list[Diagnostic]]:
    """Schema-check documents; the valid ones become manifests.

    A document whose file digest (``digests``) passed this exact check before is not
    checked again (see kagura_agent.manifest.cache).
    """
    manifests: list[Manifest] = []
    problems: list[Diagnostic] = []
    passed = PassCache("schema-pass")
    version = schema_version()
    for doc in docs:
        file_digest = (digests or {}).get(doc.file)
        doc_key = key(version, file_digest, str(doc.index)) if file_digest else None
        if doc_key is None or doc_key not in passed:
            found = validate_document(doc, known)
            if found:
                problems.extend(found)
                continue
            if doc_key is not None:
                passed.add(doc_key)
        value = doc.value
        layer = (digests_layers or {}).get(doc.file, "operator")
        manifests.append(
            Manifest(value["kind"], value["metadata"]["name"], value["spec"], doc, layer)
        )
    passed.save()
    return manifests, problems


def build_catalog(sources: Sources) -> tuple[Catalog, list[Manifest], list[Diagnostic]]:
    """Split manifests from tasks and index manifests by kind and name.

    Returns the catalog, the task manifests, and every problem (schema errors, duplicate
    names). Invalid documents are left out of the catalog so later checks do not cascade.
    """
    docs, problems = _task_files_hold_tasks(sources)
    # The manifest set first: a task's reference that is no name at all is then told
    # the names the set has.
    task_docs: list[YamlDoc] = []
    manifest_docs: list[YamlDoc] = []
    for doc in docs:
        is_task = isinstance(doc.value, dict) and doc.value.get("kind") == "Task"
        (task_docs if is_task else manifest_docs).append(doc)
    manifests, found = schema_valid(manifest_docs, sources.digests, sources.layers)
    problems.extend(found)
    known = {kind: sorted({m.name for m in manifests if m.kind == kind}) for kind in KINDS}
    tasks_valid, found = schema_valid(task_docs, sources.digests, sources.layers, known)
    manifests.extend(tasks_valid)
    problems.extend(found)
    index: dict[str, dict[str, Manifest]] = {kind: {} for kind in KINDS if kind != "Task"}
    tasks: list[Manifest] = []
    seen_tasks: dict[str, Manifest] = {}
    overrides: list[str] = []
    copies: list[str] = []
    # Packaged documents first, then the operator's: a later layer meets an earlier one.
    manifests.sort(key=lambda m: LAYERS.index(m.layer) if m.layer in LAYERS else 1)
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
        first = bucket.get(manifest.name)
        if first is None:
            bucket[manifest.name] = manifest
        elif first.layer == manifest.layer:
            problems.append(_duplicate(manifest, first))
        elif manifest.kind == "Policy":
            if manifest.spec != first.spec:
                problems.append(_policy_override(manifest, first))
        else:
            bucket[manifest.name] = manifest
            if manifest.spec != first.spec:  # an identical copy replaces nothing
                overrides.append(f"{manifest.kind}/{manifest.name}")
            else:
                copies.append(f"{manifest.kind}/{manifest.name}")
    catalog = Catalog(
        MappingProxyType({k: MappingProxyType(v) for k, v in index.items()}),
        MappingProxyType(dict(sources.digests)),
        overrides=tuple(overrides),
        copies=tuple(copies),
    )
    return catalog, tasks, problems


def _task_files_hold_tasks(sources: Sources) -> tuple[list[YamlDoc], list[Diagnostic]]:
    """Refuse every document of a task file whose kind is a manifest kind (not Task).

    Checked before the schema, so the refusal is the one error such a document gets.
    """
    kept: list[YamlDoc] = []
    problems: list[Diagnostic] = []
    for doc in sources.docs:
        value = doc.value
        kind = value.get("kind") if isinstance(value, dict) else None
        if sources.layers.get(doc.file) != "task" or kind == "Task" or kind not in KINDS:
            kept.append(doc)
            continue
        metadata = value.get("metadata")
        name = metadata.get("name") if isinstance(metadata, dict) else None
        line, col = doc.where(("kind",))
        problems.append(
            Diagnostic(
                doc.file,
                line,
                col,
                "$.kind",
                f"a task file may only hold Task documents, not {kind}"
                + (f" {name!r}" if isinstance(name, str) else ""),
                MOVE_HINT,
            )
        )
    return kept, problems


def _policy_override(manifest: Manifest, first: Manifest) -> Diagnostic:
    line, _ = first.doc.where(("metadata", "name"))
    return manifest.diag(
        ("metadata", "name"),
        f"Policy {manifest.name!r} is a packaged membrane policy; it always applies and"
        " cannot be replaced",
        hint=f"give yours another name: it then applies alongside {first.file}:{line}",
    )


def _duplicate(manifest: Manifest, first: Manifest) -> Diagnostic:
    line, _ = first.doc.where(("metadata", "name"))
    return manifest.diag(
        ("metadata", "name"),
        f"duplicate {manifest.kind} name {manifest.name!r}",
        hint=f"first defined at {first.file}:{line}",
    )


def layer_paths(catalog: Catalog) -> list[str]:
    """Every manifest folder of ``catalog`` and every file read as part of one."""
    paths: list[str] = []
    for info in catalog.layers:
        paths += [str(info["path"]), *info["reads"]]
    return paths
