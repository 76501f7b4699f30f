"""Image recipes (images/<name>/Dockerfile): digests, builds and the local image list.

Each built image is tagged ``kagura/<name>:<version>`` and labelled with the digest of
its recipe directory, so ``list`` can say when an image is stale against its recipe, and
with the ID of the parent it was built on, so a rebuilt parent marks it stale too.

``local_image_digest`` is a planner fact and must stay cheap: it talks HTTP to the
daemon's unix socket directly instead of importing docker-py (~150 ms to import).
"""

from __future__ import annotations

import grp
import hashlib
import http.client
import json
import os
import pwd
import socket
from pathlib import Path
from typing import Any
from urllib.parse import quote

from kagura_agent import __version__
from kagura_agent.errors import SetupError
from kagura_agent.paths import recipes_root, repo_root, resource_dir

LABEL_RECIPE = "dev.kagura.recipe"
LABEL_RECIPE_DIGEST = "dev.kagura.recipe-digest"
LABEL_PARENT = "dev.kagura.parent"
LABEL_VERSION = "dev.kagura.version"
# The brain software a wheelhouse image bakes (JSON: {"claude-agent-sdk": "0.2.190",
# "claude-code": "2.1.337", …}) and the digest of the dependency lock it was installed
# from, so a changed lock marks the image stale like a changed recipe does.
LABEL_SOFTWARE = "dev.kagura.software"
LABEL_LOCK_DIGEST = "dev.kagura.lock-digest"
# Build order for the recipes we know; any other recipe directory builds after these.
KNOWN_ORDER = ("base", "python", "agent", "egress-proxy")
_SKIP_NAMES = {"__pycache__", "wheelhouse", ".DS_Store"}


def image_ref(name: str) -> str:
    """The tag a recipe builds: ``kagura/<name>:<version>``."""
    return f"kagura/{name}:{__version__}"


def recipes_dir() -> Path:
    """The recipes: images/ of the source checkout, else the copy inside the wheel."""
    directory = recipes_root()
    if not directory.is_dir():
        raise SetupError(f"no image recipes at {directory} (a broken install? reinstall)")
    return directory


def recipe_path(recipe: str) -> Path | None:
    """An Image manifest's ``recipe`` (``images/<name>``) as a folder here, or None."""
    name = recipe.removeprefix("images/").strip("/")
    if not name or "/" in name or name.startswith("."):
        return None
    path = recipes_root() / name
    return path if path.is_dir() else None


def recipe_names(directory: Path | None = None) -> list[str]:
    """Every recipe (a directory with a Dockerfile) in dependency order."""
    directory = directory or recipes_dir()
    found = sorted(p.name for p in directory.iterdir() if (p / "Dockerfile").is_file())
    known = [n for n in KNOWN_ORDER if n in found]
    return known + [n for n in found if n not in known]


def recipe_digest(recipe_dir: Path) -> str:
    """``sha256:`` over every file of the recipe directory (relative path and content)."""
    digest = hashlib.sha256()
    for path in sorted(recipe_dir.rglob("*")):
        rel = path.relative_to(recipe_dir)
        if path.is_dir() or _SKIP_NAMES.intersection(rel.parts):
            continue
        digest.update(rel.as_posix().encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return "sha256:" + digest.hexdigest()


def uses_wheelhouse(recipe_dir: Path) -> bool:
    """Whether the recipe installs kagura-agent from a wheelhouse built from the lock."""
    return "wheelhouse/" in (recipe_dir / "Dockerfile").read_text()


def lock_file() -> Path:
    """The agent image's dependency lock (requirements/agent.txt, or the wheel's copy)."""
    return resource_dir("requirements") / "agent.txt"


def lock_digest() -> str | None:
    """``sha256:`` of the agent image's dependency lock; None when it is missing."""
    try:
        return "sha256:" + hashlib.sha256(lock_file().read_bytes()).hexdigest()
    except OSError:
        return None


def software_of(found: dict[str, Any]) -> dict[str, str]:
    """The brain software an inspected image carries (its label), name -> version."""
    labels = (found.get("Config") or {}).get("Labels") or {}
    try:
        data = json.loads(labels.get(LABEL_SOFTWARE) or "{}")
    except ValueError:
        return {}
    if not isinstance(data, dict):
        return {}
    return {str(k): str(v) for k, v in data.items() if isinstance(v, str | int | float)}


def base_image_default(recipe_dir: Path) -> str:
    """The default of the Dockerfile's ``ARG BASE_IMAGE=…`` (empty when it has none)."""
    for line in (recipe_dir / "Dockerfile").read_text().splitlines():
        words = line.strip().split(None, 1)
        if len(words) == 2 and words[0].upper() == "ARG" and words[1].startswith("BASE_IMAGE="):
            return words[1].split("=", 1)[1].strip().strip('"')
    return ""


def parent_recipe(recipe_dir: Path) -> str | None:
    """The recipe this one builds FROM (``kagura/<name>:…`` default), else None."""
    default = base_image_default(recipe_dir)
    if default.startswith("kagura/") and not default.startswith("kagura/bootstrap"):
        return default.removeprefix("kagura/").split(":")[0].split("@")[0]
    return None


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._socket_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self._socket_path)
        self.sock = sock


def _inspect_image_fast(ref: str, timeout: float) -> dict[str, Any] | None:
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    if not host.startswith("unix://"):
        return _inspect_image_docker_py(ref, timeout)
    conn = _UnixHTTPConnection(host.removeprefix("unix://"), timeout)
    try:
        conn.request("GET", f"/images/{quote(ref, safe='/:@')}/json")
        response = conn.getresponse()
        body = response.read()
        if response.status != 200:
            return None
        return json.loads(body)  # type: ignore[no-any-return]
    except (OSError, http.client.HTTPException, ValueError):
        return None
    finally:
        conn.close()


# A daemon that answers slowly (busy with many containers) is still a daemon: a fact
# that times out makes ``apply`` think the saved plan is stale, so the wait is generous.
# An absent daemon refuses the connection at once; this bounds only a hung one.
FACT_TIMEOUT_SECONDS = 15.0


def unreachable_hint(*, denied: bool = False) -> str:
    """Why the local Docker Engine does not answer, as far as the socket tells, and the
    fix: a socket this user may not open (not in its group; ``denied`` when a connection
    already said so) is not a stopped daemon, and scripts/docker-up.sh is offered only
    where it exists (a source checkout, never an installed package)."""
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    if not host.startswith("unix://"):
        return f"check that a Docker Engine listens at DOCKER_HOST={host}"
    socket_path = host.removeprefix("unix://")
    if denied or socket_refuses_user(socket_path):
        try:
            group = grp.getgrgid(os.stat(socket_path).st_gid).gr_name
        except (KeyError, OSError):
            group = "docker"
        user = pwd.getpwuid(os.geteuid()).pw_name if _has_passwd_entry() else str(os.geteuid())
        return (
            f"{socket_path} refuses this user ({user}): the socket exists and a daemon may"
            f" well answer there, but only root and its group {group} may use it; add the"
            f" user to the group (usermod -aG {group} {user}, then log in again) or run as"
            " root"
        )
    start = "start Docker Engine (systemctl start docker, or dockerd)" + checkout_script(
        "docker-up.sh"
    )
    if not os.path.exists(socket_path):
        return f"nothing listens at {socket_path}: {start}"
    return start


def checkout_script(name: str) -> str:
    """``; in this checkout: bash scripts/NAME`` when running from a source checkout that
    has it, else "": an installed package has no scripts/ to point to."""
    checkout = repo_root()
    if checkout is None or not (checkout / "scripts" / name).is_file():
        return ""
    return f"; in this checkout: bash {checkout / 'scripts' / name}"


def docker_socket() -> str:
    """The unix socket DOCKER_HOST names (the default one when unset); "" for tcp:// etc."""
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    return host.removeprefix("unix://") if host.startswith("unix://") else ""


def socket_refuses_user(path: str) -> bool:
    """The unix socket at ``path`` exists and refuses this user (EACCES on connect): what
    the daemon is doing behind it does not matter, this user may not ask."""
    if not path:
        return False
    probe = socket.socket(socket.AF_UNIX)
    probe.settimeout(2)
    try:
        probe.connect(path)
    except PermissionError:
        return True
    except OSError:
        return False
    finally:
        probe.close()
    return False


def refused_by_socket(exc: BaseException) -> bool:
    """``exc`` (or what caused it) is the Docker socket refusing this user."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, PermissionError) or "Permission denied" in str(current):
            return True
        current = current.__cause__ or current.__context__
    return False


def _has_passwd_entry() -> bool:
    try:
        pwd.getpwuid(os.geteuid())
    except KeyError:
        return False
    return True


def daemon_info(timeout: float = FACT_TIMEOUT_SECONDS) -> dict[str, Any] | None:
    """``docker info`` over the unix socket (no docker-py); None when no daemon answers."""
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    if not host.startswith("unix://"):
        return None
    conn = _UnixHTTPConnection(host.removeprefix("unix://"), timeout)
    try:
        conn.request("GET", "/info")
        response = conn.getresponse()
        body = response.read()
        found: dict[str, Any] | None = json.loads(body) if response.status == 200 else None
        return found
    except (OSError, http.client.HTTPException, ValueError):
        return None
    finally:
        conn.close()


def _inspect_image_docker_py(ref: str, timeout: float) -> dict[str, Any] | None:
    try:
        import docker

        client = docker.from_env(timeout=max(1, int(timeout)))
        try:
            return client.api.inspect_image(ref)  # type: ignore[no-any-return]
        finally:
            client.close()
    except Exception:
        # A fact look-up: any failure means "not known here", never a crash in plan.
        return None


def local_image_digest(ref: str, *, timeout: float = FACT_TIMEOUT_SECONDS) -> str | None:
    """The local image ID (``sha256:…``) of ``ref``; None when absent or no daemon answers."""
    found = _inspect_image_fast(ref, timeout)
    return str(found["Id"]) if found else None


def inspect_image(ref: str, *, timeout: float = FACT_TIMEOUT_SECONDS) -> dict[str, Any] | None:
    """``docker image inspect ref`` (a tag, an ID or ``repo@sha256:…``), or None."""
    return _inspect_image_fast(ref, timeout)


def image_present(image_id: str, *, timeout: float = FACT_TIMEOUT_SECONDS) -> bool:
    """Whether this daemon holds the image with exactly this ID (``sha256:…``)."""
    found = _inspect_image_fast(image_id, timeout)
    return found is not None and found.get("Id") == image_id


def repo_digest(found: dict[str, Any], repository: str) -> str | None:
    """The ``repository@sha256:…`` of an inspected image in ``repository``, or None."""
    for entry in found.get("RepoDigests") or []:
        name, _, digest = str(entry).rpartition("@")
        if name == repository and digest.startswith("sha256:"):
            return str(entry)
    return None


def image_status(name: str, directory: Path | None = None) -> dict[str, Any]:
    """One row of ``images list``: built or not, ID, and whether it is stale (and why)."""
    directory = directory or recipes_dir()
    recipe = directory / name
    ref = image_ref(name)
    current = recipe_digest(recipe)
    found = _inspect_image_fast(ref, 5.0)
    row: dict[str, Any] = {
        "name": name,
        "ref": ref,
        "recipe": f"images/{name}",
        "recipe_digest": current,
        "built": found is not None,
        "id": None,
        "created": None,
        "stale": True,
        "reason": "not built",
        "software": {},
    }
    if found is None:
        return row
    labels = (found.get("Config") or {}).get("Labels") or {}
    row.update(
        id=found["Id"],
        created=found.get("Created"),
        stale=False,
        reason="",
        software=software_of(found),
    )
    parent = parent_recipe(recipe)
    if labels.get(LABEL_RECIPE_DIGEST) != current:
        row.update(stale=True, reason="recipe changed since the build")
    elif uses_wheelhouse(recipe) and labels.get(LABEL_LOCK_DIGEST) != lock_digest():
        row.update(stale=True, reason="dependency lock (requirements/agent.txt) changed")
    elif parent and labels.get(LABEL_PARENT) != local_image_digest(image_ref(parent)):
        row.update(stale=True, reason=f"parent {image_ref(parent)} was rebuilt")
    return row


def list_images(directory: Path | None = None) -> list[dict[str, Any]]:
    """``image_status`` for every recipe, in build order."""
    directory = directory or recipes_dir()
    return [image_status(name, directory) for name in recipe_names(directory)]
