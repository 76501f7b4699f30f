"""`kagura-agent web` without a browser: what it refuses before it listens, what it prints
first, what it answers without a session, and that nothing else pays for it."""

from __future__ import annotations

import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from kagura_agent.cli.main import main
from kagura_agent.state import open_store, open_store_read_only
from kagura_agent.web.queries import Notes, RunFilter, runs_page


def test_a_bind_beyond_loopback_needs_tls_or_an_explicit_flag(
    state_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["web", "--bind", "0.0.0.0"]) == 2
    err = capsys.readouterr().err
    assert "not a loopback address" in err and "--tls-cert FILE --tls-key FILE" in err
    assert main(["web", "--bind", "10.1.2.3", "--tls-cert", "c.pem"]) == 2
    assert "go together" in capsys.readouterr().err
    assert main(["web", "--bind", "10.1.2.3", "--tls-cert", "c.pem", "--tls-key", "k.pem"]) == 2
    assert "no such file" in capsys.readouterr().err


def test_who_approves_must_be_one_of_the_cockpits_operators(
    state_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["web", "--operator", "U1"]) == 2
    assert "add --allow-approvals" in capsys.readouterr().err
    assert main(["web", "--allow-approvals", "--operator", "mallory"]) == 2
    err = capsys.readouterr().err
    assert "'mallory' is not an operator of Transport terminal" in err
    assert main(["web", "--allow-approvals", "--transport", "nope"]) == 2
    assert "no Transport named 'nope'" in capsys.readouterr().err


@pytest.fixture()
def console(state_dir: Path) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    env = {"KAGURA_AGENT_STATE_DIR": str(state_dir), "PATH": "/usr/bin:/bin"}
    process = subprocess.Popen(
        [sys.executable, "-m", "kagura_agent", "web", "--port", "0"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    try:
        yield process.stdout.readline().strip(), process
    finally:
        process.terminate()
        process.wait(timeout=15)


def _status(url: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str]]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request) as response:
            return response.status, dict(response.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers)


def test_first_line_is_the_login_url_and_nothing_answers_without_it(
    console: tuple[str, subprocess.Popen[str]],
) -> None:
    url, _ = console
    assert url.startswith("http://127.0.0.1:") and "/login?token=" in url
    base, token = url.split("/login?token=")
    assert len(token) >= 40
    status, headers = _status(base + "/")
    assert status == 401
    assert "'unsafe-inline'" not in headers["content-security-policy"]
    assert headers["x-frame-options"] == "DENY" and headers["referrer-policy"] == "no-referrer"
    assert _status(base + "/login?token=" + token[:-1] + "x")[0] == 401
    # A page that rebinds its own name to 127.0.0.1 is another host: not served.
    assert _status(base + "/", {"Host": "evil.example:1234"})[0] == 421


def test_the_cli_and_plan_do_not_import_the_web_stack() -> None:
    code = (
        "import sys; from kagura_agent.cli.main import build_parser; build_parser();"
        " import kagura_agent.facts;"
        " print([m for m in ('starlette', 'uvicorn', 'kagura_agent.web') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_runs_pages_are_bounded_and_follow_on(state_dir: Path) -> None:
    """Keyset pages: each at most ``limit`` runs, the next one starting after the last
    (runs started in the same second stay in order by id), every run exactly once."""
    from kagura_agent.state.history import MIGRATIONS

    with open_store() as store:
        store.migrate("runs", MIGRATIONS)
        with store.transaction() as conn:
            for number in range(23):
                conn.execute(
                    "INSERT INTO runs(run_id, task, fingerprint, pid, started_at, kind)"
                    " VALUES (?, 't', 'fp', 1, ?, ?)",
                    (f"run-{number:03d}", f"2026-01-01T00:00:{number // 3:02d}Z", "k"),
                )
    store = open_store_read_only()
    assert store is not None
    seen: list[str] = []
    with store:
        cursor = None
        for _ in range(10):
            rows, cursor = runs_page(store, Notes(), RunFilter(kind="k"), cursor, limit=5)
            assert len(rows) <= 5
            seen += [row["run_id"] for row in rows]
            if cursor is None:
                break
    assert seen == [f"run-{n:03d}" for n in reversed(range(23))]
