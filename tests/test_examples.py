"""Every shipped manifest and example validates and plans, and each example shows its point."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kagura_agent.cli.main import main

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted(p.parent.name for p in (ROOT / "examples").glob("*/task.yml"))
FACTS = {
    "image_digests": {"kagura/agent:0.1.0": "sha256:" + "a" * 64},
    "graduation": {"version": 0},
}


@pytest.fixture()
def at_root(monkeypatch: pytest.MonkeyPatch, state_dir: Path, tmp_path: Path) -> Path:
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.delenv("KAGURA_AGENT_MANIFESTS", raising=False)
    facts = tmp_path / "facts.json"
    facts.write_text(json.dumps(FACTS), encoding="utf-8")
    return facts


def example_args(example: str) -> list[str]:
    """An example with its own operator folder (examples/X/manifests) is planned with it."""
    folder = ROOT / "examples" / example / "manifests"
    own = ["--manifests", f"examples/{example}/manifests"] if folder.is_dir() else []
    return [*own, f"examples/{example}/task.yml"]


def plan_json(capsys: pytest.CaptureFixture[str], *argv: str) -> Any:
    code = main(["plan", "--json", *argv])
    out, err = capsys.readouterr()
    result = json.loads(out)
    # A plan apply would refuse (denied-paste) makes plan exit 6, its JSON still printed.
    refused = not all(entry["admission"]["applyable"] for entry in result["plans"])
    assert code == (6 if refused else 0), err
    assert result["ok"] is True and result["errors"] == []
    plans = [entry["plan"] for entry in result["plans"]]
    return plans[0] if len(plans) == 1 else plans


def test_at_least_six_examples() -> None:
    assert len(EXAMPLES) >= 6


def test_default_manifests_validate(at_root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["valid"] is True
    assert report["manifests"] >= 9


def test_packaged_defaults_used_outside_a_checkout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """With no ./manifests and no --manifests, the packaged default set is used."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("KAGURA_AGENT_MANIFESTS", raising=False)
    assert main(["validate"]) == 0, capsys.readouterr().err


@pytest.mark.parametrize("example", EXAMPLES)
def test_example_validates_and_plans(
    example: str, at_root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    task = f"examples/{example}/task.yml"
    assert main(["validate", *example_args(example)]) == 0, capsys.readouterr().err
    capsys.readouterr()
    plan = plan_json(capsys, "--facts", str(at_root), *example_args(example))
    assert plan["task"]["file"] == task
    assert plan["image"]["resolved"] is True


def test_examples_show_their_point(at_root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plans = {
        example: plan_json(capsys, "--facts", str(at_root), *example_args(example))
        for example in EXAMPLES
    }
    assert set(plans) == set(EXAMPLES)
    hello = plans["hello"]
    assert hello["brain"]["engine"] == "script"
    assert hello["egress"]["mode"] == "none" and not hello["credentials"]
    assert plans["summarise-repo"]["brain"]["engine"] == "sdk"
    # Its project root is a sample repository of its own, never the tool's checkout.
    assert plans["summarise-repo"]["task"]["project_root"] == str(
        ROOT / "examples" / "summarise-repo" / "sample"
    )
    deploy = {c["category"]: c["class"] for c in plans["deploy-staging"]["credentials"]}
    assert {"credential:aws/deployer", "credential:cloudflare/dns-read"} <= set(deploy)
    assert deploy["credential:cloudflare/dns-read"] == "baseline"
    dns = {c["category"]: c["class"] for c in plans["dns-change"]["credentials"]}
    assert dns["credential:cloudflare/dns-write"] == "needs-approval"
    denied = plans["denied-paste"]
    assert denied["applyable"] is False
    assert any(not r["passed"] and r["effect"] == "deny" for r in denied["policy"])
    prompt = plans["templated"]["task"]["prompt"]
    assert "0.16.1" in prompt and "{{" not in prompt


@pytest.mark.usefixtures("docker_client")  # the digests Docker reports
def test_examples_plan_with_real_facts(at_root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Without --facts the real gather runs (Docker digest when reachable, else unresolved)."""
    for example in EXAMPLES:
        code = main(["plan", *example_args(example)])
        out, err = capsys.readouterr()
        # Not applyable (a policy denies it, a checkout the agent cannot write): exit 6.
        assert code == (6 if "applyable    NO" in out else 0), err
        assert out.count("Plan for task ") == 1


@pytest.mark.parametrize("kind", ["Brain", "Task", "EgressPolicy"])
def test_schema_command_prints_json_schema(kind: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["schema", kind]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert schema["title"] == kind


@pytest.mark.parametrize("command", ["validate", "plan"])
def test_a_path_that_is_not_yaml_says_which(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([command, "/dev/null"]) == 2
    assert "/dev/null is neither a YAML file nor a directory" in capsys.readouterr().err
    assert main([command, str(tmp_path / "absent.yml")]) == 2
    assert "absent.yml does not exist" in capsys.readouterr().err
