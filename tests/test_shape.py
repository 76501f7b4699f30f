"""The package's shape: no function in kagura_agent/ takes more than 8 parameters.

A parameter list that travels through layers becomes one value (an EgressRequest, a
ContainerSpec, an ApprovalRequest, a Verdict, ...), built once where its facts exist and
passed down whole. ``self`` and ``cls`` are not counted, nor ``*args``/``**kwargs``.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "kagura_agent"
MOST = 8


def parameters(node: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    args = node.args
    every = args.posonlyargs + args.args + args.kwonlyargs
    return [arg.arg for arg in every if arg.arg not in ("self", "cls")]


def over_the_bound() -> dict[str, int]:
    found: dict[str, int] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                count = len(parameters(node))
                if count > MOST:
                    found[f"{path.relative_to(PACKAGE).as_posix()}:{node.name}"] = count
    return found


def test_no_function_takes_more_than_eight_parameters() -> None:
    found = over_the_bound()
    assert not found, (
        f"functions over {MOST} parameters (make the list that travels one value): {found}"
    )


def test_the_count_sees_keyword_only_parameters_and_skips_self() -> None:
    source = "class A:\n    def f(self, a, b=1, /, c=2, *args, d, e=3, **kw): ...\n"
    method = next(n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.FunctionDef))
    assert parameters(method) == ["a", "b", "c", "d", "e"]
