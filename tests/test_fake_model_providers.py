"""testing/fake_model_providers.py speaks the providers' protocols as their own clients do.

The checks the fake makes are only worth what they agree with: Bedrock's SigV4 is
checked against requests botocore's own signer signed (a signature of the real AWS SDK
passes, the same request changed in any signed part does not), its event stream against
botocore's own event-stream decoder (prelude and message CRCs), the Anthropic API's OAuth
rule and Vertex's bearer token against what the real CLI sends (tests/
test_conformance_endpoints.py drives the CLI itself against this fake).
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.eventstream import EventStreamBuffer

from testing.fake_model_providers import (
    FakeProviders,
    Trust,
    bedrock_chunk,
    read_eventstream,
    sigv4_problem,
)

KEY_ID, SECRET, TOKEN = "ASIAFAKEPROVIDERS001", "s3cr3t/KEY+" + "x" * 28, "FQoGZXIvYXdz" + "t" * 60
REGION = "us-east-1"
HOST = "bedrock-runtime.us-east-1.amazonaws.com"
MODEL = "us.anthropic.claude-sonnet-4-5-20250929-v1:0"
BODY = {
    "anthropic_version": "bedrock-2023-05-31",
    "max_tokens": 64,
    "messages": [{"role": "user", "content": "hello"}],
    "tools": [{"name": "Write", "input_schema": {"type": "object"}}],
    "anthropic_beta": ["interleaved-thinking-2025-05-14"],
}


def _signed(
    body: bytes, path: str, *, secret: str = SECRET, token: str = TOKEN, region: str = REGION
) -> AWSRequest:
    """A request signed by botocore's SigV4 signer, as boto3's bedrock-runtime client
    signs InvokeModelWithResponseStream."""
    request = AWSRequest(
        method="POST",
        url=f"https://{HOST}{path}",
        data=body,
        headers={"Content-Type": "application/json"},
    )
    SigV4Auth(Credentials(KEY_ID, secret, token), "bedrock", region).add_auth(request)
    return request


def _headers(request: AWSRequest) -> dict[str, list[str]]:
    out = {k.lower(): [v] for k, v in request.headers.items()}
    out.setdefault("host", [HOST])
    return out


TRUST = Trust(aws={KEY_ID: [SECRET, TOKEN]})
# What botocore sends: the model id's ':' percent-encoded in the path it signs.
PATH = "/model/us.anthropic.claude-sonnet-4-5-20250929-v1%3A0/invoke-with-response-stream"


def _problem(request: AWSRequest, *, target: str = PATH, body: bytes | None = None) -> Any:
    raw = body if body is not None else bytes(request.body)
    now = dt.datetime.now(dt.UTC)
    return sigv4_problem("POST", target, _headers(request), raw, TRUST, REGION, now)


def test_a_request_the_aws_sdk_signed_passes_and_any_change_to_it_does_not() -> None:
    body = json.dumps(BODY).encode()
    request = _signed(body, PATH)
    assert _problem(request) is None
    # The body, the path, the region and the key are all in the signature.
    assert _problem(request, body=body + b" ")[0] == "InvalidSignatureException"
    assert _problem(request, target=PATH.replace("invoke-with", "invoke-x"))[0] == (
        "InvalidSignatureException"
    )
    assert _problem(_signed(body, PATH, secret="another" + SECRET))[0] == (
        "InvalidSignatureException"
    )
    assert _problem(_signed(body, PATH, region="eu-west-1"))[0] == "InvalidSignatureException"
    assert _problem(_signed(body, PATH, token="another"))[0] == "UnrecognizedClientException"
    unsigned = AWSRequest(method="POST", url=f"https://{HOST}{PATH}", data=body)
    assert _problem(unsigned)[0] == "MissingAuthenticationTokenException"


def test_a_signature_older_than_five_minutes_is_refused() -> None:
    request = _signed(json.dumps(BODY).encode(), PATH)
    later = dt.datetime.now(dt.UTC) + dt.timedelta(minutes=6)
    found = sigv4_problem(
        "POST", PATH, _headers(request), bytes(request.body), TRUST, REGION, later
    )
    assert found == ("InvalidSignatureException", "Signature expired")


def test_the_event_stream_is_the_one_aws_sdks_decode() -> None:
    event = {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta"}}
    frame = bedrock_chunk(event)
    buffer = EventStreamBuffer()
    buffer.add_data(frame)
    (message,) = list(buffer)
    assert message.headers == {
        ":event-type": "chunk",
        ":content-type": "application/json",
        ":message-type": "event",
    }
    payload = json.loads(message.payload)
    assert json.loads(base64.b64decode(payload["bytes"])) == event
    # A damaged byte fails its CRC, in botocore's decoder and in read_eventstream.
    damaged = frame[:20] + bytes([frame[20] ^ 1]) + frame[21:]
    with pytest.raises(ValueError):
        read_eventstream(damaged)


SCRIPT = {
    "conversations": [
        {"match": "TASK-FAKE", "turns": [{"text": "hello back"}]},
    ]
}


@pytest.fixture()
def fake() -> Iterator[FakeProviders]:
    server = FakeProviders(SCRIPT, region="us-east5", project="kagura-models").start()
    server.trust(
        Trust(
            api_keys=["sk-gateway-key"],
            oauth_tokens=["sk-ant-oat01-token"],
            bearer_tokens=["ya29.token"],
            aws={KEY_ID: [SECRET, TOKEN]},
        )
    )
    yield server
    server.close()


def _post(url: str, body: dict[str, Any], headers: dict[str, str]) -> tuple[int, bytes]:
    data = json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method="POST", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


MESSAGE = {
    "model": "claude-sonnet-4-5",
    "max_tokens": 64,
    "messages": [{"role": "user", "content": "TASK-FAKE"}],
    "tools": [{"name": "Write", "input_schema": {"type": "object"}}],
}


def test_a_subscription_token_needs_the_oauth_beta_and_a_key_either_header(
    fake: FakeProviders,
) -> None:
    url = fake.base_url + "/v1/messages?beta=true"
    oauth = {"Authorization": "Bearer sk-ant-oat01-token", "content-type": "application/json"}
    assert _post(url, MESSAGE, oauth)[0] == 401
    status, _ = _post(url, MESSAGE, {**oauth, "anthropic-beta": "oauth-2025-04-20"})
    assert status == 200
    assert _post(url, MESSAGE, {"x-api-key": "sk-gateway-key"})[0] == 200
    assert _post(url, MESSAGE, {"Authorization": "Bearer sk-gateway-key"})[0] == 200
    assert _post(url, MESSAGE, {"x-api-key": "sk-other"})[0] == 401
    auths = [r["auth"] for r in fake.records()]
    assert [a.split()[0] for a in auths] == [
        "refused",
        "oauth",
        "x-api-key",
        "bearer-api-key",
        "refused",
    ]


def test_vertex_takes_its_token_for_its_project_and_region_only(fake: FakeProviders) -> None:
    where = "/v1/projects/kagura-models/locations/us-east5/publishers/anthropic/models"
    body = {k: v for k, v in MESSAGE.items() if k != "model"}
    body["anthropic_version"] = "vertex-2023-10-16"
    bearer = {"Authorization": "Bearer ya29.token"}
    url = fake.base_url + where + "/claude-sonnet-4-5@20250929:rawPredict"
    status, out = _post(url, body, bearer)
    assert status == 200 and json.loads(out)["content"][0]["text"] == "hello back"
    assert _post(url, body, {"Authorization": "Bearer ya29.other"})[0] == 401
    other = url.replace("kagura-models", "someone-elses")
    assert _post(other, body, bearer)[0] == 403
    count = fake.base_url + where + "/count-tokens:rawPredict"
    status, out = _post(count, {**body, "model": "claude-sonnet-4-5@20250929"}, bearer)
    assert status == 200 and json.loads(out)["input_tokens"] > 0
