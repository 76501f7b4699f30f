"""kagura/agent-test: the agent image plus the fake CLIs and this checkout's kagura_agent.

Built FROM kagura/agent:<version> so apply runs its real entrypoint, hardening and
channel; the fake ``claude`` and ``codex`` (testing/fake_claude) go on PATH and the SDK
is pointed at the fake with KAGURA_CLAUDE_CLI (its bundled CLI would win over PATH).
``ensure_agent_test_image(client, real_cli=True)`` builds the variant the conformance
tests use: no fakes at all, so the SDK runs the Claude Code CLI it bundles (the one the
packaged agent image ships), against testing/fake_messages_api.py through the run's proxy.
testing/fake_mcp.py goes to /opt/mcp/notes.py (an MCP tool server for tests).
The current source is copied to /opt/src, put first on the venv's path by a ``.pth`` file
in its site-packages (site reads it also under ``python3 -I``, which ignores PYTHONPATH),
so tests exercise this checkout even when the agent image predates it; the image's
ENTRYPOINT and WORKDIR are the agent recipe's, for the same reason. Fakes log each call
to /workspace so a test can read them from the project root. Rebuilt when any input changes (a content
digest label, also in the tag so concurrent checkouts do not clobber each other's image),
otherwise reused.
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import tarfile
from pathlib import Path
from typing import Any

from kagura_agent.membrane import images
from kagura_agent.membrane.build import CONTAINER_PYTHON
from testing.fake_claude import FAKE_DIR

LOCK = "/tmp/kagura-agent-test-image.lock"

REPO = Path(__file__).resolve().parents[1]
LABEL_INPUTS = "dev.kagura.test-inputs"
FAKE_LOG = "/workspace/.fake-calls.jsonl"
MCP_SERVER = "/opt/mcp/notes.py"
SITE_PACKAGES = "/opt/kagura/lib/python{}.{}/site-packages".format(*CONTAINER_PYTHON)
OVERLAY_PTH = "import sys; '/opt/src' in sys.path or sys.path.insert(0, '/opt/src')\n"
DOCKERFILE = """\
ARG AGENT_IMAGE
FROM ${{AGENT_IMAGE}}
COPY fakes/ /opt/fakes/
COPY mcp/ /opt/mcp/
COPY src/ /opt/src/kagura_agent/
COPY pth/ {site}/
ENV PATH=/opt/fakes:/opt/kagura/bin:/usr/local/bin:/usr/bin:/bin \\
    KAGURA_CLAUDE_CLI=/opt/fakes/claude \\
    KAGURA_FAKE_LOG={log}
{recipe}
LABEL {label}={digest}
"""
# The real CLI's variant: the same source and MCP fake, no fake CLI anywhere.
REAL_CLI_DOCKERFILE = """\
ARG AGENT_IMAGE
FROM ${{AGENT_IMAGE}}
COPY mcp/ /opt/mcp/
COPY src/ /opt/src/kagura_agent/
COPY pth/ {site}/
{recipe}
LABEL {label}={digest}
"""


def recipe_start() -> str:
    """The agent recipe's last WORKDIR and ENTRYPOINT lines: how its entrypoint starts."""
    lines = (REPO / "images" / "agent" / "Dockerfile").read_text(encoding="utf-8").splitlines()
    found = {}
    for line in lines:
        word = line.split(" ", 1)[0]
        if word in ("WORKDIR", "ENTRYPOINT"):
            found[word] = line
    return "\n".join(found[word] for word in ("WORKDIR", "ENTRYPOINT"))


def test_image_ref() -> str:
    return images.image_ref("agent-test")


def _files(real_cli: bool = False) -> dict[str, Path]:
    files = {} if real_cli else {f"fakes/{name}": FAKE_DIR / name for name in ("claude", "codex")}
    # The MCP fake, where docs/authority.md's example image variant has its server: the
    # stdio tool server's command, and the http tool server a test runs from this image.
    files[MCP_SERVER.removeprefix("/opt/")] = FAKE_DIR.parent / "fake_mcp.py"
    source = REPO / "kagura_agent"
    for path in sorted(source.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            files[f"src/{path.relative_to(source)}"] = path
    return files


def _digest(agent_id: str, files: dict[str, Path]) -> str:
    digest = hashlib.sha256(agent_id.encode())
    for name, path in files.items():
        digest.update(name.encode() + b"\0" + path.read_bytes())
    for text in (OVERLAY_PTH, recipe_start()):
        digest.update(b"\0" + text.encode())
    return digest.hexdigest()[:32]


def _context(files: dict[str, Path], dockerfile: str) -> io.BytesIO:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, path in files.items():
            info = tar.gettarinfo(str(path), arcname=name)
            info.uid = info.gid = 0
            info.mode = 0o755 if name.startswith("fakes/") else 0o644
            with path.open("rb") as handle:
                tar.addfile(info, handle)
        for name, text in (("pth/00-kagura-src.pth", OVERLAY_PTH), ("Dockerfile", dockerfile)):
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    buffer.seek(0)
    return buffer


def ensure_agent_test_image(client: Any, *, real_cli: bool = False) -> str:
    """The test image's ref, built from the local agent image when missing or stale;
    ``real_cli``: the variant that keeps the SDK's bundled Claude Code CLI."""
    agent = images.image_ref("agent")
    agent_id = images.local_image_digest(agent)
    if agent_id is None:
        raise RuntimeError(f"{agent} is not built (kagura-agent images build agent)")
    files = _files(real_cli)
    template = REAL_CLI_DOCKERFILE if real_cli else DOCKERFILE
    digest = _digest(agent_id + template, files)
    # One tag per input digest: checkouts testing concurrently on one daemon (worktrees)
    # must not rebuild each other's image under a run (its digest is in the plan).
    ref = f"{test_image_ref()}-{'real-' if real_cli else ''}{digest[:12]}"
    if _built(client, ref, digest):
        return ref
    # Parallel test workers (pytest-xdist) ask at once: one builds, the others wait for it.
    with open(LOCK, "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _built(client, ref, digest):
            return ref
        dockerfile = template.format(
            log=FAKE_LOG,
            label=LABEL_INPUTS,
            digest=digest,
            site=SITE_PACKAGES,
            recipe=recipe_start(),
        )
        _build(client, ref, agent, files, dockerfile)
    return ref


def _built(client: Any, ref: str, digest: str) -> bool:
    try:
        labels = client.images.get(ref).labels or {}
    except Exception:  # docker.errors.ImageNotFound: build it
        labels = {}
    return labels.get(LABEL_INPUTS) == digest


def _build(client: Any, ref: str, agent: str, files: dict[str, Path], dockerfile: str) -> None:
    client.images.build(
        fileobj=_context(files, dockerfile),
        custom_context=True,
        tag=ref,
        buildargs={"AGENT_IMAGE": agent},
        rm=True,
        forcerm=True,
        network_mode="none",
    )
