"""Where root secrets may come from and go to: declared secret dirs, provider endpoints."""

from __future__ import annotations

import json
import os
import select
import socket
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from kagura_agent.cli.main import main
from kagura_agent.clock import FixedClock
from kagura_agent.errors import KaguraError, RefusedError, SetupError
from kagura_agent.membrane.endpoints import check_endpoints
from kagura_agent.membrane.leases import Broker, LeaseRequest, Ledger
from kagura_agent.membrane.leases.ledger import Owner
from kagura_agent.membrane.leases.sweeper import Sweeper
from kagura_agent.membrane.secrets import resolve
from kagura_agent.state import open_store

CANARY = "canary-root-5d1e88b0c2"


@pytest.fixture()
def listener() -> Iterator[tuple[socket.socket, int]]:
    """A loopback port that counts connections: nothing may ever connect to it."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.setblocking(False)
    yield server, server.getsockname()[1]
    server.close()


def connections(server: socket.socket) -> int:
    count = 0
    while select.select([server], [], [], 0.2)[0]:
        conn, _ = server.accept()
        conn.close()
        count += 1
    return count


def provider_doc(name: str, spec: str) -> str:
    # A cloudflare scope must say what its token may do (no scope grants all by omission).
    narrowing = (
        ", permission_groups: [4755a26eedb94da69e1066d98aa820be],"
        " resources: {com.cloudflare.api.account.zone.0123456789abcdef: '*'}"
        if "type: cloudflare" in spec
        else ""
    )
    return (
        f"apiVersion: kagura.dev/v1\nkind: CredentialProvider\nmetadata: {{name: {name}}}\n"
        f"spec:\n{spec}  scopes: {{all: {{description: everything{narrowing}}}}}\n"
    )


@pytest.fixture()
def ops(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, state_dir: Path) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("KAGURA_AGENT_MANIFESTS", raising=False)
    folder = tmp_path / "ops"
    folder.mkdir()
    return folder


def validate_errors(capsys: pytest.CaptureFixture[str]) -> list[dict[str, Any]]:
    assert main(["validate", "--json", "--manifests", "ops"]) == 2
    errors: list[dict[str, Any]] = json.loads(capsys.readouterr().out)["errors"]
    return errors


@pytest.mark.parametrize(
    "target", ["/proc/self/environ", "/sys/kernel/notes", "/dev/mem", "/etc/shadow"]
)
def test_a_file_secret_outside_the_declared_dirs_is_refused_at_validate(
    target: str, ops: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = f"  type: static\n  standing: true\n  secret: file:{target}\n  static: {{env: T}}\n"
    (ops / "p.yml").write_text(provider_doc("stolen", spec))
    [error] = validate_errors(capsys)
    assert (error["file"], error["line"], error["path"]) == ("ops/p.yml", 7, "$.spec.secret")
    assert "outside the declared secret directories" in error["message"]


def test_a_file_secret_in_a_declared_dir_validates_and_a_symlink_out_does_not(
    ops: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "cf").write_text("value\n")
    (secrets / "escape").symlink_to("/proc/self/environ")
    (ops / "policy.yml").write_text(
        "apiVersion: kagura.dev/v1\nkind: Policy\nmetadata: {name: house}\n"
        f"spec:\n  secret_dirs: [{secrets}]\n"
    )
    spec = f"  type: static\n  standing: true\n  secret: file:{secrets}/cf\n  static: {{env: T}}\n"
    (ops / "p.yml").write_text(provider_doc("ok", spec))
    assert main(["validate", "--manifests", "ops"]) == 0, capsys.readouterr().err
    capsys.readouterr()
    (ops / "q.yml").write_text(provider_doc("escape", spec.replace("/cf", "/escape")))
    [error] = validate_errors(capsys)
    assert error["file"] == "ops/q.yml" and "outside the declared" in error["message"]


def test_a_policy_cannot_declare_proc_as_a_secret_dir(
    ops: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (ops / "policy.yml").write_text(
        "apiVersion: kagura.dev/v1\nkind: Policy\nmetadata: {name: house}\n"
        "spec:\n  secret_dirs: [/proc/self]\n"
    )
    [error] = validate_errors(capsys)
    assert error["path"] == "$.spec.secret_dirs[0]" and "cannot hold secrets" in error["message"]


def test_resolve_reads_only_the_applying_users_regular_files(tmp_path: Path) -> None:
    own = tmp_path / "own"
    own.write_text(CANARY + "\n")
    os.chmod(own, 0o600)
    assert resolve(f"file:{own}") == CANARY
    link = tmp_path / "link"
    link.symlink_to("/proc/self/environ")
    for ref in ("file:/proc/self/environ", f"file:{link}", f"file:{tmp_path}"):
        with pytest.raises(SetupError) as caught:
            resolve(ref)
        assert "refused" in caught.value.message or "cannot be read" in caught.value.message
    if os.geteuid() == 0:
        other = tmp_path / "other"
        other.write_text(CANARY)
        os.chown(other, 1000, 1000)
        with pytest.raises(SetupError, match="belongs to another user") as caught:
            resolve(f"file:{other}")
        assert CANARY not in caught.value.message


@pytest.mark.parametrize(
    ("endpoint", "message"),
    [
        ("http://127.0.0.1:9/client/v4", "127.0.0.1 is not a public address"),
        ("https://169.254.169.254/latest", "169.254.169.254 is not a public address"),
        ("https://[::1]/x", "::1 is not a public address"),
        ("https://10.1.2.3/x", "10.1.2.3 is not a public address"),
        ("http://api.example.com/x", "must be https"),
        ("https://user:pw@api.example.com/x", "user info"),
    ],
)
def test_a_provider_endpoint_must_be_public_https_unless_declared(
    endpoint: str, message: str, ops: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = f"  type: cloudflare\n  secret: env:ROOT\n  cloudflare: {{endpoint: '{endpoint}'}}\n"
    (ops / "p.yml").write_text(provider_doc("cf", spec))
    [error] = validate_errors(capsys)
    assert error["path"] == "$.spec.cloudflare.endpoint" and message in error["message"]


def test_a_declared_loopback_endpoint_validates(
    ops: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = (
        "  type: cloudflare\n  secret: env:ROOT\n  cloudflare:\n"
        "    endpoint: http://127.0.0.1:9/client/v4\n    endpoint_addresses: [127.0.0.1/32]\n"
    )
    (ops / "p.yml").write_text(provider_doc("cf", spec))
    assert main(["validate", "--manifests", "ops"]) == 0, capsys.readouterr().err


def test_a_host_name_resolving_to_a_private_address_gets_no_secret() -> None:
    settings = {"endpoint": "https://sts.example.com/"}
    with pytest.raises(RefusedError, match=r"resolves to 169\.254\.169\.254"):
        check_endpoints(settings, resolver=lambda host, port: ["169.254.169.254"])
    with pytest.raises(RefusedError, match="resolves to ::ffff:7f00:1"):
        check_endpoints(settings, resolver=lambda host, port: ["::ffff:127.0.0.1"])
    check_endpoints(settings, resolver=lambda host, port: ["93.184.216.34"])
    declared = {**settings, "endpoint_addresses": ["10.0.0.0/8"]}
    check_endpoints(declared, resolver=lambda host, port: ["10.2.3.4"])


def _lease(port: int, **extra: Any) -> dict[str, Any]:
    return {
        "name": "cf-all",
        "provider": "cf",
        "type": "cloudflare",
        "scope": "all",
        "scope_spec": {
            "permission_groups": ["4755a26eedb94da69e1066d98aa820be"],
            "resources": {"com.cloudflare.api.account.zone.0123456789abcdef": "*"},
            "endpoint": f"http://127.0.0.1:{port}/client/v4",
            "max_retries": 0,
            **extra,
        },
        "ttl_seconds": 900,
        "renewals": 0,
        "budget_seconds": 900,
        "secret_ref": "env:KAGURA_TEST_CF_ROOT",
        "standing": False,
        "class": "baseline",
    }


def test_the_broker_sends_the_root_secret_to_no_undeclared_loopback_endpoint(
    state_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    listener: tuple[socket.socket, int],
) -> None:
    server, port = listener
    monkeypatch.setenv("KAGURA_TEST_CF_ROOT", CANARY)
    store = open_store()
    try:
        broker = Broker(store, run_id="run-x", clock=FixedClock(datetime.now(UTC)))
        with pytest.raises(KaguraError) as caught:
            broker.acquire(LeaseRequest.from_plan(_lease(port)))
        assert "127.0.0.1 is not a public address" in caught.value.message
        assert CANARY not in caught.value.message
    finally:
        store.close()
    assert connections(server) == 0


def test_the_sweeper_never_calls_an_undeclared_endpoint_recorded_in_the_ledger(
    state_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    listener: tuple[socket.socket, int],
) -> None:
    """A ledger row naming an undeclared loopback endpoint: poisoned, never contacted."""
    server, port = listener
    monkeypatch.setenv("KAGURA_TEST_CF_ROOT", CANARY)
    clock = FixedClock(datetime.now(UTC).replace(microsecond=0))
    store = open_store()
    try:
        ledger = Ledger(store, clock)
        gone = Owner(pid=2**22 + 7, start="not-this-process", run_id="run-x")
        grant = ledger.record_intent(
            lease="lease-x", request=_lease(port), ttl_seconds=900, owner=gone
        )
        ledger.record_minted(grant, "token-1", clock.now())
        for _ in range(2):  # every later start-up sweep too
            Sweeper(store, clock=clock, sleep=lambda _s: None).sweep()
        [row] = Ledger(store, clock).rows()
        assert row.state == "poison" and "not a public address" in (row.last_error or "")
    finally:
        store.close()
    assert connections(server) == 0


def test_a_task_chosen_endpoint_gets_no_request_at_apply(
    ops: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    listener: tuple[socket.socket, int],
) -> None:
    """A task file bringing its own provider on 127.0.0.1: apply refuses before any call."""
    server, port = listener
    monkeypatch.setenv("CLOUDFLARE_ROOT_TOKEN", CANARY)
    spec = (
        "  type: cloudflare\n  secret: env:CLOUDFLARE_ROOT_TOKEN\n  baseline_scopes: [all]\n"
        f"  cloudflare: {{endpoint: 'http://127.0.0.1:{port}/client/v4',"
        " endpoint_addresses: [127.0.0.1/32]}\n"
    )
    (tmp_path / "task.yml").write_text(
        provider_doc("mine", spec)
        + "---\napiVersion: kagura.dev/v1\nkind: Task\nmetadata: {name: t}\n"
        "spec:\n  credentials: [{provider: mine, scope: all}]\n  steps: [env]\n"
    )
    assert main(["apply", "--yes", "task.yml"]) == 2
    out, err = capsys.readouterr()
    assert "a task file may only hold Task documents" in err
    assert CANARY not in out + err
    assert connections(server) == 0


@pytest.mark.parametrize(
    "url", ["http://169.254.169.254/mcp", "https://127.0.0.1:8443/mcp", "http://mem.example.com/"]
)
def test_a_cloud_memory_url_gets_the_token_only_when_public_https_or_declared(
    url: str, ops: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (ops / "memory.yml").write_text(
        "apiVersion: kagura.dev/v1\nkind: Memory\nmetadata: {name: team}\n"
        f"spec:\n  backend: cloud\n  url: '{url}'\n  token: env:MEM_TOKEN\n"
    )
    [error] = validate_errors(capsys)
    assert error["path"] == "$.spec.url"
