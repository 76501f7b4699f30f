"""A pull request's plan comment: which tasks a change touches, and the comment's body.

``changed_files`` asks git what changed since the merge base with the target branch;
``select_tasks`` turns that into task files to plan (a changed task file, or every task
under the given folders when a manifest changed); ``comment_body`` renders the plans as
one markdown comment whose first line is a marker, so a CI job can find and update its
own comment instead of adding a new one on every push.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import yaml

from kagura_agent import hostproc
from kagura_agent.errors import KaguraError, UsageError, ValidationError
from kagura_agent.hygiene import neutralise
from kagura_agent.inputfile import Unreadable, read_text
from kagura_agent.manifest.loader import yaml_files
from kagura_agent.manifest.workspace import load_workspace
from kagura_agent.plan.diff import Change
from kagura_agent.plan.manifestdiff import diff_catalogs
from kagura_agent.plan.model import Plan
from kagura_agent.plan.render import markdown_with_changes

MARKER = "<!-- kagura-agent plan -->"
_MAX_TASK_BYTES = 1 << 20  # larger files are not task files we would plan anyway


def git_root(cwd: Path) -> Path:
    return Path(_git(cwd, "rev-parse", "--show-toplevel").strip())


def changed_files(base: str, cwd: Path) -> list[str]:
    """Files added or modified since the merge base of ``base`` and HEAD (deleted ones are
    gone from the tree and have nothing to plan), relative to the repository root."""
    out = _git(cwd, "diff", "--name-only", "--diff-filter=d", "-z", f"{base}...HEAD", "--")
    return sorted(name for name in out.split("\0") if name)


def removed_task_files(base: str, cwd: Path) -> list[str]:
    """Task files (at the merge base) the branch deleted, relative to the repository root:
    a task that no longer runs is a change a reviewer sees."""
    out = _git(cwd, "diff", "--name-only", "--diff-filter=D", "-z", f"{base}...HEAD", "--")
    merge_base = _git(cwd, "merge-base", base, "HEAD").strip()
    removed = []
    for name in sorted(n for n in out.split("\0") if n):
        if Path(name).suffix not in (".yml", ".yaml"):
            continue
        text = _git(cwd, "show", f"{merge_base}:{name}")
        if _holds_tasks(text):
            removed.append(name)
    return removed


def _git(cwd: Path, *args: str) -> str:
    try:
        done = hostproc.run(
            ["git", "-C", str(cwd.resolve()), *args],
            env=hostproc.environment(),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except OSError as exc:
        raise UsageError(f"cannot run git: {exc.strerror}") from None
    if done.returncode != 0:
        raise UsageError(f"git {' '.join(args[:2])} failed: {done.stderr.strip()[:300]}")
    return str(done.stdout)


def is_task_file(path: Path) -> bool:
    """A YAML file whose documents are Tasks (our task files hold nothing else)."""
    try:
        return _holds_tasks(read_text(path, _MAX_TASK_BYTES))
    except Unreadable:
        return False


def _holds_tasks(text: str) -> bool:
    if len(text) > _MAX_TASK_BYTES:
        return False
    try:
        docs = list(yaml.safe_load_all(text))
    except yaml.YAMLError:
        return False
    return bool(docs) and all(isinstance(d, dict) and d.get("kind") == "Task" for d in docs if d)


def manifest_changes(manifests: str | None, base: str) -> tuple[list[Change], str]:
    """(every manifest added, removed or changed since ``base``, widening first; why the
    manifest set could not be compared, "" when it was)."""
    try:
        head = load_workspace(manifests, []).catalog
    except KaguraError as exc:
        return [], f"the manifests do not load: {problem_text(exc)}"
    try:
        old = load_workspace(manifests, [], base_rev=base).catalog
    except KaguraError as exc:
        return [], f"the manifests at {base} do not load: {problem_text(exc)}"
    return diff_catalogs(old, head), ""


def problem_text(exc: KaguraError, limit: int = 20) -> str:
    """An error for a comment: a validation error names each problem, file:line:col
    first (never only "1 validation error")."""
    if isinstance(exc, ValidationError):
        shown = [
            d.render().replace("\n    hint: ", " (hint: ") + (")" if d.hint else "")
            for d in exc.diagnostics[:limit]
        ]
        more = len(exc.diagnostics) - len(shown)
        return "; ".join(shown) + (f"; and {more} more" if more > 0 else "")
    return exc.message


def select_tasks(
    changed: Sequence[str], root: Path, manifests: Path, task_dirs: Sequence[Path]
) -> tuple[list[Path], list[str]]:
    """(task files to plan, changed manifest files), both sorted.

    A changed manifest can change any plan, so then every task under ``task_dirs`` is
    planned too; otherwise only the task files the change touched.
    """
    manifests = manifests.resolve()
    tasks: set[Path] = set()
    manifest_changes: list[str] = []
    for name in changed:
        path = (root / name).resolve()
        if path.suffix not in (".yml", ".yaml"):
            continue
        if path.is_relative_to(manifests):
            manifest_changes.append(name)
        elif any(part.startswith(".") for part in Path(name).parts):
            continue
        elif is_task_file(path):
            tasks.add(path)
    if manifest_changes:
        for folder in task_dirs:
            tasks.update(p.resolve() for p in yaml_files(folder) if is_task_file(p))
    return sorted(tasks), manifest_changes


def comment_body(
    base: str,
    sections: Sequence[str],
    manifest_files: Sequence[str],
    problems: Sequence[str],
    *,
    widened: Sequence[str] = (),
    manifest_diff: Sequence[Change] = (),
    removed: Sequence[str] = (),
) -> str:
    """The whole comment: marker, what widens a grant (first, open), the manifest diff,
    problems (each located), tasks removed, one section per planned task."""
    lines = [MARKER, f"## kagura-agent plan against `{base}`", ""]
    if widened:
        lines += [f"### Widened grants ({len(widened)})", "", "```diff"]
        lines += [neutralise(line, newlines=False) for line in widened]
        lines += ["```", ""]
    if manifest_files:
        lines.append("Changed manifests: " + ", ".join(f"`{m}`" for m in manifest_files))
        lines.append("")
    if manifest_diff:
        lines += ["```diff", *(change.render() for change in manifest_diff), "```", ""]
    if removed:
        lines.append("Removed task files: " + ", ".join(f"`{name}`" for name in removed))
        lines.append("")
    if not sections and not problems and not removed:
        lines.append("No task or manifest change to plan.")
    for problem in problems:
        lines.append(f"> **error**: {neutralise(problem, newlines=False)}")
    if problems:
        lines.append("")
    body = "\n".join(lines) + "\n"
    return body + "".join("\n" + section for section in sections)


def plan_section(plan: Plan, changes: Sequence[Change], label: str) -> str:
    return markdown_with_changes(plan, list(changes), label)
