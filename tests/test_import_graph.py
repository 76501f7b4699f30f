"""The package's own import graph, read statically (ast) from kagura_agent/**.

- No cycles among module-level imports (``if TYPE_CHECKING:`` blocks excluded: they never
  run). An edge is an import a module writes; the parent package Python initialises on
  the way to a submodule is not one, but importing *from* a package's ``__init__`` is.
- Inside the core, our own modules are imported at the top: a function-level import of one
  is allowed only at a boundary that keeps ``plan`` fast (LAZY_ALLOWED).
- The CLI is the edge: no module outside kagura_agent/cli/ imports kagura_agent.cli, at
  any depth (functions and TYPE_CHECKING blocks included). ``__main__`` is the entry point.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "kagura_agent"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _statements(
    body: list[ast.stmt], *, everywhere: bool, type_checking: bool = False
) -> Iterator[ast.stmt]:
    """Statements that run at import time (plus ``if TYPE_CHECKING:`` blocks with
    ``type_checking``); with ``everywhere``, every statement."""
    for node in body:
        yield node
        if isinstance(node, ast.If) and _type_checking(node) and not (everywhere or type_checking):
            yield from _statements(node.orelse, everywhere=everywhere)
            continue
        if not everywhere and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        nested = {"everywhere": everywhere, "type_checking": type_checking}
        for child in ("body", "orelse", "finalbody"):
            yield from _statements(getattr(node, child, None) or [], **nested)
        for handler in getattr(node, "handlers", None) or []:
            yield from _statements(handler.body, **nested)
        for case in getattr(node, "cases", None) or []:
            yield from _statements(case.body, **nested)


def imports(name: str, *, everywhere: bool = False, type_checking: bool = False) -> set[str]:
    """The package's own modules ``name`` imports (the deepest module each import names):
    at import time, or also under TYPE_CHECKING, or ``everywhere`` (functions too)."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    body = ast.parse(path.read_text()).body
    for node in _statements(body, everywhere=everywhere, type_checking=type_checking):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                found.add(submodule if submodule in MODULES else base)
    return {module for module in found if module in MODULES and module != name}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_walker_sees_a_cycle_and_relative_imports() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
    assert "kagura_agent.errors" in imports("kagura_agent.cli.main")
    assert "kagura_agent.plan.model" in imports("kagura_agent.plan.render")


def test_module_level_imports_have_no_cycle() -> None:
    graph = {name: imports(name) for name in MODULES}
    assert cycles(graph) == [], "import cycles (module level, TYPE_CHECKING excluded)"


def test_no_core_module_imports_the_cli() -> None:
    offenders = {
        name: sorted(m for m in imports(name, everywhere=True) if m.startswith("kagura_agent.cli"))
        for name in MODULES
        if not name.startswith("kagura_agent.cli") and name != "kagura_agent.__main__"
    }
    assert {name: found for name, found in offenders.items() if found} == {}


# (importing module, imported module): function-level imports of our own modules that are
# allowed. memory.cloud is a configured backend that pulls in asyncio, which plan (sqlite)
# does not need. team.queue (psycopg, apply's executor) serves only a cockpit started with
# --queue: every other serve starts ~120 ms sooner without it.
LAZY_ALLOWED = {
    ("kagura_agent.memory.factory", "kagura_agent.memory.cloud"),
    ("kagura_agent.memory.gate", "kagura_agent.memory.cloud"),
    ("kagura_agent.cockpit.runner", "kagura_agent.team.queue"),
    # Only when a State manifest chooses the store; written reads run history from a store.
    ("kagura_agent.state", "kagura_agent.apply.written"),
}


def test_core_imports_its_own_modules_at_the_top() -> None:
    lazy = {
        (name, module)
        for name in MODULES
        if not name.startswith("kagura_agent.cli")
        for module in imports(name, everywhere=True) - imports(name, type_checking=True)
    }
    assert sorted(lazy - LAZY_ALLOWED) == []
