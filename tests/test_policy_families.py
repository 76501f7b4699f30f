"""Deny rules on hosts match families, not strings; public-suffix wildcards are refused.

Through the CLI (``plan --json`` with an operator folder holding only an EgressPolicy):
every spelling that reaches a paste site — a subdomain, a wildcard over it, a wildcard
over a subdomain, another letter case, a trailing dot — is denied by the packaged
``membrane/no-paste-sites`` rule. Wildcards over a public suffix never validate.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kagura_agent.cli.main import main
from kagura_agent.plan.policy import check_rule, reaches

ROOT = Path(__file__).resolve().parents[1]
FACTS = {
    "image_digests": {"kagura/agent:0.1.0": "sha256:" + "a" * 64},
    "graduation": {"version": 0},
}
TASK = (
    "apiVersion: kagura.dev/v1\nkind: Task\nmetadata: {name: leak}\n"
    "spec:\n  project_root: project\n  egress: [outbound]\n  steps: [ls]\n"
)


@pytest.fixture()
def at_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, state_dir: Path) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.delenv("KAGURA_AGENT_MANIFESTS", raising=False)
    (tmp_path / "facts.json").write_text(json.dumps(FACTS), encoding="utf-8")
    (tmp_path / "project").mkdir()
    (tmp_path / "ops").mkdir()
    (tmp_path / "task.yml").write_text(TASK, encoding="utf-8")
    return tmp_path


def _policy(base: Path, host: str) -> None:
    (base / "ops" / "egress.yml").write_text(
        "apiVersion: kagura.dev/v1\nkind: EgressPolicy\nmetadata: {name: outbound}\n"
        f"spec:\n  allow: [{{host: {json.dumps(host)}}}]\n",
        encoding="utf-8",
    )


@pytest.mark.parametrize(
    "host",
    [
        "pastebin.com",
        "www.pastebin.com",
        "*.pastebin.com",
        "*.www.pastebin.com",
        "PasteBin.COM",
        "pastebin.com.",
        "a.b.transfer.sh",
    ],
)
def test_every_spelling_of_a_paste_site_is_denied(
    host: str, at_tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _policy(at_tmp, host)
    argv = ["plan", "--json", "--facts", "facts.json", "--manifests", "ops", "task.yml"]
    assert main(argv) == 6, capsys.readouterr().err  # refused: plan exits 6
    plan = json.loads(capsys.readouterr().out)["plans"][0]["plan"]
    assert plan["applyable"] is False
    denied = [r for r in plan["policy"] if not r["passed"] and r["effect"] == "deny"]
    assert [r["policy"] for r in denied] == ["membrane/no-paste-sites"]
    assert denied[0]["violations"][0]["path"] == "$.egress.allow[0].host"
    assert "reaches the denied domain" in denied[0]["violations"][0]["message"]


@pytest.mark.parametrize(
    "host", ["pastebin.community", "notpastebin.com", "*.bin.com", "paste.example"]
)
def test_neighbours_of_a_denied_domain_are_not_denied(
    host: str, at_tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _policy(at_tmp, host)
    argv = ["plan", "--json", "--facts", "facts.json", "--manifests", "ops", "task.yml"]
    assert main(argv) == 0, capsys.readouterr().err
    plan = json.loads(capsys.readouterr().out)["plans"][0]["plan"]
    assert all(r["passed"] for r in plan["policy"] if r["policy"] == "membrane/no-paste-sites")


def test_a_wildcard_over_a_parent_domain_reaches_the_denied_one() -> None:
    """``*.com`` (refused at validate anyway) would reach pastebin.com: the rule says so."""
    assert reaches("*.com", "pastebin.com")
    rule = {"properties": {"host": {"deniedDomains": ["pastebin.com"]}}}
    assert check_rule(rule, {"host": "*.com"})
    assert not check_rule(rule, {"host": "*.org"})


@pytest.mark.parametrize(
    ("host", "suffix"),
    [
        ("*.co.uk", "co.uk"),
        ("*.github.io", "github.io"),
        ("*.com", ""),
        ("*.s3.amazonaws.com", "s3.amazonaws.com"),
    ],
)
def test_public_suffix_wildcards_are_refused_at_validate(
    host: str, suffix: str, at_tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _policy(at_tmp, host)
    assert main(["validate", "--manifests", "ops", "task.yml"]) == 2
    err = capsys.readouterr().err
    assert "ops/egress.yml:" in err and "$.spec.allow[0].host" in err, err
    if suffix:
        assert f"covers the public suffix {suffix}" in err, err
    else:
        assert "at least two labels" in err, err


def test_a_registrable_domain_under_a_public_suffix_is_fine(
    at_tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _policy(at_tmp, "*.example.co.uk")
    assert main(["validate", "--manifests", "ops", "task.yml"]) == 0, capsys.readouterr().err


@pytest.mark.usefixtures("without_docker")
def test_a_repeated_plan_does_not_load_the_suffix_list_again(tmp_path: Path) -> None:
    """The packaged set has a wildcard (*.amazonaws.com): the first plan checks it against
    the list, later plans answer from the pass cache and stay fast."""
    code = (
        "import sys\n"
        "from kagura_agent.cli.main import main\n"
        "assert main(['plan', '--allow-unapplyable', 'examples/hello/task.yml']) == 0\n"
        "print('publicsuffixlist' in sys.modules)\n"
    )
    env = {
        **os.environ,
        "KAGURA_AGENT_STATE_DIR": str(tmp_path / "state"),
        "KAGURA_AGENT_CACHE_DIR": str(tmp_path / "cache"),
        "PYTHONPATH": str(ROOT),
    }
    loaded = []
    for _ in range(2):
        done = subprocess.run(
            [sys.executable, "-c", code],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        loaded.append(done.stdout.strip().splitlines()[-1])
    assert loaded == ["True", "False"]
