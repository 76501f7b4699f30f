"""Read a command line the way the Claude Code CLI parses it, not the way one SDK wrote it.

The CLI takes an option's value either as the next argument (``--max-turns 3``) or after
an ``=`` in the same argument (``--max-turns=3``); claude-agent-sdk has used both shapes
across patch releases. Tests that check what the SDK passed read options through here, so
a release that changes the shape (and nothing else) does not fail them.
"""

from __future__ import annotations

from collections.abc import Sequence


def option_values(argv: Sequence[str], name: str) -> list[str]:
    """Every value given for ``name`` (``--name v`` or ``--name=v``), in order."""
    if not name.startswith("-"):
        raise ValueError(f"an option name starts with a dash: {name!r}")
    values: list[str] = []
    args = list(argv)
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == name:
            if i + 1 >= len(args):
                raise AssertionError(f"{name} is the last argument and has no value: {args}")
            values.append(args[i + 1])
            i += 2
            continue
        if arg.startswith(name + "="):
            values.append(arg[len(name) + 1 :])
        i += 1
    return values


def option(argv: Sequence[str], name: str) -> str | None:
    """The value of ``name``, or None when it is absent; an error when it is given twice."""
    values = option_values(argv, name)
    if len(values) > 1:
        raise AssertionError(f"{name} given {len(values)} times: {list(argv)}")
    return values[0] if values else None


def has_flag(argv: Sequence[str], name: str) -> bool:
    """Whether ``name`` appears, as a bare flag or with a value in either shape."""
    return any(arg == name or arg.startswith(name + "=") for arg in argv)
