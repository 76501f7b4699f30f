"""kagura-agent setup: the first run, interactive or by flags, and safe to run again.

1. Docker: is a daemon answering? (the fix when not)
2. images: build the recipes that are missing or stale (asks; ``--build-images``)
3. a starter operator folder (layered on the packaged defaults): written once, kept after
4. the Anthropic API key stored in the OS keyring; the folder holds only the reference
5. doctor, on that folder

Nothing is overwritten: a file that exists is kept and named. No secret is ever printed.
"""

from __future__ import annotations

import argparse
import getpass
import os
import sys
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
        "--dir", default="manifests", metavar="DIR", help="the operator folder (./manifests)"
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
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from kagura_agent.cli.doctor import print_checks
    from kagura_agent.doctor import run_checks
    from kagura_agent.errors import ExitCode

    interactive = not args.yes and sys.stdin.isatty()
    docker_up = _docker()
    if docker_up:
        _images(args, interactive)
    folder = Path(args.dir)
    _starter(folder)
    _secret(args, interactive)
    print("== doctor", flush=True)
    checks = run_checks(str(folder))
    failed = print_checks(checks)
    return int(ExitCode.DOCTOR) if failed else 0


def _say(text: str) -> None:
    print(text, flush=True)


def _ask(question: str, default: bool) -> bool:
    answer = input(f"{question} [{'Y/n' if default else 'y/N'}] ").strip().lower()
    return default if not answer else answer in ("y", "yes")


def _docker() -> bool:
    from kagura_agent.membrane.images import daemon_info

    info = daemon_info()
    if info is None:
        _say("docker: no daemon answers (start it: bash scripts/docker-up.sh, or dockerd)")
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


def _starter(folder: Path) -> None:
    target = folder / "operator.yml"
    if target.exists():
        _say(f"manifests: {target} exists, kept")
        return
    folder.mkdir(parents=True, exist_ok=True)
    target.write_text(STARTER.format(service=KEYRING_SERVICE), encoding="utf-8")
    _say(f"manifests: wrote {target} (layered on the packaged defaults)")


def _secret(args: argparse.Namespace, interactive: bool) -> None:
    from kagura_agent.errors import SetupError

    value = ""
    if args.anthropic_key_env:
        value = os.environ.get(args.anthropic_key_env, "")
        if not value:
            raise SetupError(f"${args.anthropic_key_env} is empty or not set")
    elif interactive:
        value = getpass.getpass("Anthropic API key (empty: keep/skip): ").strip()
    if not value:
        _say(f"secrets: unchanged (keyring:{KEYRING_SERVICE}/anthropic)")
        return
    try:
        import keyring
        import keyring.errors

        keyring.set_password(KEYRING_SERVICE, "anthropic", value)
    except ImportError:
        raise SetupError(
            "storing the key needs the keyring package", hint="pip install 'kagura-agent[keyring]'"
        ) from None
    except keyring.errors.KeyringError as exc:
        raise SetupError(f"the keyring refused the key ({type(exc).__name__})") from None
    _say(f"secrets: stored as keyring:{KEYRING_SERVICE}/anthropic")
