"""Secret references, resolution (env, file, keyring via keyrings.alt), detection, redaction."""

from __future__ import annotations

import json
from pathlib import Path

import keyring
import keyring.backends.fail
import pytest
from keyrings.alt.file import PlaintextKeyring

from kagura_agent.errors import SetupError
from kagura_agent.membrane.secrets import (
    Redactor,
    SecretRef,
    looks_like_secret,
    parse_secret_ref,
    resolve,
)

CANARY = "canary-root-secret-7f3a9c21d4e8"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("env:AWS_ROOT_KEY", SecretRef("env", "AWS_ROOT_KEY")),
        ("file:/etc/kagura/cf-token", SecretRef("file", "/etc/kagura/cf-token")),
        ("file:~/.config/kagura/key", SecretRef("file", "~/.config/kagura/key")),
        ("keyring:kagura/cloudflare", SecretRef("keyring", "kagura/cloudflare")),
    ],
)
def test_parse_valid_references(text: str, expected: SecretRef) -> None:
    assert parse_secret_ref(text) == expected
    assert str(expected) == text


@pytest.mark.parametrize(
    "text",
    [
        "AKIAIOSFODNN7EXAMPLE",
        "sk-ant-api03-" + "x" * 40,
        "env:",
        "env:1BAD",
        "file:relative/path",
        "keyring:nouser",
        "vault:secret/x",
        "",
    ],
)
def test_parse_rejects_non_references_without_echoing_them(text: str) -> None:
    message = parse_secret_ref(text)
    assert isinstance(message, str)
    if len(text) > 12:
        assert text not in message


def test_resolve_env_and_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAGURA_TEST_SECRET", CANARY)
    assert resolve("env:KAGURA_TEST_SECRET") == CANARY
    path = tmp_path / "token"
    path.write_text(CANARY + "\n")
    assert resolve(f"file:{path}") == CANARY


def test_resolve_errors_name_the_reference_not_a_value(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KAGURA_TEST_MISSING", raising=False)
    with pytest.raises(SetupError, match="env:KAGURA_TEST_MISSING is not set"):
        resolve("env:KAGURA_TEST_MISSING")
    with pytest.raises(SetupError, match="cannot be read"):
        resolve(f"file:{tmp_path}/absent")
    with pytest.raises(SetupError, match="not a secret reference"):
        resolve(CANARY)


def test_keyring_with_the_keyrings_alt_file_backend(tmp_path: Path) -> None:
    backend = PlaintextKeyring()
    backend.file_path = str(tmp_path / "keyring.cfg")
    previous = keyring.get_keyring()
    keyring.set_keyring(backend)
    try:
        keyring.set_password("kagura", "cloudflare", CANARY)
        assert resolve("keyring:kagura/cloudflare") == CANARY
        with pytest.raises(SetupError, match="not in the keyring"):
            resolve("keyring:kagura/absent")
    finally:
        keyring.set_keyring(previous)


def test_keyring_without_a_usable_backend_names_the_alternatives() -> None:
    previous = keyring.get_keyring()
    keyring.set_keyring(keyring.backends.fail.Keyring())
    try:
        with pytest.raises(SetupError) as caught:
            resolve("keyring:kagura/cloudflare")
    finally:
        keyring.set_keyring(previous)
    assert "no usable keyring backend" in caught.value.message
    assert "env:NAME" in caught.value.hint and "file:PATH" in caught.value.hint


@pytest.mark.parametrize(
    ("value", "label"),
    [
        ("AKIAIOSFODNN7EXAMPLE", "AWS access key"),
        ("ASIAQWERTYUIOPASDFGH", "AWS access key"),
        ("sk-ant-api03-" + "a1B2" * 10, "Anthropic"),
        ("sk-proj-" + "a1B2" * 10, "OpenAI"),
        ("xoxb-1234567890-abcdefghij", "Slack"),
        ("xapp-1-A0123456789-abcdef", "Slack app"),
        ("ghp_" + "a" * 36, "GitHub token"),
        ("github_pat_" + "A1_" * 20, "fine-grained"),
        ("-----BEGIN RSA PRIVATE KEY-----\nMIIE", "private key"),
        ("-----BEGIN PRIVATE KEY-----", "private key"),
        ("cloudflare_api_token: " + "Ab3_" * 10, "Cloudflare"),
        ("aws_secret_access_key = " + "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", "AWS secret"),
    ],
)
def test_looks_like_secret_finds_inline_key_material(value: str, label: str) -> None:
    found = looks_like_secret(value)
    assert found is not None and label.lower() in found.lower()


@pytest.mark.parametrize(
    "value",
    [
        "env:AWS_ROOT_KEY",
        "arn:aws:iam::123456789012:role/deployer",
        "deployer@project.iam.gserviceaccount.com",
        "0123456789abcdef0123456789abcdef01234567",  # a bare 40-char id: not keyed, not flagged
        "sk-short",
        "api.github.com",
    ],
)
def test_looks_like_secret_leaves_ordinary_values(value: str) -> None:
    assert looks_like_secret(value) is None


def test_redactor_scrubs_every_known_value_and_line() -> None:
    redactor = Redactor()
    pem = "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAAS\n-----END PRIVATE KEY-----"
    redactor.add(CANARY, pem, "abc")
    text = f"token={CANARY} key line MIIEvQIBADANBgkqhkiG9w0BAQEFAAS and abc stays"
    scrubbed = redactor.scrub(text)
    assert CANARY not in scrubbed and "MIIEvQIBADAN" not in scrubbed
    assert "abc stays" in scrubbed  # too short to register: would shred ordinary text
    assert "(sensitive)" in scrubbed
    assert CANARY not in repr(redactor)


def test_scrub_any_case_finds_a_value_whose_case_was_folded() -> None:
    redactor = Redactor()
    redactor.add("Tok3n-MixedCase-9f8e7d")
    folded = "tok3n-mixedcase-9f8e7d.evil.test"  # as a proxy logs a host name
    assert redactor.scrub(folded) == folded  # the exact match misses it
    assert redactor.scrub_any_case(folded) == "(sensitive).evil.test"
    redactor.add("Another-Value-0a1b2c")  # a later value is matched too
    assert redactor.scrub_any_case("ANOTHER-VALUE-0A1B2C") == "(sensitive)"


# A service-account key as GCP issues it: JSON, its private key one line with \n escapes.
_KEY_BODY = "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7canaryKEYmaterial"
SERVICE_ACCOUNT_KEY = (
    "{\n"
    '  "type": "service_account",\n'
    '  "private_key_id": "0f1e2d3c4b5a69788796a5b4c3d2e1f0canary1",\n'
    '  "private_key": "-----BEGIN PRIVATE KEY-----\\n'
    + _KEY_BODY
    + '\\n-----END PRIVATE KEY-----\\n",\n'
    '  "client_email": "agent@canary-project.iam.gserviceaccount.com"\n'
    "}\n"
)
QUOTED_PASSWORD = 'pa"ss\\word-canary-7731'


@pytest.mark.parametrize(
    "printed",
    [
        SERVICE_ACCOUNT_KEY,  # cat key.json
        QUOTED_PASSWORD,  # echo "$DB_PASSWORD"
        "-----BEGIN PRIVATE KEY-----\n" + _KEY_BODY + "\n-----END PRIVATE KEY-----\n",  # jq -r
    ],
    ids=["key-file", "quoted-password", "decoded-private-key"],
)
@pytest.mark.parametrize("as_json", [True, False], ids=["json", "text"])
def test_a_secret_the_agent_prints_is_scrubbed_from_the_live_view(
    printed: str, as_json: bool
) -> None:
    """``apply --json`` (what serve's chat, the team's event store and a CI job read) and
    the terminal: the agent prints a leased secret; none of it may reach the output, in
    any encoding. Before, the json view scrubbed its encoded line, where the key file's
    quotes and a password's backslash are escaped: all three leaked whole."""
    import io

    from kagura_agent.apply.records.live import LiveView
    from kagura_agent.brain.events import ToolResultEvent

    redactor = Redactor()
    redactor.add(SERVICE_ACCOUNT_KEY, QUOTED_PASSWORD)
    out = io.StringIO()
    LiveView(redactor, stream=out, as_json=as_json).brain(ToolResultEvent("t1", printed))
    line = out.getvalue()
    shown = json.loads(line)["output"] if as_json else line
    for material in (_KEY_BODY, QUOTED_PASSWORD, "0f1e2d3c4b5a69788796a5b4c3d2e1f0canary1"):
        assert material not in line and material not in shown, line


def test_the_public_parts_of_a_json_secret_are_not_scrubbed() -> None:
    """A service-account key's type, e-mail, URLs and PEM armour stay readable in output
    (registered, they would shred every GCP command's output); its secrets do not."""
    redactor = Redactor()
    key = json.loads(SERVICE_ACCOUNT_KEY)
    key |= {"universe_domain": "googleapis.com", "token_uri": "https://oauth2.googleapis.com/token"}
    redactor.add(json.dumps(key, indent=2))
    public = "gs://b storage.googleapis.com service_account https://oauth2.googleapis.com/token"
    public += " agent@canary-project.iam.gserviceaccount.com -----BEGIN PRIVATE KEY-----"
    assert redactor.scrub(public) == public
    assert redactor.scrub(f"{_KEY_BODY} {key['private_key_id']}") == "(sensitive) (sensitive)"
