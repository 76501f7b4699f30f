"""Which host paths may cross into the container as bind mounts.

The rules (one function, called by plan validation and again by the runtime just before
a container is created, because the file system can change between the two):

- the source is resolved with realpath; a path whose resolution leaves the project root
  (a symlink planted inside it pointing at /etc, say) is judged by where it lands;
- sockets, device files and FIFOs are never mounted (docker.sock above all);
- never ``/``, the home directory, or a directory holding either of them;
- only the project root itself may be writable; everything else is read-only.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from kagura_agent.paths import under

# Anything that exposes a container engine is a full host escape, whatever its mode.
_ENGINE_SOCKETS = ("docker.sock", "containerd.sock", "podman.sock", "crio.sock")
_SYSTEM_PREFIXES = ("/proc", "/sys", "/dev", "/run", "/var/run", "/boot")


def _home_dirs() -> list[str]:
    homes = {os.path.realpath(Path.home())}
    sudo_home = os.environ.get("SUDO_USER")
    if sudo_home:
        homes.add(os.path.realpath(Path(f"~{sudo_home}").expanduser()))
    return sorted(homes)


def check_mount(source: str, project_root: str, *, writable: bool) -> str | None:
    """Return why ``source`` must not be bind-mounted, or None when it may be.

    ``writable`` asks for a read-write bind; only the project root itself may have one.
    ``project_root`` is the task's project root (resolved here too).
    """
    if not os.path.isabs(source):
        return f"mount source {source!r} is not an absolute path"
    real = os.path.realpath(source)
    root = os.path.realpath(project_root)
    moved = f" (resolves to {real})" if real != os.path.normpath(source) else ""
    try:
        mode = os.stat(real).st_mode
    except OSError as exc:
        return f"mount source {source}{moved} cannot be read: {exc.strerror}"
    if os.path.basename(real) in _ENGINE_SOCKETS or os.path.basename(source) in _ENGINE_SOCKETS:
        return f"mount source {source}{moved} is a container engine socket"
    if stat.S_ISSOCK(mode):
        return f"mount source {source}{moved} is a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return f"mount source {source}{moved} is a device file"
    if stat.S_ISFIFO(mode):
        return f"mount source {source}{moved} is a FIFO"
    if real == "/":
        return f"mount source {source}{moved} is the host root directory"
    for home in _home_dirs():
        if under(home, real):
            return f"mount source {source}{moved} is or contains the home directory {home}"
    for prefix in _SYSTEM_PREFIXES:
        if under(real, prefix):
            return f"mount source {source}{moved} is under the system directory {prefix}"
    if _is_link_escape(source, project_root, root, real):
        return f"mount source {source} is a symlink that leaves the project root {root}{moved}"
    if writable and real != root:
        return (
            f"mount source {source}{moved} may only be read-only; only the project root is writable"
        )
    return None


def _is_link_escape(source: str, project_root: str, root: str, real: str) -> bool:
    """True when ``source`` is written inside the project root but resolves outside it."""
    lexical = os.path.normpath(source)
    written_inside = under(lexical, os.path.normpath(project_root)) or under(lexical, root)
    return written_inside and not under(real, root)
