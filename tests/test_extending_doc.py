"""docs/extending.md names, for each kind of extension, the sibling to copy and the
places a new one is registered: every file it names exists, and every registry it names
holds the sibling (its yaml examples are validated by tests/test_docs_examples.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from kagura_agent.brain.engines import _EXTRAS
from kagura_agent.brain.protocol import ENGINES
from kagura_agent.manifest.schema import KINDS
from kagura_agent.membrane.providers import PROVIDER_TYPES
from kagura_agent.membrane.providers.traits import TRAITS

REPO = Path(__file__).resolve().parent.parent
PAGE = (REPO / "docs" / "extending.md").read_text()


def _enum(schema: str, *path: str) -> list[str]:
    node = json.loads((REPO / "schemas" / schema).read_text())
    for key in path:
        node = node[key]
    return list(node["enum"])


def test_every_file_the_guide_names_exists() -> None:
    named = set(
        re.findall(r"`((?:kagura_agent|schemas|testing|tests|scripts|docs)/[^`<> ]+)`", PAGE)
    )
    assert len(named) > 20
    missing = sorted(path for path in named if not (REPO / path).exists())
    assert missing == []


def test_each_sibling_is_where_the_guide_says_a_new_one_goes() -> None:
    spec = ("properties", "spec", "properties")
    # A credential provider type: the module table, its traits, the schema's enum.
    for sibling in ("cloudflare", "aws-sts"):
        assert sibling in PROVIDER_TYPES and sibling in TRAITS
        assert sibling in _enum("credentialprovider.json", *spec, "type")
    # A brain engine: ENGINES, select_engine's extras, the schema's enum.
    assert {"script", "sdk"} <= set(ENGINES) and "sdk" in _EXTRAS
    assert {"script", "sdk"} <= set(_enum("brain.json", *spec, "engine"))
    # A transport: serve builds it by type, the schema's enum.
    serve = (REPO / "kagura_agent" / "cli" / "serve.py").read_text()
    assert 'if kind == "discord":' in serve and "def _transport(" in serve
    assert "discord" in _enum("transport.json", *spec, "type")
    # A manifest kind: KINDS and its schema file.
    assert "Workspace" in KINDS and (REPO / "schemas" / "workspace.json").exists()
    assert all((REPO / "schemas" / f"{kind.lower()}.json").exists() for kind in KINDS)
