"""Credential providers: mint a scoped, expiring credential from a root secret on the host.

Every provider kind lives in its own module and imports its SDK only when built, so
``plan`` and ``validate`` never pay for boto3, google-cloud-iam or cloudflare.

    provider = build_provider("cloudflare", scope_spec, root_secret)
    minted = provider.mint(scope_spec, ttl_seconds=900, lease_id="L…")
    provider.revoke(minted.id)

Errors from SDKs are translated here into ProviderError, classified as transient
(network, throttling, 5xx: retry later) or not (bad credentials, forbidden, bad scope).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from kagura_agent.clock import Clock, SystemClock
from kagura_agent.errors import RefusedError, SetupError, UsageError
from kagura_agent.manifest.scopes import missing_narrowing

CREDS_DIR = "/run/kagura/creds"  # a tmpfs inside the container, owner-only


@dataclass(frozen=True)
class Bundle:
    """What reaches the container: files under CREDS_DIR and env for tool processes.

    Values are secret: the repr shows only names. ``plain`` names the env entries that
    carry none (a file's path, a region): the Redactor leaves those alone, or a run with
    an AWS lease would hide its region everywhere, the Bedrock endpoint's host in the
    egress record included.
    """

    files: Mapping[str, str] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    plain: frozenset[str] = frozenset()

    def to_json(self) -> dict[str, dict[str, str]]:
        return {"files": dict(self.files), "env": dict(self.env)}

    def values(self) -> list[str]:
        """Every secret-bearing string, for the Redactor."""
        env = [value for name, value in self.env.items() if name not in self.plain]
        return [*self.files.values(), *env]

    def __repr__(self) -> str:
        return f"Bundle(files={sorted(self.files)}, env={sorted(self.env)})"


@dataclass(frozen=True)
class Minted:
    """One minted credential. ``id`` is safe to record; ``bundle`` and ``secrets`` are not."""

    id: str
    expires_at: datetime
    bundle: Bundle = field(repr=False)
    # Extra values to redact that are not in the bundle verbatim (e.g. raw token).
    secrets: tuple[str, ...] = field(default=(), repr=False)
    # The credential as the run's proxy injects it, one line (a brain's model endpoint:
    # plan/endpoint.py): an API key or token as is; an AWS key as ID:SECRET:SESSION_TOKEN.
    for_proxy: str = field(default="", repr=False)

    def sensitive_values(self) -> list[str]:
        extra = [self.for_proxy] if self.for_proxy else []
        return [*self.bundle.values(), *self.secrets, *extra]


class ProviderError(Exception):
    """A provider call failed. ``transient`` says whether retrying later may help.

    The message is built by the provider from status codes and error names only —
    never from a response body that could echo a token.
    """

    def __init__(
        self, message: str, *, transient: bool, gone: bool = False, unsent: bool = False
    ) -> None:
        super().__init__(message)
        self.transient = transient
        self.gone = gone  # the credential no longer exists (revoking it again is a no-op)
        # The request never reached the provider (no connection was made: the name did not
        # resolve, the connection was refused or timed out): nothing can have been minted.
        self.unsent = unsent


class CredentialProvider(Protocol):
    """The adapter every provider kind implements."""

    kind: str
    revocable: bool  # revocable by id alone, i.e. by the sweeper after a crash
    min_ttl: int  # shortest lease the provider can mint (seconds)
    max_ttl: int

    def mint(self, scope_spec: Mapping[str, Any], ttl_seconds: int, lease_id: str) -> Minted:
        """Mint a credential limited to ``scope_spec`` that expires in about ``ttl_seconds``."""
        ...

    def revoke(self, minted_id: str) -> bool:
        """Revoke a minted credential; False when there is nothing this process can revoke.

        Raises ProviderError(gone=True) if the credential no longer exists.
        """
        ...

    def find(self, lease_id: str) -> list[str]:
        """Minted ids carrying ``lease_id`` (crash between mint and ledger update)."""
        ...


_MODULES = {
    "aws-sts": "aws_sts",
    "gcp": "gcp",
    "cloudflare": "cloudflare",
    "github-app": "github_app",
    "static": "static",
}
PROVIDER_TYPES = tuple(_MODULES)


def build_provider(
    kind: str, settings: Mapping[str, Any], root_secret: str, *, clock: Clock | None = None
) -> CredentialProvider:
    """Build the provider for ``kind``; ``settings`` is the scope_spec (endpoint, region…).

    ``clock`` dates what the provider computes itself (a static lease's expiry, a GitHub
    App JWT); the broker passes its own.
    """
    module_name = _MODULES.get(kind)
    if module_name is None:
        raise UsageError(f"unknown credential provider type {kind!r}")
    module = importlib.import_module(f"kagura_agent.membrane.providers.{module_name}")
    provider: CredentialProvider = module.create(settings, root_secret, clock or SystemClock())
    return provider


def require_extra(module: str, extra: str) -> Any:
    """Import an optional SDK, or explain which extra installs it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise SetupError(
            f"this credential provider needs {module}, which is not installed",
            hint=f"pip install 'kagura-agent[{extra}]'",
        ) from None


def http_failure(status: int, what: str) -> ProviderError:
    """Classify an HTTP status from a provider API."""
    if status == 404:
        return ProviderError(f"{what}: not found (HTTP 404)", transient=False, gone=True)
    transient = status in (408, 409, 425, 429) or status >= 500
    return ProviderError(f"{what}: HTTP {status}", transient=transient)


def require_narrowing(kind: str, scope_spec: Mapping[str, Any]) -> None:
    """Refuse to mint a scope that narrows nothing unless it says ``full_access: true``.

    Validation refuses such a scope already; this holds for any scope_spec that reaches a
    provider by another way (a saved plan, the ledger), so the provider's whole power is
    never leased by omission.
    """
    missing = missing_narrowing(kind, scope_spec)
    if missing is not None:
        raise RefusedError(
            f"{kind} scope narrows nothing without {missing}; not minted",
            hint="narrow the scope in the CredentialProvider manifest, or say full_access: true",
        )
