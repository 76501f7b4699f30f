"""``kagura-agent setup`` through a real pty (as an operator types), and by flags alone.

The keyring is keyrings.alt's file backend under the test's own data directory; the key
typed or passed is a canary that must never be printed. A second run keeps what the first
wrote (idempotent). Docker is pointed at a socket that does not exist, so doctor ends
with a FAIL (exit 4) and no images are offered.
"""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from testing import forked

ROOT = Path(__file__).resolve().parents[1]
CANARY = "sk-ant-setup-canary-" + "q" * 24


@pytest.fixture()
def env(tmp_path: Path) -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PYTHONPATH": str(ROOT),
        "HOME": str(tmp_path / "home"),
        "XDG_DATA_HOME": str(tmp_path / "data"),
        "KAGURA_AGENT_STATE_DIR": str(tmp_path / "state"),
        "PYTHON_KEYRING_BACKEND": "keyrings.alt.file.PlaintextKeyring",
        "DOCKER_HOST": "unix:///nonexistent/docker.sock",
        "NO_COLOR": "1",
    }


def _interactive(
    cwd: Path, env: dict[str, str], answers: dict[str, str], *args: str
) -> tuple[int, str]:
    """Run setup on a pty; answer each prompt (matched by its text) as it appears."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "kagura_agent", "setup", *args],
        stdin=follower,
        stdout=follower,
        stderr=follower,
        cwd=cwd,
        env=env,
        close_fds=True,
    )
    os.close(follower)
    seen = b""
    pending = dict(answers)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        ready, _, _ = select.select([leader], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # the child closed the pty
                break
            if not chunk:
                break
            seen += chunk
            for prompt, answer in list(pending.items()):
                if prompt.encode() in seen:
                    os.write(leader, answer.encode() + b"\n")
                    del pending[prompt]
        elif proc.poll() is not None:
            break
    code = proc.wait(timeout=30)
    os.close(leader)
    assert not pending, f"never asked: {list(pending)}\n{seen.decode(errors='replace')}"
    return code, seen.decode(errors="replace")


PLAIN = "--allow-plaintext-keyring"  # the tests' keyring is keyrings.alt's plain file


def test_setup_through_a_pty_then_again(tmp_path: Path, env: dict[str, str]) -> None:
    code, out = _interactive(tmp_path, env, {"Anthropic API key": CANARY}, PLAIN)
    assert code == 4, out  # doctor: no Docker engine here
    assert "docker: no daemon answers: nothing listens at /nonexistent/docker.sock" in out
    assert "manifests: wrote manifests/operator.yml" in out
    assert (
        "secrets: stored as keyring:kagura-agent/anthropic in keyrings.alt.file.PlaintextKeyring"
    ) in out
    assert "a plain file, as --allow-plaintext-keyring allowed" in out
    assert "PASS  secret anthropic                 keyring:kagura-agent/anthropic resolves" in out
    assert "PASS  brain claude credential" in out
    assert CANARY not in out
    starter = (tmp_path / "manifests" / "operator.yml").read_text()
    assert "secret: keyring:kagura-agent/anthropic" in starter and CANARY not in starter
    # Again, keeping everything: the folder is kept, an empty answer keeps the key.
    code, again = _interactive(tmp_path, env, {"Anthropic API key": ""}, PLAIN)
    assert code == 4
    assert "manifests: manifests/operator.yml exists, kept" in again
    assert "secrets: unchanged (keyring:kagura-agent/anthropic resolves)" in again
    assert "PASS  secret anthropic" in again
    assert (tmp_path / "manifests" / "operator.yml").read_text() == starter


def test_setup_by_flags_alone(tmp_path: Path, env: dict[str, str]) -> None:
    done = _run(
        ["setup", "--yes", "--dir", "ops", "--anthropic-key-env", "MY_KEY", PLAIN],
        tmp_path,
        {**env, "MY_KEY": CANARY},
    )
    assert done.returncode == 4, done.stdout + done.stderr
    assert "manifests: wrote ops/operator.yml" in done.stdout
    # ops is not what later commands read: setup says so, with the fix.
    assert "manifests: ops is not the folder commands read by default (manifests)" in done.stdout
    assert f"export KAGURA_AGENT_MANIFESTS={tmp_path / 'ops'}" in done.stdout
    assert "PASS  secret anthropic" in done.stdout
    assert CANARY not in done.stdout + done.stderr
    missing = _run(["setup", "--yes", "--anthropic-key-env", "NOPE"], tmp_path, env)
    assert missing.returncode == 3 and "$NOPE is empty or not set" in missing.stderr


def _run(argv: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``python -m kagura_agent ARGV`` without a terminal, as a child of the fork server
    (testing/forked.py): a real process without an interpreter start per command. The
    terminal's case (a pty) starts its own interpreter (_interactive)."""
    return forked.run(argv, cwd=cwd, env=env, timeout=120).text()


def _setup(cwd: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return _run(["setup", "--yes", *args], cwd, env)


def test_no_key_given_writes_nothing_and_the_environment_keeps_working(
    tmp_path: Path, env: dict[str, str]
) -> None:
    """Without a terminal and without --anthropic-key-env no key is stored: the packaged
    env:ANTHROPIC_API_KEY must stay in force (before, a keyring reference replaced it and
    doctor still said the brain's credential was ready)."""
    done = _setup(tmp_path, {**env, "ANTHROPIC_API_KEY": CANARY})
    assert done.returncode == 4, done.stdout + done.stderr  # no Docker engine here
    assert "secrets: unchanged" not in done.stdout
    assert (
        "secrets: no key stored (stdin is not a terminal; --anthropic-key-env NAME stores the"
        " value of $NAME); the key stays env:ANTHROPIC_API_KEY (set in this shell)"
    ) in done.stdout
    assert "manifests: nothing written to manifests" in done.stdout
    assert not (tmp_path / "manifests").exists()
    assert "PASS  brain claude credential" in done.stdout
    assert CANARY not in done.stdout + done.stderr


@pytest.mark.parametrize(
    ("backend", "said"),
    [
        ("keyring.backends.fail.Keyring", "no OS keyring here (keyring.backends.fail.Keyring)"),
        (
            "keyrings.alt.file.PlaintextKeyring",
            "the keyring backend is keyrings.alt.file.PlaintextKeyring, which keeps the key in"
            " a plain file",
        ),
    ],
)
def test_a_key_that_cannot_be_kept_safely_leaves_everything_as_it_was(
    tmp_path: Path, env: dict[str, str], backend: str, said: str
) -> None:
    done = _setup(
        tmp_path,
        {**env, "PYTHON_KEYRING_BACKEND": backend, "MY_KEY": CANARY},
        "--anthropic-key-env",
        "MY_KEY",
    )
    assert done.returncode == 3, done.stdout + done.stderr
    assert said in done.stderr and "nothing was written" in done.stderr
    assert not (tmp_path / "manifests").exists()  # the packaged env: reference stays
    assert not list((tmp_path / "data").rglob("*.cfg"))  # no keyring file either
    assert CANARY not in done.stdout + done.stderr


def test_doctor_fails_an_operator_reference_that_does_not_resolve(
    tmp_path: Path, env: dict[str, str]
) -> None:
    (tmp_path / "manifests").mkdir()
    (tmp_path / "manifests" / "operator.yml").write_text(
        (ROOT / "kagura_agent" / "cli" / "setup.py")
        .read_text()
        .split('STARTER = """\\\n', 1)[1]
        .split('"""', 1)[0]
        .format(service="kagura-agent")
    )
    done = _run(["doctor"], tmp_path, {**env, "ANTHROPIC_API_KEY": CANARY})
    assert done.returncode == 4
    assert "FAIL  secret anthropic" in done.stdout
    assert "FAIL  brain claude credential" in done.stdout
