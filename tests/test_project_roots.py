"""Project roots the membrane refuses, through the real CLI (validate and plan).

Each case is a task file whose project root is a place the agent must never be able to
write: system directories, credential folders, another user's home, the state and cache
directories, the tool's own checkout and installation, a folder owned by someone else,
and any folder containing one of these. Symlinks are judged by where they land.
"""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from testing.inprocess import run_main

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs" / "membrane.md"


def _task(folder: Path, root: str | Path, *extra: dict[str, Any]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    task = {
        "apiVersion": "kagura.dev/v1",
        "kind": "Task",
        "metadata": {"name": "rooted"},
        "spec": {"brain": "script", "steps": ["true"], "project_root": str(root)},
    }
    path = folder / "task.yml"
    path.write_text(yaml.safe_dump_all([task, *extra], sort_keys=False))
    return path


@pytest.fixture()
def env(tmp_path: Path) -> dict[str, str]:
    """A fake operator home with credential folders, and the tool's own dirs in tmp."""
    home = tmp_path / "home"
    for folder in (".ssh/keys", ".aws", ".config/gcloud", ".gnupg", ".kube", ".docker"):
        (home / folder).mkdir(parents=True)
    (tmp_path / "tool" / "state").mkdir(parents=True)
    (tmp_path / "cache").mkdir()
    return {
        **os.environ,
        "HOME": str(home),
        "KAGURA_AGENT_STATE_DIR": str(tmp_path / "tool" / "state"),
        "KAGURA_AGENT_CACHE_DIR": str(tmp_path / "cache"),
        "NO_COLOR": "1",
        "PYTHONPATH": str(REPO),
    }


def _cli(
    command: str, task: Path, env: dict[str, str], *more: str
) -> subprocess.CompletedProcess[str]:
    return run_main([command, *more, str(task)], cwd=REPO, env=env)


def _refused(task: Path, env: dict[str, str], reason: str) -> None:
    for command in ("validate", "plan"):
        done = _cli(command, task, env)
        assert done.returncode == 2, (command, done.stdout, done.stderr)
        assert "$.spec.project_root" in done.stderr, done.stderr
        assert f"{task}:" in done.stderr or "task.yml:" in done.stderr
        assert reason in done.stderr, done.stderr
        assert "Traceback" not in done.stderr


SYSTEM = [
    ("/", "is the host root directory"),
    ("/etc", "is a system directory"),
    ("/usr", "is a system directory"),
    ("/usr/share", "is inside /usr, a system directory"),
    ("/opt", "is a system directory for installed software"),
    ("/var", "is a shared system directory"),
    ("/var/lib", "is a system directory"),
    ("/var/log", "is a system directory"),
    ("/home", "is a shared system directory"),
    ("/proc", "is a system directory"),
    ("/sys", "is a system directory"),
    ("/dev", "is a system directory"),
    ("/boot", "is a system directory"),
    ("/run", "is a system directory"),
    ("/tmp", "is a shared system directory"),
]


@pytest.mark.parametrize(("root", "reason"), SYSTEM)
def test_system_directories_are_refused(
    root: str, reason: str, tmp_path: Path, env: dict[str, str]
) -> None:
    if not os.path.isdir(root):
        os.makedirs(root, exist_ok=True)  # /boot may be absent in a container
    _refused(_task(tmp_path / "t", root), env, f"project root {root} {reason}")


def test_docker_data_root_is_refused(tmp_path: Path, env: dict[str, str]) -> None:
    os.makedirs("/var/lib/docker", exist_ok=True)
    _refused(_task(tmp_path / "t", "/var/lib/docker"), env, "is Docker's data root")


@pytest.mark.parametrize(
    "folder", [".ssh", ".ssh/keys", ".aws", ".config/gcloud", ".gnupg", ".kube", ".docker"]
)
def test_credential_folders_are_refused(folder: str, tmp_path: Path, env: dict[str, str]) -> None:
    _refused(_task(tmp_path / "t", Path(env["HOME"]) / folder), env, "a credential or tool folder")


def test_the_home_directory_itself_is_refused(tmp_path: Path, env: dict[str, str]) -> None:
    _refused(_task(tmp_path / "t", env["HOME"]), env, "the operator's home directory itself")


def test_a_symlink_is_judged_by_where_it_lands(tmp_path: Path, env: dict[str, str]) -> None:
    (tmp_path / "innocent").symlink_to(Path(env["HOME"]) / ".ssh")
    task = _task(tmp_path / "t", tmp_path / "innocent")
    _refused(task, env, f"(resolves to {env['HOME']}/.ssh)")


def test_the_state_directory_and_its_parent_are_refused(
    tmp_path: Path, env: dict[str, str]
) -> None:
    state = env["KAGURA_AGENT_STATE_DIR"]
    _refused(_task(tmp_path / "a", state), env, "is the kagura-agent state directory")
    (Path(state) / "locks").mkdir()
    _refused(_task(tmp_path / "b", Path(state) / "locks"), env, "the kagura-agent state directory")
    # A parent of the state directory contains it.
    _refused(_task(tmp_path / "c", Path(state).parent), env, f"contains {state}, the kagura-agent")


def test_the_cache_directory_is_refused(tmp_path: Path, env: dict[str, str]) -> None:
    _refused(_task(tmp_path / "t", env["KAGURA_AGENT_CACHE_DIR"]), env, "kagura-agent cache")


@pytest.mark.parametrize(
    ("root", "reason"),
    [
        (".", "is the kagura-agent source checkout"),
        ("kagura_agent", "is the kagura-agent installation"),
        ("kagura_agent/plan", "kagura-agent installation"),
        ("manifests", "is the kagura-agent source checkout"),
        ("schemas", "is the kagura-agent source checkout"),
    ],
)
def test_the_tools_checkout_and_installation_are_refused(
    root: str, reason: str, tmp_path: Path, env: dict[str, str]
) -> None:
    _refused(_task(tmp_path / "t", REPO / root), env, reason)


def test_the_python_installation_is_refused(tmp_path: Path, env: dict[str, str]) -> None:
    prefix = os.path.realpath(sys.prefix)
    _refused(_task(tmp_path / "t", prefix), env, f"project root {prefix}")


def test_a_memory_store_folder_is_refused(tmp_path: Path, env: dict[str, str]) -> None:
    store = tmp_path / "memstore"
    store.mkdir()
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    for file in (REPO / "manifests").glob("*.yml"):
        if file.name != "memory.yml":
            (manifests / file.name).write_text(file.read_text())
    memory = {
        "apiVersion": "kagura.dev/v1",
        "kind": "Memory",
        "metadata": {"name": "local"},
        "spec": {"backend": "sqlite", "path": str(store / "memory.db"), "default": True},
    }
    (manifests / "memory.yml").write_text(yaml.safe_dump(memory))
    task = _task(tmp_path / "t", store)
    done = _cli("validate", task, env, "--manifests", str(manifests))
    assert done.returncode == 2, done.stderr
    assert "contains" in done.stderr and "the memory store of Memory 'local'" in done.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")
def test_a_folder_owned_by_a_system_account_is_refused(tmp_path: Path, env: dict[str, str]) -> None:
    project = tmp_path / "project"
    project.mkdir()
    os.chown(project, 5, 5)
    _refused(_task(tmp_path / "t", project), env, "not by the operator")


def _docs_workspace() -> dict[str, Any]:
    text = DOCS.read_text(encoding="utf-8")
    block = text.split("```yaml\n", 1)[1].split("```", 1)[0]
    doc: dict[str, Any] = yaml.safe_load(block)
    assert doc["kind"] == "Workspace"
    return doc


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")
@pytest.mark.usefixtures("without_docker")
def test_a_declared_workspace_root_lifts_only_the_soft_rules(
    tmp_path: Path, env: dict[str, str]
) -> None:
    """The docs' Workspace example, pointed at a temp folder: a system account's folder
    inside it is accepted; the state directory stays refused even when declared."""
    shared = tmp_path / "shared"
    project = shared / "project"
    project.mkdir(parents=True)
    os.chown(project, 5, 5)
    workspace = _docs_workspace()
    workspace["spec"]["roots"][0]["path"] = str(shared)
    workspace["spec"]["roots"].append({"path": env["KAGURA_AGENT_STATE_DIR"], "reason": "no"})
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    for file in (REPO / "manifests").glob("*.yml"):
        (manifests / file.name).write_text(file.read_text())
    (manifests / "workspace.yml").write_text(yaml.safe_dump(workspace))
    task = _task(tmp_path / "t", project)
    done = _cli("plan", task, env, "--manifests", str(manifests))
    assert done.returncode == 0, done.stderr
    # Without the declaration: refused.
    refused = _cli("plan", task, env)
    assert refused.returncode == 2 and "not by the operator" in refused.stderr
    # A Workspace carried by the task file itself counts for nothing.
    own = _task(tmp_path / "own", project, workspace)
    done = _cli("validate", own, env)
    assert done.returncode == 2 and "not by the operator" in done.stderr, done.stderr
    state = _task(tmp_path / "s", env["KAGURA_AGENT_STATE_DIR"])
    done = _cli("validate", state, env, "--manifests", str(manifests))
    assert done.returncode == 2 and "kagura-agent state directory" in done.stderr


def test_another_users_home_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A home from the password database that is not the operator's (in-process CLI, with
    the password database extended by one account)."""
    from kagura_agent.cli.main import main

    home = tmp_path / "users" / "bob"
    (home / "project").mkdir(parents=True)
    bob = pwd.struct_passwd(("bob", "x", 4321, 4321, "", str(home), "/bin/sh"))
    real = pwd.getpwall
    monkeypatch.setattr(pwd, "getpwall", lambda: [*real(), bob])
    monkeypatch.setenv("KAGURA_AGENT_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.chdir(REPO)
    for root in (home, home / "project", tmp_path / "users"):
        task = _task(tmp_path / "t", root)
        assert main(["validate", str(task)]) == 2
        err = capsys.readouterr().err
        assert "the home directory of user bob" in err, err


@pytest.mark.parametrize("where", ["parent", "itself", "inside"])
def test_a_declared_secret_dir_is_no_project_root(
    where: str, tmp_path: Path, env: dict[str, str]
) -> None:
    """The operator's root secrets (a Policy's ``secret_dirs``, ``/srv/kagura/secrets`` in
    docs/authority.md) are read by the host to mint leases: a task rooted at, inside or
    above that folder had the agent read them (no lease, no scope, no expiry) and rewrite
    them for the host's next read."""
    secrets = tmp_path / "kagura" / "secrets"
    (secrets / "sub").mkdir(parents=True)
    (secrets / "cloudflare-root").write_text("root-token\n")
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    policy = {
        "apiVersion": "kagura.dev/v1",
        "kind": "Policy",
        "metadata": {"name": "house-secrets"},
        "spec": {"secret_dirs": [str(secrets)]},
    }
    (manifests / "policy.yml").write_text(yaml.safe_dump(policy))
    root = {"parent": secrets.parent, "itself": secrets, "inside": secrets / "sub"}[where]
    task = _task(tmp_path / "t", root)
    for command in ("validate", "plan"):
        done = _cli(command, task, env, "--manifests", str(manifests))
        assert done.returncode == 2, (command, done.stdout, done.stderr)
        assert "$.spec.project_root" in done.stderr, done.stderr
        assert "secret folder of Policy 'house-secrets'" in done.stderr, done.stderr
