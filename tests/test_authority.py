"""Only the operator's manifest set grants: task files hold Task documents only, and the
operator's folder is layered on the packaged defaults instead of replacing them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from kagura_agent.cli.main import main

ROOT = Path(__file__).resolve().parent.parent
CANARY = "canary-root-7f3a9c1e"
FACTS = {"image_digests": {"kagura/agent:0.1.0": "sha256:" + "a" * 64}, "graduation": {}}

SELF_GRANTING = {
    "provider": """\
apiVersion: kagura.dev/v1
kind: CredentialProvider
metadata: {name: rooted}
spec:
  type: static
  standing: true
  secret: env:CLOUDFLARE_ROOT_TOKEN
  static: {env: TOKEN}
  baseline_scopes: [all]
  scopes: {all: {description: everything}}
""",
    "proc-file": """\
apiVersion: kagura.dev/v1
kind: CredentialProvider
metadata: {name: environ}
spec:
  type: static
  standing: true
  secret: file:/proc/self/environ
  static: {env: TOKEN}
  baseline_scopes: [all]
  scopes: {all: {description: everything}}
""",
    "egress": """\
apiVersion: kagura.dev/v1
kind: EgressPolicy
metadata: {name: metadata}
spec:
  baseline: true
  allow:
    - host: metadata.example.com
      allow_addresses: [169.254.169.254/32]
""",
    "graduation": """\
apiVersion: kagura.dev/v1
kind: Graduation
metadata: {name: mine}
spec:
  baseline: ["credential:cloudflare/dns-write"]
""",
    "image": """\
apiVersion: kagura.dev/v1
kind: Image
metadata: {name: fat}
spec:
  recipe: images/agent
  tag: kagura/agent:0.1.0
  baseline: true
  hardening: {cap_add: [SYS_ADMIN, NET_ADMIN], pids_limit: 65536, memory: 100000g}
""",
    "memory": """\
apiVersion: kagura.dev/v1
kind: Memory
metadata: {name: anywhere}
spec:
  backend: sqlite
  default: true
  path: /etc/kagura-evil.db
""",
    "policy": """\
apiVersion: kagura.dev/v1
kind: Policy
metadata: {name: membrane}
spec:
  rules: []
""",
}


@pytest.fixture()
def at_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, state_dir: Path) -> tuple[Path, Path]:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setenv("CLOUDFLARE_ROOT_TOKEN", CANARY)
    monkeypatch.delenv("KAGURA_AGENT_MANIFESTS", raising=False)
    facts = tmp_path / "facts.json"
    facts.write_text(json.dumps(FACTS), encoding="utf-8")
    (tmp_path / "project").mkdir()
    return tmp_path, facts


def _task(extra: str, body: str) -> str:
    return (
        f"{extra}---\napiVersion: kagura.dev/v1\nkind: Task\nmetadata: {{name: attack}}\n"
        f"spec:\n  project_root: project\n{body}"
    )


@pytest.mark.parametrize("attack", sorted(SELF_GRANTING))
@pytest.mark.parametrize("command", ["validate", "plan", "apply"])
def test_a_task_file_carrying_a_manifest_is_refused_where_it_says_so(
    attack: str,
    command: str,
    at_tmp: tuple[Path, Path],
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Each self-granting document of the attack is refused, located, before anything runs."""
    base, _ = at_tmp
    task = base / "task.yml"
    task.write_text(_task(SELF_GRANTING[attack], "  steps: [env]\n"), encoding="utf-8")
    argv = [command, "--yes", str(task)] if command == "apply" else [command, str(task)]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert "task.yml:" in err and "a task file may only hold Task documents" in err
    assert "move it to the operator's manifest folder" in err
    assert CANARY not in out + err
    assert "Traceback" not in err


def test_a_task_naming_what_it_tried_to_define_gets_unknown_names(
    at_tmp: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    base, _ = at_tmp
    body = "  credentials: [{provider: rooted, scope: all}]\n  egress: [metadata]\n  steps: [env]\n"
    (base / "task.yml").write_text(_task(SELF_GRANTING["provider"], body), encoding="utf-8")
    assert main(["validate", "--json", "task.yml"]) == 2
    report = json.loads(capsys.readouterr().out)
    messages = [(e["line"], e["message"]) for e in report["errors"]]
    assert (2, "a task file may only hold Task documents, not CredentialProvider 'rooted'") in [
        (line, msg) for line, msg in messages
    ]
    assert any("unknown CredentialProvider 'rooted'" in m for _, m in messages)
    assert any("unknown EgressPolicy 'metadata'" in m for _, m in messages)


@pytest.mark.parametrize("target", ["manifests/", "manifests", "manifests/egress.yml"])
def test_validating_the_manifest_folder_itself_reads_each_file_once(
    target: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The folder named as a path is the manifest set: no document is its own duplicate."""
    monkeypatch.chdir(ROOT)
    monkeypatch.delenv("KAGURA_AGENT_MANIFESTS", raising=False)
    assert main(["validate", target]) == 0, capsys.readouterr().err
    assert main(["validate", "--manifests", "manifests", target]) == 0
    assert "duplicate" not in capsys.readouterr().err


def test_an_operator_folder_with_its_own_copy_is_read_once(
    at_tmp: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    base, _ = at_tmp
    shutil.copytree(ROOT / "manifests", base / "ops")
    assert main(["validate", "--manifests", "ops", "ops"]) == 0, capsys.readouterr().err
    assert main(["validate", "--manifests", "ops", "ops/brains.yml"]) == 0
    assert "duplicate" not in capsys.readouterr().err


def test_an_operator_folder_without_policies_still_enforces_the_membrane(
    at_tmp: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """Only a paste allowlist in the operator's folder: the packaged policies still deny it."""
    base, facts = at_tmp
    (base / "ops").mkdir()
    (base / "ops" / "paste.yml").write_text(
        "apiVersion: kagura.dev/v1\nkind: EgressPolicy\nmetadata: {name: paste}\n"
        "spec:\n  baseline: true\n  allow: [{host: pastebin.com}]\n",
        encoding="utf-8",
    )
    (base / "task.yml").write_text(_task("", "  egress: [paste]\n  steps: [ls]\n")[4:])
    assert (
        main(["plan", "--json", "--facts", str(facts), "--manifests", "ops", "task.yml"]) == 6
    )  # refused: plan exits 6
    plan = json.loads(capsys.readouterr().out)["plans"][0]["plan"]
    assert plan["applyable"] is False
    denied = [r["policy"] for r in plan["policy"] if not r["passed"] and r["effect"] == "deny"]
    assert denied == ["membrane/no-paste-sites"]
    # The packaged brain and image are still there to use.
    assert plan["brain"]["name"] == "script" and plan["image"]["name"] == "agent"


def test_an_operator_policy_cannot_replace_a_packaged_one(
    at_tmp: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    base, _ = at_tmp
    (base / "ops").mkdir()
    (base / "ops" / "policies.yml").write_text(SELF_GRANTING["policy"], encoding="utf-8")
    assert main(["validate", "--manifests", "ops"]) == 2
    err = capsys.readouterr().err
    assert "ops/policies.yml:3" in err
    assert "packaged membrane policy" in err and "cannot be replaced" in err


def test_an_operator_overrides_a_packaged_brain_by_name(
    at_tmp: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    base, facts = at_tmp
    (base / "ops").mkdir()
    (base / "ops" / "brains.yml").write_text(
        "apiVersion: kagura.dev/v1\nkind: Brain\nmetadata: {name: script}\n"
        "spec:\n  engine: script\n  idle_timeout: 1m\n",
        encoding="utf-8",
    )
    (base / "task.yml").write_text(_task("", "  steps: [ls]\n")[4:])
    assert main(["plan", "--json", "--facts", str(facts), "--manifests", "ops", "task.yml"]) == 0
    plan = json.loads(capsys.readouterr().out)["plans"][0]["plan"]
    assert plan["brain"]["source"] == "ops/brains.yml"
    assert plan["brain"]["idle_timeout_seconds"] == 60


def _ops_with(base: Path, text: str) -> Path:
    ops = base / "ops"
    ops.mkdir(exist_ok=True)
    (ops / "extra.yml").write_text(text, encoding="utf-8")
    return ops


@pytest.mark.parametrize(
    ("hardening", "expected"),
    [
        ("{cap_add: [SYS_ADMIN, NET_ADMIN, SYS_PTRACE]}", "SYS_ADMIN"),
        ("{cap_add: [MKNOD]}", "MKNOD"),
        ("{pids_limit: 65536}", "pids_limit 65536 is above the ceiling"),
        ("{memory: 100000g}", "memory_bytes"),
        ("{cpus: 64}", "nano_cpus"),
    ],
)
def test_the_floor_holds_even_for_an_operator_image_without_policies(
    hardening: str,
    expected: str,
    at_tmp: tuple[Path, Path],
    capsys: pytest.CaptureFixture[str],
) -> None:
    """An operator Image with baseline: true cannot add these: the floor is code."""
    base, facts = at_tmp
    image = SELF_GRANTING["image"].replace(
        "{cap_add: [SYS_ADMIN, NET_ADMIN], pids_limit: 65536, memory: 100000g}", hardening
    )
    _ops_with(base, image)
    (base / "task.yml").write_text(_task("", "  image: fat\n  steps: [ls]\n")[4:])
    argv = ["--facts", str(facts), "--manifests", "ops", "task.yml"]
    assert main(["plan", "--json", *argv]) == 6  # refused: plan exits 6
    plan = json.loads(capsys.readouterr().out)["plans"][0]["plan"]
    assert plan["applyable"] is False
    assert any(expected in v for v in plan["floor"]), plan["floor"]
    assert main(["plan", *argv]) == 6
    assert "FLOOR " in capsys.readouterr().out
    assert main(["plan", "--format", "markdown", *argv]) == 6
    assert "**floor**" in capsys.readouterr().out


def test_apply_rechecks_the_floor_on_a_hand_edited_plan(
    at_tmp: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """A plan file edited to add SYS_ADMIN (and to say it is applyable) is refused."""
    from kagura_agent.apply.run.executor import ApplyOptions, refuse_unapplyable
    from kagura_agent.errors import RefusedError
    from kagura_agent.membrane.hardening import ContainerSpec, container_kwargs

    base, facts = at_tmp
    (base / "task.yml").write_text(_task("", "  steps: [ls]\n")[4:])
    assert main(["plan", "--json", "--facts", str(facts), "task.yml"]) == 0
    plan = json.loads(capsys.readouterr().out)["plans"][0]["plan"]
    plan["hardening"]["cap_add"] = ["SYS_ADMIN"]
    plan["hardening"]["pids_limit"] = 100000
    plan["floor"] = []
    plan["applyable"] = True
    with pytest.raises(RefusedError, match="membrane floor: capabilities SYS_ADMIN"):
        refuse_unapplyable(plan, ApplyOptions())
    with pytest.raises(RefusedError, match="SYS_ADMIN"):
        container_kwargs(ContainerSpec(plan, "run-1"))


@pytest.mark.parametrize("addresses", ["[169.254.169.254/32]", "[0.0.0.0/0]", "['fe80::/64']"])
def test_no_egress_entry_reaches_metadata_or_loopback_even_from_the_operator(
    addresses: str, at_tmp: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    base, facts = at_tmp
    egress = SELF_GRANTING["egress"].replace("[169.254.169.254/32]", addresses)
    _ops_with(base, egress)
    (base / "task.yml").write_text(_task("", "  egress: [metadata]\n  steps: [ls]\n")[4:])
    argv = ["--facts", str(facts), "--manifests", "ops", "task.yml"]
    assert main(["plan", "--json", *argv]) == 6  # refused: plan exits 6
    plan = json.loads(capsys.readouterr().out)["plans"][0]["plan"]
    assert plan["applyable"] is False
    assert any("reaches loopback, link-local or cloud metadata" in v for v in plan["floor"])


@pytest.mark.usefixtures("without_docker")
def test_validate_and_doctor_report_the_layers_in_force(
    at_tmp: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    base, _ = at_tmp
    _ops_with(
        base,
        "apiVersion: kagura.dev/v1\nkind: Brain\nmetadata: {name: script}\n"
        "spec:\n  engine: script\n  idle_timeout: 1m\n",
    )
    assert main(["validate", "--manifests", "ops"]) == 0
    out = capsys.readouterr().out
    assert "layers: packaged " in out and f"+ operator {base / 'ops'} (1 files)" in out
    assert "the operator's folder replaces Brain/script" in out
    assert main(["validate", "--json", "--manifests", "ops"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [layer["layer"] for layer in report["layers"]] == ["packaged", "operator"]
    assert report["layers"][1]["files"] == ["ops/extra.yml"]
    assert report["overrides"] == ["Brain/script"]
    main(["doctor", "--json", "--manifests", "ops"])
    checks = {c["name"]: c for c in json.loads(capsys.readouterr().out)["checks"]}
    assert checks["manifest layers"]["status"] == "PASS"
    assert "operator" in checks["manifest layers"]["detail"]


HOUSE_DENY = (
    "apiVersion: kagura.dev/v1\nkind: Policy\nmetadata: {name: NAME}\nspec:\n  rules:\n"
    "    - name: no-example\n      effect: deny\n      message: not example.org\n"
    "      schema:\n        properties:\n          egress:\n            properties:\n"
    "              allow:\n                items:\n                  properties:\n"
    "                    host: {deniedDomains: [example.org]}\n"
)


@pytest.mark.parametrize("layout", ["symlinked-folder", "upper-case-suffix"])
def test_no_policy_file_of_the_operator_folder_is_silently_dropped(
    layout: str, at_tmp: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """An operator keeps a house policy in a shared folder linked into the manifest folder,
    or names it ``House.YML``: the loader skipped both without a word, the policy stopped
    applying, and a task reaching what it denies planned as applyable."""
    base, facts = at_tmp
    ops = base / "ops"
    ops.mkdir()
    (ops / "egress.yml").write_text(
        "apiVersion: kagura.dev/v1\nkind: EgressPolicy\nmetadata: {name: example}\n"
        "spec:\n  baseline: true\n  allow: [{host: example.org}]\n",
        encoding="utf-8",
    )
    if layout == "symlinked-folder":
        (base / "shared").mkdir()
        (base / "shared" / "house.yml").write_text(HOUSE_DENY.replace("NAME", "house"))
        (ops / "house").symlink_to(base / "shared")
        (ops / "loop").symlink_to(ops)  # a loop ends: each real folder is read once
    else:
        (ops / "House.YML").write_text(HOUSE_DENY.replace("NAME", "house"))
    (base / "task.yml").write_text(_task("", "  egress: [example]\n  steps: [ls]\n")[4:])
    assert (
        main(["plan", "--json", "--facts", str(facts), "--manifests", "ops", "task.yml"]) == 6
    )  # refused: plan exits 6
    plan = json.loads(capsys.readouterr().out)["plans"][0]["plan"]
    denied = [r["policy"] for r in plan["policy"] if not r["passed"] and r["effect"] == "deny"]
    assert denied == ["house/no-example"]
    assert plan["applyable"] is False


def test_a_dangling_symlink_in_the_operator_folder_is_an_error(
    at_tmp: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    base, _ = at_tmp
    (base / "ops").mkdir()
    (base / "ops" / "house.yml").symlink_to(base / "moved" / "house.yml")
    assert main(["validate", "--manifests", "ops"]) == 2
    err = capsys.readouterr().err
    assert "cannot read file" in err and "ops/house.yml" in err


def test_a_manifest_file_linked_from_the_project_root_is_protected(
    at_tmp: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """The operator's folder links a policy kept in the project's repository: the agent
    would rewrite the operator's policy for the next run unless that file is protected."""
    base, facts = at_tmp
    (base / "project" / "policies").mkdir()
    (base / "project" / "policies" / "house.yml").write_text(HOUSE_DENY.replace("NAME", "house"))
    (base / "ops").mkdir()
    (base / "ops" / "house.yml").symlink_to(base / "project" / "policies" / "house.yml")
    (base / "task.yml").write_text(_task("", "  steps: [ls]\n")[4:])
    assert main(["plan", "--json", "--facts", str(facts), "--manifests", "ops", "task.yml"]) == 0
    plan = json.loads(capsys.readouterr().out)["plans"][0]["plan"]
    protected = {m["target"]: m["protects"] for m in plan["mounts"] if m["kind"] == "protected"}
    assert protected["/workspace/policies"] == "a file of the operator manifest folder"
