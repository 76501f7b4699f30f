"""The demo from start to end: check Docker and the images, make the world, start the
endpoint, show the plan, apply, show what changed, remove everything it started."""

from __future__ import annotations

import contextlib
import shutil
import signal
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TextIO

from kagura_agent.demo.drive import Seen, demo_environment, run_apply
from kagura_agent.demo.world import World, endpoint_container, make_world
from kagura_agent.errors import SetupError, Terminated
from kagura_agent.hostproc import kagura_argv
from kagura_agent.hostproc import run as run_process
from kagura_agent.membrane import images
from kagura_agent.membrane.runtime import connect

BUILD_HINT = "build them once: kagura-agent images build --missing (a few minutes, no key)"
FILES = ("hello.py", "README.md", "NOTES.md")


@dataclass(frozen=True)
class DemoOptions:
    yes: bool
    image: str | None
    timeout: float
    keep: bool


def run_demo(options: DemoOptions, out: TextIO = sys.stdout) -> int:
    """The demo; apply's exit code."""
    client = connect()
    image = options.image or images.image_ref("agent")
    missing = [
        ref
        for ref in (image, images.image_ref("egress-proxy"))
        if images.local_image_digest(ref) is None
    ]
    if missing:
        raise SetupError(f"the demo needs the image(s) {', '.join(missing)}", hint=BUILD_HINT)
    root = Path(tempfile.mkdtemp(prefix="kagura-demo-"))
    world: World | None = None
    with _sigterm_interrupts():
        try:
            world = make_world(root, image)
            out.write(
                "kagura-agent demo: the real Claude Code CLI in the membrane. Its model is a"
                " SCRIPTED DEMO ENDPOINT the demo starts (no key, no model, nothing leaves"
                " this machine).\n"
                f"  project    {world.project}\n"
                f"  endpoint   container {world.container} on internal network"
                f" {world.network}\n\n"
            )
            out.flush()
            with endpoint_container(client, image, world):
                code = _plan(world, out)
                if code != 0:
                    return code
                out.write("\n── apply (the live run) ──\n")
                out.flush()
                seen = run_apply(world, out, yes=options.yes, wall_seconds=options.timeout)
                _summary(world, seen, out)
            return seen.exit_code
        finally:
            if world is not None:
                out.write(f"removed the demo endpoint {world.container} and {world.network}\n")
            if options.keep:
                out.write(f"kept the demo's folder: {root}\n")
            else:
                shutil.rmtree(root, ignore_errors=True)
                out.write(f"removed the demo's folder {root}\n")
            out.flush()


def _plan(world: World, out: TextIO) -> int:
    """``kagura-agent plan`` of the demo task, shown as it prints; its exit code."""
    out.write("── plan (what apply will run, and nothing else) ──\n")
    out.flush()
    done = run_process(
        kagura_argv("plan", "--manifests", str(world.manifests), str(world.task)),
        env=demo_environment(world),
        capture_output=True,
        text=True,
        timeout=120,
    )
    out.write(done.stdout)
    if done.returncode != 0:
        out.write(done.stderr)
    out.flush()
    return int(done.returncode)


def _summary(world: World, seen: Seen, out: TextIO) -> None:
    result = seen.result
    out.write("\n── what the run did ──\n")
    out.write(f"  outcome     {result.get('outcome', 'unknown')} (exit {seen.exit_code})\n")
    out.write(f"  tool calls  {', '.join(seen.tool_calls) or 'none'}\n")
    for question, answer in zip(seen.questions, seen.answers, strict=False):
        first = question.splitlines()[0] if question else ""
        out.write(f"  asked       {first}\n  answered    {answer}\n")
    for message in seen.steering:
        out.write(f"  steered     {message}\n")
    for name in FILES:
        path = world.project / name
        if path.is_file():
            text = path.read_text(encoding="utf-8", errors="replace")[:2000]
            out.write(f"\n  {name}:\n" + "".join(f"    | {line}\n" for line in text.splitlines()))
    out.flush()


@contextlib.contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """A SIGTERM ends the demo as Ctrl-C does: everything it started is removed."""

    def stop(signum: int, frame: FrameType | None) -> None:
        raise Terminated()

    before = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)
