"""Every capability the membrane floor forbids is refused by name, on its own.

The floor (membrane/floor.py) is code so that it holds when the packaged policies are
missing or edited: each forbidden capability is tried alone — never beside SYS_ADMIN,
which the packaged policies refuse first and which would hide a missing entry — through
an operator Image in a manifest set with no Policy at all, and through a saved plan edited
by hand (its fingerprints recomputed). The list tried is the code's list joined with the
one docs/authority.md promises, so deleting an entry from either fails a test here.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from apply_helpers import run_ids
from plan_forgery import forge

from kagura_agent.apply.run.executor import ApplyOptions, refuse_unapplyable
from kagura_agent.cli.main import main
from kagura_agent.errors import RefusedError
from kagura_agent.manifest import loader, workspace
from kagura_agent.membrane.floor import ADDABLE_CAPABILITIES, FORBIDDEN_CAPABILITIES
from kagura_agent.membrane.hardening import ContainerSpec, container_kwargs
from kagura_agent.plan import planfile

ROOT = Path(__file__).resolve().parent.parent
FACTS = {"image_digests": {"kagura/agent:0.1.0": "sha256:" + "a" * 64}, "graduation": {}}


def _documented() -> frozenset[str]:
    """The capabilities docs/authority.md says are never added."""
    text = (ROOT / "docs" / "authority.md").read_text(encoding="utf-8")
    match = re.search(r"capabilities never added: (.*?);", text, re.S)
    assert match, "docs/authority.md no longer lists the forbidden capabilities"
    return frozenset(re.findall(r"\b[A-Z][A-Z_]+\b", match[1]))


def _schema_capabilities() -> frozenset[str]:
    schema = json.loads((ROOT / "schemas" / "image.json").read_text(encoding="utf-8"))
    hardening = schema["properties"]["spec"]["properties"]["hardening"]["properties"]
    return frozenset(hardening["cap_add"]["items"]["enum"])


DOCUMENTED = _documented()
# Union, not the code's list alone: a test parametrised over the code's list loses the
# case of the very entry a sabotage deleted.
FORBIDDEN = sorted(FORBIDDEN_CAPABILITIES | DOCUMENTED)
NAMEABLE = _schema_capabilities()


def test_the_floor_forbids_what_the_docs_promise() -> None:
    assert DOCUMENTED == FORBIDDEN_CAPABILITIES
    for must in ("ALL", "SYS_ADMIN", "NET_ADMIN", "SYS_PTRACE", "SYS_MODULE", "BPF"):
        assert must in FORBIDDEN_CAPABILITIES
    # What an Image may name in its manifest is either addable or forbidden, never neither.
    assert NAMEABLE <= ADDABLE_CAPABILITIES | FORBIDDEN_CAPABILITIES
    assert not ADDABLE_CAPABILITIES & FORBIDDEN_CAPABILITIES


@pytest.fixture()
def bare(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, state_dir: Path
) -> tuple[Path, list[str]]:
    """A packaged manifest set with its policies deleted, an operator folder on top, and
    the argv tail that plans ``task.yml`` with them."""
    packaged = tmp_path / "packaged"
    shutil.copytree(ROOT / "manifests", packaged)
    (packaged / "policies.yml").unlink()
    assert not any("kind: Policy" in f.read_text() for f in packaged.glob("*.yml"))
    monkeypatch.setattr(loader, "packaged_dir", lambda: packaged)
    monkeypatch.setattr(workspace, "packaged_dir", lambda: packaged)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.delenv("KAGURA_AGENT_MANIFESTS", raising=False)
    (tmp_path / "facts.json").write_text(json.dumps(FACTS), encoding="utf-8")
    (tmp_path / "project").mkdir()
    (tmp_path / "ops").mkdir()
    return tmp_path, ["--facts", "facts.json", "--manifests", "ops", "task.yml"]


def _image_adding(base: Path, cap: str) -> None:
    (base / "ops" / "image.yml").write_text(
        "apiVersion: kagura.dev/v1\nkind: Image\nmetadata: {name: fat}\nspec:\n"
        "  recipe: images/agent\n  tag: kagura/agent:0.1.0\n  baseline: true\n"
        f"  hardening: {{cap_add: [{cap}]}}\n",
        encoding="utf-8",
    )
    (base / "task.yml").write_text(
        "apiVersion: kagura.dev/v1\nkind: Task\nmetadata: {name: alone}\nspec:\n"
        "  project_root: project\n  image: fat\n  steps: [ls]\n",
        encoding="utf-8",
    )


def _floor_says(cap: str) -> str:
    return f"capabilities {cap} break the membrane and are never added"


@pytest.mark.parametrize("cap", FORBIDDEN)
def test_an_image_adding_one_forbidden_capability_is_refused_with_no_policy_at_all(
    cap: str, bare: tuple[Path, list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    base, argv = bare
    _image_adding(base, cap)
    if cap not in NAMEABLE:
        # The Image schema has no name for it: a located error, before any plan.
        assert main(["validate", "--manifests", "ops", "task.yml"]) == 2
        assert "$.spec.hardening.cap_add[0]" in capsys.readouterr().err
        return
    assert main(["plan", "--json", *argv]) == 6  # refused: plan exits 6
    [entry] = json.loads(capsys.readouterr().out)["plans"]
    plan = entry["plan"]
    assert plan["policy"] == []  # no policy to refuse it: only the floor does
    assert plan["hardening"]["cap_add"] == [cap]
    assert plan["floor"] == [_floor_says(cap)]
    assert plan["applyable"] is False and entry["admission"]["applyable"] is False
    with pytest.raises(RefusedError, match=_floor_says(cap)):
        refuse_unapplyable(plan, ApplyOptions())
    assert main(["plan", *argv]) == 6
    text = capsys.readouterr().out
    assert f"FLOOR {_floor_says(cap)}" in text and "applyable    NO" in text


@pytest.mark.parametrize("written", ["{cap}", "cap_{lower}"])
@pytest.mark.parametrize("cap", FORBIDDEN)
def test_a_saved_plan_edited_to_add_one_forbidden_capability_is_refused_by_name(
    cap: str,
    written: str,
    bare: tuple[Path, list[str]],
    state_dir: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """However the capability is spelt (Docker takes ``cap_sys_ptrace`` too)."""
    base, argv = bare
    (base / "task.yml").write_text(
        "apiVersion: kagura.dev/v1\nkind: Task\nmetadata: {name: edited}\nspec:\n"
        "  project_root: project\n  steps: [ls]\n",
        encoding="utf-8",
    )
    saved = base / "plan.json"
    assert main(["plan", *argv, "-o", str(saved)]) == 0
    spelt = written.format(cap=cap, lower=cap.lower())

    def add(plan: dict[str, Any]) -> None:
        plan["hardening"]["cap_add"] = [spelt]

    forge(saved, add)
    capsys.readouterr()
    plan = planfile.load(saved)  # it loads: the fingerprints match its content
    assert plan["applyable"] is True and plan["floor"] == []
    for check in (
        lambda: refuse_unapplyable(plan, ApplyOptions()),
        lambda: container_kwargs(ContainerSpec(plan, "r")),
    ):
        with pytest.raises(RefusedError, match=_floor_says(cap)):
            check()
    assert main(["show", str(saved)]) == 0
    text = capsys.readouterr().out
    assert f"FLOOR {_floor_says(cap)}" in text and "applyable    NO" in text
    assert main(["apply", "--yes", str(saved)]) == 6
    assert f"membrane floor: {_floor_says(cap)}" in capsys.readouterr().err
    assert run_ids(state_dir) == []
