"""The content-addressed check cache never hides an error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kagura_agent.cli.main import main

VALID = """apiVersion: kagura.dev/v1
kind: EgressPolicy
metadata: {name: extra}
spec:
  allow:
    - host: example.org
"""


def test_a_cached_pass_is_rechecked_when_a_byte_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("KAGURA_AGENT_CACHE_DIR", str(tmp_path / "cache"))
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    extra = manifests / "extra.yml"
    extra.write_text(VALID)
    assert main(["validate", "--manifests", str(manifests)]) == 0
    assert any((tmp_path / "cache" / "schema-pass").glob("*/*"))
    # Same length, one byte different: a mistyped key must still be reported, located.
    extra.write_text(VALID.replace("  allow:", "  alloW:"))
    capsys.readouterr()
    assert main(["validate", "--manifests", str(manifests)]) == 2
    err = capsys.readouterr().err
    assert "extra.yml:5:3  $.spec.alloW  unknown key 'alloW'" in err


@pytest.mark.usefixtures("without_docker")
def test_an_unwritable_cache_only_costs_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("KAGURA_AGENT_CACHE_DIR", "/dev/null/no-cache")
    monkeypatch.setenv("KAGURA_AGENT_STATE_DIR", str(tmp_path / "state"))
    assert main(["plan", "--json", "--allow-unapplyable", "examples/hello/task.yml"]) == 0
    plan = json.loads(capsys.readouterr().out)["plans"][0]["plan"]
    assert plan["policy"] and all(rule["passed"] for rule in plan["policy"])


def test_old_entries_are_pruned(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os
    import time

    from kagura_agent.manifest.cache import PassCache

    monkeypatch.setenv("KAGURA_AGENT_CACHE_DIR", str(tmp_path))
    cache = PassCache("probe")
    cache.add("ab" * 32)
    cache.add("cd" * 32)
    old = time.time() - 40 * 86400
    os.utime(cache.folder / "ab" / ("ab" * 32), (old, old))
    assert cache.prune() == 1
    assert "ab" * 32 not in cache
    assert "cd" * 32 in cache
