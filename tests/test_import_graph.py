"""The package's own import graph, read statically (ast) from kagura_agent/**.

- No cycles among module-level imports (``if TYPE_CHECKING:`` blocks excluded: they never
  run), and none either once every import is counted: function-level imports (a cycle
  they close runs the first time the function does) and ``TYPE_CHECKING`` blocks. An edge
  is an import a module writes; the parent package Python initialises on the way to a
  submodule is not one, but importing *from* a package's ``__init__`` is — including
  ``from package import submodule``, which runs the package face first.
- The state layer (kagura_agent/state/) imports nothing above it: what it reads, at any
  depth, is the foundation listed in STATE_FOUNDATION.
- Inside the core, our own modules are imported at the top: a function-level import of one
  is allowed only at a boundary that keeps ``plan`` fast (LAZY_ALLOWED).
- The CLI is the edge: no module outside kagura_agent/cli/ imports kagura_agent.cli, at
  any depth (functions and TYPE_CHECKING blocks included). ``__main__`` is the entry point.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from pathlib import Path

import pytest

# Every test here reads the same parsed package (_parsed, imports: cached per process):
# on one xdist worker it is parsed once, not once on each worker a test lands on.
pytestmark = pytest.mark.xdist_group("import-graph")

PACKAGE = Path(__file__).resolve().parents[1] / "kagura_agent"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _is_face(name: str) -> bool:
    """A package whose ``__init__`` imports our own modules (an empty one closes no cycle)."""
    if name not in MODULES or MODULES[name].name != "__init__.py":
        return False
    return "from kagura_agent" in MODULES[name].read_text()


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


@functools.cache
def _parsed(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


@functools.cache
def imports(name: str, *, everywhere: bool = False, type_checking: bool = False) -> set[str]:
    """The package's own modules ``name`` imports (the deepest module each import names):
    at import time, or also under TYPE_CHECKING, or ``everywhere`` (functions too)."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    body = _parsed(path).body
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
                if _is_face(base) and submodule in MODULES:
                    found.add(base)  # ``from package import submodule`` runs the face
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


def every_import(name: str) -> set[str]:
    """Every import ``name`` writes: module level, in functions, under TYPE_CHECKING."""
    return imports(name, everywhere=True) | imports(name, type_checking=True)


def function_level_imports() -> set[tuple[str, str]]:
    """(importing module, imported module) for each import of our own modules written
    only inside a function."""
    return {
        (name, module)
        for name in MODULES
        for module in imports(name, everywhere=True) - imports(name, type_checking=True)
    }


def test_no_import_cycle_anywhere_function_level_imports_counted() -> None:
    lazy = function_level_imports()
    assert len(lazy) > 100  # the walker sees them (the CLI imports its handlers' modules late)
    graph = {name: every_import(name) for name in MODULES}
    assert cycles(graph) == [], (
        f"import cycles counting the {len(lazy)} function-level imports and TYPE_CHECKING"
    )


def test_the_walker_counts_function_level_imports_and_package_faces() -> None:
    # A function-level import is an edge of the full graph only.
    assert ("kagura_agent.cockpit.runner", "kagura_agent.team.queue") in function_level_imports()
    # ``from kagura_agent.state import history`` names the submodule and runs the package
    # face first, whose __init__ imports our modules (an empty face closes no cycle).
    assert {"kagura_agent.state.history", "kagura_agent.state"} <= imports(
        "kagura_agent.apply.run.freshness"
    )


# What the state layer may read, at any depth: the error tree, paths, the clock, the
# hygiene of messages, bounded file reads, and the State manifest's own reader (which
# resolves the URL's secret reference). Nothing that plans, applies, remembers or talks.
STATE_FOUNDATION = {
    "kagura_agent.clock",
    "kagura_agent.errors",
    "kagura_agent.hygiene",
    "kagura_agent.inputfile",
    "kagura_agent.paths",
    "kagura_agent.manifest.loader",
    "kagura_agent.manifest.schema",
    "kagura_agent.manifest.statebackend",
    "kagura_agent.manifest.yamlpos",
    "kagura_agent.membrane.secrets",
}


def test_the_state_layer_imports_nothing_above_it() -> None:
    layer = {name for name in MODULES if name.split(".")[:2] == ["kagura_agent", "state"]}
    assert {"kagura_agent.state.store", "kagura_agent.state.choose"} <= layer
    reached: set[str] = set()
    todo = list(layer)
    while todo:
        name = todo.pop()
        for module in every_import(name) - reached:
            reached.add(module)
            todo.append(module)
    assert sorted(reached - layer - STATE_FOUNDATION) == []
    # And the foundation never reaches back into the state layer.
    assert all(not (every_import(name) & layer) for name in STATE_FOUNDATION)


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
}


def test_core_imports_its_own_modules_at_the_top() -> None:
    lazy = {(name, module) for name, module in function_level_imports()}
    core = {(name, module) for name, module in lazy if not name.startswith("kagura_agent.cli")}
    assert sorted(core - LAZY_ALLOWED) == []
