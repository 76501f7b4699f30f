"""A fake of GitHub's App installation-token API, checking the app JWT for real.

    POST   /app/installations/{id}/access_tokens   (Bearer: RS256 app JWT, iss = app id)
    DELETE /installation/token                     (Bearer: the installation token)
    GET    /installation/repositories              (Bearer: the installation token)

Register an app with ``add_app(app_id, public_key_pem, installation_id, repos, perms)``;
the fake grants only the intersection of what is asked and what is installed, as GitHub
does. Mints and revocations are recorded. Run standalone: ``python -m testing.fake_github``.
"""

from __future__ import annotations

import secrets
import sys
import threading
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import jwt

from testing.fake_http import FakeServer, Request, serve_main


@dataclass
class App:
    app_id: str
    public_key: str
    installation_id: int
    repositories: list[str]
    permissions: dict[str, str]


class FakeGithub(FakeServer):
    def __init__(self, port: int = 0, owner: str = "kagura-test") -> None:
        super().__init__(port=port)
        self.owner = owner
        self.apps: dict[int, App] = {}
        self.tokens: dict[str, dict[str, Any]] = {}
        # A misbehaving GitHub, for tests: what a mint grants beyond what was asked
        # (permissions merged in; extra repositories; repository_selection "all").
        self.overgrant_permissions: dict[str, str] = {}
        self.overgrant_repositories: list[str] = []
        self.overgrant_all = False
        self._state_lock = threading.Lock()
        self.route("POST", r"/app/installations/(?P<inst>\d+)/access_tokens", self._create)
        self.route("DELETE", r"/installation/token", self._revoke)
        self.route("GET", r"/installation/repositories", self._repos)

    def add_app(
        self,
        app_id: str,
        public_key: str,
        installation_id: int,
        repositories: list[str],
        permissions: dict[str, str],
    ) -> None:
        self.apps[installation_id] = App(
            app_id, public_key, installation_id, repositories, permissions
        )

    def _create(self, request: Request) -> tuple[int, Any]:
        app = self.apps.get(int(request.match["inst"]))
        if app is None:
            return 404, {"message": "Not Found"}
        try:
            claims = jwt.decode(
                request.bearer() or "",
                app.public_key,
                algorithms=["RS256"],
                options={"require": ["iat", "exp", "iss"]},
            )
        except jwt.PyJWTError as exc:
            return 401, {"message": f"A JSON web token could not be decoded ({exc})"}
        if str(claims["iss"]) != app.app_id or claims["exp"] - claims["iat"] > 600:
            return 401, {"message": "'Issuer' or 'Expiration time' claim invalid"}
        body = request.json()
        repos = body.get("repositories") or app.repositories
        unknown = [r for r in repos if r not in app.repositories]
        if unknown:
            return 422, {
                "message": f"There is at least one repository that does not exist "
                f"or is not accessible to the parent installation: {unknown}"
            }
        asked = body.get("permissions") or app.permissions
        if any(app.permissions.get(k) not in (v, "write") for k, v in asked.items()):
            return 422, {
                "message": "The permissions requested are not granted to this installation."
            }
        asked = {**asked, **self.overgrant_permissions}
        repos = [*repos, *(r for r in self.overgrant_repositories if r not in repos)]
        token = "ghs_" + secrets.token_hex(18)
        expires = datetime.now(UTC).replace(microsecond=0) + timedelta(hours=1)
        expires_at = expires.isoformat().replace("+00:00", "Z")
        with self._state_lock:
            self.tokens[token] = {
                "repositories": repos,
                "permissions": asked,
                "installation": app.installation_id,
            }
        self.record(
            "mint",
            installation=app.installation_id,
            repositories=repos,
            permissions=asked,
            expires_at=expires_at,
        )
        return 201, {
            "token": token,
            "expires_at": expires_at,
            "permissions": asked,
            "repository_selection": "all" if self.overgrant_all else "selected",
            "repositories": [{"name": r, "full_name": f"{self.owner}/{r}"} for r in repos],
        }

    def _revoke(self, request: Request) -> tuple[int, Any]:
        with self._state_lock:
            found = self.tokens.pop(request.bearer() or "", None)
        if found is None:
            return 401, {"message": "Bad credentials"}
        self.record(
            "revoke", installation=found["installation"], repositories=found["repositories"]
        )
        return 204, None

    def _repos(self, request: Request) -> tuple[int, Any]:
        with self._state_lock:
            found = self.tokens.get(request.bearer() or "")
        if found is None:
            return 401, {"message": "Bad credentials"}
        repos = [{"name": r, "full_name": f"{self.owner}/{r}"} for r in found["repositories"]]
        return 200, {"total_count": len(repos), "repositories": repos}


if __name__ == "__main__":
    serve_main(lambda port: FakeGithub(port), sys.argv[1:])
