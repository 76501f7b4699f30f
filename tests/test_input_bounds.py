"""Every input is bounded: hostile YAML, prompt templates and huge scalars are refused
fast, with a located error, through the real CLI.

Each case runs ``kagura-agent validate|plan`` in a child process (forked from one that has
imported the CLI, testing/forked.py) and reads that child's own CPU time and peak RSS
(``os.wait4``: the CLI's figures, not the test process's). Before the bounds
a seven-level alias bomb took 36 s and 1.6 GB, ``'a'*3000000000`` 2.9 GB, a nested
``range(99999)`` never finished, and a 50 MB scalar 10 s in the secret scan.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from kagura_agent.cli.main import main
from kagura_agent.hygiene import SECRET_PATTERNS
from kagura_agent.manifest.template import TemplateLimit, render_prompt
from testing import forked

REPO = Path(__file__).resolve().parent.parent
LIMIT_SECONDS = 5.0
LIMIT_RSS_MIB = 512
HEAD = "apiVersion: kagura.dev/v1\nkind: Task\nmetadata: {name: bounds}\nspec:\n"

# The CLI runs as a child; its own resource usage (os.wait4) gives its peak RSS and the
# CPU time it used (the imports done before the fork are not counted: the bound is on
# the work the input makes). "Fast" is CPU time, the work the input made the CLI do: wall time also
# counts waiting for a core, which on a loaded machine (parallel test workers) is most of
# it. A child that blocks instead of working is killed at the timeout.
TIMEOUT = 60


def alias_bomb(levels: int = 7) -> str:
    lines = ["  steps: [echo hi]", "  vars:", '    a0: &a0 ["lol","lol","lol","lol","lol"]']
    for i in range(1, levels + 1):
        lines.append(f"    a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]")
    return HEAD + "\n".join(lines) + "\n"


def prompt_task(template: str) -> str:
    return HEAD + f"  brain: claude\n  prompt: {json.dumps(template)}\n"


CASES: dict[str, tuple[str, int, int, str]] = {
    # name: (task text, line, col, message fragment)
    "alias-bomb": (alias_bomb(), 7, 0, "refusing a possible alias bomb"),
    "self-alias": (
        HEAD + "  steps: [echo hi]\n  vars: &a\n    x: *a\n",
        6,  # the anchored node; the JSON path names the alias
        0,
        "YAML alias refers to a node that contains it",
    ),
    "deep-nesting": (
        HEAD + "  steps: [echo hi]\n  vars: {x: " + "[" * 100_000 + "]" * 100_000 + "}\n",
        6,
        0,
        "nesting is deeper than 64",
    ),
    "nested-range": (
        prompt_task(
            "{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}"
        ),
        6,
        11,
        "range() of more than",
    ),
    "nested-range-under-cap": (
        prompt_task("{% for i in range(9999) %}{% for j in range(9999) %}{% endfor %}{% endfor %}"),
        6,
        11,
        "rendering took longer than",
    ),
    "string-times-3e9": (prompt_task("{{ 'a' * 3000000000 }}"), 6, 11, "repeating a value"),
    "two-power-1e8": (prompt_task("{{ 2**1e8 }}"), 6, 11, "exponent"),
    "include": (prompt_task("{% include '/etc/passwd' %}"), 6, 11, "include is not allowed"),
    "import": (prompt_task("{% import 'x' as y %}"), 6, 11, "import is not allowed"),
    "recursive-macro": (
        prompt_task("{% macro f(n) %}{{ f(n+1) }}{% endmacro %}{{ f(0) }}"),
        6,
        11,
        "recursion deeper than",
    ),
    "doubling": (
        prompt_task(
            "{% set ns = namespace(x='a') %}{% for i in range(64) %}"
            "{% set ns.x = ns.x ~ ns.x %}{% endfor %}{{ ns.x }}"
        ),
        6,
        11,
        "joining values with ~ builds more than",
    ),
    # Many values, each within the bounds: the memory guard stops the whole.
    "growing": (
        prompt_task(
            "{% set ns = namespace(l=[]) %}{% for i in range(10000) %}"
            "{{ ns.l.append(['x' * 1000000]) or '' }}{% endfor %}"
        ),
        6,
        11,
        "rendering used more than",
    ),
    "format-width": (prompt_task("{{ '{:>999999999}'.format(1) }}"), 6, 11, "format field"),
    "fifty-mb-scalar": (
        HEAD + "  steps: [echo hi]\n  vars: {x: " + "a" * 50_000_000 + "}\n",
        1,
        1,
        "limited to 1024 KiB",
    ),
}


def run_cli(cwd: Path, *argv: str) -> dict[str, object]:
    done = forked.run(argv, cwd=cwd, env=os.environ, timeout=TIMEOUT)
    return {
        "code": done.returncode,
        "out": done.stdout.decode(errors="replace")[-4000:],
        "err": done.stderr.decode(errors="replace")[-4000:],
        "rss_mib": done.maxrss_kib / 1024,
        "cpu_s": done.cpu_s,
    }


@pytest.mark.parametrize("command", ["validate", "plan"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_hostile_input_refused_fast_and_small(tmp_path: Path, case: str, command: str) -> None:
    text, line, col, fragment = CASES[case]
    (tmp_path / "task.yml").write_text(text, encoding="utf-8")
    (tmp_path / "facts.json").write_text(
        json.dumps({"image_digests": {}, "graduation": {"version": 0}}), encoding="utf-8"
    )
    argv = [command, "--manifests", str(REPO / "manifests"), "task.yml"]
    if command == "plan":
        argv[1:1] = ["--facts", "facts.json"]
    result = run_cli(tmp_path, *argv)
    err = str(result["err"])
    assert result["code"] == 2, result
    assert "Traceback" not in err + str(result["out"])
    assert float(str(result["cpu_s"])) < LIMIT_SECONDS, (case, result["cpu_s"])
    assert float(str(result["rss_mib"])) < LIMIT_RSS_MIB, (case, result["rss_mib"])
    located = [ln for ln in err.splitlines() if fragment in ln]
    assert located, err
    where = f"task.yml:{line}:" + (f"{col}  " if col else "")
    assert located[0].startswith(where), located[0]
    assert err.rstrip().endswith("validation error"), err


def test_alias_sharing_below_budget_still_loads(tmp_path: Path) -> None:
    """Ordinary aliases (a shared block reused a few times) keep working."""
    text = HEAD + "  steps: [echo hi]\n  vars:\n    base: &b {a: 1, b: [x, y]}\n    one: *b\n"
    (tmp_path / "task.yml").write_text(text, encoding="utf-8")
    assert (
        main(["validate", "--manifests", str(REPO / "manifests"), str(tmp_path / "task.yml")]) == 0
    )


@pytest.mark.parametrize(
    "template",
    [
        "{{ ('x'*100000)|replace('', 'y'*100000) }}",
        "{{ ('a'*1000000)|wordwrap(1, true, 'b'*100000) }}",
        "{{ (['x'*1000000]*1000)|join }}",
        "{{ 'a'|center(3000000000) }}",
        "{{ 'a'.ljust(10**9) }}",
        "{{ '%999999999d' % 1 }}",
        "{{ 2**100000000 }}",
        "{{ lipsum(n=100000) }}",
        "{% from 'x' import y %}",
        "{% extends 'base' %}",
        "{% for i in range(200) %}{{ 'x' * 1000000 }}{% endfor %}",
    ],
)
def test_template_amplifiers_refused(template: str) -> None:
    start = time.process_time()  # CPU time: the work done, not the wait for a core
    with pytest.raises(Exception) as caught:
        render_prompt(template, {})
    assert time.process_time() - start < LIMIT_SECONDS
    assert isinstance(caught.value, TemplateLimit) or "lipsum" in str(caught.value)


def test_ordinary_templates_render() -> None:
    text = render_prompt(
        "Hi {{ name }}: {% for i in range(3) %}{{ i }}{% endfor %} {{ ('ab' * 2)|replace('a', 'c') }}"
        " {{ [1, 2]|join(',') }} {{ 2**10 }} {{ '%3d' % 7 }} {{ '{:>4}'.format('x') }}",
        {"name": "ops"},
    )
    assert text == "Hi ops: 012 cbcb 1,2 1024   7    x"


# In the child: a template that works ~0.5 s of CPU. When it has started rendering (its
# first call), a thread stops the whole process (SIGSTOP); the test holds it stopped 3 s.
STOPPED_RENDER = """
import os, signal, threading
from kagura_agent.manifest.template import render_prompt
started = threading.Event()
def stop():
    started.wait()
    os.kill(os.getpid(), signal.SIGSTOP)
def start():
    started.set()
    return ""
threading.Thread(target=stop, daemon=True).start()
source = "{{ start() }}{% for i in range(50) %}{% for j in range(1000) %}{% endfor %}{% endfor %}done"
print(render_prompt(source, {"start": start}))
"""


def test_a_template_is_bounded_by_its_work_not_by_waiting_for_a_core() -> None:
    """The render's time bound is CPU time: a template stopped while it renders (as one is
    on a loaded machine, waiting for a core) is not refused for the time it did not run.
    With a wall-clock deadline this render was refused ('took longer than 2 s')."""
    child = forked.spawn([], cwd="/", env=os.environ, code=STOPPED_RENDER)
    stat = Path(f"/proc/{child.pid}/stat")
    deadline = time.monotonic() + 60
    while stat.read_text().rsplit(")", 1)[1].split()[0] != "T":
        assert time.monotonic() < deadline, "the child never stopped"
        time.sleep(0.01)
    time.sleep(3.0)
    os.kill(child.pid, signal.SIGCONT)
    done = child.wait(timeout=60)
    assert done.cpu_s < 2.0, done  # the template's work fits the bound: only the stop did not
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.decode().strip() == "done"


@pytest.mark.parametrize(("label", "pattern"), SECRET_PATTERNS)
def test_secret_patterns_scan_in_linear_time(label: str, pattern: object) -> None:
    """No pattern rescans a run from every start (the JWT one did: 8 s for 200 kB)."""
    import re

    assert isinstance(pattern, re.Pattern)
    units = ["eyJ-", "sk-ant-", "sk-", "xoxb-", "AKIA", "aws secret ", "cf_token ", "ghp_", "a"]
    # The bound is the one every input has (5 s), on 1 MB of the worst repetitions: a
    # linear scan takes tens of milliseconds even on a loaded machine, while the old
    # quadratic one would take minutes — so this fails only for a real regression, never
    # for a busy CI host (0.5 s did, at load 13).
    for unit in units:
        text = unit * (1_000_000 // len(unit))
        start = time.process_time()  # CPU time: the work done, not the wait for a core
        pattern.search(text)
        assert time.process_time() - start < LIMIT_SECONDS, (label, unit)
