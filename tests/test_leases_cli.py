"""`kagura-agent leases` on an empty and a populated ledger; imports stay light."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kagura_agent.cli.main import main

# Every test here runs against both state backends (SQLite, PostgreSQL).
pytestmark = pytest.mark.usefixtures("state_target")


def test_list_and_sweep_on_an_empty_ledger(
    state_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["leases", "list"]) == 0
    assert "no open leases" in capsys.readouterr().out
    assert main(["leases", "list", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"ok": True, "errors": [], "leases": []}
    assert main(["leases", "sweep", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)["sweep"]
    assert report["revoked"] == [] and report["poison"] == []
    assert main(["leases", "revoke", "g-unknown"]) == 2
    assert "no open lease" in capsys.readouterr().err


def test_leases_imports_no_provider_sdk() -> None:
    code = (
        "import sys, kagura_agent.membrane.leases, kagura_agent.cli.leases;"
        "heavy = [m for m in ('boto3', 'cloudflare', 'google.cloud', 'httpx', 'jwt', 'keyring')"
        " if m in sys.modules]; print(heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
