"""YAML loading that remembers where every node came from.

Each document is composed into nodes (the C parser when available) and turned into
plain JSON-like values while recording ``path -> (line, col)`` for every value and
every mapping key, so a schema error at ``$.spec.allow[2].host`` can be reported at
the exact line and column. Only JSON types are produced: timestamps stay strings, and
booleans are only ``true``/``false`` (no YAML 1.1 "yes"/"on" coercion).

Every input is bounded (a manifest is data an attacker may have written): nesting
deeper than ``MAX_DEPTH`` is refused from the event stream before anything is composed
(libyaml's composer recurses in C), and aliases are expanded against one budget per
file -- ``MAX_NODES`` values and ``MAX_CHARS`` characters of scalars -- so an alias
bomb stops at the budget instead of expanding exponentially. An alias that refers to
a node containing it is a located error, not a RecursionError. A NUL character (the
``"\\0"`` escape) in any key or value is a located error too: no manifest text needs
one, and every path, name and command would carry it to an OS call that refuses it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

import yaml

from kagura_agent.errors import Diagnostic

Path = tuple[str | int, ...]

_BaseLoader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _Loader(_BaseLoader):  # type: ignore[misc]
    """Safe loader whose implicit booleans are YAML 1.2's true/false only."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in _BaseLoader.yaml_implicit_resolvers.items()
}
_BOOL = re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$")
for _first in "tTfF":
    _Loader.yaml_implicit_resolvers.setdefault(_first, []).insert(
        0, ("tag:yaml.org,2002:bool", _BOOL)
    )

_SCALAR = yaml.constructor.SafeConstructor()

MAX_DEPTH = 64
# libyaml's own nesting limit (1000 levels), met in flow collections it scans ahead.
_NESTING_REFUSED = "exceeded maximum nesting depth"
MAX_NODES = 100_000
MAX_CHARS = 4 * 1024 * 1024


_NUL = "text contains a NUL character (\\0); no key or value may hold one"


class _TooBig(Exception):
    """The document broke a bound; carries the located diagnostic."""

    def __init__(self, diagnostic: Diagnostic) -> None:
        super().__init__(diagnostic.message)
        self.diagnostic = diagnostic


@dataclass
class _Budget:
    """What is left of one file's expansion budget, and the nodes being built."""

    nodes: int = MAX_NODES
    chars: int = MAX_CHARS
    building: set[int] = field(default_factory=set)


@dataclass
class YamlDoc:
    """One YAML document: its value and the position of every node in it."""

    file: str
    index: int
    value: Any
    line: int
    col: int
    positions: dict[Path, tuple[int, int]] = field(default_factory=dict)
    key_positions: dict[Path, tuple[int, int]] = field(default_factory=dict)
    # The source text of every scalar YAML did not read as a string (true, 1.0, null, an
    # empty value), so an error can show what to quote.
    plain: dict[Path, str] = field(default_factory=dict)

    def where(self, path: Path, *, key: bool = False) -> tuple[int, int]:
        """The position of ``path`` (its key when ``key``), else its nearest ancestor's."""
        probe = path
        while True:
            if key and probe in self.key_positions:
                return self.key_positions[probe]
            if probe in self.positions:
                return self.positions[probe]
            if not probe:
                return (self.line, self.col)
            probe = probe[:-1]


def json_path(path: Path) -> str:
    out = "$"
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        elif re.fullmatch(r"[A-Za-z_][A-Za-z0-9_-]*", part):
            out += f".{part}"
        else:
            out += f"[{part!r}]"
    return out


def load_documents(text: str, file: str) -> tuple[list[YamlDoc], list[Diagnostic]]:
    """Parse every document in ``text``; a syntax error becomes a located diagnostic."""
    docs: list[YamlDoc] = []
    problems: list[Diagnostic] = []
    budget = _Budget()
    try:
        _check_depth(text, file)
        for index, node in enumerate(yaml.compose_all(text, Loader=_Loader)):
            if node is None:
                continue
            doc = YamlDoc(file, index, None, node.start_mark.line + 1, node.start_mark.column + 1)
            doc.value = _build(node, (), doc, problems, budget)
            docs.append(doc)
    except _TooBig as exc:
        problems.append(exc.diagnostic)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line, col = (mark.line + 1, mark.column + 1) if mark else (1, 1)
        problem = str(exc.problem or exc)
        if _NESTING_REFUSED in problem:
            # libyaml (bundled with PyYAML since 6.0.4) refuses deep flow nesting while
            # scanning ahead, before our event-stream check sees a collection: the same
            # refusal, said the same way whichever layer made it.
            problem = f"YAML nesting is deeper than {MAX_DEPTH} levels"
            problems.append(Diagnostic(file, line, col, "$", problem))
        else:
            problems.append(Diagnostic(file, line, col, "$", f"YAML syntax error: {problem}"))
    except yaml.reader.ReaderError as exc:
        # Raised before parsing (a control character, invalid UTF-8): locate it from the
        # character offset, and keep the message on one line like every diagnostic.
        line = text.count("\n", 0, exc.position) + 1
        col = exc.position - (text.rfind("\n", 0, exc.position) + 1) + 1
        problems.append(
            Diagnostic(
                file,
                line,
                col,
                "$",
                f"YAML error: unacceptable character #x{exc.character:04x}: {exc.reason}",
            )
        )
    except yaml.YAMLError as exc:
        problems.append(Diagnostic(file, 1, 1, "$", "YAML error: " + " ".join(str(exc).split())))
    return docs, problems


def _check_depth(text: str, file: str) -> None:
    """Refuse nesting deeper than MAX_DEPTH from the (iterative) event stream."""
    depth = 0
    for event in yaml.parse(text, Loader=_Loader):
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_DEPTH:
                mark = event.start_mark
                line, col = (mark.line + 1, mark.column + 1) if mark else (1, 1)
                raise _TooBig(
                    Diagnostic(
                        file,
                        line,
                        col,
                        "$",
                        f"YAML nesting is deeper than {MAX_DEPTH} levels",
                    )
                )
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1


def _refuse(node: yaml.Node, path: Path, doc: YamlDoc, message: str) -> _TooBig:
    line, col = node.start_mark.line + 1, node.start_mark.column + 1
    return _TooBig(Diagnostic(doc.file, line, col, json_path(path), message))


def _build(
    node: yaml.Node, path: Path, doc: YamlDoc, problems: list[Diagnostic], budget: _Budget
) -> Any:
    budget.nodes -= 1
    if budget.nodes < 0:
        raise _refuse(
            node,
            path,
            doc,
            f"YAML expands to more than {MAX_NODES} values (aliases are expanded);"
            " refusing a possible alias bomb",
        )
    if len(path) > MAX_DEPTH:
        raise _refuse(node, path, doc, f"YAML nesting is deeper than {MAX_DEPTH} levels")
    doc.positions[path] = (node.start_mark.line + 1, node.start_mark.column + 1)
    if isinstance(node, yaml.ScalarNode):
        if "\0" in node.value:
            raise _refuse(node, path, doc, _NUL)
        budget.chars -= len(node.value)
        if budget.chars < 0:
            raise _refuse(
                node,
                path,
                doc,
                f"YAML expands to more than {MAX_CHARS // (1024 * 1024)} MiB of text"
                " (aliases are expanded); refusing a possible alias bomb",
            )
        value = _scalar(node)
        if not isinstance(value, str):
            doc.plain[path] = str(node.value)
        return value
    if id(node) in budget.building:
        raise _refuse(node, path, doc, "YAML alias refers to a node that contains it")
    budget.building.add(id(node))
    try:
        return _collection(node, path, doc, problems, budget)
    finally:
        budget.building.discard(id(node))


def _collection(
    node: yaml.Node, path: Path, doc: YamlDoc, problems: list[Diagnostic], budget: _Budget
) -> Any:
    if isinstance(node, yaml.MappingNode):
        result: dict[str, Any] = {}
        for key_node, value_node in node.value:
            key = _scalar(key_node) if isinstance(key_node, yaml.ScalarNode) else None
            line, col = key_node.start_mark.line + 1, key_node.start_mark.column + 1
            if isinstance(key, str) and "\0" in key:
                raise _refuse(key_node, path, doc, _NUL)
            if key_node.tag == "tag:yaml.org,2002:merge":
                problems.append(
                    Diagnostic(
                        doc.file,
                        line,
                        col,
                        json_path(path),
                        "YAML merge keys (<<) are not supported",
                    )
                )
                continue
            if not isinstance(key, str):
                problems.append(
                    Diagnostic(
                        doc.file,
                        line,
                        col,
                        json_path(path),
                        f"mapping keys must be strings, got {key!r}",
                    )
                )
                continue
            child = (*path, key)
            if key in result:
                problems.append(
                    Diagnostic(doc.file, line, col, json_path(child), f"duplicate key {key!r}")
                )
            doc.key_positions[child] = (line, col)
            result[key] = _build(value_node, child, doc, problems, budget)
        return result
    return [_build(item, (*path, i), doc, problems, budget) for i, item in enumerate(node.value)]


def _scalar(node: yaml.Node) -> Any:
    tag = node.tag
    if tag in ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float", "tag:yaml.org,2002:null"):
        try:
            value = _SCALAR.construct_object(node, deep=True)
        except ValueError:  # an integer of more than 4300 digits
            return str(node.value)
        # JSON has no NaN or infinity: .nan and .inf stay text, so a number field
        # reports them as a located type error instead of failing later (int(nan)).
        if isinstance(value, float) and not math.isfinite(value):
            return str(node.value)
        return value
    if tag == "tag:yaml.org,2002:bool":
        return str(node.value).lower() == "true"
    return str(node.value)
