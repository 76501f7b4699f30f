"""Messages a newcomer met that said too little or too much, through the real CLI (its
main, in process): each says what was wrong and what to write instead, and never a
traceback.

- a text field given a YAML boolean, number or null (``- true``): quote it;
- a host where a task names an EgressPolicy (``egress: [github.com]``): the policy names
  the manifest set has, and where a host goes;
- a CredentialProvider's ``ttl: 2h`` (clamped to 1h in silence): a located error naming
  15m..1h, or the scope's max_ttl;
- ``KAGURA_AGENT_STATE_URL`` without its scheme (``user:PASSWORD@db:5432/k``): the
  refusal repeated the URL with its password;
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from testing.inprocess import run_main

REPO = Path(__file__).resolve().parent.parent
MANIFESTS = REPO / "manifests"


def cli(
    cwd: Path, *argv: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    base = {
        **os.environ,
        "KAGURA_AGENT_STATE_DIR": str(cwd.parent / "state"),
        "KAGURA_AGENT_CACHE_DIR": str(cwd.parent / "cache"),
        "NO_COLOR": "1",
    }
    base.pop("KAGURA_AGENT_MANIFESTS", None)
    return run_main(argv, cwd=cwd, env={**base, **(env or {})})


def task(tmp_path: Path, spec: str) -> Path:
    root = tmp_path / "project"
    root.mkdir(exist_ok=True)
    path = root / "task.yml"
    path.write_text(
        "apiVersion: kagura.dev/v1\nkind: Task\nmetadata: {name: t}\nspec:\n" + spec,
        encoding="utf-8",
    )
    return path


def validate(path: Path, manifests: Path = MANIFESTS) -> subprocess.CompletedProcess[str]:
    proc = cli(path.parent, "validate", "--manifests", str(manifests), path.name)
    assert "Traceback" not in proc.stdout + proc.stderr
    return proc


@pytest.mark.parametrize(
    ("written", "read_as", "shown"),
    [
        ("true", "True", 'YAML read this as a boolean; quote it: "true"'),
        ("False", "False", 'YAML read this as a boolean; quote it: "False"'),
        ("1.0", "1.0", 'YAML read this as a number; quote it: "1.0"'),
        ("0x1F", "31", 'YAML read this as a number; quote it: "0x1F"'),
        ("null", "None", 'YAML read this as null; quote it: "null"'),
        ("~", "None", 'YAML read this as null; quote it: "~"'),
        ("", "None", "the value is empty (YAML reads that as null): write the text, quoted"),
    ],
)
def test_text_that_yaml_read_as_something_else(
    tmp_path: Path, written: str, read_as: str, shown: str
) -> None:
    path = task(tmp_path, f"  steps:\n    - {written}\n")
    proc = validate(path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"$.spec.steps[0]  {read_as} is not of type 'string'" in proc.stderr
    assert f"    hint: {shown}\n" in proc.stderr, proc.stderr


def test_quote_hint_for_any_text_field(tmp_path: Path) -> None:
    """Not only steps: every string-typed field (here a task kind and a budget's wall_time)."""
    path = task(tmp_path, "  kind: true\n  steps: [ls]\n  budget: {wall_time: 30}\n")
    proc = validate(path)
    assert proc.returncode == 2
    assert "$.spec.kind  True is not of type" in proc.stderr
    assert 'hint: YAML read this as a boolean; quote it: "true"' in proc.stderr
    assert "$.spec.budget.wall_time  30 is not of type" in proc.stderr
    assert 'hint: YAML read this as a number; quote it: "30"' in proc.stderr


def test_no_quote_hint_where_text_is_not_wanted(tmp_path: Path) -> None:
    """A field that wants no text gets no advice to quote."""
    path = task(tmp_path, "  steps: [ls]\n  budget: {turns: true}\n")
    proc = validate(path)
    assert proc.returncode == 2
    assert "$.spec.budget.turns  True is not of type 'integer'" in proc.stderr
    assert "quote it" not in proc.stderr


def test_a_host_in_a_tasks_egress_lists_the_policies(tmp_path: Path) -> None:
    """A task's egress names EgressPolicy manifests: a host there is told the names of the
    manifest set in force (here one of the operator's on top of the packaged ones)."""
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    (manifests / "egress.yml").write_text(
        "apiVersion: kagura.dev/v1\nkind: EgressPolicy\nmetadata: {name: internal-git}\n"
        "spec:\n  allow:\n    - host: git.example.com\n",
        encoding="utf-8",
    )
    path = task(tmp_path, "  egress: [github.com]\n  steps: [ls]\n")
    proc = validate(path, manifests)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "task.yml:5:12  $.spec.egress[0]  'github.com' is not an EgressPolicy name" in (
        proc.stderr
    )
    hint = next(line for line in proc.stderr.splitlines() if "hint:" in line)
    assert "spec.egress names EgressPolicy manifests, not hosts" in hint
    assert "github, " in hint and "internal-git" in hint and "pypi" in hint
    assert "a host goes into an EgressPolicy's spec.allow list" in hint
    assert "DNS-label" not in proc.stderr


@pytest.mark.parametrize(
    ("field", "kind", "name"),
    [("brain: Claude", "Brain", "claude"), ("image: my/image", "Image", "agent")],
)
def test_any_reference_that_is_no_name_lists_the_names(
    tmp_path: Path, field: str, kind: str, name: str
) -> None:
    path = task(tmp_path, f"  {field}\n  steps: [ls]\n")
    proc = validate(path)
    assert proc.returncode == 2
    assert f"is not a {kind} name" in proc.stderr or f"is not an {kind} name" in proc.stderr
    assert f"known {kind} names: " in proc.stderr and name in proc.stderr


PROVIDER = """apiVersion: kagura.dev/v1
kind: CredentialProvider
metadata: {name: aws}
spec:
  type: aws-sts
  secret: env:KAGURA_AWS_ROOT_KEY
  ttl: TTL
  aws: {region: us-east-1}
  scopes:
    deployer:
      role_arn: arn:aws:iam::123456789012:role/deployer
      max_ttl: 30m
      full_access: true
"""


@pytest.mark.parametrize(
    ("ttl", "message"),
    [
        ("2h", "ttl 2h is outside 15m..1h"),
        ("5m", "ttl 5m is outside 15m..1h"),
        ("45m", "ttl 45m is above scope 'deployer''s max_ttl 30m"),
    ],
)
def test_a_provider_ttl_no_lease_may_have_is_an_error(
    tmp_path: Path, ttl: str, message: str
) -> None:
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    (manifests / "credentials.yml").write_text(PROVIDER.replace("TTL", ttl), encoding="utf-8")
    path = task(tmp_path, "  steps: [ls]\n")
    for argv in (
        ["validate", "--manifests", str(manifests), path.name],
        ["plan", "--manifests", str(manifests), path.name],
    ):
        proc = cli(path.parent, *argv)
        assert proc.returncode == 2, (argv, proc.stdout + proc.stderr)
        assert "Traceback" not in proc.stdout + proc.stderr
        assert f"credentials.yml:7:8  $.spec.ttl  {message}" in proc.stderr, proc.stderr


def test_a_provider_ttl_in_range_is_valid(tmp_path: Path) -> None:
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    (manifests / "credentials.yml").write_text(PROVIDER.replace("TTL", "30m"), encoding="utf-8")
    proc = validate(task(tmp_path, "  steps: [ls]\n"), manifests)
    assert proc.returncode == 0, proc.stderr


CANARY = "s3cret-canary-7Qx"


@pytest.mark.parametrize(
    "url",
    [
        f"user:{CANARY}@db:5432/k",
        f"postgresql:user:{CANARY}@db:5432/k",
        f"mysql://user:{CANARY}@db:5432/k",
        f"host=db user=u password={CANARY}",
    ],
)
@pytest.mark.parametrize(
    "argv", [["leases", "list"], ["queue", "list"], ["graduation", "status"], ["egress", "log"]]
)
def test_a_state_url_without_its_scheme_never_shows_its_password(
    tmp_path: Path, url: str, argv: list[str]
) -> None:
    root = tmp_path / "project"
    root.mkdir()
    proc = cli(root, *argv, env={"KAGURA_AGENT_STATE_URL": url})
    out = proc.stdout + proc.stderr
    assert "Traceback" not in out
    assert CANARY not in out, out
    if url.startswith("postgresql:"):
        return  # the scheme is right: it fails reaching the database, not at the check
    assert proc.returncode == 3, out
    assert "KAGURA_AGENT_STATE_URL must be a postgresql:// URL" in proc.stderr
    assert "***" in proc.stderr


def test_a_state_manifest_url_without_its_scheme_never_shows_its_password(
    tmp_path: Path,
) -> None:
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    (manifests / "state.yml").write_text(
        "apiVersion: kagura.dev/v1\nkind: State\nmetadata: {name: team}\nspec:\n"
        f"  url: kagura:{CANARY}@db.internal:5432/kagura\n  backend: postgres\n",
        encoding="utf-8",
    )
    proc = validate(task(tmp_path, "  steps: [ls]\n"), manifests)
    assert proc.returncode == 2
    assert CANARY not in proc.stdout + proc.stderr
    assert "$.spec.url  'kagura:***@db.internal:5432/kagura' is not valid here" in proc.stderr
