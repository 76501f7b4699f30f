"""docs/manifests.md is generated from schemas/*.json and must not drift from them."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent


def generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "gen_manifest_docs", ROOT / "scripts" / "gen_manifest_docs.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_manifest_reference_is_up_to_date() -> None:
    expected = generator().render()
    current = (ROOT / "docs" / "manifests.md").read_text(encoding="utf-8")
    assert current == expected, (
        "docs/manifests.md is stale: run python scripts/gen_manifest_docs.py"
    )


def test_check_mode_reports_staleness(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module = generator()
    stale = tmp_path / "docs" / "manifests.md"
    stale.parent.mkdir()
    monkeypatch.setattr(module, "ROOT", tmp_path)
    monkeypatch.setattr(module, "OUTPUT", stale)
    stale.write_text("# old\n", encoding="utf-8")
    assert module.main(["--check"]) == 1
    assert module.main([]) == 0
    assert module.main(["--check"]) == 0


def test_every_kind_and_every_field_is_documented() -> None:
    """Each kind has a section, and every spec property of every schema has a row."""
    text = (ROOT / "docs" / "manifests.md").read_text(encoding="utf-8")
    module = generator()
    for kind in module.KINDS:
        assert f"\n## {kind}\n" in text
        schema = json.loads((ROOT / "schemas" / f"{kind.lower()}.json").read_text("utf-8"))
        for name in schema["properties"]["spec"].get("properties", {}):
            assert f"| `spec.{name}` |" in text, f"{kind}: spec.{name} missing"


def test_kinds_match_the_loader() -> None:
    from kagura_agent.manifest.schema import KINDS

    assert tuple(generator().KINDS) == KINDS


def plan_generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "gen_plan_docs", ROOT / "scripts" / "gen_plan_docs.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_plan_field_table_is_up_to_date() -> None:
    current = (ROOT / "docs" / "plan-format.md").read_text(encoding="utf-8")
    assert current == plan_generator().render(current), (
        "docs/plan-format.md's field table is stale: run python scripts/gen_plan_docs.py"
    )


def test_plan_table_check_mode_reports_staleness(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = plan_generator()
    stale = tmp_path / "plan-format.md"
    stale.write_text(
        f"# prose\n\n{module.BEGIN}\n| old |\n{module.END}\n\nafter\n", encoding="utf-8"
    )
    monkeypatch.setattr(module, "ROOT", tmp_path)
    monkeypatch.setattr(module, "OUTPUT", stale)
    assert module.main(["--check"]) == 1
    assert module.main([]) == 0
    assert module.main(["--check"]) == 0
    text = stale.read_text(encoding="utf-8")
    assert text.startswith("# prose\n") and text.endswith("\nafter\n")
    assert "| `hardening.tmpfs` |" in text
