"""static: a standing secret passed through as is — only when the manifest says standing: true.

scope_spec keys: env (variable name the tools read, e.g. ANTHROPIC_API_KEY) and/or file
(path under /run/kagura/creds, e.g. anthropic/key). This is how a bring-your-own-key LLM
API key reaches an in-container brain. Nothing is minted and nothing can be revoked; the
broker refuses it unless the plan entry is ``standing``.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from kagura_agent.clock import Clock
from kagura_agent.errors import UsageError
from kagura_agent.membrane.providers import Bundle, Minted
from kagura_agent.membrane.providers.traits import TRAITS


class StaticProvider:
    kind = "static"
    # revocable, min_ttl, max_ttl: membrane/providers/traits.py (one table for all)
    revocable = TRAITS["static"].revocable
    min_ttl = TRAITS["static"].min_ttl
    max_ttl = TRAITS["static"].max_ttl

    def __init__(self, settings: Mapping[str, Any], root_secret: str, clock: Clock) -> None:
        self._clock = clock
        self._value = root_secret

    def mint(self, scope_spec: Mapping[str, Any], ttl_seconds: int, lease_id: str) -> Minted:
        env_name = scope_spec.get("env")
        file_name = scope_spec.get("file")
        if not env_name and not file_name:
            raise UsageError("static scope_spec needs env (a variable name) and/or file")
        if file_name and (str(file_name).startswith("/") or ".." in str(file_name).split("/")):
            raise UsageError("static scope_spec file must be a relative path without ..")
        files = {str(file_name): self._value} if file_name else {}
        env = {str(env_name): self._value} if env_name else {}
        return Minted(
            id=f"static:{lease_id}",
            expires_at=self._clock.now() + timedelta(seconds=ttl_seconds),
            bundle=Bundle(files=files, env=env),
            secrets=(self._value,),
            for_proxy=self._value,
        )

    def revoke(self, minted_id: str) -> bool:
        """A standing secret cannot be revoked from here."""
        return False

    def find(self, lease_id: str) -> list[str]:
        return []


def create(settings: Mapping[str, Any], root_secret: str, clock: Clock) -> StaticProvider:
    return StaticProvider(settings, root_secret, clock)
