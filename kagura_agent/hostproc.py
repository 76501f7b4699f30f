"""Every process the host starts, started from one place and never from where an agent writes.

A project root, the workspace and the folder a plan was made from are the agent's
writing, and a Python started there imports from there: ``python -m X`` puts its working
directory first on ``sys.path``, ``python -c`` the working directory as it is when each
later import runs (``''``), and PYTHONPATH, PYTHONSTARTUP or a user site may name any
folder. A ``kagura_agent/__init__.py``, ``json.py`` or ``yaml.py`` the agent left in its
root would then run on the host, as the operator, in the next ``dispatch``, ``serve``
launch or team runner job started from that folder. So every start goes through
:func:`run`, :func:`popen` or :func:`start`, which check it:

- Python runs isolated (``-I``: no script or working directory on ``sys.path``, no
  PYTHON* variable, no user site); a start of Python without it is refused. kagura-agent
  itself (:func:`kagura_argv`, :func:`python_code_argv`) runs the very package this
  process imported: its folder is put on the isolated path when it is not there already
  (a checkout on PYTHONPATH, an editable install), so a child never picks up another copy.
- The working directory is explicit, and for Python :data:`NEUTRAL_CWD` (the file
  system's root: no project root can be it, and no agent writes there). A non-Python
  command that must run in a folder (``bash -c`` of a ``runtime: host`` verify) names it.
- The environment is explicit: :func:`environment` is the operator's, without what makes a
  program load code from a path it names (PYTHON*, BASH_ENV, ENV) and without PATH
  entries that are relative (they would resolve in the working directory).

tests/test_host_isolation.py fails when a process start anywhere in the package does not
come through here (the agent's own steps in brain/engines/script.py are the one
exception: they are the agent's processes, in its container).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kagura_agent.paths import NEUTRAL_CWD, WORKDIR_ENV

if TYPE_CHECKING:
    import asyncio

# Which interpreter options make a start isolated: -I alone, or -P, -E and -s together
# (what -I means, for an interpreter given its options one by one).
_ISOLATED = ("-I",)
_ISOLATED_PARTS = frozenset({"-P", "-E", "-s"})
# Variables naming code a program runs at its start (Python's are ignored under -I, but a
# non-Python child may start a Python, or a shell, of its own).
_STEERING_PREFIXES = ("PYTHON",)
_STEERING = frozenset({"BASH_ENV", "ENV"})
# The folder holding the kagura_agent package this process runs.
PACKAGE_HOME = str(Path(__file__).resolve().parent.parent)
# Put first on an isolated child's path: the folder of this very package, when the
# isolated path would not find it there (a checkout on PYTHONPATH, an editable install).
_HOME_BOOT = (
    "import sys\nhome = sys.argv.pop(1)\nif home not in sys.path:\n    sys.path.insert(0, home)\n"
)
_CLI = "from kagura_agent.cli.main import main\nraise SystemExit(main(sys.argv[1:]))\n"


class UnsafeStart(ValueError):
    """A process start that could import or run what an agent wrote (a bug, not input)."""


def python_code_argv(source: str, *args: str, python: str | None = None) -> list[str]:
    """argv running ``source`` (``python -c``) isolated, on this kagura_agent package;
    ``sys.argv[1:]`` is ``args`` there."""
    return [python or sys.executable, "-I", "-c", _HOME_BOOT + source, PACKAGE_HOME, *args]


def python_module_argv(module: str, *args: str, python: str | None = None) -> list[str]:
    """argv running ``python -I -m MODULE ARGS`` (a module of the interpreter's own
    environment, such as pip)."""
    return [python or sys.executable, "-I", "-m", module, *args]


def kagura_argv(*args: str) -> list[str]:
    """argv running ``kagura-agent ARGS`` on this very code, isolated."""
    return python_code_argv(_CLI, *args)


def environment(
    extra: Mapping[str, str] | None = None, *, base: Mapping[str, str] | None = None
) -> dict[str, str]:
    """``base`` (the operator's environment) plus ``extra``, without the variables that
    name start-up code and without relative PATH entries."""
    source = os.environ if base is None else base
    env = {
        key: value
        for key, value in source.items()
        if key not in _STEERING and not key.startswith(_STEERING_PREFIXES)
    }
    env.update(extra or {})
    if "PATH" in env:
        env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if os.path.isabs(p))
    return env


def kagura_environment(
    extra: Mapping[str, str] | None = None, *, base: Mapping[str, str] | None = None
) -> dict[str, str]:
    """:func:`environment` for a kagura-agent child, naming this process's working
    directory as the one it works for (:data:`WORKDIR_ENV`)."""
    env = environment(extra, base=base)
    try:
        env[WORKDIR_ENV] = os.getcwd()
    except OSError:  # removed under us: the child keeps its own
        env.pop(WORKDIR_ENV, None)
    return env


def run(
    argv: Sequence[str], *, env: Mapping[str, str], cwd: str = NEUTRAL_CWD, **options: Any
) -> subprocess.CompletedProcess[Any]:
    """``subprocess.run`` of a checked start (see the module's docstring)."""
    _check(argv, cwd, env)
    return subprocess.run(list(argv), cwd=cwd, env=dict(env), **options)


def popen(
    argv: Sequence[str], *, env: Mapping[str, str], cwd: str = NEUTRAL_CWD, **options: Any
) -> subprocess.Popen[Any]:
    """``subprocess.Popen`` of a checked start."""
    _check(argv, cwd, env)
    return subprocess.Popen(list(argv), cwd=cwd, env=dict(env), **options)


async def start(
    argv: Sequence[str], *, env: Mapping[str, str], cwd: str = NEUTRAL_CWD, **options: Any
) -> asyncio.subprocess.Process:
    """``asyncio.create_subprocess_exec`` of a checked start."""
    import asyncio  # here, not at the top: validate and plan start processes without it

    _check(argv, cwd, env)
    return await asyncio.create_subprocess_exec(*argv, cwd=cwd, env=dict(env), **options)


def is_python(program: str) -> bool:
    """Whether ``program`` is a Python interpreter (by name, or this very one)."""
    name = os.path.basename(program)
    return program == sys.executable or name.startswith("python") or name.startswith("pypy")


def isolated(argv: Sequence[str]) -> bool:
    """Whether a Python argv isolates the interpreter (options before the first -c/-m or
    script)."""
    options: set[str] = set()
    for word in argv[1:]:
        if not word.startswith("-") or word in ("-c", "-m") or word == "-":
            break
        options.add(word)
    return any(o in options for o in _ISOLATED) or options >= _ISOLATED_PARTS


def _check(argv: Sequence[str], cwd: str, env: Mapping[str, str]) -> None:
    if not argv:
        raise UnsafeStart("an empty argv")
    if not os.path.isabs(cwd):
        raise UnsafeStart(f"a relative working directory {cwd!r} for {argv[0]}")
    if is_python(argv[0]):
        if not isolated(argv):
            raise UnsafeStart(f"Python started without -I: {list(argv)[:4]}")
        if cwd != NEUTRAL_CWD:
            raise UnsafeStart(f"Python started in {cwd} (only {NEUTRAL_CWD})")
    loaded = sorted(k for k in env if k in _STEERING or k.startswith(_STEERING_PREFIXES))
    if loaded:
        raise UnsafeStart(f"{argv[0]} started with {', '.join(loaded)} (use environment())")
