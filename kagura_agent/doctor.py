"""Preflight: is this machine ready to apply plans? Each check is PASS, WARN or FAIL.

FAIL means an apply would be refused or could not run (exit 4); WARN means it would run
with less protection or a feature is unavailable. No check prints a secret value: secret
references are checked for presence only.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kagura_agent.errors import KaguraError
from kagura_agent.manifest.endpoint import INJECTED_MODES
from kagura_agent.manifest.workspace import layers_summary, load_workspace
from kagura_agent.membrane.images import list_images, unreachable_hint
from kagura_agent.membrane.runtime import connect, daemon_isolation_report
from kagura_agent.membrane.secrets import resolve
from kagura_agent.memory.factory import section_from_manifest
from kagura_agent.memory.gate import check_ready
from kagura_agent.paths import state_dir
from kagura_agent.plan.hardening import root_access
from kagura_agent.state import StateStore, describe, state_location


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # PASS | WARN | FAIL
    detail: str

    def to_json(self) -> dict[str, str]:
        return {"name": self.name, "status": self.status, "detail": self.detail}


EXTRAS = {
    "sdk": ("claude_agent_sdk", "claude"),
    "kagura-brain": ("kagura_brain", "brain"),
    "aws-sts": ("boto3", "aws"),
    "gcp": ("google.cloud.iam_credentials_v1", "gcp"),
    "cloudflare": ("cloudflare", "cloudflare"),
    "github-app": ("jwt", "github"),
    "slack": ("slack_bolt", "slack"),
    "discord": ("discord", "discord"),
}


def run_checks(manifests: str | None, project_root: str | None = None) -> list[Check]:
    checks: list[Check] = []
    catalog = None
    try:
        catalog = load_workspace(manifests, []).catalog
        checks.append(Check("manifests", "PASS", f"valid ({catalog.origin})"))
        # Which layers grant: the packaged defaults always, the operator's folder on top.
        checks.append(Check("manifest layers", "PASS", layers_summary(catalog)))
    except KaguraError as exc:
        checks.append(Check("manifests", "FAIL", exc.message))
    checks.append(_state_dir())
    checks.append(_state_store())
    checks.extend(_docker())
    if catalog is not None:
        checks.append(_memory(catalog))
        checks.extend(_extras(catalog))
        checks.extend(_secrets(catalog))
        checks.extend(_brain_credentials(catalog))
    checks.append(_project_root(project_root))
    return checks


def _project_root(explicit: str | None) -> Check:
    """Can the agent (never root) write the project root? FAIL when one was named."""
    path = os.path.realpath(explicit or os.getcwd())
    try:
        info = os.stat(path)
    except OSError as exc:
        return Check("project root", "FAIL", f"{path}: {exc.strerror}")
    access = root_access([info.st_uid, info.st_gid], info.st_mode & 0o7777, path)
    if access.writable:
        return Check("project root", "PASS", f"{path}: the agent writes it as {access.user}")
    status = "FAIL" if explicit else "WARN"
    return Check(
        "project root",
        status,
        f"{path} is owned by uid {info.st_uid} (mode {info.st_mode & 0o777:o}); the agent"
        f" runs as {access.user} and could not write it: {access.fix}",
    )


def _brain_credentials(catalog: Any) -> list[Check]:
    """Each brain's credential provider (an API key, a subscription's token, a cloud
    credential for its endpoint) exists and its secret resolves."""
    providers = {p.name: p for p in catalog.of("CredentialProvider")}
    checks = []
    for brain in catalog.of("Brain"):
        auth = brain.spec.get("auth") or {}
        if auth.get("mode") not in INJECTED_MODES or not auth.get("credential"):
            continue
        name = f"brain {brain.name} credential"
        provider = providers.get(auth["credential"])
        if provider is None:
            checks.append(Check(name, "FAIL", f"no CredentialProvider {auth['credential']}"))
            continue
        problem = _resolve_problem(provider.spec["secret"])
        if problem:
            # The operator's brain or provider: a run of that brain would fail.
            own = provider.layer != "packaged" or brain.layer != "packaged"
            status = "FAIL" if own else "WARN"
            checks.append(Check(name, status, f"provider {provider.name}: {problem}"))
        else:
            checks.append(Check(name, "PASS", f"provider {provider.name} resolves"))
    return checks


def _resolve_problem(ref: str) -> str:
    """Why a secret reference does not resolve ("" when it does); never the value."""
    try:
        resolve(ref)
    except KaguraError as exc:
        return exc.message
    return ""


def _state_dir() -> Check:
    path = state_dir()
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".doctor-probe"
        probe.write_text("ok")
        probe.unlink()
    except OSError as exc:
        return Check("state directory", "FAIL", f"{path} is not writable: {exc.strerror}")
    return Check("state directory", "PASS", str(path))


def _state_store() -> Check:
    """Which state store commands use; a PostgreSQL one must answer (password masked)."""
    try:
        location = state_location()
        if isinstance(location, Path):
            return Check("state store", "PASS", f"embedded SQLite {location}")
        store = StateStore.read_only(location)  # a URL: never None
        if store is not None:
            with store:
                store.conn.execute("SELECT 1")
    except KaguraError as exc:
        return Check("state store", "FAIL", exc.message)
    return Check("state store", "PASS", f"PostgreSQL {describe(location)}")


def _docker() -> list[Check]:
    try:
        client = connect(timeout=10)
        report = daemon_isolation_report(client)
    except KaguraError as exc:
        return [Check("docker engine", "FAIL", f"{exc.message}: {exc.hint or unreachable_hint()}")]
    checks = [Check("docker engine", "PASS", f"runtimes: {', '.join(report['runtimes'])}")]
    mode = "userns-remap" if report["userns_remap"] else "rootless" if report["rootless"] else ""
    checks.append(
        Check("user namespaces", "PASS", mode)
        if mode
        else Check("user namespaces", "WARN", "; ".join(report["warnings"][:1]))
    )
    try:
        rows = list_images()
    except KaguraError as exc:
        return [*checks, Check("images", "FAIL", exc.message)]
    for row in rows:
        if not row["built"]:
            checks.append(
                Check(f"image {row['ref']}", "FAIL", "not built: kagura-agent images build")
            )
        elif row["stale"]:
            checks.append(Check(f"image {row['ref']}", "WARN", f"stale: {row['reason']}"))
        else:
            checks.append(Check(f"image {row['ref']}", "PASS", str(row["id"])[:19]))
    return checks


def _memory(catalog: Any) -> Check:
    memory = catalog.default("Memory")
    section = section_from_manifest(*((memory.name, memory.spec) if memory else (None, None)))
    try:
        check_ready(section)
    except KaguraError as exc:
        return Check("memory", "FAIL", exc.message)
    return Check("memory", "PASS", f"{section['backend']} ready")


def _extras(catalog: Any) -> list[Check]:
    needed: dict[str, str] = {}
    for brain in catalog.of("Brain"):
        if brain.spec["engine"] in EXTRAS:
            needed[brain.spec["engine"]] = f"brain {brain.name}"
    for provider in catalog.of("CredentialProvider"):
        if provider.spec["type"] in EXTRAS:
            needed[provider.spec["type"]] = f"provider {provider.name}"
    for transport in catalog.of("Transport"):
        if transport.spec["type"] in EXTRAS:
            needed[transport.spec["type"]] = f"transport {transport.name}"
    checks = []
    for kind, user in sorted(needed.items()):
        module, extra = EXTRAS[kind]
        try:
            present = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:
            present = False
        if present:
            checks.append(Check(f"extra {extra}", "PASS", f"{module} importable ({user})"))
        else:
            fix = f"pip install 'kagura-agent[{extra}]'"
            checks.append(Check(f"extra {extra}", "WARN", f"{user} needs it: {fix}"))
    return checks


def _secrets(catalog: Any) -> list[Check]:
    """Each provider's secret reference resolves (env, file and keyring alike).

    A reference the operator's folder wrote that does not resolve FAILs: it replaces a
    packaged one (``setup``'s keyring reference over ``env:ANTHROPIC_API_KEY``), so every
    run that needs it would fail. A packaged provider's unset reference only WARNs: a
    fresh machine has no AWS or Cloudflare root key, and tasks that do not use them run.
    """
    checks = []
    for provider in catalog.of("CredentialProvider"):
        ref = provider.spec["secret"]
        problem = _resolve_problem(ref)
        if problem and provider.layer != "packaged":
            detail = f"{problem} (written in {provider.file}, replacing any packaged one)"
            checks.append(Check(f"secret {provider.name}", "FAIL", detail))
        elif problem:
            detail = f"{problem} (packaged; needed only by tasks using it)"
            checks.append(Check(f"secret {provider.name}", "WARN", detail))
        else:
            verb = "is set" if ref.startswith("env:") else "resolves"
            checks.append(Check(f"secret {provider.name}", "PASS", f"{ref} {verb}"))
    return checks
