"""One-off tasks: the Task document that `run "TEXT"`, `repl` and the cockpit's `run TEXT`
write to the state directory (kept there for review) and then plan like any task file."""

from __future__ import annotations

import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from kagura_agent.clock import Clock, SystemClock
from kagura_agent.errors import UsageError
from kagura_agent.manifest.catalog import Catalog
from kagura_agent.manifest.workspace import load_workspace
from kagura_agent.paths import state_dir


@dataclass(frozen=True)
class AdhocTask:
    """A one-off task as the operator asked for it: the ``text``, and the names the
    options chose (``--brain``, ``--image``, ``--egress``, ``--tool-server``; a chat's
    brain ``session``). ``brain`` None: the first LLM brain of the manifest set;
    ``project_root`` None: the current directory."""

    text: str
    brain: str | None = None
    image: str | None = None
    egress: Sequence[str] = ()
    session: str | None = None
    project_root: Path | None = None
    tool_servers: Sequence[str] = ()


def write_adhoc_task(task: AdhocTask, *, manifests: str | None, clock: Clock | None = None) -> Path:
    """Write ``task`` as a Task document under the state directory; return its path.

    Every name is checked first, so a wrong one is reported against the option that gave
    it and no file is written. Each call writes a new file (the cockpit writes from many
    threads): named by the clock's millisecond plus a random suffix.
    """
    catalog = load_workspace(manifests, []).catalog
    chosen = checked_brain(catalog, task)
    found = catalog.get("Brain", chosen)
    document = adhoc_task(
        replace(task, brain=chosen, project_root=(task.project_root or Path.cwd()).resolve()),
        script=found is not None and found.spec["engine"] == "script",
    )
    folder = state_dir() / "adhoc"
    folder.mkdir(parents=True, exist_ok=True)
    millis = int((clock or SystemClock()).now().timestamp() * 1000)
    path = folder / f"{millis}-{secrets.token_hex(4)}.yml"
    with path.open("x", encoding="utf-8") as stream:
        stream.write(yaml.safe_dump(document, sort_keys=False))
    return path


def adhoc_task(task: AdhocTask, *, script: bool = False) -> dict[str, Any]:
    """The Task document of ``task`` (its brain and project root chosen): ``text`` is a
    template *value*, never template source. For the script brain (``script``) the text is
    the one step it runs (steps are no template)."""
    text = task.text
    name = re.sub(r"[^a-z0-9-]+", "-", text.lower())[:40].strip("-") or "task"
    spec: dict[str, Any] = {"brain": task.brain}
    if script:
        spec["steps"] = [text]
    else:
        spec.update({"prompt": "{{ text }}", "vars": {"text": text}})
    spec.update({"project_root": str(task.project_root), "kind": "adhoc"})
    if task.session:
        spec["session"] = task.session
    if task.egress:
        spec["egress"] = list(task.egress)
    if task.image:
        spec["image"] = task.image
    if task.tool_servers:
        spec["tool_servers"] = list(task.tool_servers)
    return {
        "apiVersion": "kagura.dev/v1",
        "kind": "Task",
        "metadata": {"name": f"run-{name}"[:63].rstrip("-")},
        "spec": spec,
    }


def checked_brain(catalog: Catalog, task: AdhocTask) -> str:
    """The brain to use, after checking every name given (by --brain, --image, --egress,
    --tool-server).

    A wrong name is the user's option, so the error names the option, not the task file
    generated from it.
    """
    brain = task.brain
    given = [("--brain", "Brain", brain), ("--image", "Image", task.image)]
    given += [("--egress", "EgressPolicy", name) for name in task.egress]
    given += [("--tool-server", "ToolServer", name) for name in task.tool_servers]
    for option, kind, name in given:
        if name and catalog.get(kind, name) is None:
            known = ", ".join(catalog.names(kind)) or "(none)"
            raise UsageError(f"{option} {name}: no {kind} of that name", hint=f"known: {known}")
    return brain or _llm_brain(catalog)


def _llm_brain(catalog: Catalog) -> str:
    default = catalog.default("Brain")
    if default is not None and default.spec["engine"] != "script":
        return default.name
    for found in catalog.of("Brain"):
        if found.spec["engine"] != "script":
            return found.name
    raise UsageError(
        "no LLM brain in the manifests", hint="add a Brain with engine sdk or kagura-brain"
    )
