"""doctor: PASS/WARN/FAIL per check, exit 4 on any FAIL, no secret values printed."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest

from kagura_agent.cli.main import main


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any]]:
    code = main(["doctor", "--json", *args])
    return code, json.loads(capsys.readouterr().out)


def test_doctor_fails_without_a_docker_engine(
    state_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    code, report = _run(capsys)
    assert code == 4
    statuses = {c["name"]: c["status"] for c in report["checks"]}
    assert statuses["docker engine"] == "FAIL"
    assert statuses["manifests"] == "PASS"
    assert statuses["memory"] == "PASS"


def test_doctor_never_prints_secret_values(
    state_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    canary = "CANARY-doctor-7f3a9c1e5b"
    monkeypatch.setenv("ANTHROPIC_API_KEY", canary)
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    code = main(["doctor"])
    out = capsys.readouterr()
    assert code == 4
    assert "env:ANTHROPIC_API_KEY is set" in out.out
    assert canary not in out.out + out.err


def test_doctor_passes_with_a_daemon(
    state_dir: Path, docker_client: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    _, report = _run(capsys)
    statuses = {c["name"]: c["status"] for c in report["checks"]}
    assert statuses["docker engine"] == "PASS"
    assert statuses["user namespaces"] in ("PASS", "WARN")


def test_doctor_names_the_extra_a_chat_transport_needs(
    state_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import importlib.util
    import shutil

    manifests = tmp_path / "manifests"
    shutil.copytree(Path(__file__).resolve().parents[1] / "manifests", manifests)
    (manifests / "zz-chat.yml").write_text(
        "apiVersion: kagura.dev/v1\nkind: Transport\nmetadata: {name: chat}\n"
        "spec: {type: slack, token: 'env:X_BOT', app_token: 'env:X_APP', operators: [U1]}\n"
    )
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    _, report = _run(capsys, "--manifests", str(manifests))
    checks = {c["name"]: c for c in report["checks"]}
    assert checks["extra slack"]["status"] == "PASS"
    assert "transport chat" in checks["extra slack"]["detail"]
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "slack_bolt" else real(name, *a),
    )
    _, report = _run(capsys, "--manifests", str(manifests))
    checks = {c["name"]: c for c in report["checks"]}
    assert checks["extra slack"]["status"] == "WARN"
    assert "pip install 'kagura-agent[slack]'" in checks["extra slack"]["detail"]


def test_doctor_checks_the_project_root_the_agent_must_write(
    state_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import os

    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    project = tmp_path / "project"
    project.mkdir()
    project.chmod(0o555)  # nobody may write it: not root's folder, not its owner's either
    _, report = _run(capsys, "--project-root", str(project))
    check = {c["name"]: c for c in report["checks"]}["project root"]
    assert check["status"] == "FAIL"
    assert "chown -R" in check["detail"] and str(project) in check["detail"]
    project.chmod(0o777)
    _, report = _run(capsys, "--project-root", str(project))
    check = {c["name"]: c for c in report["checks"]}["project root"]
    assert check["status"] == "PASS", check
    # Not named: the current folder, and only a warning.
    project.chmod(0o555)
    monkeypatch.chdir(project)
    _, report = _run(capsys)
    assert {c["name"]: c for c in report["checks"]}["project root"]["status"] == "WARN"
    project.chmod(0o755)
    assert os.path.isdir(project)


def test_doctor_resolves_keyring_references_and_the_brain_credential(
    state_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import shutil

    import keyring
    from keyrings.alt.file import PlaintextKeyring

    canary = "CANARY-doctor-keyring-51c0"
    manifests = tmp_path / "manifests"
    shutil.copytree(Path(__file__).resolve().parents[1] / "manifests", manifests)
    creds = manifests / "credentials.yml"
    creds.write_text(
        creds.read_text().replace(
            "secret: env:ANTHROPIC_API_KEY", "secret: keyring:kagura/anthropic"
        )
    )
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    backend = PlaintextKeyring()
    backend.file_path = str(tmp_path / "keyring.cfg")
    previous = keyring.get_keyring()
    keyring.set_keyring(backend)
    try:
        _, report = _run(capsys, "--manifests", str(manifests))
        checks = {c["name"]: c for c in report["checks"]}
        # The operator's folder replaced the packaged reference with one that does not
        # resolve: every run of that brain would fail, so doctor fails.
        assert checks["secret anthropic"]["status"] == "FAIL"
        assert "not in the keyring" in checks["secret anthropic"]["detail"]
        assert checks["brain claude credential"]["status"] == "FAIL"
        keyring.set_password("kagura", "anthropic", canary)
        code = main(["doctor", "--json", "--manifests", str(manifests)])
        out = capsys.readouterr().out
        checks = {c["name"]: c for c in json.loads(out)["checks"]}
        assert code == 4  # no Docker engine here
        assert checks["secret anthropic"] == {
            "name": "secret anthropic",
            "status": "PASS",
            "detail": "keyring:kagura/anthropic resolves",
        }
        assert checks["brain claude credential"]["status"] == "PASS"
        assert canary not in out
    finally:
        keyring.set_keyring(previous)


def _in_child_as(uid: int, call: Any) -> str:
    """``call()`` in a forked child running as ``uid`` (root drops to it), its text back."""
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            if os.geteuid() == 0:
                os.setgroups([])
                os.setgid(uid)
                os.setuid(uid)
            os.write(writer, str(call()).encode())
        finally:
            os._exit(0)
    os.close(writer)
    with os.fdopen(reader) as stream:
        text = stream.read()
    os.waitpid(pid, 0)
    return text


def test_a_user_outside_the_sockets_group_is_told_so_not_that_no_daemon_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import socket

    from kagura_agent.membrane import images

    # Where another user can reach it (pytest's own tmp folder is root's alone).
    folder = Path(tempfile.mkdtemp(prefix="kagura-sock-", dir="/tmp"))
    folder.chmod(0o755)
    path = folder / "docker.sock"
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(path))
    path.chmod(0o660 if os.geteuid() == 0 else 0o000)
    monkeypatch.setenv("DOCKER_HOST", f"unix://{path}")
    try:
        said = _in_child_as(65534, images.unreachable_hint)
    finally:
        listener.close()
        path.unlink()
        folder.rmdir()
    assert f"{path} refuses this user" in said and "usermod -aG" in said, said
    assert "no daemon" not in said and "scripts/" not in said
    # Nothing listening: start the engine; scripts/docker-up.sh only from a checkout.
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    monkeypatch.setattr(images, "repo_root", lambda: None)
    said = images.unreachable_hint()
    assert said.startswith("nothing listens at /nonexistent/docker.sock: start Docker Engine")
    assert "scripts/" not in said


def _doctor_in_child_as(uid: int, state: Path) -> str:
    """``kagura-agent doctor --json`` (its main) in a forked child running as ``uid``: its
    stdout and stderr, and its exit code as the last line."""
    import contextlib
    import io

    # The child may not read root's site-packages: everything doctor imports is imported
    # here first, by one doctor against a socket that is not there.
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DOCKER_HOST", f"unix://{state}/absent.sock")
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            main(["doctor", "--json"])

    def doctor() -> str:
        out = io.StringIO()
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
                code = main(["doctor", "--json"])
        except BaseException:  # the child's failure, shown in the parent's assertion
            import traceback

            return out.getvalue() + traceback.format_exc()
        return f"{out.getvalue()}\nexit {code}"

    return _in_child_as(uid, doctor)


def test_doctor_tells_a_socket_refusing_the_user_from_no_daemon(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A user outside the docker group: doctor says the socket exists but this user may
    not use it (the group, or root), not that no daemon answers, and points to no
    repository script from an installed package."""
    import socket

    from kagura_agent import paths
    from kagura_agent.membrane import images

    folder = Path(tempfile.mkdtemp(prefix="kagura-sock-", dir="/tmp"))
    folder.chmod(0o777)
    path = folder / "docker.sock"
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(path))
    listener.listen()
    path.chmod(0o000)
    monkeypatch.setenv("DOCKER_HOST", f"unix://{path}")
    monkeypatch.setenv("KAGURA_AGENT_STATE_DIR", str(folder / "state"))
    monkeypatch.setenv("KAGURA_AGENT_CACHE_DIR", str(folder / "cache"))
    monkeypatch.setenv("HOME", str(folder))
    monkeypatch.delenv("KAGURA_AGENT_MANIFESTS", raising=False)
    monkeypatch.chdir(folder)
    monkeypatch.setattr(images, "repo_root", lambda: None)  # as from an installed wheel
    monkeypatch.setattr(paths, "repo_root", lambda: None)
    try:
        said = _doctor_in_child_as(65534, folder)
    finally:
        listener.close()
        shutil.rmtree(folder, ignore_errors=True)
    assert "Traceback" not in said, said
    assert said.rstrip().endswith("exit 4"), said
    body = said.rstrip().rpartition("\n")[0]
    checks = {c["name"]: c for c in json.loads(body)["checks"]}
    detail = checks["docker engine"]["detail"]
    assert checks["docker engine"]["status"] == "FAIL"
    assert "the Docker socket refuses this user (permission denied)" in detail, detail
    assert f"{path} refuses this user" in detail and "the socket exists" in detail
    assert "usermod -aG" in detail and "or run as root" in detail
    assert "unreachable" not in detail and "no daemon" not in detail
    assert "scripts/" not in said
