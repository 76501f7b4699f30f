"""The ``State`` manifest: which state store every command of an operator's folder opens.

    apiVersion: kagura.dev/v1
    kind: State
    metadata: {name: team}
    spec:
      backend: postgres
      url: env:KAGURA_TEAM_STATE_URL      # or file:/etc/kagura/state-url

Why a kind of its own (and not a field of Policy or Memory): the store is chosen before
anything else is read — ``leases``, ``graduation``, ``queue`` and ``runner`` open it with no
task and no plan — so it must be found without compiling the manifest set, and there is
exactly one per folder. A Policy may be layered and several are merged; a Memory names one
of several memory backends. The URL is a secret reference (it carries the password): the
schema refuses a URL written inline.

Where it is read from: the folder in ``KAGURA_AGENT_STATE_MANIFESTS`` (the CLI sets it
from ``--manifests`` for itself and the processes it starts: the cockpit's applies, a
runner's), else the operator's default folder (``$KAGURA_AGENT_MANIFESTS``, else
./manifests). Only files that mention ``kind: State`` are parsed, so a folder without
one costs a directory listing. ``KAGURA_AGENT_STATE_URL`` overrides it (state.py).

Problems are the manifest's, located: two State documents, a reference that does not
resolve, a value that is not a ``postgresql://`` URL.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from kagura_agent.errors import Diagnostic, KaguraError, ValidationError
from kagura_agent.inputfile import Unreadable, read_text
from kagura_agent.manifest.loader import (
    MAX_FILE_BYTES,
    display_path,
    manifests_dir,
    read_text_source,
    yaml_files,
)
from kagura_agent.manifest.schema import validate_document
from kagura_agent.manifest.yamlpos import YamlDoc
from kagura_agent.membrane.secrets import resolve

MANIFESTS_ENV = "KAGURA_AGENT_STATE_MANIFESTS"
_MENTIONS = re.compile(r"^\s*kind:\s*[\"']?State[\"']?\s*(#.*)?$", re.M)


@dataclass(frozen=True)
class StateChoice:
    """The store a State manifest names: its URL and where that was said."""

    url: str
    name: str
    where: str  # FILE:LINE of the manifest
    # What the choice was read from: the folder, the manifest file and a file: reference.
    reads: tuple[str, ...] = ()

    def origin(self) -> str:
        return f"State {self.name} ({self.where})"


def folder() -> Path:
    """The operator folder whose State manifest chooses the store."""
    chosen = os.environ.get(MANIFESTS_ENV, "").strip()
    return Path(chosen) if chosen else manifests_dir(None)


def state_documents(directory: Path) -> list[YamlDoc]:
    """The State documents of ``directory`` (files that do not mention one are not parsed)."""
    return [doc for _file, doc in _state_documents(directory)]


def _state_documents(directory: Path) -> list[tuple[Path, YamlDoc]]:
    found: list[tuple[Path, YamlDoc]] = []
    for file in yaml_files(directory):
        try:
            text = read_text(file, MAX_FILE_BYTES)
        except Unreadable:
            continue  # validate reports it; here it cannot hold the State manifest
        if not _MENTIONS.search(text):
            continue
        sources = read_text_source(text, display_path(file))
        found.extend(
            (file, doc)
            for doc in sources.docs
            if isinstance(doc.value, dict) and doc.value.get("kind") == "State"
        )
    return found


def choose(directory: Path) -> StateChoice | None:
    """The store ``directory``'s State manifest names (None: it has none); every problem
    with it, located, as a ValidationError."""
    located = _state_documents(directory)
    docs = [doc for _file, doc in located]
    if not docs:
        return None
    problems: list[Diagnostic] = []
    for doc in docs:
        problems.extend(validate_document(doc))
    first = docs[0]
    for extra in docs[1:]:
        line, col = extra.where(("kind",))
        problems.append(
            Diagnostic(
                extra.file,
                line,
                col,
                "$.kind",
                "more than one State manifest: the state store is one"
                f" (the other is at {first.file}:{first.where(('kind',))[0]})",
            )
        )
    if problems:
        raise ValidationError(problems)
    spec = first.value["spec"]
    name = str(first.value["metadata"]["name"])
    line, col = first.where(("spec", "url"))

    def url_problem(message: str) -> ValidationError:
        return ValidationError([Diagnostic(first.file, line, col, "$.spec.url", message)])

    try:
        url = resolve(spec["url"]).strip()
    except KaguraError as exc:
        raise url_problem(f"State {name}: {spec['url']} does not resolve: {exc}") from None
    if urlsplit(url).scheme not in ("postgresql", "postgres"):
        raise url_problem(f"State {name}: {spec['url']} holds no postgresql:// URL")
    reads = [str(directory), str(located[0][0])]
    if str(spec["url"]).startswith("file:"):
        reads.append(str(spec["url"]).removeprefix("file:"))
    return StateChoice(url, name, f"{first.file}:{first.where(('kind',))[0]}", tuple(reads))
