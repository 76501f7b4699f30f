"""No input makes validate or plan crash: always a located error or a valid plan.

Two generators feed ``kagura_agent.cli.main.main`` in-process:

- arbitrary text (and arbitrary JSON-like values dumped as YAML) as a task file;
- the example tasks and the default manifests with random mutations applied to one
  node: a key dropped, a value replaced by another type, a random key inserted, a key
  renamed;
- hostile shapes: anchor chains that fan out into alias bombs, self-referencing aliases,
  deep nesting, and prompt templates assembled from amplifying pieces (huge ranges,
  repetition, powers, format widths, recursive macros, include) -- each must also
  finish within 5 s.

``plan`` validates before it compiles, so it drives both paths with one call per
example. The command must return 0 or 2 and never raise. On 2 every stderr line is a located
diagnostic (``file:line:col  $.path  message``), its hint, or the one closing
``error:`` line; a validation failure has at least one located line. On 0 ``plan
--json`` printed its result object (one entry per planned task).
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from resources import fast_tier

from kagura_agent.cli.main import main

REPO = Path(__file__).resolve().parent.parent
EXAMPLE_TASKS = sorted((REPO / "examples").glob("*/task.yml"))
MANIFEST_FILES = sorted((REPO / "manifests").glob("*.yml"))
FACTS = {"image_digests": {}, "graduation": {"version": 0}}
LOCATED = re.compile(r"^\S.*:\d+:\d+  \$.*?  .+$")
# The fast tier (scripts/test.sh --fast) searches less: the same properties, fewer examples.
EXAMPLES = 25 if fast_tier() else 200
SETTINGS = settings(
    max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False),
    st.text(max_size=20),
    st.sampled_from(["15m", "env:X", "*.example.com", "{{ x }}", "{%", "..", "/", "~"]),
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)


@pytest.fixture(scope="module")
def scratch() -> Iterator[Path]:
    """A scratch project: a copy of the default manifests and a facts file.

    Module-scoped (Hypothesis runs many examples per test); each example writes its
    task file and restores any manifest it mutated.
    """
    with tempfile.TemporaryDirectory(prefix="kagura-fuzz-") as name:
        root = Path(name)
        shutil.copytree(REPO / "manifests", root / "manifests")
        (root / "facts.json").write_text(json.dumps(FACTS), encoding="utf-8")
        yield root


def run(root: Path, *argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.chdir(root), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


def check_outcome(code: int, out: str, err: str, *, plan: bool) -> None:
    # 6: planned, and not applyable (plan refuses what apply would refuse).
    assert code in ((0, 2, 6) if plan else (0, 2)), (code, out, err)
    assert "Traceback" not in out + err
    if code == 2:
        lines = [line for line in err.splitlines() if line.strip()]
        assert lines, "exit 2 with nothing printed"
        assert lines[-1].startswith("error: "), lines
        for line in lines[:-1]:
            assert LOCATED.match(line) or line.startswith("    hint: "), line
        if "validation error" in lines[-1]:
            assert any(LOCATED.match(line) for line in lines), lines
    elif plan:
        data = json.loads(out)
        plans = [entry["plan"] for entry in data["plans"]]
        assert plans and data["ok"] is True
        refused = not all(entry["admission"]["applyable"] for entry in data["plans"])
        assert code == (6 if refused else 0), (code, err)
        for one in plans:
            assert one["format_version"] == 1
            assert one["fingerprint"].startswith("sha256:")


def plan(root: Path) -> None:
    """``plan`` validates first, so one call covers both the error and the plan path."""
    argv = ("plan", "--json", "--facts", "facts.json", "--manifests", "manifests", "task.yml")
    check_outcome(*run(root, *argv), plan=True)


@SETTINGS
@given(text=st.one_of(st.text(max_size=300), values.map(lambda v: yaml.safe_dump(v))))
def test_arbitrary_yaml_text(scratch: Path, text: str) -> None:
    (scratch / "task.yml").write_text(text, encoding="utf-8")
    plan(scratch)


def test_validate_reports_like_plan(scratch: Path) -> None:
    """validate prints the same located errors as plan (the fuzzing only drives plan)."""
    (scratch / "task.yml").write_text("kind: Task\nmetadata: {name: x}\n", encoding="utf-8")
    argv = ("--manifests", "manifests", "task.yml")
    v_code, _, v_err = run(scratch, "validate", *argv)
    p_code, _, p_err = run(scratch, "plan", "--facts", "facts.json", *argv)
    assert v_code == p_code == 2
    assert v_err == p_err
    check_outcome(v_code, "", v_err, plan=False)


def _paths(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield path
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _paths(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _paths(item, (*path, index))


def _mutate(doc: Any, path: tuple[Any, ...], op: str, key: str, new: Any) -> Any:
    if not path:
        return new if op == "retype" else doc
    parent = doc
    for part in path[:-1]:
        parent = parent[part]
    last = path[-1]
    if op == "drop":
        del parent[last]
    elif op == "retype":
        parent[last] = new
    elif op == "insert" and isinstance(parent[last], dict):
        parent[last][key] = new
    elif op == "insert" and isinstance(parent[last], list):
        parent[last].append(new)
    elif op == "rename" and isinstance(parent, dict):
        parent[key] = parent.pop(last)
    else:
        parent[last] = new
    return doc


@SETTINGS
@given(data=st.data())
def test_mutated_examples_and_manifests(scratch: Path, data: st.DataObject) -> None:
    target = data.draw(st.sampled_from([*EXAMPLE_TASKS, *MANIFEST_FILES]), label="file")
    docs = list(yaml.safe_load_all(target.read_text(encoding="utf-8")))
    index = data.draw(st.integers(0, len(docs) - 1), label="document")
    path = data.draw(st.sampled_from(list(_paths(docs[index]))), label="path")
    op = data.draw(st.sampled_from(["drop", "retype", "insert", "rename"]), label="op")
    key = data.draw(st.one_of(st.text(max_size=10), st.sampled_from(["spec", "kind", "name"])))
    new = data.draw(values, label="value")
    docs[index] = _mutate(docs[index], path, op, key, new)
    text = yaml.safe_dump_all(docs, sort_keys=False)
    if target in EXAMPLE_TASKS:
        (scratch / "task.yml").write_text(text, encoding="utf-8")
        plan(scratch)
        return
    manifest = scratch / "manifests" / target.name
    shutil.copy(REPO / "examples" / "hello" / "task.yml", scratch / "task.yml")
    manifest.write_text(text, encoding="utf-8")
    try:
        plan(scratch)
    finally:
        shutil.copy(target, manifest)


# Hostile shapes: aliases that fan out (bombs), refer to themselves, or nest deeply, and
# prompt templates built from the amplifying pieces. Every one must end as 0 or a located
# error within the bound the brief sets for any input.
BOUND_SECONDS = 5.0


@st.composite
def alias_yaml(draw: st.DrawFn) -> str:
    """A task whose vars are a chain of anchors, each a list of aliases to earlier ones."""
    levels = draw(st.integers(1, 9))
    width = draw(st.integers(1, 12))
    scalar = draw(st.sampled_from(["x", "lol" * 50, "y" * 5000]))
    lines = ["  vars:", f"    a0: &a0 [{scalar!r}]"]
    for level in range(1, levels + 1):
        refs = [f"*a{draw(st.integers(0, level - 1))}" for _ in range(width)]
        lines.append(f"    a{level}: &a{level} [{', '.join(refs)}]")
    if draw(st.booleans()):
        lines.append(f"    self: &s {{x: {draw(st.sampled_from(['*s', '[*s]', '{y: *s}']))}}}")
    depth = draw(st.integers(0, 200))
    lines.append("    deep: " + "[" * depth + "]" * depth)
    head = "apiVersion: kagura.dev/v1\nkind: Task\nmetadata: {name: f}\nspec:\n"
    return head + "  steps: [echo hi]\n" + "\n".join(lines) + "\n"


TEMPLATE_PIECES = [
    "{% for i in range(N) %}",
    "{% endfor %}",
    "{{ 'a' * N }}",
    "{{ N ** N }}",
    "{{ 2 ** 1e8 }}",
    "{{ 'x'|center(N) }}",
    "{{ ('ab' * N)|replace('a', 'zz' * N) }}",
    "{{ ([ 'q' * N ] * N)|join }}",
    "{{ '%Nd' % 1 }}",
    "{{ '{:>N}'.format(1) }}",
    "{% macro m(k) %}{{ m(k) }}{% endmacro %}{{ m(1) }}",
    "{% include 'x' %}",
    "{{ x }}",
    "text ",
]


@st.composite
def hostile_template(draw: st.DrawFn) -> str:
    pieces = draw(st.lists(st.sampled_from(TEMPLATE_PIECES), min_size=1, max_size=6))
    numbers = st.sampled_from(["0", "3", "999", "99999", "3000000000", "10**9"])
    out = []
    for piece in pieces:
        while "N" in piece:
            piece = piece.replace("N", draw(numbers), 1)
        out.append(piece)
    return "".join(out)


def bounded_plan(root: Path) -> None:
    start = time.process_time()  # CPU time: the work the input made, not a wait for a core
    plan(root)
    assert time.process_time() - start < BOUND_SECONDS


@SETTINGS
@given(text=alias_yaml())
def test_alias_shapes_are_bounded(scratch: Path, text: str) -> None:
    (scratch / "task.yml").write_text(text, encoding="utf-8")
    bounded_plan(scratch)


@settings(
    max_examples=EXAMPLES * 3 // 10, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(template=hostile_template())
def test_hostile_templates_are_bounded(scratch: Path, template: str) -> None:
    task = (
        "apiVersion: kagura.dev/v1\nkind: Task\nmetadata: {name: f}\nspec:\n"
        f"  brain: claude\n  vars: {{x: 1}}\n  prompt: {json.dumps(template)}\n"
    )
    (scratch / "task.yml").write_text(task, encoding="utf-8")
    bounded_plan(scratch)
