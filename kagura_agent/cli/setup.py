"""kagura-agent setup: the first run, interactive or by flags, and safe to run again.

1. Docker: is a daemon answering? (the fix when not: start it, or join the socket's group)
2. images: build the recipes that are missing or stale (asks; ``--build-images``)
3. the Anthropic API key stored in the OS keyring — and read back from it — when one is
   given; the backend is named, and one that keeps it in a plain file is refused unless
   ``--allow-plaintext-keyring``
4. a starter operator folder (layered on the packaged defaults) whose provider reads the
   key from the keyring: written only when that reference resolves (step 3 done now or
   before), so the packaged ``env:ANTHROPIC_API_KEY`` is never replaced by a reference
   that does not work; a file that exists is kept
5. doctor, on that folder

Nothing is written unless every step it reports as done is done; no secret is printed.
"""

from __future__ import annotations

import argparse
import getpass
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

KEYRING_SERVICE = "kagura-agent"
STARTER = """\
# The operator's folder, layered on kagura-agent's packaged defaults: a manifest here with
# the same kind and name replaces the packaged one; anything else adds to the set.
# Written by `kagura-agent setup`; yours to edit and keep in git.
apiVersion: kagura.dev/v1
kind: CredentialProvider
metadata:
  name: anthropic
  description: The Anthropic API key, from the OS keyring (kagura-agent setup stored it).
spec:
  type: static
  standing: true
  secret: keyring:{service}/anthropic
  static:
    env: ANTHROPIC_API_KEY
  baseline_scopes: [api]
  scopes:
    api:
      description: Call the Anthropic API.
"""


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "setup", help="first run: Docker, images, a starter manifest folder, secrets, doctor"
    )
    parser.add_argument(
        "--dir",
        default=None,
        metavar="DIR",
        help="the operator folder (default: the one commands read: $KAGURA_AGENT_MANIFESTS,"
        " else ./manifests)",
    )
    parser.add_argument(
        "--yes", action="store_true", help="non-interactive: take the flags, ask nothing"
    )
    parser.add_argument("--build-images", action="store_true", help="build missing or stale images")
    parser.add_argument(
        "--anthropic-key-env",
        metavar="NAME",
        help="store the value of $NAME in the keyring as the Anthropic API key",
    )
    parser.add_argument(
        "--allow-plaintext-keyring",
        action="store_true",
        help="store the key even in a keyring backend that keeps it in a plain file"
        " (keyrings.alt's PlaintextKeyring)",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from kagura_agent.cli.doctor import print_checks
    from kagura_agent.doctor import run_checks
    from kagura_agent.errors import ExitCode

    interactive = not args.yes and sys.stdin.isatty()
    folder = _folder(args.dir)
    docker_up = _docker()
    if docker_up:
        _images(args, interactive)
    # The key first: the folder's provider is written only once its reference resolves.
    reference = _secret(args, interactive)
    _starter(folder, reference)
    print("== doctor", flush=True)
    # The folder when there is one; else what commands read without it.
    checks = run_checks(str(folder) if folder.is_dir() else None)
    failed = print_checks(checks)
    return int(ExitCode.DOCTOR) if failed else 0


def _say(text: str) -> None:
    print(text, flush=True)


def _ask(question: str, default: bool) -> bool:
    answer = input(f"{question} [{'Y/n' if default else 'y/N'}] ").strip().lower()
    return default if not answer else answer in ("y", "yes")


def _folder(explicit: str | None) -> Path:
    """The operator folder to write; a folder later commands will not read by default is
    said, with how to make them read it."""
    default = Path(os.environ.get("KAGURA_AGENT_MANIFESTS") or "manifests")
    folder = Path(explicit) if explicit else default
    if folder.resolve() != default.resolve():
        _say(
            f"manifests: {folder} is not the folder commands read by default ({default}):"
            f" pass --manifests {folder} to each command, or export"
            f" KAGURA_AGENT_MANIFESTS={folder.resolve()}"
        )
    return folder


def _docker() -> bool:
    from kagura_agent.membrane.images import (
        daemon_info,
        docker_socket,
        socket_refuses_user,
        unreachable_hint,
    )

    info = daemon_info()
    if info is None:
        denied = socket_refuses_user(docker_socket())
        said = "this user may not use the socket" if denied else "no daemon answers"
        _say(f"docker: {said}: {unreachable_hint(denied=denied)}")
        return False
    _say(f"docker: ok (server {info.get('ServerVersion', '?')})")
    return True


def _images(args: argparse.Namespace, interactive: bool) -> None:
    from kagura_agent.errors import KaguraError
    from kagura_agent.membrane.images import list_images

    try:
        todo = [row["name"] for row in list_images() if row["stale"]]
    except KaguraError as exc:
        _say(f"images: {exc.message}")
        return
    if not todo:
        _say("images: all built and fresh")
        return
    _say(f"images: to build: {', '.join(todo)}")
    build = args.build_images or (interactive and _ask("Build them now?", True))
    if not build:
        _say("images: skipped (kagura-agent images build)")
        return
    from kagura_agent.membrane.build import build as build_images
    from kagura_agent.membrane.runtime import connect

    for row in build_images(connect(timeout=1800), todo, log=lambda n, line: None):
        _say(f"images: built {row['ref']} in {row['seconds']}s")


def _starter(folder: Path, reference: str | None) -> None:
    target = folder / "operator.yml"
    if target.exists():
        _say(f"manifests: {target} exists, kept")
        return
    if reference is None:
        _say(
            f"manifests: nothing written to {folder}: no key is in the keyring, so the"
            " packaged provider (env:ANTHROPIC_API_KEY) stays in force"
        )
        return
    folder.mkdir(parents=True, exist_ok=True)
    target.write_text(STARTER.format(service=KEYRING_SERVICE), encoding="utf-8")
    _say(f"manifests: wrote {target} (layered on the packaged defaults; the key: {reference})")


REFERENCE = f"keyring:{KEYRING_SERVICE}/anthropic"


def _secret(args: argparse.Namespace, interactive: bool) -> str | None:
    """Store the key when one is given and read it back; the keyring reference when it
    resolves (now or from an earlier run), else None. SetupError when storing fails."""
    from kagura_agent.errors import SetupError

    value = ""
    if args.anthropic_key_env:
        value = os.environ.get(args.anthropic_key_env, "")
        if not value:
            raise SetupError(f"${args.anthropic_key_env} is empty or not set")
    elif interactive:
        value = getpass.getpass("Anthropic API key (empty: keep/skip): ").strip()
    if not value:
        return _no_key_given(interactive)
    keyring = _keyring()
    backend = _backend(keyring)
    if backend.fails:
        raise SetupError(
            f"no OS keyring here ({backend.name}): the key was not stored and nothing was written",
            hint="keep the key in the environment (export ANTHROPIC_API_KEY=…, the packaged"
            " provider reads it), or install a keyring backend",
        )
    if backend.plaintext and not args.allow_plaintext_keyring:
        raise SetupError(
            f"the keyring backend is {backend.name}, which keeps the key in a plain file"
            f"{backend.where} (base64 is no encryption): the key was not stored and nothing"
            " was written",
            hint="use an encrypted keyring (Secret Service, macOS Keychain, Windows"
            " Credential Locker; PYTHON_KEYRING_BACKEND picks one), keep export"
            " ANTHROPIC_API_KEY=…, or pass --allow-plaintext-keyring",
        )
    try:
        keyring.set_password(KEYRING_SERVICE, "anthropic", value)
        back = keyring.get_password(KEYRING_SERVICE, "anthropic")
    except keyring.errors.KeyringError as exc:
        raise SetupError(
            f"the keyring ({backend.name}) refused the key ({type(exc).__name__}): nothing"
            " was written",
            hint="keep the key in the environment: export ANTHROPIC_API_KEY=…",
        ) from None
    if back != value:
        raise SetupError(
            f"the keyring ({backend.name}) did not give the key back: nothing was written"
        )
    plain = " — a plain file, as --allow-plaintext-keyring allowed" if backend.plaintext else ""
    _say(f"secrets: stored as {REFERENCE} in {backend.name}{backend.where}{plain}")
    return REFERENCE


def _no_key_given(interactive: bool) -> str | None:
    """No key to store: say what holds the key now (never "unchanged" for a key that
    was never stored)."""
    from kagura_agent.errors import KaguraError
    from kagura_agent.membrane.secrets import resolve

    try:
        resolve(REFERENCE)
    except KaguraError:
        pass
    else:
        _say(f"secrets: unchanged ({REFERENCE} resolves)")
        return REFERENCE
    why = (
        "none typed"
        if interactive
        else "stdin is not a terminal; --anthropic-key-env NAME stores the value of $NAME"
    )
    held = "set in this shell" if os.environ.get("ANTHROPIC_API_KEY") else "not set here"
    _say(f"secrets: no key stored ({why}); the key stays env:ANTHROPIC_API_KEY ({held})")
    return None


@dataclass(frozen=True)
class _Backend:
    """The keyring backend a write goes to: its name, whether it keeps values in a plain
    file, whether it refuses every write (no keyring), and its file when it has one."""

    name: str
    plaintext: bool
    fails: bool
    where: str


def _keyring() -> Any:
    from kagura_agent.errors import SetupError

    try:
        import keyring
        import keyring.errors
    except ImportError:
        raise SetupError(
            "storing the key needs the keyring package", hint="pip install 'kagura-agent[keyring]'"
        ) from None
    return keyring


def _backend(keyring: Any) -> _Backend:
    """The backend a write goes to (a chainer's first), named as module.Class."""
    chosen = keyring.get_keyring()
    inner = getattr(chosen, "backends", None)
    if type(chosen).__name__ == "ChainerBackend" and inner:
        chosen = inner[0]
    kind = type(chosen)
    name = f"{kind.__module__}.{kind.__name__}"
    fails = kind.__module__ == "keyring.backends.fail"
    plaintext = "plaintext" in kind.__name__.lower()
    path = getattr(chosen, "file_path", None)
    return _Backend(name, plaintext=plaintext, fails=fails, where=f" ({path})" if path else "")
