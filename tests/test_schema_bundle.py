"""``kagura-agent schema --all``: one JSON Schema (oneOf on kind) that every example passes.

Editors (yaml-language-server) use it for files that mix kinds; docs/gitops.md shows the
modeline. Every shipped manifest, example, golden case and docs example validates with it,
and typical mistakes (an unknown key, an unknown kind, the wrong type) do not.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from kagura_agent.cli.main import main
from kagura_agent.manifest.schema import KINDS

ROOT = Path(__file__).resolve().parents[1]
# The documents are read at collection, in every worker: libyaml's parser when it is there.
LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@pytest.fixture(scope="module")
def validator() -> jsonschema.Draft202012Validator:
    from kagura_agent.manifest.bundle import bundle_schema

    schema = bundle_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def _documents() -> list[tuple[str, dict[str, Any]]]:
    files = [
        *ROOT.glob("manifests/*.yml"),
        *ROOT.glob("examples/*/*.yml"),
        *ROOT.glob("examples/*/manifests/*.yml"),
        *ROOT.glob("tests/plans/*/task.yml"),
        *ROOT.glob("tests/plans/*/manifests/*.yml"),
    ]
    found = []
    # examples/mistakes holds the README's deliberate mistakes (tests/test_readme.py).
    files = [f for f in files if f.parent.name != "mistakes"]
    for file in sorted(files):
        for index, doc in enumerate(yaml.load_all(file.read_text(), Loader=LOADER)):
            if doc:
                found.append((f"{file.relative_to(ROOT)}#{index}", doc))
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for block in re.findall(r"^```yaml\n(.*?)^```", page.read_text(), re.M | re.S):
            for index, doc in enumerate(yaml.load_all(block, Loader=LOADER)):
                found.append((f"{page.relative_to(ROOT)}#{index}", doc))
    return found


DOCUMENTS = _documents()


def test_the_bundle_covers_every_kind_and_is_printed(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["schema", "--all"]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert [branch["$ref"] for branch in schema["oneOf"]] == [f"#/$defs/{k}" for k in KINDS]
    kinds_seen = {doc["kind"] for _, doc in DOCUMENTS}
    assert {"Task", "EgressPolicy", "Transport", "Brain", "Policy"} <= kinds_seen


@pytest.mark.parametrize(("where", "doc"), DOCUMENTS, ids=[w for w, _ in DOCUMENTS])
def test_every_example_validates(
    where: str, doc: dict[str, Any], validator: jsonschema.Draft202012Validator
) -> None:
    errors = [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(doc)]
    assert errors == [], where


@pytest.mark.parametrize(
    "doc",
    [
        {
            "apiVersion": "kagura.dev/v1",
            "kind": "Task",
            "metadata": {"name": "t"},
            "spec": {"steps": ["true"], "egres": ["pypi"]},
        },
        {"apiVersion": "kagura.dev/v1", "kind": "Tusk", "metadata": {"name": "t"}, "spec": {}},
        {
            "apiVersion": "kagura.dev/v1",
            "kind": "EgressPolicy",
            "metadata": {"name": "e"},
            "spec": {"allow": [{"host": "a.example.com", "port": 8443}]},
        },
        {
            "apiVersion": "kagura.dev/v1",
            "kind": "Transport",
            "metadata": {"name": "s"},
            "spec": {"type": "irc"},
        },
    ],
    ids=["unknown-key", "unknown-kind", "port-not-ports", "bad-enum"],
)
def test_mistakes_do_not_validate(
    doc: dict[str, Any], validator: jsonschema.Draft202012Validator
) -> None:
    assert not validator.is_valid(doc)


def test_the_editor_section_promises_only_what_the_language_server_does() -> None:
    """The YAML language server checks the first document of a file against a modeline's
    schema, not those after a ``---``: docs/gitops.md says so and names what checks the
    rest, instead of promising that files mixing kinds are checked in the editor."""
    page = " ".join((ROOT / "docs" / "gitops.md").read_text().split())
    assert "so files that mix kinds are checked too" not in page
    assert "checks a file's first document against it" in page
    assert "`kagura-agent validate` and the pre-commit hook, which check every document" in page
