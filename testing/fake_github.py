"""A fake of GitHub's App installation-token API, checking the app JWT for real.

    POST   /app/installations/{id}/access_tokens   (Bearer: RS256 app JWT, iss = app id)
    DELETE /installation/token                     (Bearer: the installation token)
    GET    /installation/repositories              (Bearer: the installation token)

and, once ``serve_git(folder)`` names a folder of bare repositories ``OWNER/NAME.git``,
git's smart HTTP for pushes and fetches, as github.com serves it: Basic auth whose
password is a live installation token (``x-access-token:TOKEN``) for that repository,
with ``contents: write`` to push; served by ``git http-backend``.

Register an app with ``add_app(app_id, public_key_pem, installation_id, repos, perms)``;
the fake grants only the intersection of what is asked and what is installed, as GitHub
does. Mints and revocations are recorded. Run standalone: ``python -m testing.fake_github``.
"""

from __future__ import annotations

import base64
import os
import secrets
import subprocess
import sys
import threading
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import jwt

from testing.fake_http import FakeServer, Raw, Request, serve_main


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
        self.git_root: Path | None = None
        git = r"/(?P<owner>[\w.-]+)/(?P<repo>[\w.-]+)\.git/(?P<rest>info/refs|git-(?:upload|receive)-pack)"
        self.route("GET", git, self._git)
        self.route("POST", git, self._git)

    def serve_git(self, folder: Path) -> None:
        """Serve the bare repositories ``folder/OWNER/NAME.git`` over smart HTTP."""
        self.git_root = folder

    def _git(self, request: Request) -> tuple[int, Any]:
        if self.git_root is None:
            return 404, {"message": "Not Found"}
        repo, rest = request.match["repo"], request.match["rest"]
        service = (request.query.get("service") or [""])[0]
        pushing = rest == "git-receive-pack" or service == "git-receive-pack"
        scheme, _, encoded = request.headers.get("authorization", "").partition(" ")
        user, token = "", ""
        if scheme.lower() == "basic":
            user, _, token = base64.b64decode(encoded).decode(errors="replace").partition(":")
        with self._state_lock:
            grant = self.tokens.get(token)
        allowed = grant is not None and repo in grant["repositories"]
        if allowed and pushing:
            allowed = grant is not None and grant["permissions"].get("contents") == "write"
        if not allowed:
            self.record("git-denied", repo=repo, pushing=pushing, user=user)
            challenge = {"www-authenticate": 'Basic realm="GitHub"'}
            return 401, Raw("text/plain", b"Invalid username or token.\n", challenge)
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "GIT_PROJECT_ROOT": str(self.git_root),
            "GIT_HTTP_EXPORT_ALL": "1",
            "PATH_INFO": f"/{request.match['owner']}/{repo}.git/{rest}",
            "REQUEST_METHOD": request.method,
            "QUERY_STRING": urlencode(request.query, doseq=True),
            "CONTENT_TYPE": request.headers.get("content-type", ""),
            "CONTENT_LENGTH": str(len(request.body)),
            "REMOTE_USER": user or "x-access-token",  # receive-pack needs a user
            "REMOTE_ADDR": "127.0.0.1",
        }
        for header in ("content-encoding", "git-protocol"):
            if header in request.headers:
                env["HTTP_" + header.upper().replace("-", "_")] = request.headers[header]
        done = subprocess.run(
            ["git", "http-backend"], input=request.body, env=env, capture_output=True, timeout=60
        )
        head, _, body = done.stdout.partition(b"\r\n\r\n")
        status, content_type, headers = 200, "application/octet-stream", {}
        for line in head.decode(errors="replace").splitlines():
            name, _, value = line.partition(":")
            if name.lower() == "status":
                status = int(value.split()[0])
            elif name.lower() == "content-type":
                content_type = value.strip()
            elif name:
                headers[name.strip()] = value.strip()
        if pushing and rest == "git-receive-pack":
            self.record("git-push", repo=repo, installation=grant and grant["installation"])
        return status, Raw(content_type, body, headers)

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
