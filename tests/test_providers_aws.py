"""aws-sts through real boto3 against moto_server on 127.0.0.1."""

from __future__ import annotations

import configparser
import json
import os
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import boto3
import pytest

from kagura_agent.clock import FixedClock
from kagura_agent.errors import RefusedError, UsageError
from kagura_agent.membrane.leases import Broker, LeaseRequest, Ledger
from kagura_agent.membrane.providers import ProviderError, build_provider
from kagura_agent.membrane.secrets import Redactor
from kagura_agent.state import open_store
from testing import forked
from testing.moto import moto_server

ROOT_KEY_ID = "AKIAKAGURACANARY0001"
ROOT_SECRET = "rootcanary/0123456789abcdefghijklmnopqrstuv"
ROOT = json.dumps({"aws_access_key_id": ROOT_KEY_ID, "aws_secret_access_key": ROOT_SECRET})
SESSION_POLICY = {
    "Version": "2012-10-17",
    "Statement": [{"Effect": "Allow", "Action": "s3:GetObject", "Resource": "*"}],
}


@pytest.fixture(scope="module")
def moto() -> Iterator[str]:
    with moto_server() as url:
        yield url


@pytest.fixture(scope="module")
def role_arn(moto: str) -> str:
    iam = boto3.client(
        "iam",
        endpoint_url=moto,
        region_name="us-east-1",
        aws_access_key_id=ROOT_KEY_ID,
        aws_secret_access_key=ROOT_SECRET,
    )
    trust = {"Version": "2012-10-17", "Statement": []}
    role = iam.create_role(RoleName="deployer", AssumeRolePolicyDocument=json.dumps(trust))
    return str(role["Role"]["Arn"])


def caller_of(bundle_ini: str, endpoint: str) -> str:
    parser = configparser.ConfigParser()
    parser.read_string(bundle_ini)
    section = parser["default"]
    sts = boto3.client(
        "sts",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id=section["aws_access_key_id"],
        aws_secret_access_key=section["aws_secret_access_key"],
        aws_session_token=section["aws_session_token"],
    )
    return str(sts.get_caller_identity()["Arn"])


def test_mint_assumes_the_role_with_policy_and_external_id(moto: str, role_arn: str) -> None:
    provider = build_provider("aws-sts", {"endpoint": moto}, ROOT)
    assert not provider.revocable
    minted = provider.mint(
        {"role_arn": role_arn, "session_policy": SESSION_POLICY, "external_id": "ext-1"},
        900,
        "g-abc",
    )
    assert minted.id.endswith("assumed-role/deployer/kagura-g-abc")
    remaining = minted.expires_at - datetime.now(UTC)
    assert timedelta(minutes=14) < remaining <= timedelta(minutes=15)
    files, env = minted.bundle.files, minted.bundle.env
    assert set(files) == {"aws/credentials", "aws/config"}
    assert env["AWS_SHARED_CREDENTIALS_FILE"] == "/run/kagura/creds/aws/credentials"
    assert ROOT_SECRET not in files["aws/credentials"]
    assert caller_of(files["aws/credentials"], moto).endswith("/deployer/kagura-g-abc")
    assert provider.revoke(minted.id) is False  # STS has nothing to revoke: lapses


def test_the_redactor_hides_the_sts_key_not_the_region_or_paths(moto: str, role_arn: str) -> None:
    provider = build_provider("aws-sts", {"endpoint": moto}, ROOT)
    minted = provider.mint({"role_arn": role_arn, "session_policy": SESSION_POLICY}, 900, "g-r")
    redactor = Redactor()
    redactor.add(*minted.sensitive_values())
    (secret, token) = minted.secrets
    shown = redactor.scrub(
        f"POST https://bedrock-runtime.us-east-1.amazonaws.com/model/m/invoke {secret} {token}"
        " AWS_CONFIG_FILE=/run/kagura/creds/aws/config"
    )
    assert secret not in shown and token not in shown
    # Before: AWS_DEFAULT_REGION's value was registered, and every host and message that
    # named the region read "(sensitive)" (a Bedrock endpoint's host in the egress record).
    assert "bedrock-runtime.us-east-1.amazonaws.com" in shown
    assert "AWS_CONFIG_FILE=/run/kagura/creds/aws/config" in shown


def test_root_secret_short_form_and_bad_forms(moto: str) -> None:
    build_provider("aws-sts", {"endpoint": moto}, f"{ROOT_KEY_ID}:{ROOT_SECRET}")
    with pytest.raises(UsageError) as caught:
        build_provider("aws-sts", {"endpoint": moto}, ROOT_SECRET)
    assert ROOT_SECRET not in caught.value.message


def test_broker_renews_aws_before_expiry(
    moto: str, role_arn: str, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KAGURA_TEST_AWS_ROOT", ROOT)
    clock = FixedClock(datetime.now(UTC))
    store = open_store()
    entry: dict[str, Any] = {
        "name": "aws-deployer",
        "provider": "aws-main",
        "type": "aws-sts",
        "scope": "deployer",
        "scope_spec": {
            "role_arn": role_arn,
            "session_policy": SESSION_POLICY,
            "endpoint": moto,
            "endpoint_addresses": ["127.0.0.1/32"],
        },
        "ttl_seconds": 900,
        "renewals": 3,
        "budget_seconds": 3600,
        "secret_ref": "env:KAGURA_TEST_AWS_ROOT",
        "standing": False,
        "class": "baseline",
    }
    lease = Broker(store, clock=clock).acquire(LeaseRequest.from_plan(entry))
    first = lease.bundle.files["aws/credentials"]
    clock.advance(timedelta(minutes=11))
    renewed = lease.tick()
    assert renewed is not None
    second = renewed.bundle.files["aws/credentials"]
    assert second != first
    assert caller_of(second, moto).endswith(f"/deployer/kagura-{lease.grant}")
    lease.release()
    rows = Ledger(store, clock).rows()
    # Neither the superseded credential nor the last one was revoked: both still work.
    assert {r.state for r in rows} == {"lapsing"}
    assert all("lapses at" in (r.note or "") for r in rows)
    store.close()


def test_a_released_sts_lease_is_shown_lapsing_until_its_expiry(
    moto: str, role_arn: str, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """STS credentials cannot be revoked: the ledger closes the row ``lapsing`` (not
    ``released``), records the kind, and ``leases list`` keeps it in view until it lapses."""
    monkeypatch.setenv("KAGURA_TEST_AWS_ROOT", ROOT)
    clock = FixedClock(datetime.now(UTC))
    store = open_store()
    entry: dict[str, Any] = {
        "name": "aws-deployer",
        "provider": "aws-main",
        "type": "aws-sts",
        "scope": "deployer",
        "scope_spec": {
            "role_arn": role_arn,
            "session_policy": SESSION_POLICY,
            "endpoint": moto,
            "endpoint_addresses": ["127.0.0.1/32"],
        },
        "ttl_seconds": 900,
        "renewals": 0,
        "budget_seconds": 900,
        "secret_ref": "env:KAGURA_TEST_AWS_ROOT",
        "standing": False,
        "class": "baseline",
    }
    lease = Broker(store, clock=clock).acquire(LeaseRequest.from_plan(entry))
    bundle = lease.bundle.files["aws/credentials"]
    lease.release()
    assert caller_of(bundle, moto).endswith(f"/deployer/kagura-{lease.grant}")  # still works
    ledger = Ledger(store, clock)
    (row,) = ledger.rows()
    assert (row.state, row.release_kind, row.open) == ("lapsing", "lapses", False)
    shown = row.to_json()
    assert shown["revocable"] is False and shown["release"] == "lapses"
    assert shown["ends"] == f"cannot be revoked: lapses at {shown['expires_at']}"
    assert [r.id for r in ledger.rows(include_closed=False)] == [row.id]
    # A real process (a child of the fork server, testing/forked.py) reads the store.
    shown_by_cli = forked.run(
        ["leases", "list"], cwd=Path.cwd(), env={**os.environ, "NO_COLOR": "1"}
    ).text()
    assert shown_by_cli.returncode == 0, shown_by_cli.stderr
    listed = shown_by_cli.stdout
    line = next(ln for ln in listed.splitlines() if ln.startswith(row.id))
    assert " lapsing " in line and " lapses " in line, listed
    assert "  lapses: cannot be revoked: lapses at its expiry" in listed
    clock.advance(timedelta(seconds=901))
    assert ledger.rows(include_closed=False) == []  # lapsed: out of the open view
    store.close()


def test_sts_failure_is_translated(moto: str) -> None:
    provider = build_provider("aws-sts", {"endpoint": "http://127.0.0.1:9", "max_retries": 0}, ROOT)

    with pytest.raises(ProviderError) as caught:
        provider.mint(
            {"role_arn": "arn:aws:iam::123456789012:role/x", "session_policy": SESSION_POLICY},
            900,
            "g-1",
        )
    assert caught.value.transient
    with pytest.raises(UsageError):
        provider.mint({}, 900, "g-1")


@pytest.mark.parametrize("policy", [None, {}, {"Version": "2012-10-17", "Statement": []}])
def test_a_scope_without_a_session_policy_is_not_minted(
    moto: str, role_arn: str, policy: dict[str, Any] | None
) -> None:
    """Whatever way a scope_spec reaches the provider (a saved plan, the ledger), one that
    narrows nothing never becomes a lease with the role's whole power; full_access does."""
    provider = build_provider("aws-sts", {"endpoint": moto}, ROOT)
    spec: dict[str, Any] = {"role_arn": role_arn}
    if policy is not None:
        spec["session_policy"] = policy
    with pytest.raises(RefusedError, match="narrows nothing without session_policy"):
        provider.mint(spec, 900, "g-wide")
    minted = provider.mint({"role_arn": role_arn, "full_access": True}, 900, "g-full")
    assert minted.id.endswith("assumed-role/deployer/kagura-g-full")
