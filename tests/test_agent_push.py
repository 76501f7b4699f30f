"""`kagura-agent push`: an agent's branch to a remote after review — through a GitHub App
token leased for the push and released after, never forced, the token in no output, argv
or config. The remote is the fake GitHub's git smart HTTP (``git http-backend``), which
accepts only a live installation token with ``contents: write`` for the repository."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kagura_agent.cli.main import main
from kagura_agent.clock import SystemClock
from kagura_agent.membrane.leases import Ledger
from kagura_agent.state import open_store
from testing.fake_github import FakeGithub
from testing.keys import rsa_pair

BRANCH = "kagura/fix-docs/run-0123456789ab"


@pytest.fixture()
def github(tmp_path: Path) -> Iterator[FakeGithub]:
    fake = FakeGithub().start()
    fake.add_app("4242", rsa_pair("github")[1], 77, ["site", "infra"], {"contents": "write"})
    remotes = tmp_path / "remotes"
    (remotes / "kagura-test").mkdir(parents=True)
    for name in ("site", "infra"):
        _git(tmp_path, "init", "-q", "--bare", str(remotes / "kagura-test" / f"{name}.git"))
    fake.serve_git(remotes)
    yield fake
    fake.stop()


def _git(cwd: Path, *args: str) -> str:
    ident = ["-c", "user.email=op@example.invalid", "-c", "user.name=op"]
    return subprocess.run(
        ["git", *ident, *args], cwd=cwd, check=True, capture_output=True, text=True
    ).stdout


def _manifests(tmp_path: Path, fake: FakeGithub) -> Path:
    folder = tmp_path / "manifests"
    folder.mkdir()
    (folder / "gh.yml").write_text(
        f"""apiVersion: kagura.dev/v1
kind: CredentialProvider
metadata: {{name: gh}}
spec:
  type: github-app
  secret: env:KAGURA_TEST_GH_KEY
  github:
    app_id: "4242"
    installation_id: "77"
    endpoint: {fake.url}
    endpoint_addresses: [127.0.0.1/32]
  scopes:
    site-write:
      repositories: [site]
      permissions: {{contents: write}}
    site-read:
      repositories: [site]
      permissions: {{contents: read}}
""",
        encoding="utf-8",
    )
    return folder


@pytest.fixture()
def repo(tmp_path: Path) -> Path:
    """The operator's repository, with an agent's branch two commits over HEAD."""
    work = tmp_path / "work"
    work.mkdir()
    _git(work, "init", "-q", "-b", "main")
    (work / "README").write_text("hello\n")
    _git(work, "add", "README")
    _git(work, "commit", "-q", "-m", "start")
    _git(work, "branch", BRANCH)
    _git(work, "switch", "-q", BRANCH)
    for n in (1, 2):
        (work / f"fix{n}.txt").write_text(f"fix {n}\n")
        _git(work, "add", f"fix{n}.txt")
        _git(work, "commit", "-q", "-m", f"fix {n}")
    _git(work, "switch", "-q", "main")
    return work


def _push(
    tmp_path: Path, fake: FakeGithub, repo: Path, *extra: str, scope: str = "site-write"
) -> list[str]:
    url = f"{fake.url}/kagura-test/site.git"
    return [
        "push", BRANCH, "--to", url, "--credential", f"gh/{scope}", "--repo", str(repo),
        "--manifests", str(_manifests(tmp_path, fake)), *extra,
    ]  # fmt: skip


@pytest.fixture()
def key(monkeypatch: pytest.MonkeyPatch, state_dir: Path) -> str:
    private = rsa_pair("github")[0]
    monkeypatch.setenv("KAGURA_TEST_GH_KEY", private)
    return private


def _remote_branch(tmp_path: Path) -> str:
    bare = tmp_path / "remotes" / "kagura-test" / "site.git"
    return _git(bare, "for-each-ref", "--format=%(refname) %(objectname)", "refs/heads/")


def test_the_branch_is_pushed_with_a_token_leased_for_it_and_released(
    tmp_path: Path, github: FakeGithub, repo: Path, key: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main([*_push(tmp_path, github, repo, "--yes", "--json")])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    tip = _git(repo, "rev-parse", BRANCH).strip()
    assert _remote_branch(tmp_path) == f"refs/heads/{BRANCH} {tip}\n"
    # One token, minted for the push, revoked after it; the ledger says released.
    [minted] = github.ops("mint")
    assert minted["repositories"] == ["site"] and minted["permissions"] == {"contents": "write"}
    assert len(github.ops("revoke")) == 1 and github.tokens == {}
    with open_store() as store:
        rows = Ledger(store, SystemClock()).rows(include_closed=True)
    assert [(r.state, r.scope, r.klass) for r in rows] == [("released", "site-write", "approved")]
    # The token is in no output and no file of the operator's repository.
    assert '"ahead": 2' in out and "pushed" in out
    config = (repo / ".git" / "config").read_text()
    assert "ghs_" not in out + err + config and "extraHeader" not in config


def test_a_push_is_never_forced(
    tmp_path: Path, github: FakeGithub, repo: Path, key: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The remote already has the branch with other history: git refuses, nothing moves."""
    other = tmp_path / "other"
    _git(
        tmp_path, "clone", "-q", str(tmp_path / "remotes" / "kagura-test" / "site.git"), str(other)
    )
    (other / "theirs.txt").write_text("theirs\n")
    _git(other, "add", "theirs.txt")
    _git(other, "commit", "-q", "-m", "theirs")
    _git(other, "push", "-q", "origin", f"HEAD:refs/heads/{BRANCH}")
    before = _remote_branch(tmp_path)
    code = main([*_push(tmp_path, github, repo, "--yes")])
    out, err = capsys.readouterr()
    assert code == 1, out + err
    assert out.startswith("rejected: [rejected]") and "never forced" in out, out + err
    assert _remote_branch(tmp_path) == before
    assert github.tokens == {}  # released all the same


def test_a_read_only_credential_cannot_push_and_the_refusal_says_so(
    tmp_path: Path, github: FakeGithub, repo: Path, key: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main([*_push(tmp_path, github, repo, "--yes", scope="site-read")])
    out, err = capsys.readouterr()
    assert code == 1, out + err
    assert _remote_branch(tmp_path) == ""
    assert github.ops("git-denied") and github.tokens == {}
    assert "ghs_" not in out + err


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"branch": "main"}, "is not an agent's branch"),
        (
            {"branch": "kagura/fix-docs/run-ffffffffffff"},
            "no branch kagura/fix-docs/run-ffffffffffff",
        ),
        ({"url": "http://example.com/x.git"}, "only https:// remotes"),
        ({"url": "https://user:pw@example.com/x.git"}, "must not carry credentials"),
        ({"credential": "gh/nosuch"}, "has no scope 'nosuch'"),
        ({"credential": "nosuch/x"}, "no CredentialProvider of that name"),
    ],
)
def test_what_cannot_be_pushed_is_refused_before_anything_is_leased(
    tmp_path: Path,
    github: FakeGithub,
    repo: Path,
    key: str,
    change: dict[str, Any],
    says: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = _push(tmp_path, github, repo, "--yes")
    argv[1] = change.get("branch", argv[1])
    argv[3] = change.get("url", argv[3])
    argv[5] = change.get("credential", argv[5])
    assert main(argv) == 2
    assert says in capsys.readouterr().err
    assert github.ops("mint") == []


def test_without_a_terminal_or_yes_nothing_is_pushed(
    tmp_path: Path,
    github: FakeGithub,
    repo: Path,
    key: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("sys.stdin.isatty", lambda: False)
    assert main(_push(tmp_path, github, repo)) == 6
    err = capsys.readouterr().err
    assert "push kagura/fix-docs/run-0123456789ab (2 commits over HEAD" in err
    assert "not confirmed" in err and github.ops("mint") == []


def test_the_token_travels_in_git_s_environment_never_its_argv(
    tmp_path: Path,
    github: FakeGithub,
    repo: Path,
    key: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """What `ps` shows of the push (its argv) holds no token; the header git sends is in
    the environment of that one process only."""
    from kagura_agent import hostproc

    seen: list[tuple[list[str], dict[str, str]]] = []
    real = hostproc.run

    def spy(argv: Any, *, env: Any, **options: Any) -> Any:
        seen.append((list(argv), dict(env)))
        return real(argv, env=env, **options)

    monkeypatch.setattr(hostproc, "run", spy)
    assert main(_push(tmp_path, github, repo, "--yes")) == 0, capsys.readouterr()
    [(argv, env)] = [(a, e) for a, e in seen if "push" in a]
    header = next(v for k, v in env.items() if v.startswith("Authorization: Basic "))
    secret = header.removeprefix("Authorization: Basic ")
    assert not [arg for arg in argv if secret in arg or "Authorization" in arg]
    assert "--force" not in argv and not [a for a in argv if a.startswith("+")]
