"""The startup gate: a run is refused (SetupError, exit 3) fast when memory is unusable."""

from __future__ import annotations

import socket
import time
import types
from pathlib import Path

import keyring
import pytest
from keyrings.alt.file import PlaintextKeyring
from memory_helpers import CONTEXT, TOKEN

from kagura_agent.errors import ExitCode, SetupError, UsageError
from kagura_agent.memory import check_ready, open_memory
from testing.fake_memory_cloud import FakeMemoryCloud


def test_embedded_store_in_state_dir_is_ready(state_dir: Path) -> None:
    check_ready({"backend": "sqlite", "location": "state-dir"})
    assert (state_dir / "memory.db").is_file()
    check_ready(None)  # no memory section: the embedded default


def test_corrupt_database_is_refused_with_exit_3(tmp_path: Path) -> None:
    path = tmp_path / "memory.db"
    path.write_bytes(b"this is not a sqlite database" * 200)
    with pytest.raises(SetupError) as err:
        check_ready({"backend": "sqlite", "location": str(path)})
    assert err.value.exit_code == ExitCode.SETUP
    assert str(path) in err.value.message


def test_unwritable_location_is_refused(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(SetupError):
        check_ready({"backend": "sqlite", "location": str(blocker / "memory.db")})


def test_cloud_answers_an_authenticated_call() -> None:
    with FakeMemoryCloud(token=TOKEN, contexts={CONTEXT}) as cloud:
        section = {"backend": "cloud", "location": cloud.mcp_url, "context_id": CONTEXT}
        check_ready(section, token=TOKEN)
        assert "get_context_info" in cloud.calls


def test_cloud_token_resolved_from_env_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAGURA_MEMORY_TOKEN", TOKEN)
    with FakeMemoryCloud(token=TOKEN, contexts={CONTEXT}) as cloud:
        check_ready(
            {
                "backend": "cloud",
                "location": cloud.mcp_url,
                "context_id": CONTEXT,
                "token_ref": "env:KAGURA_MEMORY_TOKEN",
            }
        )


def test_cloud_token_resolved_from_the_keyring(tmp_path: Path) -> None:
    backend = PlaintextKeyring()
    backend.file_path = str(tmp_path / "keyring.cfg")
    previous = keyring.get_keyring()
    keyring.set_keyring(backend)
    try:
        keyring.set_password("kagura", "memory", TOKEN)
        with FakeMemoryCloud(token=TOKEN, contexts={CONTEXT}) as cloud:
            section = {"backend": "cloud", "location": cloud.mcp_url, "context_id": CONTEXT}
            check_ready({**section, "token_ref": "keyring:kagura/memory"})
            assert "get_context_info" in cloud.calls
            with pytest.raises(SetupError, match="not in the keyring") as err:
                check_ready({**section, "token_ref": "keyring:kagura/absent"})
            assert TOKEN not in err.value.message
    finally:
        keyring.set_keyring(previous)


@pytest.fixture()
def sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Every retry delay the gate asks for (recorded, not slept): no delay = no retry."""
    from kagura_agent.memory import gate

    asked: list[float] = []
    # Only the gate's view of the time module: other threads (the fake server) still sleep.
    monkeypatch.setattr(gate, "time", types.SimpleNamespace(sleep=asked.append))
    return asked


def test_refused_credential_fails_at_once_without_retry(sleeps: list[float]) -> None:
    with FakeMemoryCloud(token=TOKEN, contexts={CONTEXT}) as cloud:
        section = {"backend": "cloud", "location": cloud.mcp_url, "context_id": CONTEXT}
        with pytest.raises(SetupError, match="refused the credential"):
            check_ready(section, token="wrong")
        assert sleeps == []  # no retry delay was asked for


def test_unknown_context_is_refused() -> None:
    with FakeMemoryCloud(token=TOKEN, contexts={CONTEXT}) as cloud:
        section = {"backend": "cloud", "location": cloud.mcp_url, "context_id": "nope"}
        with pytest.raises(SetupError, match="get_context_info"):
            check_ready(section, token=TOKEN)


def test_unreachable_cloud_is_refused_quickly() -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    started = time.monotonic()
    with pytest.raises(SetupError, match="Connection failed"):
        check_ready({"backend": "cloud", "location": f"http://127.0.0.1:{port}/mcp"}, token="t")
    assert time.monotonic() - started < 5


@pytest.mark.parametrize(
    ("section", "error"),
    [
        ({"backend": "cloud", "location": None}, SetupError),
        ({"backend": "cloud", "location": "http://127.0.0.1:1/mcp"}, SetupError),  # no token
        (
            {"backend": "cloud", "location": "http://127.0.0.1:1/mcp", "token_ref": "env:UNSET_X"},
            SetupError,
        ),
        (
            {"backend": "cloud", "location": "http://127.0.0.1:1/mcp", "token_ref": "vault:x"},
            UsageError,
        ),
        (
            {"backend": "cloud", "location": "http://example.invalid/mcp", "token_ref": "env:HOME"},
            SetupError,
        ),  # plain http off loopback is refused by the client
        ({"backend": "redis"}, UsageError),
    ],
)
def test_missing_configuration_is_not_retried(
    section: dict[str, object], error: type, sleeps: list[float]
) -> None:
    with pytest.raises(error):
        check_ready(section)
    assert sleeps == []


def test_open_memory_defaults_to_state_dir(state_dir: Path) -> None:
    store = open_memory()
    assert store.backend == "sqlite"
    store.close()
    assert (state_dir / "memory.db").exists()
