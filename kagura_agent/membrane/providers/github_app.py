"""github-app: an installation access token limited to listed repositories and permissions.

scope_spec keys: app_id and installation_id (required), repositories (names, without the
owner), permissions ({"contents": "read", …}) — both required unless full_access: true, which
asks for the installation's every permission and repository —, endpoint (API base URL, default
https://api.github.com; a GitHub Enterprise URL or a test fake).

The root secret is the App's private key (PEM); it signs a 9-minute app JWT (RS256).
GitHub fixes installation tokens at one hour. Revoking needs the token itself, which
lives only in this process: release revokes it, but after a crash the sweeper can only
record the expiry (``revocable`` is False for exactly that reason).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from kagura_agent.clock import Clock
from kagura_agent.errors import UsageError
from kagura_agent.membrane.providers import (
    CREDS_DIR,
    Bundle,
    Minted,
    ProviderError,
    http_failure,
    require_extra,
    require_narrowing,
)
from kagura_agent.membrane.providers.traits import TRAITS

API_VERSION = "2022-11-28"


class GithubAppProvider:
    kind = "github-app"
    # revocable, min_ttl, max_ttl: membrane/providers/traits.py (one table for all)
    revocable = TRAITS["github-app"].revocable
    min_ttl = TRAITS["github-app"].min_ttl
    max_ttl = TRAITS["github-app"].max_ttl

    def __init__(self, settings: Mapping[str, Any], root_secret: str) -> None:
        self._httpx = require_extra("httpx", "github")
        self._jwt = require_extra("jwt", "github")
        try:
            self.app_id = str(settings["app_id"])
            self.installation_id = int(settings["installation_id"])
        except (KeyError, TypeError, ValueError):
            raise UsageError("github-app scope_spec needs app_id and installation_id") from None
        self._key = root_secret
        base = str(settings.get("endpoint") or "https://api.github.com").rstrip("/")
        self._client = self._httpx.Client(base_url=base, timeout=30.0)
        self._tokens: dict[str, str] = {}  # minted id -> token, for in-process revocation

    def _app_jwt(self) -> str:
        # Wall time, not the injected clock: GitHub judges the JWT by its own clock (and the
        # expiry we record comes from GitHub's answer).
        now = int(time.time())
        # iat 60 s in the past tolerates clock drift, as GitHub's docs recommend.
        claims = {"iat": now - 60, "exp": now + 540, "iss": self.app_id}
        try:
            return str(self._jwt.encode(claims, self._key, algorithm="RS256"))
        except (ValueError, TypeError, self._jwt.PyJWTError):
            raise UsageError("github-app root secret is not a usable RSA private key") from None

    def mint(self, scope_spec: Mapping[str, Any], ttl_seconds: int, lease_id: str) -> Minted:
        require_narrowing("github-app", scope_spec)
        body: dict[str, Any] = {}
        if scope_spec.get("repositories"):
            body["repositories"] = [str(r) for r in scope_spec["repositories"]]
        asked = {str(k): str(v) for k, v in dict(scope_spec.get("permissions") or {}).items()}
        if asked:
            body["permissions"] = asked
        response = self._request(
            "POST",
            f"/app/installations/{self.installation_id}/access_tokens",
            self._app_jwt(),
            body,
        )
        if response.status_code != 201:
            raise http_failure(response.status_code, "create installation token")
        data = response.json()
        token = str(data["token"])
        minted_id = f"github:{self.installation_id}:{lease_id}"
        self._tokens[minted_id] = token
        wider = _wider(asked, body.get("repositories") or [], data)
        if wider:
            # Never hand out more than was approved: revoke and fail.
            self.revoke(minted_id)
            raise ProviderError(
                f"the token GitHub granted is wider than asked ({', '.join(wider)}); revoked",
                transient=False,
            )
        expires_at = datetime.fromisoformat(str(data["expires_at"]).replace("Z", "+00:00"))
        return Minted(
            id=minted_id,
            expires_at=expires_at.astimezone(UTC),
            bundle=Bundle(
                files={"github/token": token},
                env={"GH_TOKEN": token, "GITHUB_TOKEN_FILE": f"{CREDS_DIR}/github/token"},
            ),
            secrets=(token,),
        )

    def revoke(self, minted_id: str) -> bool:
        token = self._tokens.get(minted_id)
        if token is None:
            return False  # minted by another process: it lapses at its recorded expiry
        response = self._request("DELETE", "/installation/token", token, None)
        if response.status_code in (204, 401):  # 401: already revoked or expired
            self._tokens.pop(minted_id, None)
            return True
        raise http_failure(response.status_code, "revoke installation token")

    def find(self, lease_id: str) -> list[str]:
        return []

    def _request(self, method: str, path: str, bearer: str, body: Any) -> Any:
        headers = {
            "Accept": "application/vnd.github+json",
            "Authorization": f"Bearer {bearer}",
            "X-GitHub-Api-Version": API_VERSION,
        }
        try:
            return self._client.request(method, path, headers=headers, json=body)
        except self._httpx.HTTPError as exc:
            unsent = isinstance(exc, self._httpx.ConnectError | self._httpx.ConnectTimeout)
            raise ProviderError(
                f"{method} {path}: {type(exc).__name__}", transient=True, unsent=unsent
            ) from None


# GitHub's access levels, narrowest first.
_LEVELS = {"read": 1, "write": 2, "admin": 3}


def _wider(asked: Mapping[str, str], repositories: list[str], data: Mapping[str, Any]) -> list[str]:
    """What a token GitHub answered with holds beyond what was asked (empty: nothing).

    A permission unasked for (GitHub always adds metadata:read) or at a higher level than
    asked, a repository not listed, or every repository when some were listed. Without
    asked permissions (or repositories) the scope takes the installation's, as GitHub
    grants them; nothing to compare.
    """
    wider: list[str] = []
    if asked:
        for name, level in sorted(dict(data.get("permissions") or {}).items()):
            if name == "metadata" and level == "read":
                continue
            want = _LEVELS.get(str(asked.get(name)), 0)
            if _LEVELS.get(str(level), len(_LEVELS) + 1) > want:
                wider.append(f"{name}:{level}")
    if repositories:
        listed = {r.casefold() for r in repositories}  # GitHub's names ignore case
        if data.get("repository_selection") == "all":
            wider.append("all repositories")
        for repo in data.get("repositories") or []:
            name = str(repo.get("name") if isinstance(repo, Mapping) else repo)
            if name.casefold() not in listed:
                wider.append(f"repository {name}")
    return wider


def create(settings: Mapping[str, Any], root_secret: str, clock: Clock) -> GithubAppProvider:
    """``clock`` is unused: see ``_app_jwt``."""
    return GithubAppProvider(settings, root_secret)
