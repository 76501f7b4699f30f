"""docs/credentials.md's table of provider types says where each key is written: every key
it lists as a provider setting is one under that ``spec.<settings>`` block of the
CredentialProvider schema, every scope key one under ``spec.scopes.<name>`` (a reader once
put a GitHub App's ``app_id`` in a scope because the table listed it as a scope key)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kagura_agent.manifest.schema import load_schema

ROOT = Path(__file__).resolve().parents[1]
PAGE = (ROOT / "docs" / "credentials.md").read_text(encoding="utf-8")
HEADER = "| type | root secret | provider settings (`spec.<settings>`) | scope keys"


def _rows() -> list[list[str]]:
    lines = PAGE.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(HEADER))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def _keys(cell: str) -> set[str]:
    return set(re.findall(r"`([a-z_]+)`", cell))


SPEC = load_schema("CredentialProvider")["properties"]["spec"]
SCOPE_KEYS = set(SPEC["properties"]["scopes"]["additionalProperties"]["properties"])


def test_the_table_has_every_provider_type() -> None:
    types = [re.sub(r"`", "", row[0]) for row in _rows()]
    assert types == ["aws-sts", "gcp", "cloudflare", "github-app", "static"]
    assert set(types) == set(SPEC["properties"]["type"]["enum"])


@pytest.mark.parametrize("row", _rows(), ids=lambda row: row[0].strip("`"))
def test_each_key_is_where_the_table_says(row: list[str]) -> None:
    settings_cell, scope_cell = row[2], row[3]
    block, _, keys = settings_cell.partition(":")
    block = block.strip("` ")
    assert block in SPEC["properties"], block
    settings = set(SPEC["properties"][block]["properties"])
    listed = _keys(keys)
    assert listed and listed <= settings, (block, listed - settings)
    assert not listed & (SCOPE_KEYS - settings), "a scope key listed as a provider setting"
    scope = _keys(scope_cell)
    assert scope <= SCOPE_KEYS, scope - SCOPE_KEYS
    assert not scope & settings, ("a provider setting listed as a scope key", scope & settings)
