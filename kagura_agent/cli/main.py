"""The ``kagura-agent`` entry point: argument parsing and the one place errors become exit codes.

Every command lives in its own module under kagura_agent/cli/ and exposes
``register(subparsers)``, which adds its parser and sets ``handler`` to a function
``(argparse.Namespace) -> int``. Command modules import only the standard library at
module level so that ``--help``, ``validate`` and ``plan`` start fast.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import sys
from collections.abc import Iterator, Sequence
from typing import NoReturn

from kagura_agent import __version__
from kagura_agent.errors import ExitCode, KaguraError, Terminated

# Command modules in the order --help lists them.
COMMAND_MODULES: tuple[str, ...] = (
    "init",
    "validate",
    "plan",
    "review",
    "show",
    "schema",
    "apply",
    "run",
    "serve",
    "runner",
    "queue",
    "images",
    "graduation",
    "memory",
    "leases",
    "push",
    "incidents",
    "aftercare",
    "egress",
    "web",
    "doctor",
    "setup",
    "demo",
    "completion",
)


class _JsonParser(argparse.ArgumentParser):
    """Under ``--json`` a usage mistake is a UsageError, so it becomes the JSON envelope."""

    def error(self, message: str) -> NoReturn:
        from kagura_agent.errors import UsageError

        raise UsageError(message, hint=self.format_usage().strip())


def build_parser(
    *, json_errors: bool = False, modules: Sequence[str] | None = None
) -> argparse.ArgumentParser:
    parser_class = _JsonParser if json_errors else argparse.ArgumentParser
    parser = parser_class(
        prog="kagura-agent",
        description="Plan, review and apply memory-backed agent runs behind a hardened membrane.",
        epilog="exit codes: 0 ok, 1 task failed, 2 usage/validation error, 3 setup not ready,"
        " 4 doctor failed, 5 plan has changes (--detailed-exitcode), 6 refused",
    )
    parser.add_argument("--version", action="version", version=f"kagura-agent {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES if modules is None else modules:
        module = importlib.import_module(f"kagura_agent.cli.{name}")
        module.register(subparsers)
    return parser


def cached_parser(*, json_errors: bool = False) -> argparse.ArgumentParser:
    """``build_parser``, once per process and command list: parsing does not change a
    parser, and building one costs ~25 ms (argparse looks up translations for each option
    of each command), which a caller running ``main`` many times in one process (tests)
    pays every time. Keyed by ``COMMAND_MODULES`` too: a parser built for another list
    (a test that registers one command) is never the answer for this one."""
    return _parser_for(json_errors, tuple(COMMAND_MODULES))


@functools.cache
def _parser_for(json_errors: bool, modules: tuple[str, ...]) -> argparse.ArgumentParser:
    return build_parser(json_errors=json_errors, modules=modules)


def main(argv: Sequence[str] | None = None) -> int:
    from kagura_agent.cli.common import wants_json

    words = list(sys.argv[1:] if argv is None else argv)
    json_mode = wants_json(None, words)
    parser = cached_parser(json_errors=json_mode)
    try:
        _utf8_words(words)
        args = parser.parse_args(words)
    except KaguraError as exc:  # only under --json (_JsonParser)
        return _fail(exc, json_mode)
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help(sys.stderr)
        return int(ExitCode.USAGE)
    try:
        with _state_manifests(getattr(args, "manifests", None)):
            code = int(handler(args))
        if argv is None and getattr(args, "fast_exit", False):
            _exit_now(code)
        return code
    except KaguraError as exc:
        return _fail(exc, wants_json(args, words))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Terminated:
        print("terminated", file=sys.stderr)
        return 143
    except BrokenPipeError:
        return int(ExitCode.OK)


def _utf8_words(words: Sequence[str]) -> None:
    """Refuse an argument that is not UTF-8 (Python carries its bytes as lone surrogates):
    a file name or text that cannot be stored, shown or written into a plan as text."""
    for index, word in enumerate(words, start=1):
        try:
            word.encode("utf-8")
        except UnicodeEncodeError:
            from kagura_agent.errors import UsageError

            shown = word.encode("utf-8", "surrogateescape").decode("ascii", "backslashreplace")
            raise UsageError(
                f"argument {index} is not UTF-8 text: {shown}",
                hint="kagura-agent reads file and folder names and text as UTF-8; rename it",
            ) from None


@contextlib.contextmanager
def _state_manifests(manifests: str | None) -> Iterator[None]:
    """With ``--manifests DIR``, that folder's State manifest chooses the state store, for
    this command and the processes it starts (the cockpit's applies, a runner's); put
    back after, for a caller in the same process."""
    import os

    from kagura_agent.manifest.statebackend import MANIFESTS_ENV

    if not manifests:
        yield
        return
    before = os.environ.get(MANIFESTS_ENV)
    os.environ[MANIFESTS_ENV] = os.path.abspath(manifests)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(MANIFESTS_ENV, None)
        else:
            os.environ[MANIFESTS_ENV] = before


def _exit_now(code: int) -> NoReturn:
    """End the process without the interpreter's teardown (freeing every module and object
    one by one: ~100 ms of CPU after an apply). Only for commands that opt in
    (``fast_exit``: everything of theirs is closed and written by the time they return)
    and only as a program (``argv`` None): a caller in the same process keeps running."""
    import os

    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def _fail(exc: KaguraError, json_mode: bool) -> int:
    """Every error ends here: the message on stderr, and under --json the envelope on stdout."""
    print(exc.render(), file=sys.stderr)
    if json_mode:
        from kagura_agent.cli.common import error_envelope, print_json

        with contextlib.suppress(BrokenPipeError):  # `--json | head`: the code still counts
            print_json(error_envelope(exc))
    return int(exc.exit_code)


if __name__ == "__main__":
    raise SystemExit(main())
