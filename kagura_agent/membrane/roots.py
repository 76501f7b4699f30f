"""Which directories may be a task's project root (mounted read-write at /workspace).

The agent can write anything under its project root, so a root must never be a place
whose contents the host trusts. Refused, after resolving symlinks (realpath):

- system directories and everything under them (/etc, /usr, /boot, /proc, /sys, /dev,
  /run, /var/lib, /var/log, /opt, …, and Docker's data root), and the shared tops
  themselves (/, /home, /tmp, /var, /srv, …: a folder inside them is fine);
- credential folders of the operator (~/.ssh, ~/.aws, ~/.config, ~/.gnupg, ~/.kube,
  ~/.docker, ~/.local, …) and anything inside them, and the operator's home itself;
- another user's home and anything inside it;
- the state, cache and memory locations of this tool, its installation (the package,
  the Python prefix running it) and its source checkout (the checkout's top, its .git,
  manifests/, schemas/, images/, scripts/);
- a directory owned by a user who is not the operator (see ``_owner_problem``; root may
  use a regular user's, or the dedicated ``kagura-agent`` account's);
- any directory that *contains* one of the refused places (a parent of the state
  directory, say).

An operator may widen the *soft* rules — another user's ownership or home, /opt, /srv —
for roots inside folders a ``Workspace`` manifest declares; the hard rules above never
move. ``check_project_root`` is called by validation/plan and again just before apply.
"""

from __future__ import annotations

import json
import os
import pwd
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from kagura_agent.manifest.cache import cache_dir
from kagura_agent.membrane.account import REGULAR_UIDS, agent_account_uid
from kagura_agent.paths import PACKAGE_DIR, state_dir, under

# Forbidden with everything below them.
_SYSTEM_TREES = (
    "/etc",
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/boot",
    "/proc",
    "/sys",
    "/dev",
    "/run",
    "/var/run",
    "/var/lib",
    "/var/log",
    "/var/cache",
    "/var/spool",
    "/var/mail",
    "/var/backups",
    "/snap",
    "/lost+found",
)
# Forbidden themselves; a folder of one's own inside them is fine.
_SHARED_TOPS = ("/home", "/tmp", "/var", "/var/tmp", "/mnt", "/media", "/srv")
# Soft system trees: an operator may declare workspace roots inside them.
_SOFT_TREES = ("/opt", "/var/opt")
_CREDENTIAL_FOLDERS = (
    ".ssh",
    ".aws",
    ".config",
    ".gnupg",
    ".kube",
    ".docker",
    ".azure",
    ".gcloud",
    ".local",
    ".cache",
    ".password-store",
    ".terraform.d",
    "bin",
)
_CHECKOUT_PARTS = (".git", "manifests", "schemas", "images", "scripts", ".ci")
_DOCKER_DEFAULT_ROOT = "/var/lib/docker"
_DOCKER_CONFIG = "/etc/docker/daemon.json"
_MAX_USERS = 10000  # a directory service may list many; beyond this they are not walked


@dataclass(frozen=True)
class Place:
    path: str
    reason: str
    tree: bool = True  # refuse everything below it too, not only the place itself
    soft: bool = False  # a declared Workspace root may lift it


def _real(path: str | Path) -> str:
    return os.path.realpath(os.path.expanduser(str(path)))


def operator_uids() -> set[int]:
    """The uid running the tool, plus the invoking user under sudo."""
    uids = {os.geteuid()}
    sudo = os.environ.get("SUDO_UID", "")
    if os.geteuid() == 0 and sudo.isdigit():
        uids.add(int(sudo))
    return uids


def _operator_homes() -> set[str]:
    homes = {_real(Path.home())}
    for uid in operator_uids():
        try:
            homes.add(_real(pwd.getpwuid(uid).pw_dir))
        except KeyError:
            continue
    return {h for h in homes if h != "/"}


def docker_data_root() -> str:
    """Docker's data root from its daemon.json when set there, else the default."""
    try:
        with open(_DOCKER_CONFIG, encoding="utf-8") as handle:
            config = json.loads(handle.read(65536))
        root = config.get("data-root") if isinstance(config, dict) else None
        if isinstance(root, str) and root.startswith("/"):
            return root
    except (OSError, ValueError):
        pass
    return _DOCKER_DEFAULT_ROOT


def _git_top(start: Path) -> Path | None:
    for folder in (start, *start.parents):
        if (folder / ".git").exists():
            return folder
    return None


def forbidden_places(extra: Iterable[tuple[str, str]] = ()) -> list[Place]:
    """Every refused place on this host, resolved. ``extra`` adds (path, reason) trees."""
    places = [Place("/", "the host root directory", tree=False)]
    places += [Place(p, "a system directory") for p in _SYSTEM_TREES]
    places += [Place(p, "a shared system directory", tree=False) for p in _SHARED_TOPS]
    places += [
        Place(p, "a system directory for installed software", soft=True) for p in _SOFT_TREES
    ]
    places.append(Place(docker_data_root(), "Docker's data root"))
    homes = _operator_homes()
    for home in sorted(homes):
        places.append(Place(home, "the operator's home directory itself", tree=False))
        for folder in _CREDENTIAL_FOLDERS:
            places.append(Place(os.path.join(home, folder), "a credential or tool folder"))
    places.append(Place(str(state_dir()), "the kagura-agent state directory"))
    places.append(Place(str(cache_dir()), "the kagura-agent cache directory"))
    places.append(Place(str(PACKAGE_DIR), "the kagura-agent installation"))
    for prefix in {sys.prefix, sys.exec_prefix, sys.base_prefix}:
        places.append(Place(prefix, "the Python installation running kagura-agent"))
    checkout = PACKAGE_DIR.parent
    if (checkout / "pyproject.toml").exists():  # a source checkout, not site-packages
        tops = {checkout}
        git_top = _git_top(checkout)
        if git_top is not None:
            tops.add(git_top)
        for top in sorted(tops):
            places.append(Place(str(top), "the kagura-agent source checkout", tree=False))
            for part in _CHECKOUT_PARTS:
                places.append(Place(str(top / part), "the kagura-agent source checkout"))
    places += [Place(path, reason) for path, reason in extra]
    places += _other_homes(homes)
    resolved = []
    for place in places:
        real = _real(place.path)
        if real == "/" and place.tree:
            continue  # a prefix or home of "/" would refuse everything
        resolved.append(Place(real, place.reason, place.tree, place.soft))
    return resolved


def _other_homes(operator_homes: set[str]) -> list[Place]:
    uids = operator_uids()
    skip = {_real(p) for p in ("/", *_SHARED_TOPS, *_SYSTEM_TREES)} | operator_homes
    found = []
    for count, entry in enumerate(pwd.getpwall()):
        if count >= _MAX_USERS:
            break
        if entry.pw_uid in uids or not entry.pw_dir.startswith("/"):
            continue
        home = _real(entry.pw_dir)
        if home in skip:
            continue
        found.append(Place(home, f"the home directory of user {entry.pw_name}", soft=True))
    return found


def check_project_root(
    root: str,
    *,
    allowed: Sequence[str] = (),
    extra: Iterable[tuple[str, str]] = (),
    places: Sequence[Place] | None = None,
) -> str | None:
    """Why ``root`` must not be a project root, or None when it may be.

    ``allowed`` are workspace roots an operator manifest declares (soft rules lifted
    inside them); ``extra`` more (path, reason) places to refuse (memory files, say).
    """
    real = _real(root)
    moved = f" (resolves to {real})" if real != os.path.normpath(root) else ""
    declared = any(under(real, _real(a)) for a in allowed)
    within: Place | None = None  # the most specific place the root is or is inside
    contained: Place | None = None  # the first refused place the root contains
    for place in places if places is not None else forbidden_places(extra):
        if place.soft and declared:
            continue
        if real == place.path or (place.tree and under(real, place.path)):
            if within is None or len(place.path) > len(within.path):
                within = place
        elif contained is None and under(place.path, real):
            contained = place
    if within is not None:
        where = "is" if real == within.path else f"is inside {within.path},"
        return f"project root {root}{moved} {where} {within.reason}"
    if contained is not None:
        return f"project root {root}{moved} contains {contained.path}, {contained.reason}"
    if not declared:
        return _owner_problem(root, real, moved)
    return None


def _owner_problem(root: str, real: str, moved: str) -> str | None:
    """The operator must own the root. Root as operator may use a regular user's folder
    (the agent then runs as that user) or one of the dedicated agent account's (what
    ``kagura-agent init`` makes as root, membrane/account.py), never another system
    account's (uid 1-999, nobody)."""
    try:
        owner = os.stat(real).st_uid
    except OSError as exc:
        return f"project root {root}{moved} cannot be read: {exc.strerror}"
    uids = operator_uids()
    if owner in uids or (0 in uids and (owner in REGULAR_UIDS or owner == agent_account_uid())):
        return None
    who = _user_name(owner)
    return (
        f"project root {root}{moved} is owned by {who}, not by the operator"
        f" ({', '.join(_user_name(u) for u in sorted(uids))})"
    )


def _user_name(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"
