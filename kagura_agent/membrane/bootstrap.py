"""Bootstrap a Debian bookworm base image on a machine with no image registry.

``debootstrap --variant=minbase`` builds a rootfs from the apt mirror the machine already
has configured (read from /etc/apt at run time — no mirror host is ever written into the
repository), and the rootfs is imported into Docker as ``kagura/bootstrap:bookworm``.
Every recipe in images/ then builds on it with ``--build-arg BASE_IMAGE=…``.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kagura_agent import hostproc
from kagura_agent.errors import SetupError
from kagura_agent.membrane.images import checkout_script
from kagura_agent.membrane.runtime import docker_errors

BOOTSTRAP_REF = "kagura/bootstrap:bookworm"
SUITE = "bookworm"
APT_DIR = Path("/etc/apt")


@dataclass(frozen=True)
class AptSource:
    """One ``deb`` line: a mirror URI, a suite and its components."""

    uri: str
    suite: str
    components: tuple[str, ...]

    def line(self) -> str:
        return f"deb {self.uri} {self.suite} {' '.join(self.components)}"


def _parse_one_line(text: str) -> list[AptSource]:
    found = []
    for raw in text.splitlines():
        words = raw.split("#", 1)[0].split()
        if len(words) < 3 or words[0] != "deb":
            continue
        words = words[1:]
        if words[0].startswith("["):  # options such as [signed-by=… arch=…]
            while words and not words[0].endswith("]"):
                words = words[1:]
            words = words[1:]
        if len(words) >= 2:
            found.append(AptSource(words[0], words[1], tuple(words[2:]) or ("main",)))
    return found


def _parse_deb822(text: str) -> list[AptSource]:
    found = []
    for stanza in text.split("\n\n"):
        fields: dict[str, str] = {}
        for raw in stanza.splitlines():
            if raw.startswith("#") or ":" not in raw or raw[:1].isspace():
                continue
            key, _, value = raw.partition(":")
            fields[key.strip().lower()] = value.strip()
        if "deb" not in fields.get("types", "").split() or fields.get("enabled") == "no":
            continue
        for uri in fields.get("uris", "").split():
            for suite in fields.get("suites", "").split():
                components = tuple(fields.get("components", "main").split())
                found.append(AptSource(uri, suite, components))
    return found


def apt_sources(apt_dir: Path = APT_DIR) -> list[AptSource]:
    """Every enabled ``deb`` source configured under ``apt_dir`` (one-line and deb822)."""
    found: list[AptSource] = []
    main = apt_dir / "sources.list"
    if main.is_file():
        found += _parse_one_line(main.read_text(errors="replace"))
    parts = apt_dir / "sources.list.d"
    if parts.is_dir():
        for path in sorted(parts.iterdir()):
            if path.suffix == ".list":
                found += _parse_one_line(path.read_text(errors="replace"))
            elif path.suffix == ".sources":
                found += _parse_deb822(path.read_text(errors="replace"))
    return found


def debian_sources(apt_dir: Path = APT_DIR, suite: str = SUITE) -> list[AptSource]:
    """The configured sources for ``suite`` and its -updates/-security companions.

    The first one is the plain suite (the mirror debootstrap uses). Raises SetupError
    when the machine has no mirror for the suite.
    """
    mine = [s for s in apt_sources(apt_dir) if s.suite.split("/")[0].split("-")[0] == suite]
    plain = [s for s in mine if s.suite == suite]
    if not plain:
        raise SetupError(
            f"no apt source for Debian {suite} is configured under {apt_dir}",
            hint="configure a bookworm mirror in /etc/apt/sources.list(.d), or use a machine"
            " that can pull debian:bookworm-slim",
        )
    rest = [s for s in mine if s not in plain[:1]]
    return [plain[0], *rest]


def bootstrap(
    client: Any,
    *,
    log: Callable[[str], None] = print,
    apt_dir: Path = APT_DIR,
    force: bool = False,
    ref: str = BOOTSTRAP_REF,
) -> str:
    """Build and import ``ref`` (``kagura/bootstrap:bookworm``); return its image ID.

    Skips (returning the existing ID) when the image exists and ``force`` is false.
    Needs root (debootstrap chroots) and the ``debootstrap`` tool.
    """
    api = client.api
    if not force:
        with docker_errors("looking up the bootstrap image"):
            existing = api.images(name=ref, quiet=True)
        if existing:
            log(f"{ref} already exists ({existing[0][:19]}); skipping")
            return str(existing[0])
    if shutil.which("debootstrap") is None:
        raise SetupError(
            "debootstrap is not installed",
            hint="install it (apt-get install debootstrap)" + checkout_script("docker-up.sh"),
        )
    sources = debian_sources(apt_dir)
    mirror = sources[0]
    with tempfile.TemporaryDirectory(prefix="kagura-rootfs-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        cmd = [
            "debootstrap",
            "--variant=minbase",
            "--include=ca-certificates",
            f"--components={','.join(mirror.components)}",
            SUITE,
            str(rootfs),
            mirror.uri,
        ]
        log(f"debootstrap {SUITE} from the configured mirror (this takes a few minutes)")
        proc = hostproc.run(
            cmd, env=hostproc.environment(), capture_output=True, text=True, check=False
        )
        if proc.returncode != 0:
            tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-15:])
            raise SetupError(f"debootstrap failed (exit {proc.returncode}):\n{tail}")
        _finish_rootfs(rootfs, sources)
        log(f"importing the rootfs as {ref}")
        image_id = _import(api, rootfs, ref)
    log(f"{ref} is {image_id}")
    return image_id


def _finish_rootfs(rootfs: Path, sources: list[AptSource]) -> None:
    """Point apt at the same mirrors as the host and drop caches from the image."""
    (rootfs / "etc/apt/sources.list").write_text("".join(s.line() + "\n" for s in sources))
    for cache in ("var/cache/apt/archives", "var/lib/apt/lists"):
        for item in (rootfs / cache).glob("*"):
            if item.is_file():
                item.unlink()
    # Keep the image's build-time downloads small and quiet in containers.
    (rootfs / "etc/apt/apt.conf.d/90kagura").write_text(
        'APT::Install-Recommends "false";\nAcquire::Languages "none";\n'
    )


def _import(api: Any, rootfs: Path, ref: str) -> str:
    """Stream ``tar`` of the rootfs into ``POST /images/create?fromSrc=-``."""
    repo, tag = ref.rsplit(":", 1)
    tar = hostproc.popen(
        ["tar", "--numeric-owner", "--xattrs", "-C", str(rootfs), "-c", "."],
        env=hostproc.environment(),
        stdout=subprocess.PIPE,
    )
    assert tar.stdout is not None
    with docker_errors(f"importing {ref}"):
        api.import_image_from_stream(tar.stdout, repository=repo, tag=tag, changes=['CMD ["bash"]'])
    if tar.wait() != 0:
        raise SetupError(f"tar of the rootfs failed (exit {tar.returncode})")
    with docker_errors(f"looking up {ref}"):
        return str(api.inspect_image(ref)["Id"])
