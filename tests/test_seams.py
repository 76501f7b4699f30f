"""The seam invariant: the model SDKs (the Claude Agent SDK, the Anthropic client) are
imported only by the brain engines (kagura_agent/brain/engines/). Everything else —
planner, apply, membrane, cockpit — speaks the engine protocol, so an engine can be
swapped without touching them, and plan/validate never pay for an SDK import."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "kagura_agent"
ENGINES = PACKAGE / "brain" / "engines"
SDKS = ("claude_agent_sdk", "anthropic")


def sdk_imports(source: str) -> list[tuple[int, str]]:
    """(line, module) of every import of a model SDK in ``source``: import statements at
    any depth, and importlib.import_module / __import__ with a literal name."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            first = node.args[0]
            if called in ("import_module", "__import__") and isinstance(first, ast.Constant):
                names = [str(first.value)]
        found += [
            (node.lineno, name)  # type: ignore[attr-defined]
            for name in names
            if name.split(".")[0] in SDKS
        ]
    return found


def test_no_model_sdk_is_imported_outside_the_brain_engines() -> None:
    outside = {
        f"{path.relative_to(PACKAGE.parent)}:{line}": name
        for path in sorted(PACKAGE.rglob("*.py"))
        if ENGINES not in path.parents
        for line, name in sdk_imports(path.read_text(encoding="utf-8"))
    }
    assert outside == {}


def test_the_engines_are_where_the_sdk_is_imported() -> None:
    """The check sees the real import (a checker that finds nothing proves nothing)."""
    sdk = sdk_imports((ENGINES / "sdk.py").read_text(encoding="utf-8"))
    assert [name for _, name in sdk] == ["claude_agent_sdk"]


def test_every_form_of_import_is_seen() -> None:
    planted = (
        "import anthropic\n"
        "from claude_agent_sdk.types import X\n"
        "def f():\n"
        "    import claude_agent_sdk as s\n"
        "    importlib.import_module('anthropic.types')\n"
        "    __import__('claude_agent_sdk')\n"
        "from .anthropic import y\n"
        "import anthropicx\n"
    )
    assert [line for line, _ in sdk_imports(planted)] == [1, 2, 4, 5, 6]
