"""``kagura-agent ARGV`` run in the test's own process, for tests about what a command
says and returns rather than about the process it runs in.

``run_main`` sets the environment, working directory and stdin the child would have had,
calls ``kagura_agent.cli.main.main`` and returns what ``subprocess.run`` would: the exit
code (a ``SystemExit`` as the interpreter would turn it into one), stdout and stderr. It
saves a Python start and the package's imports per call (~0.5 s of CPU each). A test
about the process itself (signals, a blocked read that a timeout must stop, isolation,
bytes on the command line) keeps its subprocess.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from kagura_agent.cli.main import main


@contextlib.contextmanager
def _environment(env: Mapping[str, str]) -> Iterator[None]:
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@contextlib.contextmanager
def _stdin(text: str) -> Iterator[None]:
    saved = sys.stdin
    sys.stdin = io.StringIO(text)
    try:
        yield
    finally:
        sys.stdin = saved


def _exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)  # what the interpreter does with a message
    return 1


def run_main(
    argv: Sequence[str], *, cwd: Path, env: Mapping[str, str], stdin: str = ""
) -> subprocess.CompletedProcess[str]:
    """``python -m kagura_agent ARGV`` with ``env`` in ``cwd``, in this process."""
    out, err = io.StringIO(), io.StringIO()
    with (
        _environment(env),
        contextlib.chdir(cwd),
        _stdin(stdin),
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(err),
    ):
        try:
            code = main(list(argv))
        except SystemExit as exc:
            code = _exit_code(exc)
    return subprocess.CompletedProcess(
        ["kagura-agent", *argv], code, out.getvalue(), err.getvalue()
    )
