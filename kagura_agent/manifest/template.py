"""Rendering a task's prompt template with every resource bounded.

A prompt template is data from a task file, which a reviewer may not read closely, so
rendering it must not hang, exhaust memory or reach files. jinja2's sandbox already
refuses unsafe attributes; on top of it:

- ``include``, ``import``, ``from … import`` and ``extends`` are refused at parse time
  (there is no loader: a prompt is one self-contained string);
- every binary operator is intercepted: ``*`` and ``+`` may not build a value over
  ``MAX_VALUE``, ``**`` may not have a huge exponent (``2**1e8``), and ``%`` / ``format``
  may not ask for a huge field width;
- every call (methods, globals, filters) refuses integer arguments over ``MAX_INT_ARG``
  and a result over ``MAX_VALUE``; ``range`` is capped at ``MAX_RANGE`` items and
  ``replace``/``join`` are refused before they build an oversized string;
- the output is streamed and stops at ``MAX_OUTPUT`` characters;
- a guard traces the template's own frames (``sys.settrace``, this thread only): past
  ``MAX_SECONDS`` of this thread's CPU time (the work the template makes, not the time it
  waits for a core on a loaded machine), ``MAX_GROWTH`` bytes of new peak memory, or macro
  recursion deeper than ``MAX_DEPTH``, rendering stops.

Every refusal is a ``TemplateLimit`` whose message names the bound.
"""

from __future__ import annotations

import re
import resource
import sys
import time
from collections.abc import Callable, Sized
from functools import wraps
from types import FrameType
from typing import Any

MAX_OUTPUT = 256 * 1024
MAX_VALUE = 1024 * 1024
MAX_RANGE = 10_000
MAX_INT_ARG = 262_144
MAX_PRODUCT = 16 * MAX_VALUE
MAX_EXPONENT = 4096
MAX_DEPTH = 32
MAX_SECONDS = 2.0
MAX_GROWTH = 128 * 1024 * 1024

_TEMPLATE_FILE = "<template>"
_WIDE_FIELD = re.compile(r"\d{7,}")
_BINOPS = frozenset(["+", "-", "*", "/", "//", "%", "**"])


class TemplateLimit(Exception):
    """The template broke one of the rendering bounds."""


def render_prompt(source: str, variables: dict[str, Any]) -> str:
    """Render ``source`` with ``variables``; raises TemplateLimit or a jinja2 TemplateError."""
    from jinja2 import StrictUndefined, nodes

    env = _environment()(undefined=StrictUndefined, autoescape=False, keep_trailing_newline=False)
    env.globals["range"] = _range
    del env.globals["lipsum"]  # lipsum(n=…) builds n paragraphs in one call
    env.filters = {name: _checked(name, func) for name, func in env.filters.items()}
    ast = env.parse(source)
    for node in ast.find_all((nodes.Include, nodes.Import, nodes.FromImport, nodes.Extends)):
        raise TemplateLimit(
            f"line {node.lineno}: {type(node).__name__.lower()} is not allowed in a prompt"
            " template (a prompt is one self-contained string)"
        )
    template = env.from_string(ast)
    guard = _Guard()
    previous = sys.gettrace()
    sys.settrace(guard.trace_call)
    try:
        parts: list[str] = []
        size = 0
        for part in template.generate(**variables):
            size += len(part)
            if size > MAX_OUTPUT:
                raise TemplateLimit(f"the rendered prompt is longer than {MAX_OUTPUT} characters")
            parts.append(part)
    finally:
        sys.settrace(previous)
    return "".join(parts)


def _environment() -> Any:
    """The sandbox subclass, built on first use (jinja2 is imported lazily)."""
    from jinja2.compiler import CodeGenerator, Frame
    from jinja2.nodes import Concat
    from jinja2.sandbox import SandboxedEnvironment

    class BoundedCodeGenerator(CodeGenerator):
        def visit_Concat(self, node: Concat, frame: Frame) -> None:
            # ``a ~ b`` is no binop the sandbox intercepts: joined through the check.
            self.write("environment.checked_concat((")
            for arg in node.nodes:
                self.visit(arg, frame)
                self.write(", ")
            self.write("))")

    class BoundedEnvironment(SandboxedEnvironment):
        intercepted_binops = _BINOPS
        code_generator_class = BoundedCodeGenerator

        @staticmethod
        def checked_concat(values: tuple[Any, ...]) -> str:
            parts = [str(value) for value in values]
            if sum(len(part) for part in parts) > MAX_VALUE:
                raise TemplateLimit(
                    f"joining values with ~ builds more than {MAX_VALUE} characters"
                )
            return "".join(parts)

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            _check_binop(operator, left, right)
            return _check_result(super().call_binop(context, operator, left, right))

        def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
            # The sandbox hands str.format over wrapped; the string is the wrapped self.
            bound = getattr(__obj, "__wrapped__", __obj)
            _check_call(getattr(__obj, "__name__", ""), getattr(bound, "__self__", None), args)
            _check_ints((*args, *kwargs.values()))
            return _check_result(super().call(__context, __obj, *args, **kwargs))

    return BoundedEnvironment


def _range(*args: int) -> range:
    _check_ints(args)
    values = range(*args)
    if len(values) > MAX_RANGE:
        raise TemplateLimit(f"range() of more than {MAX_RANGE} items")
    return values


def _checked(name: str, func: Callable[..., Any]) -> Callable[..., Any]:
    @wraps(func)  # keeps jinja's pass_context/pass_eval_context marker
    def filter_(*args: Any, **kwargs: Any) -> Any:
        values = [a for a in args if not type(a).__name__.endswith(("Context", "Environment"))]
        _check_call(name, values[0] if values else None, tuple(values[1:]))
        _check_ints((*values[1:], *kwargs.values()))
        return _check_result(func(*args, **kwargs))

    return filter_


def _check_ints(values: tuple[Any, ...]) -> None:
    for value in values:
        if _is_number(value) and abs(value) > MAX_INT_ARG:
            raise TemplateLimit(f"argument {value!r} is larger than {MAX_INT_ARG}")


def _check_call(name: str, subject: Any, args: tuple[Any, ...]) -> None:
    """Refuse the calls that can build a huge string from small inputs.

    ``replace`` and ``join`` are estimated exactly; any other call taking a long value
    and a long string argument (``indent``, ``wordwrap``, ``center`` …) is refused when
    the product of their lengths passes ``MAX_PRODUCT``.
    """
    if isinstance(subject, Sized):
        longest = max((len(a) for a in args if isinstance(a, str)), default=0)
        if len(subject) * longest > MAX_PRODUCT:
            raise TemplateLimit(f"{name or 'a call'}() on values this long could build too much")
    if name in ("format", "format_map") and isinstance(subject, str):
        _check_format(subject)
    if name == "replace" and isinstance(subject, str) and len(args) >= 2:
        old, new = str(args[0]), str(args[1])
        count = len(subject) + 1 if not old else subject.count(old)
        if len(subject) + count * (len(new) - len(old)) > MAX_VALUE:
            raise TemplateLimit(f"replace() would build more than {MAX_VALUE} characters")
    if name == "join" and isinstance(subject, list | tuple | str):
        if isinstance(subject, str):
            seq, sep = (args[0] if args else ()), subject
        else:
            seq, sep = subject, (args[0] if args else "")
        if isinstance(seq, list | tuple) and isinstance(sep, str):
            total = len(sep) * len(seq) + sum(len(x) for x in seq if isinstance(x, Sized))
            if total > MAX_VALUE:
                raise TemplateLimit(f"join() would build more than {MAX_VALUE} characters")


def _check_format(text: str) -> None:
    if _WIDE_FIELD.search(text):
        raise TemplateLimit("a format field width or precision over 6 digits")


def _check_binop(operator: str, left: Any, right: Any) -> None:
    if operator == "**" and _is_number(left) and _is_number(right):
        if abs(right) > MAX_EXPONENT and abs(left) > 1:
            raise TemplateLimit(f"exponent {right!r} is larger than {MAX_EXPONENT}")
    elif operator == "*":
        for seq, times in ((left, right), (right, left)):
            if (
                isinstance(seq, Sized)
                and isinstance(times, int)
                and not isinstance(seq, dict)
                and len(seq) * times > MAX_VALUE
            ):
                raise TemplateLimit(
                    f"repeating a value {times} times builds more than {MAX_VALUE} items"
                )
    elif operator == "+" and isinstance(left, Sized) and isinstance(right, Sized):
        if len(left) + len(right) > MAX_VALUE:
            raise TemplateLimit(f"joining values builds more than {MAX_VALUE} items")
    elif operator == "%" and isinstance(left, str):
        _check_format(left)


def _check_result(value: Any) -> Any:
    if isinstance(value, Sized) and not isinstance(value, range) and len(value) > MAX_VALUE:
        raise TemplateLimit(f"a value of more than {MAX_VALUE} items")
    return value


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _peak_bytes() -> int:
    # ru_maxrss is in KiB on Linux. A high-water mark: growth past it is new memory.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class _Guard:
    """CPU time, peak memory and recursion depth of the template's frames."""

    def __init__(self) -> None:
        self.deadline = time.thread_time() + MAX_SECONDS
        self.peak = _peak_bytes() + MAX_GROWTH

    def trace_call(self, frame: FrameType, event: str, arg: Any) -> Any:
        if frame.f_code.co_filename != _TEMPLATE_FILE:
            return None
        depth = 0
        probe: FrameType | None = frame
        while probe is not None and depth <= MAX_DEPTH:
            depth += probe.f_code.co_filename == _TEMPLATE_FILE
            probe = probe.f_back
        if depth > MAX_DEPTH:
            raise TemplateLimit(f"template recursion deeper than {MAX_DEPTH} calls")
        self.check()
        return self.trace_line

    def trace_line(self, frame: FrameType, event: str, arg: Any) -> Any:
        if event == "line":
            self.check()
        return self.trace_line

    def check(self) -> None:
        if time.thread_time() > self.deadline:
            raise TemplateLimit(f"rendering took longer than {MAX_SECONDS:g} s of CPU time")
        if _peak_bytes() > self.peak:
            raise TemplateLimit(f"rendering used more than {MAX_GROWTH // 2**20} MiB")
