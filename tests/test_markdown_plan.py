"""The markdown plan (a pull-request comment) shows egress classes and what to approve."""

from __future__ import annotations

from pathlib import Path

import pytest

from kagura_agent.cli.main import main

ROOT = Path(__file__).resolve().parents[1]


def _markdown(capsys: pytest.CaptureFixture[str], task: str, *extra: str) -> str:
    # The comment is the point here, refused plans included: the old exit code.
    assert main(["plan", "--format", "markdown", "--allow-unapplyable", *extra, task]) == 0
    return capsys.readouterr().out


@pytest.fixture(autouse=True)
def _at_root(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("KAGURA_AGENT_STATE_DIR", str(tmp_path / "state"))


@pytest.mark.usefixtures("without_docker")
def test_egress_rows_carry_their_class(capsys: pytest.CaptureFixture[str]) -> None:
    text = _markdown(capsys, "examples/dns-change/task.yml")
    rows = [line for line in text.splitlines() if line.startswith("| egress |")]
    assert rows == [
        "| egress | `https://api.cloudflare.com:443` (policy cloudflare-api) | needs-approval |",
    ]
    # The model host is no forward-port entry: the calls go through the key-injecting port.
    [calls] = [line for line in text.splitlines() if line.startswith("| model calls |")]
    assert "https://api.anthropic.com:443 through the key-injecting port only" in calls
    assert "the provider reaches nothing for the agent" in calls


@pytest.mark.usefixtures("without_docker")
def test_the_approvals_section_names_each_decision_and_the_flags(
    capsys: pytest.CaptureFixture[str],
) -> None:
    text = _markdown(capsys, "examples/dns-change/task.yml")
    section = text.split("#### Approvals\n", 1)[1].split("\n\n- **", 1)[0]
    assert "- **needs-approval** `egress:cloudflare-api`: locked;" in section
    assert "- **needs-approval** `credential:cloudflare/dns-write`: locked;" in section
    assert (
        "`kagura-agent apply --yes --approve egress:cloudflare-api"
        " --approve credential:cloudflare/dns-write …`" in section
    )


@pytest.mark.usefixtures("without_docker")
def test_a_baseline_plan_says_nothing_needs_approval(capsys: pytest.CaptureFixture[str]) -> None:
    text = _markdown(capsys, "examples/hello/task.yml")
    assert "#### Approvals\n\nNothing to approve: every capability is baseline." in text


@pytest.mark.usefixtures("without_docker")
def test_a_denied_capability_is_listed(capsys: pytest.CaptureFixture[str]) -> None:
    text = _markdown(
        capsys,
        "examples/denied-paste/task.yml",
        "--manifests",
        "examples/denied-paste/manifests",
    )
    assert "- **denied** `egress:paste`" in text
    assert "| denied |" in text


def test_the_pinned_egress_proxy_image_has_its_row(capsys: pytest.CaptureFixture[str]) -> None:
    case = ROOT / "tests" / "plans" / "egress-wildcards"
    facts = str(case / "facts.json")
    text = _markdown(
        capsys, str(case / "task.yml"), "--manifests", str(case / "manifests"), "--facts", facts
    )
    rows = [line for line in text.splitlines() if line.startswith("| egress proxy image |")]
    assert rows == ["| egress proxy image | `kagura/egress-proxy:0.1.0` sha256:333333333333… | |"]
