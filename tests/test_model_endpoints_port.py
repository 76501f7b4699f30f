"""Each model endpoint API at the key-injecting port, from the outside.

A run's real proxy (EgressSession, as apply starts it) with the plan the planner made for
a Brain naming the endpoint, towards testing/fake_model_providers.py, which checks each
call's credential as the provider does (Bedrock recomputes the SigV4 signature the port
made; Vertex and the Anthropic API check their tokens). The calls are made from inside
an unprivileged agent container, in the shapes the real CLI sends (recorded in
docs/egress.md; tests/test_conformance_endpoints.py drives the CLI itself):

- a gateway gets its key as the header it takes, under its base path, and nothing else;
- a subscription's OAuth token goes as the CLI sends one, with the oauth beta;
- Bedrock's calls leave the port signed with the leased key, their event stream passes
  through intact and as it comes; the CLI's inference-profile discovery is answered by
  the port; a renewed key is in force for the next call; a withdrawn one leaves none;
- Vertex's calls carry the leased token, for the endpoint's project and region only, and
  are counted and capped at the turn budget as the Anthropic API's are.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from apply_helpers import make_project, manifest_set, write_task

from kagura_agent.membrane.egress.modelport import Injection
from kagura_agent.membrane.egress.session import EgressRequest, EgressSession
from kagura_agent.plan.build import plan_tasks
from testing.egress_images import ensure_egress_images, start_forwarder, this_proxy_image
from testing.fake_messages_api import key_marker
from testing.fake_model_providers import (
    FakeProvidersContainer,
    Trust,
    fake_providers_container,
    read_eventstream,
)

pytestmark = pytest.mark.usefixtures("docker_client")

LABEL = {"dev.kagura.test": "model-endpoints"}
GATEWAY_KEY = "sk-gateway-canary-" + "G7" * 16
OAUTH_TOKEN = "sk-ant-oat01-canary-" + "O3" * 16
ATTACKER = "sk-ant-attacker-" + "A1" * 16
AWS_ID, AWS_SECRET, AWS_TOKEN = (
    "ASIAENDPOINTS0000001",
    "aws/secret+" + "S" * 29,
    "IQoJb3" + "T" * 90,
)
AWS_ID2, AWS_SECRET2, AWS_TOKEN2 = (
    "ASIAENDPOINTS0000002",
    "aws/secret+" + "R" * 29,
    "IQoJb3" + "U" * 90,
)
GCP_TOKEN = "ya29.canary-" + "V5" * 20
# The request the agent's client sends: python's http.client, from inside the agent.
CLIENT = """
import base64, http.client, json, sys, time
method, path, headers, body = json.loads(base64.b64decode(sys.argv[1]))
conn = http.client.HTTPConnection("127.0.0.1", 3129, timeout=20)
start = time.monotonic()
conn.request(method, path, body=base64.b64decode(body) if body else None, headers=headers)
response = conn.getresponse()
first = None
out = b""
while True:
    chunk = response.read1(65536)
    if not chunk:
        break
    first = time.monotonic() - start if first is None else first
    out += chunk
print(json.dumps({"status": response.status, "headers": dict(response.getheaders()),
                  "body": base64.b64encode(out).decode(), "first": first,
                  "total": time.monotonic() - start}))
"""
TOOLS = [{"name": "Write", "description": "write", "input_schema": {"type": "object"}}]
SCRIPT = {
    "conversations": [
        {"match": "TASK-PORT", "turns": [{"text": "one", "delay": 0.0}], "then": {"text": "on"}},
        {
            "match": "TASK-SLOW",
            "turns": [{"text": "slow stream of words for the first byte", "delay": 0.3}],
        },
    ]
}


@dataclass
class Endpoint:
    session: EgressSession
    agent: Any
    fake: FakeProvidersContainer
    plan: Any
    events: list[dict[str, Any]] = field(default_factory=list)

    def call(
        self,
        path: str,
        body: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
        method: str = "POST",
    ) -> dict[str, Any]:
        raw = base64.b64encode(json.dumps(body).encode()).decode() if body is not None else ""
        args = base64.b64encode(json.dumps([method, path, headers or {}, raw]).encode()).decode()
        result = self.agent.exec_run(["python3", "-c", CLIENT, args])
        assert result.exit_code == 0, result.output
        reply: dict[str, Any] = json.loads(result.output)
        reply["body"] = base64.b64decode(reply["body"])
        return reply

    def records(self) -> list[dict[str, Any]]:
        return self.fake.records()

    def decisions(self) -> list[dict[str, Any]]:
        self.session.drain()
        return [e for e in self.events if e.get("type") == "egress.decision"]


@pytest.fixture(scope="module")
def images(docker_client: Any) -> dict[str, str]:
    found = ensure_egress_images(docker_client)
    return {"base": found["base"], "proxy": this_proxy_image(docker_client)}


def _plan(tmp_path: Path, brain: dict[str, Any], provider: dict[str, Any]) -> Any:
    """The planner's plan of a task on ``brain`` (never a hand-built one)."""
    folder = manifest_set(
        tmp_path, {"kind": "Brain", "metadata": {"name": "endpoint"}, "spec": brain}, provider
    )
    project = make_project(tmp_path)
    spec = {"brain": "endpoint", "prompt": "hello", "budget": {"turns": 5}}
    (plan,) = plan_tasks(str(folder), [str(write_task(project, "t", spec))])
    return plan


@contextlib.contextmanager
def open_endpoint(
    client: Any,
    images: dict[str, str],
    plan: Any,
    secret: str,
    trust: Trust,
) -> Iterator[Endpoint]:
    """The plan's proxy injecting ``secret`` towards the fake (the endpoint's own host
    name resolving to it, plain HTTP), and an agent container whose forwarder reaches it."""
    endpoint = plan["brain"]["model_endpoint"]
    injection = Injection.for_endpoint(endpoint)
    with contextlib.ExitStack() as stack:
        fake = stack.enter_context(
            fake_providers_container(
                client,
                images["base"],
                LABEL,
                SCRIPT,
                region=endpoint["region"] or "us-east-1",
                project=endpoint["project"] or "kagura-test",
                prefix=injection.base_path,
            )
        )
        fake.trust(trust)
        events: list[dict[str, Any]] = []
        request = EgressRequest(
            plan,
            f"test-endpoint-{time.monotonic_ns()}",
            image=images["proxy"],
            injection=dataclasses.replace(injection, port=fake.port, tls=False),
            injection_secret=secret,
            extra_hosts={injection.host: fake.address},
            extra_networks=(fake.network,),
            scrub=lambda text: text,
        )
        session = EgressSession.start(client, request, events.append)
        stack.callback(session.close)
        net = session.agent_network_config()
        agent = client.containers.create(
            images["base"],
            ["sleep", "600"],
            labels=LABEL,
            user="1000:1000",
            cap_drop=["ALL"],
            security_opt=["no-new-privileges:true"],
            read_only=True,
            tmpfs={"/tmp": "rw,size=16m"},
            **net.docker_kwargs(),
        )
        stack.callback(agent.remove, force=True)
        agent.start()
        start_forwarder(agent, net)
        yield Endpoint(session, agent, fake, plan, events)


def _message(prompt: str = "TASK-PORT", **extra: Any) -> dict[str, Any]:
    body = {
        "model": "claude-sonnet-4-5",
        "max_tokens": 64,
        "stream": True,
        "tools": TOOLS,
        "messages": [{"role": "user", "content": prompt}],
    }
    return {**body, **extra}


def _static(name: str, env: str) -> dict[str, Any]:
    return {
        "kind": "CredentialProvider",
        "metadata": {"name": name},
        "spec": {
            "type": "static",
            "standing": True,
            "secret": f"env:{env}",
            "static": {"env": env},
            "baseline_scopes": ["use"],
            "scopes": {"use": {"description": "the model"}},
        },
    }


def _sdk(**spec: Any) -> dict[str, Any]:
    return {"engine": "sdk", "model": "claude-sonnet-4-5", "runtime": "container", **spec}


def test_a_gateway_gets_its_key_as_its_header_under_its_base_path(
    docker_client: Any, images: dict[str, str], tmp_path: Path
) -> None:
    brain = _sdk(
        endpoint={
            "url": "https://llm-gateway.corp.example:4000/anthropic",
            "header": "authorization",
        },
        auth={"mode": "api-key", "credential": "gateway"},
    )
    plan = _plan(tmp_path, brain, _static("gateway", "GATEWAY_KEY"))
    assert plan["egress"]["model_calls"]["upstream"] == (
        "https://llm-gateway.corp.example:4000/anthropic"
    )
    with open_endpoint(
        docker_client, images, plan, GATEWAY_KEY, Trust(api_keys=[GATEWAY_KEY])
    ) as port:
        agent_headers = {
            "x-api-key": "injected-at-the-proxy",
            "Authorization": f"Bearer {ATTACKER}",
            "anthropic-version": "2023-06-01",
            "anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14",
        }
        reply = port.call("/v1/messages?beta=true", _message(), agent_headers)
        assert reply["status"] == 200 and b"message_stop" in reply["body"], reply
        # Only the Messages API's own paths pass; the gateway's other routes do not.
        other = port.call("/v1/chat/completions", _message(), agent_headers)
        assert other["status"] == 403
        (seen,) = port.records()
        assert seen["path"] == "/anthropic/v1/messages?beta=true"
        assert seen["auth"] == "bearer-api-key " + key_marker(GATEWAY_KEY)
        assert "x-api-key" not in seen["headers"], seen["headers"]
        assert seen["headers"]["host"] == "llm-gateway.corp.example"
        allowed = [d for d in port.decisions() if d["decision"] == "allow"]
        assert [(d["host"], d["reason"], d["squid_status"]) for d in allowed] == [
            ("llm-gateway.corp.example", "injected", "MODEL_TURN")
        ]


def test_a_subscription_token_goes_as_the_cli_sends_one(
    docker_client: Any, images: dict[str, str], tmp_path: Path
) -> None:
    brain = _sdk(auth={"mode": "subscription", "credential": "claude-subscription"})
    plan = _plan(tmp_path, brain, _static("claude-subscription", "CLAUDE_CODE_OAUTH_TOKEN"))
    assert plan["brain"]["model_endpoint"]["environment"]["CLAUDE_CODE_OAUTH_TOKEN"] == (
        "injected-at-the-proxy"
    )
    with open_endpoint(
        docker_client, images, plan, OAUTH_TOKEN, Trust(oauth_tokens=[OAUTH_TOKEN])
    ) as port:
        # As the real CLI sends a subscriber's call (CLAUDE_CODE_OAUTH_TOKEN set).
        cli = {
            "Authorization": "Bearer injected-at-the-proxy",
            "anthropic-version": "2023-06-01",
            "anthropic-beta": "claude-code-20250219,oauth-2025-04-20,"
            "interleaved-thinking-2025-05-14,extended-cache-ttl-2025-04-11",
        }
        assert port.call("/v1/messages?beta=true", _message(), cli)["status"] == 200
        # A call without the oauth beta gets it: the token is never sent without it.
        bare = {"Authorization": "Bearer injected-at-the-proxy", "anthropic-version": "2023-06-01"}
        assert port.call("/v1/messages?beta=true", _message(), bare)["status"] == 200
        seen = port.records()
        assert [r["auth"] for r in seen] == ["oauth " + key_marker(OAUTH_TOKEN)] * 2
        assert "oauth-2025-04-20" in seen[1]["headers"]["anthropic-beta"]


def _aws_provider() -> dict[str, Any]:
    return {
        "kind": "CredentialProvider",
        "metadata": {"name": "aws-models"},
        "spec": {
            "type": "aws-sts",
            "secret": "env:KAGURA_AWS_ROOT_KEY",
            "aws": {"region": "us-east-1"},
            "baseline_scopes": ["bedrock"],
            "scopes": {
                "bedrock": {
                    "role_arn": "arn:aws:iam::123456789012:role/models",
                    "session_policy": {
                        "Version": "2012-10-17",
                        "Statement": [
                            {"Effect": "Allow", "Action": "bedrock:InvokeModel*", "Resource": "*"}
                        ],
                    },
                }
            },
        },
    }


BEDROCK_MODEL = "us.anthropic.claude-sonnet-4-5-20250929-v1:0"


def _bedrock_body(prompt: str = "TASK-PORT", **extra: Any) -> dict[str, Any]:
    body = {k: v for k, v in _message(prompt).items() if k not in ("model", "stream")}
    return {
        **body,
        "anthropic_version": "bedrock-2023-05-31",
        "anthropic_beta": ["interleaved-thinking-2025-05-14", "tool-search-tool-2025-10-19"],
        **extra,
    }


def test_bedrock_calls_leave_signed_with_the_leased_key_and_stream_through_intact(
    docker_client: Any, images: dict[str, str], tmp_path: Path
) -> None:
    brain = _sdk(
        model=BEDROCK_MODEL,
        endpoint={"api": "bedrock", "region": "us-east-1"},
        auth={"mode": "cloud", "credential": "aws-models"},
    )
    plan = _plan(tmp_path, brain, _aws_provider())
    first = f"{AWS_ID}:{AWS_SECRET}:{AWS_TOKEN}"
    trust = Trust(aws={AWS_ID: [AWS_SECRET, AWS_TOKEN]})
    stream = f"/model/{BEDROCK_MODEL}/invoke-with-response-stream"
    with open_endpoint(docker_client, images, plan, first, trust) as port:
        cli = {"anthropic-version": "2023-06-01", "anthropic-beta": "claude-code-20250219"}
        # The CLI's inference-profile discovery: answered by the port, nothing upstream.
        profiles = port.call("/inference-profiles?type=SYSTEM_DEFINED", method="GET")
        assert profiles["status"] == 200
        assert json.loads(profiles["body"]) == {"inferenceProfileSummaries": []}
        reply = port.call(stream, _bedrock_body(), cli)
        assert reply["status"] == 200, reply
        assert reply["headers"]["Content-Type"] == "application/vnd.amazon.eventstream"
        # Every frame passed intact (its CRCs hold) and carries the Messages API's events.
        frames = read_eventstream(reply["body"])
        events = [json.loads(base64.b64decode(json.loads(p)["bytes"])) for _, p in frames]
        assert events[0]["type"] == "message_start"
        assert events[-1]["type"] == "message_stop"
        # A slow stream is passed on as it comes, not when it ends.
        slow = port.call(stream, _bedrock_body("TASK-SLOW"), cli)
        assert slow["status"] == 200 and slow["first"] < slow["total"] / 2, slow
        # What the port refuses: another path spelling, the model in the body, an
        # unlisted beta in the body, a query.
        refused = [
            port.call(stream.replace(":0", "%3A0"), _bedrock_body(), cli),
            port.call(stream, _bedrock_body(model=BEDROCK_MODEL), cli),
            port.call(stream, _bedrock_body(anthropic_beta=["web-fetch-2025-09-10"]), cli),
            port.call(stream + "?x=1", _bedrock_body(), cli),
            port.call(f"/model/{BEDROCK_MODEL}/converse", _bedrock_body(), cli),
        ]
        assert [r["status"] for r in refused] == [403, 403, 403, 403, 403]
        # A renewed key is in force for the next call (the fake trusts only the new one).
        port.fake.trust(Trust(aws={AWS_ID2: [AWS_SECRET2, AWS_TOKEN2]}))
        port.session.renew_credential(f"{AWS_ID2}:{AWS_SECRET2}:{AWS_TOKEN2}")
        assert port.call(stream, _bedrock_body(), cli)["status"] == 200
        # Withdrawn (the lease's budget spent): no call carries a credential any more.
        port.session.renew_credential("withdrawn")
        assert port.call(stream, _bedrock_body(), cli)["status"] == 503
        seen = port.records()
        decisions = port.decisions()
    assert [r["auth"].split()[0] for r in seen] == ["sigv4"] * 3, seen
    assert [r["headers"]["authorization"].split()[1] for r in seen] == [AWS_ID, AWS_ID, AWS_ID2]
    # ':' of the model id encoded as AWS's SDKs send it (and as the signature covers it).
    assert {r["path"] for r in seen} == {stream.replace(":0", "%3A0")}
    kinds = [(d["method"], d["squid_status"], d["reason"]) for d in decisions]
    assert kinds[0] == ("GET", "MODEL_LOCAL", "answered-by-port")
    assert kinds.count(("POST", "MODEL_TURN", "injected")) == 3
    assert [d["reason"] for d in decisions if d["decision"] == "deny"] == [
        "not-model-call",
        "body",
        "beta",
        "not-model-call",
        "not-model-call",
        "credential",
    ]


def _gcp_provider() -> dict[str, Any]:
    return {
        "kind": "CredentialProvider",
        "metadata": {"name": "gcp-models"},
        "spec": {
            "type": "gcp",
            "secret": "env:KAGURA_GCP_ROOT_KEY",
            "baseline_scopes": ["vertex"],
            "scopes": {
                "vertex": {
                    "service_account": "models@kagura-models.iam.gserviceaccount.com",
                    "scopes": ["https://www.googleapis.com/auth/cloud-platform.read-only"],
                }
            },
        },
    }


def test_vertex_calls_carry_the_leased_token_for_the_endpoints_project_only(
    docker_client: Any, images: dict[str, str], tmp_path: Path
) -> None:
    brain = _sdk(
        model="claude-sonnet-4-5@20250929",
        endpoint={"api": "vertex", "region": "us-east5", "project": "kagura-models"},
        auth={"mode": "cloud", "credential": "gcp-models"},
    )
    plan = _plan(tmp_path, brain, _gcp_provider())
    where = "/v1/projects/kagura-models/locations/us-east5/publishers/anthropic/models"
    body = {k: v for k, v in _message().items() if k != "model"}
    body["anthropic_version"] = "vertex-2023-10-16"
    with open_endpoint(
        docker_client, images, plan, GCP_TOKEN, Trust(bearer_tokens=[GCP_TOKEN])
    ) as port:
        # As the real CLI sends it: web-search's beta on every call, no web_search tool.
        cli = {
            "anthropic-version": "2023-06-01",
            "anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14,"
            "web-search-2025-03-05,tool-search-tool-2025-10-19",
        }
        reply = port.call(f"{where}/claude-sonnet-4-5@20250929:streamRawPredict", body, cli)
        assert reply["status"] == 200 and b"message_stop" in reply["body"], reply
        count = {**body, "model": "claude-sonnet-4-5@20250929"}
        assert port.call(f"{where}/count-tokens:rawPredict", count, cli)["status"] == 200
        other = where.replace("kagura-models", "someone-elses")
        assert (
            port.call(f"{other}/claude-sonnet-4-5@20250929:rawPredict", body, cli)["status"] == 403
        )
        # The server-side tool itself is refused, beta or not.
        search = {**body, "tools": [{"type": "web_search_20250305", "name": "web_search"}]}
        assert (
            port.call(f"{where}/claude-sonnet-4-5@20250929:rawPredict", search, cli)["status"]
            == 403
        )
        # Counted and capped as on the Anthropic API: the plan's 5 turns are 5 turn calls;
        # the sixth is refused at the port, nothing of it upstream.
        stream = f"{where}/claude-sonnet-4-5@20250929:streamRawPredict"
        assert [port.call(stream, body, cli)["status"] for _ in range(4)] == [200] * 4
        past = port.call(stream, body, cli)
        assert past["status"] == 403 and b"budget of 5 turn calls" in past["body"], past
        seen = port.records()
        decisions = port.decisions()
    assert [r["auth"] for r in seen] == ["bearer " + key_marker(GCP_TOKEN)] * 6
    assert "web-search" not in seen[0]["headers"]["anthropic-beta"]
    assert "tool-search-tool-2025-10-19" in seen[0]["headers"]["anthropic-beta"]
    kinds = [d["squid_status"] for d in decisions if d["decision"] == "allow"]
    assert kinds == ["MODEL_TURN", "MODEL_FREE"] + ["MODEL_TURN"] * 4
    assert [d["reason"] for d in decisions if d["decision"] == "deny"][-1] == "budget"
