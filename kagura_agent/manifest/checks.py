"""Checks beyond the schema: references between manifests, egress hosts, inline secrets."""

from __future__ import annotations

import bisect
import ipaddress
import json
from collections.abc import Iterator
from functools import cache
from typing import Any

from kagura_agent.errors import Diagnostic
from kagura_agent.manifest.cache import PassCache, key
from kagura_agent.manifest.catalog import Catalog, Manifest
from kagura_agent.manifest.endpoint import CLOUD_PROVIDERS, read_endpoint
from kagura_agent.manifest.grants import check_grants
from kagura_agent.manifest.hosts import normalize_host
from kagura_agent.manifest.scopes import scope_problems
from kagura_agent.manifest.secretscan import scan, scan_joined
from kagura_agent.manifest.task import MAX_TTL, MIN_TTL
from kagura_agent.manifest.toolservers import check_tool_server
from kagura_agent.manifest.yamlpos import Path, YamlDoc, json_path
from kagura_agent.units import parse_duration

DEFAULTABLE = ("Brain", "Image", "Memory")
# Kinds a manifest set holds one of (docs/manifests.md, "Layers and singleton kinds"):
# the packaged document, merged key by key under the operator's one
# (graduation/settings.py); two of the operator's own are an error, never merged in file
# order. The value says why.
SINGLETONS = {
    "State": ("the state store is one", "already names it"),
    "Graduation": ("the graduation knobs are one set", "already sets them; merge the two"),
}


def walk_strings(value: Any, path: Path = ()) -> Iterator[tuple[Path, str, bool]]:
    """Every string in ``value`` with its path, mapping keys too (``True`` for a key)."""
    if isinstance(value, str):
        yield path, value, False
    elif isinstance(value, dict):
        for key, item in value.items():
            if isinstance(key, str):
                yield (*path, key), key, True
            yield from walk_strings(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from walk_strings(item, (*path, index))


def _secret_problem(file: str, line: int, col: int, path: str, what: str) -> Diagnostic:
    return Diagnostic(
        file,
        line,
        col,
        path,
        f"this looks like an inline secret ({what}); manifests hold references only",
        "use env:NAME, file:PATH or keyring:SERVICE/USER",
    )


def inline_secrets(doc: YamlDoc) -> tuple[list[Diagnostic], set[str]]:
    """Key material in any value or mapping key of ``doc`` (manifest/secretscan.py), as
    parsed (so a YAML escape hides nothing); and the secrets found, so that the scan of the
    file's text (``text_secrets``) does not report them twice.

    The strings are scanned as one text, a line each (one pass, however many strings);
    each string is reported once, an aliased one at its first occurrence.
    """
    strings: list[tuple[Path, bool]] = []
    texts: list[str] = []
    starts: list[int] = []
    scanned: set[int] = set()
    size = 0
    for path, text, is_key in walk_strings(doc.value):
        # An alias repeats the same string object: scan it once, so the scan stays
        # linear in the file (whose size the loader caps), not in its expansion.
        if id(text) in scanned:
            continue
        scanned.add(id(text))
        strings.append((path, is_key))
        texts.append(text)
        starts.append(size)
        size += len(text) + 1
    problems = []
    secrets: set[str] = set()
    reported: set[int] = set()
    # Whole keys only: a piece of one is judged in the file's text, where the rest may be.
    for finding in [f for f in scan("\n".join(texts)) if not f.fragment]:
        index = bisect.bisect_right(starts, finding.offset) - 1
        secrets.add(finding.secret)
        if index in reported:
            continue
        reported.add(index)
        path, is_key = strings[index]
        line, col = doc.where(path, key=is_key)
        what = finding.describe() + (", as a mapping key" if is_key else "")
        problems.append(_secret_problem(doc.file, line, col, json_path(path), what))
    return problems, secrets


def text_secrets(file: str, text: str, docs: list[YamlDoc], seen: set[str]) -> list[Diagnostic]:
    """Key material in a file's text that its parsed values do not hold (``seen``): in a
    comment, or broken across lines or list items. Located at its line and column, with
    the path of the nearest node before it."""
    direct = scan(text)
    # A key found whole is not also "split"; a piece found whole across a break is.
    places = {f.offset for f in direct if not f.fragment}
    joined = [f for f in scan_joined(text, seen) if f.offset not in places]
    direct = [f for f in direct if f.offset not in {j.offset for j in joined}]
    problems = []
    for finding in sorted(direct + joined, key=lambda f: f.offset):
        if finding.secret in seen:
            continue
        line = text.count("\n", 0, finding.offset) + 1
        col = finding.offset - (text.rfind("\n", 0, finding.offset) + 1) + 1
        path = _nearest(docs, line, col)
        what = f"{finding.describe()}, in the file's text: a comment or a broken line"
        problems.append(_secret_problem(file, line, col, path, what))
    return problems


def _nearest(docs: list[YamlDoc], line: int, col: int) -> str:
    """The JSON path of the last node that starts at or before ``line``:``col``."""
    best: tuple[tuple[int, int], Path] = ((0, 0), ())
    for doc in docs:
        for path, where in doc.positions.items():
            if best[0] < where <= (line, col):
                best = (where, path)
    return json_path(best[1])


def check_catalog(catalog: Catalog) -> list[Diagnostic]:
    problems: list[Diagnostic] = []
    for kind in DEFAULTABLE:
        # One default per layer: the operator's default replaces the packaged one.
        flagged = [m for m in catalog.of(kind) if m.spec.get("default") is True]
        own = [m for m in flagged if m.layer != "packaged"]
        defaults = own or flagged
        for extra in defaults[1:]:
            problems.append(
                extra.diag(
                    ("spec", "default"),
                    f"more than one default {kind}",
                    hint=f"{defaults[0].name} is already the default",
                )
            )
    problems.extend(check_singletons(catalog))
    for egress in catalog.of("EgressPolicy"):
        problems.extend(check_egress(egress))
    for brain in catalog.of("Brain"):
        problems.extend(check_brain(brain, catalog))
    for provider in catalog.of("CredentialProvider"):
        for index, name in enumerate(provider.spec.get("baseline_scopes", [])):
            if name not in provider.spec["scopes"]:
                problems.append(
                    provider.diag(
                        ("spec", "baseline_scopes", index),
                        f"unknown scope {name!r}",
                        hint=_known(provider.spec["scopes"]),
                    )
                )
        problems.extend(check_provider_ttl(provider))
        for scope_name, scope in provider.spec["scopes"].items():
            for field, message, hint in scope_problems(provider.spec["type"], scope):
                at = ("spec", "scopes", scope_name) + ((field,) if field else ())
                problems.append(provider.diag(at, message, hint=hint, key=True))
    for policy in catalog.of("Policy"):
        problems.extend(check_policy(policy))
    for server in catalog.of("ToolServer"):
        problems.extend(check_tool_server(server, catalog))
    problems.extend(check_grants(catalog))
    return problems


def check_provider_ttl(provider: Manifest) -> list[Diagnostic]:
    """A provider's default lease lifetime is one a lease may have: 15m..1h, and no longer
    than any of its scopes' max_ttl (it was clamped in silence)."""
    if "ttl" not in provider.spec:
        return []
    text = provider.spec["ttl"]
    ttl = parse_duration(text)
    if not MIN_TTL <= ttl <= MAX_TTL:
        return [
            provider.diag(
                ("spec", "ttl"),
                f"ttl {text} is outside 15m..1h: a lease lasts 15 minutes to one hour",
                hint="renewals extend a run past one lease, inside the task's budget",
            )
        ]
    problems = []
    for name, scope in sorted(provider.spec["scopes"].items()):
        if "max_ttl" in scope and ttl > parse_duration(scope["max_ttl"]):
            problems.append(
                provider.diag(
                    ("spec", "ttl"),
                    f"ttl {text} is above scope {name!r}'s max_ttl {scope['max_ttl']}",
                    hint=f"a lease of {name!r} lasts 15m..{scope['max_ttl']}: lower spec.ttl"
                    " or raise the scope's max_ttl",
                )
            )
    return problems


def check_singletons(catalog: Catalog) -> list[Diagnostic]:
    """Two documents of a singleton kind in the operator's folder (an identical copy of a
    packaged document is the packaged one), each extra one located."""
    problems = []
    copies = set(catalog.copies)
    for kind, (why, hint) in SINGLETONS.items():
        own = [
            m
            for m in catalog.of(kind)
            if m.layer != "packaged" and f"{kind}/{m.name}" not in copies
        ]
        for extra in own[1:]:
            line, _ = own[0].doc.where(("metadata", "name"))
            problems.append(
                extra.diag(
                    ("kind",),
                    f"more than one {kind} manifest: {why}",
                    hint=f"{kind} {own[0].name} ({own[0].file}:{line}) {hint}",
                )
            )
    return problems


def check_egress(manifest: Manifest) -> list[Diagnostic]:
    problems = []
    for index, raw in enumerate(manifest.spec.get("model_calls", {}).get("mcp_servers", [])):
        _, problem = normalize_host(raw)
        if problem:
            at = ("spec", "model_calls", "mcp_servers", index)
            problems.append(manifest.diag(at, f"MCP server host: {problem}"))
    for index, entry in enumerate(manifest.spec.get("allow", [])):
        _, problem = normalize_host(entry["host"])
        if problem:
            problems.append(manifest.diag(("spec", "allow", index, "host"), problem))
        for cidr_index, cidr in enumerate(entry.get("allow_addresses", [])):
            try:
                ipaddress.ip_network(cidr, strict=False)
            except ValueError:
                problems.append(
                    manifest.diag(
                        ("spec", "allow", index, "allow_addresses", cidr_index),
                        f"{cidr!r} is not an address range",
                        hint="use CIDR such as 10.0.0.0/8",
                    )
                )
    return problems


def check_brain(manifest: Manifest, catalog: Catalog) -> list[Diagnostic]:
    spec = manifest.spec
    problems = []
    auth = spec.get("auth", {"mode": "none"})
    container = spec.get("runtime", "container") == "container"
    needs_credential = auth["mode"] in ("api-key", "cloud") or (
        auth["mode"] == "subscription" and container
    )
    if needs_credential:
        problems += _brain_credential(manifest, catalog, spec)
    if "scope" in auth and not auth.get("credential"):
        problems.append(manifest.diag(("spec", "auth", "scope"), "scope needs auth.credential"))
    if auth["mode"] == "subscription" and not container and auth.get("credential"):
        problems.append(
            manifest.diag(
                ("spec", "auth", "credential"),
                "with runtime host the CLI uses the operator's own login; the credential"
                " is for a brain in the container",
            )
        )
    if spec["engine"] != "sdk" and "permission_mode" in spec:
        problems.append(
            manifest.diag(
                ("spec", "permission_mode"), "permission_mode applies to the sdk engine only"
            )
        )
    if spec["engine"] != "kagura-brain":
        for key in ("backend", "local_provider"):
            if key in spec:
                problems.append(
                    manifest.diag(("spec", key), f"{key} applies to the kagura-brain engine only")
                )
    problems += _brain_endpoint(manifest, spec, container)
    return problems


def _brain_credential(
    manifest: Manifest, catalog: Catalog, spec: dict[str, Any]
) -> list[Diagnostic]:
    """The CredentialProvider a brain's auth names exists, is of the type its mode needs,
    and has the scope it names."""
    auth = spec["auth"]
    mode = auth["mode"]
    name = auth.get("credential")
    if name is None:
        return [manifest.diag(("spec", "auth"), f"{mode} auth needs auth.credential")]
    provider = catalog.get("CredentialProvider", name)
    if provider is None:
        return [
            manifest.diag(
                ("spec", "auth", "credential"),
                f"unknown CredentialProvider {name!r}",
                hint=_known_names(catalog, "CredentialProvider"),
            )
        ]
    kind = provider.spec["type"]
    endpoint = spec.get("endpoint")
    api = str(endpoint.get("api", "anthropic")) if isinstance(endpoint, dict) else "anthropic"
    wanted, what = "static", "an API key" if mode == "api-key" else "a subscription token"
    if mode == "cloud":
        # No cloud api named: read_endpoint says so; the provider is not the problem.
        wanted, what = CLOUD_PROVIDERS.get(api, kind), f"endpoint api {api}"
    if kind != wanted:
        return [
            manifest.diag(
                ("spec", "auth", "credential"),
                f"{name!r} is a {kind} provider; {what} needs one of type {wanted}",
            )
        ]
    scope = auth.get("scope")
    if scope is not None and scope not in provider.spec["scopes"]:
        return [
            manifest.diag(
                ("spec", "auth", "scope"),
                f"provider {name!r} has no scope {scope!r}",
                hint=_known(provider.spec["scopes"]),
            )
        ]
    return []


def _brain_endpoint(manifest: Manifest, spec: dict[str, Any], container: bool) -> list[Diagnostic]:
    """A kagura-brain endpoint is a URL; an sdk one is read by manifest/endpoint.py."""
    endpoint = spec.get("endpoint")
    if spec["engine"] == "kagura-brain":
        if isinstance(endpoint, dict):
            return [manifest.diag(("spec", "endpoint"), "a kagura-brain endpoint is a URL")]
        return []
    if spec["engine"] != "sdk":
        if endpoint is not None:
            return [
                manifest.diag(
                    ("spec", "endpoint"), "endpoint applies to the sdk and kagura-brain engines"
                )
            ]
        return []
    if endpoint is not None and not container:
        return [
            manifest.diag(
                ("spec", "endpoint"),
                "a model endpoint is reached through the run's proxy: it needs runtime container",
            )
        ]
    if not container:
        return []
    _, found = read_endpoint(spec)
    return [manifest.diag(("spec", *path), message) for path, message in found]


def check_policy(manifest: Manifest) -> list[Diagnostic]:
    problems = []
    for index, rule in enumerate(manifest.spec.get("rules", [])):
        problem = _schema_problem(json.dumps(rule["schema"], sort_keys=True))
        if problem:
            problems.append(
                manifest.diag(
                    ("spec", "rules", index, "schema"), f"not a valid JSON Schema: {problem}"
                )
            )
    return problems


def _schema_problem(schema_json: str) -> str | None:
    """A rule schema's metaschema problem, or None; passes are remembered on disk."""
    passed = PassCache("metaschema-pass")
    digest = key("metaschema", schema_json)
    if digest in passed:
        return None
    problem = _metaschema_problem(schema_json)
    if problem is None:
        passed.add(digest)
        passed.save()
    return problem


@cache
def _metaschema_problem(schema_json: str) -> str | None:
    """Check a rule schema against the metaschema, once per distinct schema per process.

    The metaschema check dominates repeated in-process validation (tests, the cockpit
    re-planning); keyed on canonical JSON so equal schemas share one check.
    """
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import SchemaError

    try:
        Draft202012Validator.check_schema(json.loads(schema_json))
    except SchemaError as exc:
        return str(exc.message)
    return None


def _known(mapping: dict[str, Any]) -> str:
    return "known: " + (", ".join(sorted(mapping)) or "(none)")


def _known_names(catalog: Catalog, kind: str) -> str:
    return f"known {kind} names: " + (", ".join(catalog.names(kind)) or "(none)")
