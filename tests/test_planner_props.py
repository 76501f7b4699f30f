"""Properties of the planner and the plan commands.

- compile is pure and deterministic: no clock, environment or I/O inside;
- a saved plan edited by hand is refused (exit 6);
- ``plan -o`` then ``show`` renders the same plan;
- ``--detailed-exitcode``: 5 with changes, 0 without;
- ``--base REV`` diffs against the manifests at a git revision;
- canary secret values behind the references never appear in any output.
"""

from __future__ import annotations

import builtins
import json
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from kagura_agent.cli.main import main
from kagura_agent.errors import RefusedError
from kagura_agent.facts import Facts
from kagura_agent.manifest.workspace import load_workspace
from kagura_agent.plan import planfile
from kagura_agent.plan.planner import compile_plan, fingerprint

GOLDEN = Path(__file__).parent / "plans"


@pytest.fixture()
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, state_dir: Path) -> Path:
    """A copy of the aws-cloudflare-grants golden case as the working directory."""
    root = tmp_path / "project"
    shutil.copytree(GOLDEN / "aws-cloudflare-grants", root)
    for name in ("expected.json", "expected.txt"):
        (root / name).unlink()
    monkeypatch.chdir(root)
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.delenv("KAGURA_AGENT_MANIFESTS", raising=False)
    return root


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


PLAN = ("plan", "--manifests", "manifests", "--facts", "facts.json", "task.yml")


def _compile(facts: Facts) -> dict[str, Any]:
    workspace = load_workspace("manifests", ["task.yml"])
    return compile_plan(workspace.catalog, workspace.tasks[0], facts)


def test_compile_is_deterministic_across_env_and_time(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    facts = Facts.from_json(json.loads(Path("facts.json").read_text()))
    first = _compile(facts)
    monkeypatch.setenv("TZ", "Asia/Tokyo")
    monkeypatch.setenv("KAGURA_AGENT_STATE_DIR", str(project.parent / "elsewhere"))
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-changed-between-runs-0000000000")
    monkeypatch.setattr(time, "time", lambda: 4_000_000_000.0)
    monkeypatch.setattr(time, "monotonic", lambda: 123.0)
    second = _compile(facts)
    assert first == second
    assert first["fingerprint"] == second["fingerprint"] == fingerprint(second)


def test_compile_does_no_io(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """After a warm-up (lazy imports, cached schema digest) compile touches nothing."""
    facts = Facts.from_json(json.loads(Path("facts.json").read_text()))
    workspace = load_workspace("manifests", ["task.yml"])
    expected = compile_plan(workspace.catalog, workspace.tasks[0], facts)

    touched: list[str] = []

    def forbidden(*args: Any, **kwargs: Any) -> Any:
        touched.append(repr(args))
        raise OSError("I/O inside compile")

    # Patched only around the call (pytest itself needs the real functions to report).
    with monkeypatch.context() as patch:
        patch.setattr(builtins, "open", forbidden)
        patch.setattr(os, "stat", forbidden)
        patch.setattr(os, "listdir", forbidden)
        patch.setattr(os, "environ", {})
        patch.setattr(subprocess, "run", forbidden)
        patch.setattr(socket, "socket", forbidden)
        patch.setattr(time, "time", forbidden)
        try:
            again: Any = compile_plan(workspace.catalog, workspace.tasks[0], facts)
        except Exception as exc:  # reported below, outside the patch
            again = exc
    assert not touched, touched
    assert again == expected


def test_compile_does_not_mutate_its_inputs(project: Path) -> None:
    facts = Facts.from_json(json.loads(Path("facts.json").read_text()))
    workspace = load_workspace("manifests", ["task.yml"])
    before = json.dumps(
        [m.spec for k in workspace.catalog.by_kind for m in workspace.catalog.of(k)]
    )
    facts_before = json.dumps(facts.to_json(), sort_keys=True)
    compile_plan(workspace.catalog, workspace.tasks[0], facts)
    after = json.dumps([m.spec for k in workspace.catalog.by_kind for m in workspace.catalog.of(k)])
    assert before == after
    assert json.dumps(facts.to_json(), sort_keys=True) == facts_before


def test_cli_plan_is_deterministic(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, first, _ = cli(capsys, *PLAN, "--json")
    os.environ["SOME_UNRELATED_VARIABLE"] = "x"
    try:
        _, second, _ = cli(capsys, *PLAN, "--json")
    finally:
        del os.environ["SOME_UNRELATED_VARIABLE"]
    assert first == second


@pytest.mark.parametrize(
    "edit",
    [
        lambda p: p["egress"]["allow"].append({**p["egress"]["allow"][0], "host": "evil.example"}),
        lambda p: p["credentials"][0].update(ttl_seconds=86400),
        lambda p: p["hardening"].update(privileged=True),
        lambda p: p.update(applyable=not p["applyable"]),
    ],
    ids=["egress", "ttl", "privileged", "applyable"],
)
def test_hand_edited_plan_is_refused(
    edit: Any, project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli(capsys, *PLAN, "-o", "plan.json")[0] == 0
    plan = json.loads(Path("plan.json").read_text())
    edit(plan)
    Path("plan.json").write_text(json.dumps(plan, indent=2))
    code, out, err = cli(capsys, "show", "plan.json")
    assert code == 6
    assert "fingerprint mismatch" in err and not out
    with pytest.raises(RefusedError):
        planfile.load(Path("plan.json"))


def test_saved_plan_shows_the_same(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, planned, _ = cli(capsys, *PLAN, "-o", "plan.json")
    assert code == 0
    _, shown, _ = cli(capsys, "show", "plan.json")
    # plan adds the change list after the rendering; show renders the plan alone.
    assert shown and planned.startswith(shown)
    _, planned_json, _ = cli(capsys, *PLAN, "--json")
    _, shown_json, _ = cli(capsys, "show", "plan.json", "--json")
    planned_entry = json.loads(planned_json)["plans"][0]
    shown_entry = json.loads(shown_json)["plans"][0]
    assert planned_entry["plan"] == shown_entry["plan"] == planfile.load(Path("plan.json"))
    _, planned_md, _ = cli(capsys, *PLAN, "--format", "markdown")
    _, shown_md, _ = cli(capsys, "show", "plan.json", "--format", "markdown")
    assert planned_md.startswith(shown_md)


def _replace_host(old: str, new: str) -> None:
    egress = Path("manifests/egress.yml")
    text = egress.read_text()
    assert old in text
    egress.write_text(text.replace(old, new))


def test_detailed_exitcode(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Nothing applied yet: everything is new.
    assert cli(capsys, *PLAN, "--detailed-exitcode")[0] == 5
    assert cli(capsys, *PLAN, "-o", "saved.json")[0] == 0
    code, out, _ = cli(capsys, *PLAN, "--against", "saved.json", "--detailed-exitcode")
    assert code == 0 and "no changes against the saved plan saved.json" in out
    # Without --detailed-exitcode changes still exit 0.
    _replace_host("sts.amazonaws.com", "sts.us-east-1.amazonaws.com")
    assert cli(capsys, *PLAN, "--against", "saved.json")[0] == 0
    code, out, _ = cli(capsys, *PLAN, "--against", "saved.json", "--detailed-exitcode")
    assert code == 5
    assert "+ egress sts.us-east-1.amazonaws.com:443 (policy aws-sts)" in out
    assert "- egress sts.amazonaws.com:443 (policy aws-sts)" in out


def test_full_access_is_loud_in_the_plan_its_diff_and_its_approval(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The golden case's aws/deployer says full_access: true (and is listed in
    baseline_scopes): the text, markdown and approval reason say FULL ACCESS, and a
    scope narrowed later (or widened again) shows in the diff against the saved plan."""
    code, out, _ = cli(capsys, *PLAN, "-o", "saved.json")
    assert code == 0
    line = next(ln for ln in out.splitlines() if "aws/deployer (" in ln)
    assert "FULL ACCESS" in line
    assert "+ credential aws:deployer (ttl 30m, renewals 2, budget 90m, access FULL)" in out
    assert "FULL ACCESS" not in "".join(ln for ln in out.splitlines() if "cloudflare/" in ln)
    _, markdown, _ = cli(capsys, *PLAN, "--format", "markdown")
    assert "| credential | aws/deployer" in markdown and "FULL ACCESS" in markdown
    plan = planfile.load(Path("saved.json"))
    [approval] = [a for a in plan["approvals"] if a["category"] == "credential:aws/deployer"]
    assert "FULL ACCESS" in approval["reason"]
    creds = Path("manifests/credentials.yml")
    text = creds.read_text()
    narrowed = text.replace(
        "      full_access: true\n",
        "      session_policy:\n"
        '        Version: "2012-10-17"\n'
        "        Statement: [{Effect: Allow, Action: s3:GetObject, Resource: '*'}]\n",
    )
    assert narrowed != text
    creds.write_text(narrowed)
    code, out, _ = cli(capsys, *PLAN, "--against", "saved.json", "-o", "narrow.json")
    assert code == 0 and "~ credential aws:deployer access FULL → narrowed" in out
    assert "~ credential aws:deployer scope changed: session_policy" in out
    assert "FULL ACCESS" not in out
    # A narrowing that only widens (one more action) is a change of what a lease may do.
    creds.write_text(narrowed.replace("Action: s3:GetObject", "Action: [s3:GetObject, s3:*]"))
    code, out, _ = cli(capsys, *PLAN, "--against", "narrow.json", "--detailed-exitcode")
    assert code == 5 and "~ credential aws:deployer scope changed: session_policy" in out
    creds.write_text(text)
    code, out, _ = cli(capsys, *PLAN, "--against", "narrow.json")
    assert code == 0 and "~ credential aws:deployer access narrowed → FULL" in out


def _git(*args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid", *args],
        check=True,
        capture_output=True,
    )


def test_base_revision_diff(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _git("init", "-q", ".")
    _git("add", "manifests", "task.yml", "facts.json")
    _git("commit", "-q", "-m", "manifests")
    code, out, err = cli(capsys, *PLAN, "--base", "HEAD", "--detailed-exitcode")
    assert code == 0, err
    assert "no changes against the task and manifests at HEAD" in out
    _replace_host("api.cloudflare.com", "dns.cloudflare.example")
    code, out, err = cli(capsys, *PLAN, "--base", "HEAD", "--detailed-exitcode")
    assert code == 5, err
    assert "changes against the manifests at HEAD" in out
    assert "+ egress dns.cloudflare.example:443 (policy cloudflare-api)" in out
    assert "- egress api.cloudflare.com:443 (policy cloudflare-api)" in out
    # The working tree was read, HEAD was read with git: nothing was checked out.
    assert "dns.cloudflare.example" in Path("manifests/egress.yml").read_text()


def test_base_revision_unknown_is_a_usage_error(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _git("init", "-q", ".")
    code, _, err = cli(capsys, *PLAN, "--base", "no-such-rev")
    assert code == 2
    assert "Traceback" not in err
    # git's own one-line reason, not the command line that was run
    assert "git revision 'no-such-rev': fatal:" in err
    assert "ls-tree" not in err


CANARY = "kagura-canary-7f3a9c1e5b2d"


def test_canary_secrets_never_appear(
    project: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Plant values behind every secret reference; no output may contain them."""
    # Beside the project, never in it: a project root holding a secret folder is refused.
    secrets = project.parent / "secrets"
    secrets.mkdir()
    secret_file = secrets / "cloudflare-root-token"
    secret_file.write_text(f"{CANARY}-file\n")
    creds = Path("manifests/credentials.yml")
    creds.write_text(creds.read_text().replace("env:CLOUDFLARE_ROOT_TOKEN", f"file:{secret_file}"))
    # file: secrets only come from a directory a Policy declares.
    Path("manifests/secret-dirs.yml").write_text(
        "apiVersion: kagura.dev/v1\nkind: Policy\nmetadata: {name: test-secrets}\n"
        f"spec:\n  secret_dirs: [{secrets}]\n"
    )
    for name in ("ANTHROPIC_API_KEY", "KAGURA_AWS_ROOT_KEY", "CLOUDFLARE_ROOT_TOKEN"):
        monkeypatch.setenv(name, f"{CANARY}-{name}")
    outputs = []
    for extra in ((), ("--json",), ("--format", "markdown"), ("-o", "plan.json")):
        code, out, err = cli(capsys, *PLAN, *extra)
        assert code == 0, err
        outputs += [out, err]
    for extra in ((), ("--json",), ("--format", "markdown")):
        code, out, err = cli(capsys, "show", "plan.json", *extra)
        assert code == 0, err
        outputs += [out, err]
    outputs.append(Path("plan.json").read_text())
    joined = "\n".join(outputs)
    assert CANARY not in joined
    # The references themselves are shown, so a reviewer sees where secrets come from.
    assert f"file:{secret_file}" in joined
    assert "env:ANTHROPIC_API_KEY" in joined
