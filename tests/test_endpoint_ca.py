"""A gateway behind a private authority (a Brain's ``endpoint.ca``: manifest/endpoint.py):
the plan carries the authorities and shows their fingerprints, a diff sees them change,
the proxy checks the endpoint against them alone, and a mistake (a key pasted in, a
server's certificate, text that is no certificate) is a located validation error that
never repeats what was pasted. The TLS hop itself: tests/test_model_port_tls.py."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography.hazmat.primitives import serialization
from golden import PLANS, golden_plan

from kagura_agent.cli.main import main
from kagura_agent.manifest.endpoint import read_authorities
from kagura_agent.membrane.egress.modelport import (
    ENDPOINT_AUTHORITIES,
    SYSTEM_AUTHORITIES,
    Injection,
    render_nginx_conf,
)
from kagura_agent.plan.build import plan_tasks
from kagura_agent.plan.diff import diff_plans
from kagura_agent.plan.render import render_markdown, render_text
from kagura_agent.ui import Style
from testing.tls import Authority


@pytest.fixture(scope="module")
def authority() -> Authority:
    return Authority.make("corp gateway authority")


def _gateway(tmp_path: Path, ca: str | None) -> Path:
    """The sdk-gateway golden case with ``ca`` on its Brain's endpoint."""
    folder = tmp_path / "case"
    shutil.copytree(PLANS / "sdk-gateway", folder)
    brains = folder / "manifests" / "brains.yml"
    documents = list(yaml.safe_load_all(brains.read_text()))
    if ca is not None:
        documents[1]["spec"]["endpoint"]["ca"] = ca
    brains.write_text(yaml.safe_dump_all(documents))
    return folder


def _plan(folder: Path) -> Any:
    (plan,) = plan_tasks(
        str(folder / "manifests"),
        [str(folder / "task.yml")],
        facts_file=str(folder / "facts.json"),
    )
    return plan


def test_the_proxy_trusts_the_brains_authorities_alone(
    tmp_path: Path, authority: Authority
) -> None:
    plan = _plan(_gateway(tmp_path, authority.pem.decode()))
    endpoint = plan["brain"]["model_endpoint"]
    der = authority.certificate.public_bytes(serialization.Encoding.DER)
    assert endpoint["ca"]["sha256"] == [hashlib.sha256(der).hexdigest()]
    injection = Injection.for_endpoint(endpoint)
    assert injection.ca_pem == endpoint["ca"]["pem"]
    conf = render_nginx_conf(injection)
    assert f"proxy_ssl_trusted_certificate {ENDPOINT_AUTHORITIES};" in conf
    assert SYSTEM_AUTHORITIES not in conf
    # Without it: the system's authorities, as for the Anthropic API.
    plain = Injection.for_endpoint(golden_plan("sdk-gateway")["brain"]["model_endpoint"])
    assert plain.ca_pem is None
    assert f"proxy_ssl_trusted_certificate {SYSTEM_AUTHORITIES};" in render_nginx_conf(plain)


def test_every_view_shows_whom_it_trusts_and_a_diff_sees_it_change(
    tmp_path: Path, authority: Authority
) -> None:
    plan = _plan(_gateway(tmp_path, authority.pem.decode()))
    fingerprint = plan["brain"]["model_endpoint"]["ca"]["sha256"][0]
    shown = f"checked against the Brain's authorities only (sha256:{fingerprint[:16]}…)"
    assert shown in render_text(plan, Style(False))
    assert shown in render_markdown(plan)
    changes = [c.render() for c in diff_plans(golden_plan("sdk-gateway"), plan)]
    assert [c for c in changes if "model endpoint" in c] == [
        f"~ model endpoint https://llm-gateway.corp.example:4000/anthropic ca None → {fingerprint}"
        "  (widens)"
    ], changes
    other = Authority.make("another authority")
    replanned = _plan(_gateway(tmp_path / "again", other.pem.decode() + authority.pem.decode()))
    [moved] = [c.render() for c in diff_plans(plan, replanned) if "model endpoint" in c.render()]
    assert "ca " + fingerprint + " → " in moved


def _key_pem() -> str:
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()


@pytest.mark.parametrize(
    ("what", "message"),
    [
        ("key", "holds a private key: give the authority's certificate only"),
        ("server", "is not an authority's (CA:TRUE)"),
        ("text", "no certificate in it"),
        ("base64", "certificate 1 is not valid base64"),
        ("not x509", "cannot be read (not an X.509 certificate)"),
        ("twice", "is given twice"),
    ],
)
def test_a_mistake_is_a_located_error_that_repeats_nothing(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    authority: Authority,
    what: str,
    message: str,
) -> None:
    pem = authority.pem.decode()
    ca = {
        "key": pem + _key_pem(),
        "server": authority.identity("llm-gateway.corp.example").decode().split("-----BEGIN P")[0],
        "text": "the corporate CA, see the wiki",
        "base64": "-----BEGIN CERTIFICATE-----\nnot*base64\n-----END CERTIFICATE-----\n",
        "not x509": "-----BEGIN CERTIFICATE-----\naGVsbG8=\n-----END CERTIFICATE-----\n",
        "twice": pem + pem,
    }[what]
    folder = _gateway(tmp_path, ca)
    code = main(["validate", "--manifests", str(folder / "manifests")])
    err = capsys.readouterr().err
    assert code == 2, err
    # (A key is also what the secret scan refuses in any manifest, on a line of its own.)
    lines = [line for line in err.splitlines() if "$.spec.endpoint.ca " in line]
    assert any(line.startswith(f"{folder}/") and message in line for line in lines), err
    for pasted in ca.splitlines():
        if len(pasted) > 16 and "-----" not in pasted:
            assert pasted not in err  # neither a key nor a certificate is repeated


def test_a_local_endpoint_takes_no_authority(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], authority: Authority
) -> None:
    folder = tmp_path / "case"
    shutil.copytree(PLANS / "sdk-local", folder)
    brains = folder / "manifests" / "brains.yml"
    documents = list(yaml.safe_load_all(brains.read_text()))
    documents[1]["spec"]["endpoint"]["ca"] = authority.pem.decode()
    brains.write_text(yaml.safe_dump_all(documents))
    assert main(["validate", "--manifests", str(folder / "manifests")]) == 2
    err = capsys.readouterr().err
    assert "$.spec.endpoint.ca " in err and "a local one is plain HTTP" in err, err


def test_read_authorities_keeps_certificates_only() -> None:
    one, two = Authority.make("one"), Authority.make("two")
    text = "# the company's roots\n" + one.pem.decode() + "\n\n" + two.pem.decode()
    found, problem = read_authorities(text)
    assert found is not None, problem
    assert found.pem == one.pem.decode() + two.pem.decode()
    assert len(found.sha256) == 2
