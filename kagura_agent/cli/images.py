"""``kagura-agent images``: bootstrap a base rootfs, build the recipes, list what is built."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from kagura_agent.cli.common import add_manifest_option, print_ok


def register(subparsers: Any) -> None:
    """Add ``images bootstrap|build|push|list``."""
    parser = subparsers.add_parser("images", help="build and list the container images")
    sub = parser.add_subparsers(dest="images_command", metavar="ACTION", required=True)

    boot = sub.add_parser(
        "bootstrap", help="debootstrap kagura/bootstrap:bookworm from the configured apt mirror"
    )
    boot.add_argument("--force", action="store_true", help="rebuild even if it exists")
    boot.set_defaults(handler=_bootstrap)

    build = sub.add_parser("build", help="build recipes from images/ (all when none named)")
    build.add_argument("names", nargs="*", metavar="NAME", help="recipe names (base, python…)")
    build.add_argument("-v", "--verbose", action="store_true", help="show every build line")
    build.add_argument(
        "--from-upstream",
        action="store_true",
        help="build on the digest-pinned upstream images even if the bootstrap image exists",
    )
    build.add_argument(
        "--missing",
        action="store_true",
        help="only the recipes not built yet or stale (recipe, lock or parent changed), and"
        " the recipes built on them; nothing when all are built and fresh",
    )
    build.add_argument("--json", action="store_true", help="print the built images as JSON")
    build.set_defaults(handler=_build)

    push = sub.add_parser(
        "push",
        help="push images to their Image manifest's repository; plans then pin repo@sha256:…",
    )
    push.add_argument(
        "names", nargs="*", metavar="IMAGE", help="Image manifest names (all with a repository)"
    )
    add_manifest_option(push)
    push.add_argument("--json", action="store_true", help="print the pushed references as JSON")
    push.set_defaults(handler=_push)

    listing = sub.add_parser("list", help="show each recipe's image, ID and staleness")
    listing.add_argument("--json", action="store_true", help="machine-readable output")
    listing.set_defaults(handler=_list)


def _progress(verbose: bool) -> Any:
    started = time.monotonic()

    def log(name: str, line: str) -> None:
        # Without --verbose only the milestones: builder steps and our own messages.
        quiet_noise = not line.startswith(("Step ", "pip wheel", "building", "built"))
        if verbose or not quiet_noise:
            elapsed = time.monotonic() - started
            print(f"[{elapsed:6.1f}s] {name:<12} {line.rstrip()}", file=sys.stderr, flush=True)

    return log


def _bootstrap(args: argparse.Namespace) -> int:
    from kagura_agent.membrane.bootstrap import bootstrap
    from kagura_agent.membrane.runtime import connect

    image_id = bootstrap(
        connect(), log=lambda line: print(line, file=sys.stderr, flush=True), force=args.force
    )
    print(image_id)
    return 0


def _build(args: argparse.Namespace) -> int:
    from kagura_agent.membrane.build import build
    from kagura_agent.membrane.runtime import connect

    names = list(args.names)
    if args.missing:
        names = _missing(names)
        if not names:
            if args.json:
                print_ok({"images": []})
            else:
                print("every image is built and fresh: nothing to build")
            return 0
    rows = build(
        connect(timeout=1800),
        names,
        log=_progress(args.verbose),
        upstream=args.from_upstream,
    )
    if args.json:
        print_ok({"images": rows})
    else:
        for row in rows:
            print(f"{row['ref']:<28} {row['id'][:19]}  {row['seconds']}s")
    return 0


def _missing(names: list[str]) -> list[str]:
    """Of ``names`` (all recipes when empty): those not built or stale, and every recipe
    built on one of them (its parent is about to change)."""
    from kagura_agent.membrane import images

    directory = images.recipes_dir()
    wanted = names or images.recipe_names(directory)
    todo = {row["name"] for row in images.list_images(directory) if row["stale"]}
    for name in wanted:
        parent = images.parent_recipe(directory / name)
        while parent and name not in todo:
            if parent in todo:
                todo.add(name)
            parent = images.parent_recipe(directory / parent)
    return [name for name in wanted if name in todo]


def _push(args: argparse.Namespace) -> int:
    from kagura_agent.errors import UsageError
    from kagura_agent.manifest.workspace import load_workspace
    from kagura_agent.membrane.registry import push

    images = load_workspace(args.manifests, []).catalog.of("Image")
    known = {image.name: image for image in images}
    unknown = [name for name in args.names if name not in known]
    if unknown:
        raise UsageError(
            "no Image manifest named " + ", ".join(unknown), hint="known: " + ", ".join(known)
        )
    chosen = [known[name] for name in args.names] or [
        image for image in images if image.spec.get("repository")
    ]
    bare = [image.name for image in chosen if not image.spec.get("repository")]
    if bare or not chosen:
        raise UsageError(
            "no repository to push to: " + (", ".join(bare) or "no Image names one"),
            hint="give the Image manifest a spec.repository (e.g. 127.0.0.1:5000/kagura/agent)",
        )
    pushed = []
    for image in chosen:
        ref = push(
            image.spec["tag"],
            image.spec["repository"],
            log=lambda line: print(line, file=sys.stderr, flush=True),
        )
        pushed.append({"name": image.name, "tag": image.spec["tag"], "pushed": ref})
    if args.json:
        print_ok({"images": pushed})
    else:
        for row in pushed:
            print(f"{row['name']:<12} {row['pushed']}")
    return 0


def _list(args: argparse.Namespace) -> int:
    from kagura_agent.membrane.images import list_images

    rows = list_images()
    if args.json:
        print_ok({"images": rows})
        return 0
    print(f"{'IMAGE':<28} {'ID':<19}  STATUS")
    for row in rows:
        status = "stale: " + row["reason"] if row["stale"] else "up to date"
        print(f"{row['ref']:<28} {(row['id'] or '-')[:19]:<19}  {status}")
        if row["software"]:
            baked = ", ".join(f"{name} {version}" for name, version in row["software"].items())
            print(f"{'':<28} bakes {baked}")
    return 0
