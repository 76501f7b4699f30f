"""Checks on what the manifest set hands out: where file: secrets live, where providers are.

- A ``file:`` secret reference (CredentialProvider ``secret``, Memory ``token``,
  Transport ``token``/``app_token``, State ``url``) must point inside a directory a Policy declares in
  ``secret_dirs`` (after ``~`` expansion and resolving symlinks), and never into /proc,
  /sys or /dev. At apply, ``membrane.secrets.resolve`` checks the file again (a regular
  file owned by the applying user, outside /proc, /sys and /dev).
- A provider's ``endpoint``/``revoke_endpoint`` (and a cloud Memory's ``url``, which
  receives its token) is a plain https URL whose host is a name or a public address,
  unless ``endpoint_addresses`` lists it
  (``membrane.endpoints``; the lease broker and sweeper check resolved addresses too).
"""

from __future__ import annotations

import os

from kagura_agent.errors import Diagnostic
from kagura_agent.manifest.catalog import Catalog, Manifest
from kagura_agent.membrane.endpoints import endpoint_problems
from kagura_agent.membrane.secrets import FORBIDDEN_SECRET_ROOTS
from kagura_agent.paths import under

SECRET_FIELDS = {
    "CredentialProvider": ("secret",),
    "Memory": ("token",),
    "Transport": ("token", "app_token"),
    "State": ("url",),
}
SETTINGS_BLOCKS = ("aws", "gcp", "cloudflare", "github")


def secret_dirs(catalog: Catalog) -> list[str]:
    """Every declared secret directory, resolved (symlinks followed)."""
    found: list[str] = []
    for policy in catalog.of("Policy"):
        for entry in policy.spec.get("secret_dirs", []):
            real = os.path.realpath(os.path.expanduser(entry))
            if real not in found:
                found.append(real)
    return found


def check_grants(catalog: Catalog) -> list[Diagnostic]:
    problems: list[Diagnostic] = []
    for policy in catalog.of("Policy"):
        for index, entry in enumerate(policy.spec.get("secret_dirs", [])):
            real = os.path.realpath(os.path.expanduser(entry))
            if real == "/" or any(under(real, root) for root in FORBIDDEN_SECRET_ROOTS):
                problems.append(
                    policy.diag(
                        ("spec", "secret_dirs", index),
                        f"{entry} cannot hold secrets (never /, /proc, /sys or /dev)",
                    )
                )
    allowed = [d for d in secret_dirs(catalog) if d != "/" and not _forbidden(d)]
    for kind, fields in SECRET_FIELDS.items():
        for manifest in catalog.of(kind):
            for field in fields:
                problems.extend(_file_ref(manifest, field, allowed))
    for memory in catalog.of("Memory"):
        if memory.spec.get("backend") != "cloud" or not memory.spec.get("url"):
            continue
        cloud = {
            "endpoint": memory.spec["url"],
            "endpoint_addresses": memory.spec.get("endpoint_addresses", []),
        }
        for key, message in sorted(endpoint_problems(cloud).items()):
            field = "url" if key == "endpoint" else key
            problems.append(
                memory.diag(
                    ("spec", field),
                    f"{field} {message}",
                    hint="the memory token is only ever sent to a public https URL or an"
                    " address listed in endpoint_addresses",
                )
            )
    for provider in catalog.of("CredentialProvider"):
        for block in SETTINGS_BLOCKS:
            settings = provider.spec.get(block)
            if not isinstance(settings, dict):
                continue
            for key, message in sorted(endpoint_problems(settings).items()):
                problems.append(
                    provider.diag(
                        ("spec", block, key),
                        f"{key} {message}",
                        hint="a root secret is only ever sent to a public https endpoint"
                        " or an address the provider lists in endpoint_addresses",
                    )
                )
    return problems


def _forbidden(path: str) -> bool:
    return any(under(path, root) for root in FORBIDDEN_SECRET_ROOTS)


def _file_ref(manifest: Manifest, field: str, allowed: list[str]) -> list[Diagnostic]:
    ref = manifest.spec.get(field)
    if not isinstance(ref, str) or not ref.startswith("file:"):
        return []
    target = os.path.realpath(os.path.expanduser(ref.removeprefix("file:")))
    if not _forbidden(target) and any(under(target, d) for d in allowed):
        return []
    shown = ", ".join(allowed) or "none declared"
    return [
        manifest.diag(
            ("spec", field),
            f"{ref} is outside the declared secret directories",
            hint=f"declared (Policy spec.secret_dirs): {shown}; never /proc, /sys or /dev",
        )
    ]
