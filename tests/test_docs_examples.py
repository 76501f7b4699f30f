"""Every example in docs/ and the README is checked: manifests validate, commands parse.

- each ```yaml block is a manifest set: it validates with the packaged defaults;
- each ``kagura-agent …`` line in a code block parses with the real argument parser
  (placeholders such as RUN or CATEGORY are filled in first);
- the docs stand alone: no relative link leaves the repository, and no page talks about
  the project's issue tracker.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
from pathlib import Path

import pytest

from kagura_agent.cli.main import cached_parser
from testing.inprocess import run_main

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)
# Words the docs use as placeholders in command lines, and what stands in for them.
PLACEHOLDERS = {
    "RUN": "run-0123",
    "ID": "1",
    "CATEGORY": "egress:pypi",
    "SESSION": "s-1",
    "TEXT": "hello",
    "NAME": "base",
    "NAME...": "base",
    "FILE": "f.yml",
    "REV": "main",
    "SHELL": "bash",
}


def _blocks(lang: str | None = None) -> list[tuple[str, str]]:
    found = []
    for page in PAGES:
        for fence, body in FENCE.findall(page.read_text(encoding="utf-8")):
            if lang is None or fence == lang:
                found.append((f"{page.relative_to(ROOT)}", body))
    return found


def _command_lines() -> list[tuple[str, str]]:
    lines = []
    for page, body in _blocks():
        for raw in body.splitlines():
            line = raw.strip().removeprefix("$ ")
            if line.startswith("kagura-agent ") and "…" not in line:
                lines.append((page, line))
    return lines


YAML_BLOCKS = _blocks("yaml")
COMMANDS = _command_lines()


def test_the_docs_have_yaml_examples_and_commands() -> None:
    pages = {page for page, _ in YAML_BLOCKS}
    assert {"docs/egress.md", "docs/cockpit.md"} <= pages
    assert len(COMMANDS) > 20


@pytest.mark.parametrize(("page", "body"), YAML_BLOCKS, ids=[p for p, _ in YAML_BLOCKS])
def test_every_yaml_example_validates(page: str, body: str, tmp_path: Path) -> None:
    manifests = tmp_path / "manifests"
    shutil.copytree(ROOT / "manifests", manifests)
    (manifests / "zz-example.yml").write_text(body, encoding="utf-8")
    done = run_main(["validate", "--manifests", str(manifests)], cwd=tmp_path, env=os.environ)
    assert done.returncode == 0, f"{page}:\n{body}\n{done.stdout}{done.stderr}"


def _argv(line: str) -> list[str]:
    words = shlex.split(line.split("  #")[0].split(" # ")[0])[1:]
    argv: list[str] = []
    skip = False
    for word in words:
        if word in (">", ">>"):  # a shell redirection ends the command's own words
            break
        if word == "|":  # "A | B": one of them is enough
            skip = True
            continue
        if skip or word.startswith(("[", "(")) or word.endswith(("]", ")")) or "|" in word:
            skip = False
            continue  # an optional part, a choice list or a remark in a usage line
        argv.append(PLACEHOLDERS.get(word, word))
    return argv


@pytest.mark.parametrize(("page", "line"), COMMANDS, ids=[f"{p}:{c[:50]}" for p, c in COMMANDS])
def test_every_command_in_the_docs_parses(page: str, line: str) -> None:
    parser = cached_parser()  # the one main() parses with
    try:
        args = parser.parse_args(_argv(line))
    except SystemExit as exc:  # argparse's way of saying "usage error"
        pytest.fail(f"{page}: `{line}` does not parse (exit {exc.code})")
    assert getattr(args, "handler", None) is not None, line


def test_no_link_leaves_the_repository() -> None:
    link = re.compile(r"\]\(([\w./:-]+)(?:#[\w-]*)?\)")
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        assert "../shared" not in text, page
        for target in link.findall(text):
            if re.match(r"[a-z]+://", target):
                continue
            resolved = (page.parent / target).resolve()
            assert resolved.is_relative_to(ROOT), f"{page}: link to {target} leaves the repository"
            assert resolved.exists(), f"{page}: link to {target} does not exist"


def test_no_page_talks_about_issues() -> None:
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        found = re.findall(r"[^.\n]*\bissues?\b[^.\n]*", text, re.I)
        assert not found, f"{page}: {found}"
