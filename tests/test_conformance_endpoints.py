"""The real Claude Code CLI through ``kagura-agent apply`` on each model endpoint a Brain
can name: an Anthropic-compatible gateway, a Claude subscription, Amazon Bedrock and
Google Vertex AI.

Each test runs the CLI claude-agent-sdk bundles in the packaged agent image (tests/
conformance.py's world), behind the run's proxy, with the model played by
testing/fake_model_providers.py on the endpoint's own wire protocol and checking its
credential as the provider does: the gateway's key, the subscription's OAuth token (with
its beta), Bedrock's SigV4 signature by an STS key moto issued to the run's lease, Vertex's
bearer token that testing.fake_gcp minted for it. The CLI is only told the documented
switches and the port's address (plan brain.model_endpoint.environment); the credential
is injected at the proxy. While the run goes on the test reads the ``docker inspect`` of
the agent's container and the proxy's, and the scripted model has the agent dump its
environment, every process's environ and command line, its HOME and /tmp into the project
root: none of it, nor the run's output or state, holds the credential or any part of it.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from apply_helpers import (
    REPO,
    cli_env,
    json_lines,
    last_json,
    make_project,
    manifest_set,
    run_containers,
    run_ids,
    wait_for_container,
    write_task,
)
from conformance import LABEL, apply_argv, brain_events, dump, egress_decisions, image_manifest

from testing.agent_test_image import ensure_agent_test_image
from testing.egress_images import ensure_egress_images, this_proxy_image
from testing.fake_endpoint_runtime import endpoint_route_env
from testing.fake_gcp import FakeGcp
from testing.fake_messages_api import key_marker
from testing.fake_model_providers import (
    FakeProvidersContainer,
    Trust,
    fake_providers_container,
)
from testing.keys import rsa_pair
from testing.moto import moto_server

pytestmark = [pytest.mark.docker, pytest.mark.conformance]

GATEWAY_KEY = "sk-gateway-e2e-canary-" + "K4" * 16
OAUTH_TOKEN = "sk-ant-oat01-e2e-canary-" + "T8" * 16
AWS_ROOT = "AKIAENDPOINTSE2E0001:aws-root/" + "r" * 30
VERTEX_ACCOUNT = "models@kagura-models.iam.gserviceaccount.com"
# What the model has the agent do: a file, then a dump of everything it can see: its
# environment, every process's environ and command line, the files of its HOME and /tmp
# (the CLI's settings, session and caches; not the run's canary decoy, whose opening
# trips the run, as it should).
DUMP = (
    "mkdir -p /workspace/seen && env > /workspace/seen/env.txt"
    " && for f in /proc/[0-9]*/environ /proc/[0-9]*/cmdline; do cat $f 2>/dev/null; echo;"
    " done > /workspace/seen/proc.txt"
    " && find /home/agent /tmp -type f ! -name .git-credentials"
    " -exec cp --parents {} /workspace/seen/ ';' 2>/dev/null; echo dumped"
)
SCRIPT = {
    "conversations": [
        {
            "match": "TASK-ENDPOINT",
            "turns": [
                {
                    "text": "Writing the notes.",
                    "tools": [
                        {
                            "name": "Write",
                            "input": {"file_path": "/workspace/notes.txt", "content": "alpha\n"},
                        }
                    ],
                },
                {"tools": [{"name": "Bash", "input": {"command": DUMP, "description": "look"}}]},
                {"text": "All done: {last_tool_result}"},
            ],
        }
    ]
}


@pytest.fixture(scope="module")
def images(docker_client: Any) -> dict[str, str]:
    """The real-CLI agent image, the fakes' image and this checkout's proxy image."""
    base = ensure_egress_images(docker_client)["base"]
    proxy = this_proxy_image(docker_client)
    tag = next(t for t in docker_client.images.get(proxy).tags if "-" in t.rpartition(":")[2])
    return {
        "real": ensure_agent_test_image(docker_client, real_cli=True),
        "base": base,
        "proxy": tag,
    }


def _brain(model: str, endpoint: dict[str, Any] | None, auth: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "engine": "sdk",
        "model": model,
        "permission_mode": "bypassPermissions",
        "runtime": "container",
        "auth": auth,
        "budget": {"turns": 10, "wall_time": "5m"},
    }
    if endpoint is not None:
        spec["endpoint"] = endpoint
    return {"kind": "Brain", "metadata": {"name": "endpoint"}, "spec": spec}


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


def _run(
    client: Any,
    images: dict[str, str],
    tmp_path: Path,
    state_dir: Path,
    fake: FakeProvidersContainer,
    documents: list[dict[str, Any]],
    environment: dict[str, str],
) -> dict[str, Any]:
    """apply of a TASK-ENDPOINT task on the ``endpoint`` brain; the ``docker inspect`` of
    the run's containers (the agent's, the proxy's) read while the agent runs."""
    proxy = {
        "kind": "Image",
        "metadata": {"name": "egress-proxy-here"},
        "spec": {"recipe": "images/egress-proxy", "tag": images["proxy"], "baseline": True},
    }
    folder = manifest_set(tmp_path, image_manifest(images["real"]), proxy, *documents)
    project = make_project(tmp_path)
    spec = {
        "image": "agent-real",
        "brain": "endpoint",
        "prompt": "TASK-ENDPOINT: keep notes",
        "verify": ["grep -qx alpha notes.txt", "test -s seen/env.txt"],
    }
    task_file = write_task(project, "endpoint", spec)
    env = cli_env(state_dir, **environment)
    proc = subprocess.Popen(
        apply_argv(folder, task_file), env=env, cwd=REPO, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    ended: dict[str, str] = {}

    def wait() -> None:
        ended["out"], ended["err"] = proc.communicate(timeout=300)

    waiter = threading.Thread(target=wait, daemon=True)
    waiter.start()
    inspected = ""
    with contextlib.suppress(AssertionError):  # a run that ends at once: its output says why
        run_id = _first_run(state_dir, waiter)
        wait_for_container(client, run_id, timeout=120)
        # Every container of the run while the agent runs: the agent's and the proxy's
        # (which holds the credential on its tmpfs, never in its configuration).
        found = run_containers(client, run_id)
        assert len(found) >= 2, [c.name for c in found]
        inspected = json.dumps([client.api.inspect_container(c.id) for c in found])
    waiter.join(320)
    out, err = ended.get("out", ""), ended.get("err", "")
    result = last_json(out) if out.strip() else {}
    return {
        "code": proc.returncode,
        "result": result,
        "lines": json_lines(err),
        "err": err,
        "out": out,
        "inspected": inspected,
        "project": project,
        "records": fake.records(),
        "decisions": egress_decisions(state_dir, result.get("run_id", "")),
    }


def _first_run(state_dir: Path, waiter: threading.Thread) -> str:
    import time

    deadline = time.monotonic() + 120
    while not (ids := run_ids(state_dir)):
        assert waiter.is_alive() and time.monotonic() < deadline, "apply never opened a run"
        time.sleep(0.05)
    return ids[0]


def _held_nowhere(run: dict[str, Any], state_dir: Path, secrets: list[str]) -> None:
    """None of ``secrets`` in the container's inspect, anything the agent could read and
    dumped, the project root, apply's output or the state directory."""
    seen = run["project"] / "seen"
    assert (seen / "env.txt").read_text().strip(), "the agent dumped its environment"
    assert (
        "ANTHROPIC" in (seen / "env.txt").read_text()
        or "CLAUDE_CODE" in (seen / "env.txt").read_text()
    )
    assert run["inspected"], "the run's containers were inspected while the agent ran"
    shown = run["inspected"] + run["out"] + run["err"]
    for secret in secrets:
        assert secret not in shown
        for folder in (run["project"], state_dir):
            for path in folder.rglob("*"):
                if path.is_file() and not path.is_symlink():
                    assert secret.encode() not in path.read_bytes(), path


def _succeeded(run: dict[str, Any]) -> list[dict[str, Any]]:
    """The run's agent calls, once it is shown to have done the task."""
    assert run["code"] == 0, run["err"][-5000:]
    result = run["result"]
    assert result["outcome"] == "success", dump(result)
    events = brain_events(run["lines"])
    tools = [e["name"] for e in events if e["type"] == "tool_call"]
    assert tools == ["Write", "Bash"], dump(events)
    assert (run["project"] / "notes.txt").read_text() == "alpha\n"
    calls = [r for r in run["records"] if (r.get("turn") or {}).get("agent")]
    assert [c["turn"]["index"] for c in calls] == [0, 1, 2], dump(run["records"])
    # Counted at the port, and the budget held to that count.
    assert result["model_calls"] == len(calls), dump(run["decisions"])
    reasons = {(d["inport"], d["decision"], d["reason"]) for d in run["decisions"]}
    assert reasons <= {(3129, "allow", "injected"), (3129, "allow", "answered-by-port")}, reasons
    return calls


def test_a_gateway_takes_its_key_from_the_proxy_as_the_header_it_wants(
    docker_client: Any, images: dict[str, str], tmp_path: Path, state_dir: Path
) -> None:
    brain = _brain(
        "claude-sonnet-4-5",
        {
            "url": "https://llm-gateway.corp.test:4000/anthropic",
            "header": "authorization",
            "baseline": True,
        },
        {"mode": "api-key", "credential": "gateway"},
    )
    trust = Trust(api_keys=[GATEWAY_KEY])
    with fake_providers_container(
        docker_client, images["base"], LABEL, SCRIPT, prefix="/anthropic", trust=trust
    ) as fake:
        run = _run(
            docker_client,
            images,
            tmp_path,
            state_dir,
            fake,
            [brain, _static("gateway", "GATEWAY_KEY")],
            {"GATEWAY_KEY": GATEWAY_KEY, **endpoint_route_env(fake)},
        )
    calls = _succeeded(run)
    assert {c["path"] for c in calls} == {"/anthropic/v1/messages?beta=true"}
    assert {c["auth"] for c in calls} == {"bearer-api-key " + key_marker(GATEWAY_KEY)}
    # The CLI held a placeholder, and the port sent no x-api-key beside the gateway's header.
    assert not any("x-api-key" in c["headers"] for c in calls)
    _held_nowhere(run, state_dir, [GATEWAY_KEY])


def test_a_subscription_token_is_injected_and_the_cli_speaks_as_a_subscriber(
    docker_client: Any, images: dict[str, str], tmp_path: Path, state_dir: Path
) -> None:
    brain = _brain(
        "claude-sonnet-4-5", None, {"mode": "subscription", "credential": "claude-subscription"}
    )
    trust = Trust(oauth_tokens=[OAUTH_TOKEN])
    with fake_providers_container(
        docker_client, images["base"], LABEL, SCRIPT, trust=trust
    ) as fake:
        run = _run(
            docker_client,
            images,
            tmp_path,
            state_dir,
            fake,
            [brain, _static("claude-subscription", "SUBSCRIPTION_TOKEN")],
            {"SUBSCRIPTION_TOKEN": OAUTH_TOKEN, **endpoint_route_env(fake)},
        )
    calls = _succeeded(run)
    assert {c["auth"] for c in calls} == {"oauth " + key_marker(OAUTH_TOKEN)}
    # What the CLI sends with CLAUDE_CODE_OAUTH_TOKEN: its own oauth beta (not the port's).
    assert all("oauth-2025-04-20" in c["headers"]["anthropic-beta"] for c in calls)
    _held_nowhere(run, state_dir, [OAUTH_TOKEN])


def _aws_provider(moto: str) -> dict[str, Any]:
    return {
        "kind": "CredentialProvider",
        "metadata": {"name": "aws-models"},
        "spec": {
            "type": "aws-sts",
            "secret": "env:KAGURA_AWS_ROOT_KEY",
            "ttl": "15m",
            "aws": {
                "region": "us-east-1",
                "endpoint": moto,
                "endpoint_addresses": ["127.0.0.1/32"],
            },
            "baseline_scopes": ["bedrock"],
            "scopes": {
                "bedrock": {
                    "description": "Invoke Claude on Bedrock.",
                    "role_arn": "arn:aws:iam::123456789012:role/kagura-models",
                    "session_policy": {
                        "Version": "2012-10-17",
                        "Statement": [
                            {
                                "Effect": "Allow",
                                "Action": [
                                    "bedrock:InvokeModel",
                                    "bedrock:InvokeModelWithResponseStream",
                                ],
                                "Resource": "*",
                            }
                        ],
                    },
                }
            },
        },
    }


def test_bedrock_calls_are_signed_at_the_proxy_with_the_runs_sts_lease(
    docker_client: Any, images: dict[str, str], tmp_path: Path, state_dir: Path
) -> None:
    brain = _brain(
        "us.anthropic.claude-sonnet-4-5-20250929-v1:0",
        {"api": "bedrock", "region": "us-east-1", "baseline": True},
        {"mode": "cloud", "credential": "aws-models"},
    )
    with (
        moto_server() as moto,
        fake_providers_container(docker_client, images["base"], LABEL, SCRIPT) as fake,
    ):
        run = _run(
            docker_client,
            images,
            tmp_path,
            state_dir,
            fake,
            [brain, _aws_provider(moto)],
            {"KAGURA_AWS_ROOT_KEY": AWS_ROOT, **endpoint_route_env(fake, moto=moto)},
        )
        with urllib.request.urlopen(moto + "/moto-api/data.json", timeout=10) as response:
            roles = json.load(response)["sts"]["AssumedRole"]
    calls = _succeeded(run)
    (role,) = roles  # one lease for the run, its key signed every call
    assert role["role_arn"] == "arn:aws:iam::123456789012:role/kagura-models"
    assert {c["auth"] for c in calls} == {"sigv4 " + role["access_key_id"]}
    assert {c["model"] for c in calls} == {"us.anthropic.claude-sonnet-4-5-20250929-v1:0"}
    # The CLI's inference-profile discovery was answered by the port, nothing upstream.
    local = [d for d in run["decisions"] if d["reason"] == "answered-by-port"]
    assert [(d["method"], d["path"]) for d in local] == [("GET", "/inference-profiles")]
    # The record names the endpoint's host whole (the lease's region is no secret).
    hosts = {d["host"] for d in run["decisions"]}
    assert hosts == {"bedrock-runtime.us-east-1.amazonaws.com"}, hosts
    assert not [r for r in run["records"] if r["protocol"] != "bedrock"], dump(run["records"])
    secrets = [role["secret_access_key"], role["session_token"], AWS_ROOT.split(":")[1]]
    _held_nowhere(run, state_dir, secrets)


@pytest.fixture()
def gcp() -> Iterator[FakeGcp]:
    fake = FakeGcp(allowed_accounts=(VERTEX_ACCOUNT,)).start()
    fake.register_key("key-1", rsa_pair("gcp")[1])
    yield fake
    fake.stop()


def _gcp_provider(fake: FakeGcp) -> dict[str, Any]:
    return {
        "kind": "CredentialProvider",
        "metadata": {"name": "gcp-models"},
        "spec": {
            "type": "gcp",
            "secret": "env:KAGURA_GCP_ROOT_KEY",
            "ttl": "15m",
            "gcp": {
                "endpoint": fake.url,
                "revoke_endpoint": fake.url + "/revoke",
                "endpoint_addresses": ["127.0.0.1/32"],
            },
            "baseline_scopes": ["vertex"],
            "scopes": {
                "vertex": {
                    "description": "Call Claude on Vertex AI.",
                    "service_account": VERTEX_ACCOUNT,
                    "scopes": ["https://www.googleapis.com/auth/cloud-platform.read-only"],
                }
            },
        },
    }


def test_vertex_calls_carry_the_runs_gcp_token_added_at_the_proxy(
    docker_client: Any,
    images: dict[str, str],
    tmp_path: Path,
    state_dir: Path,
    gcp: FakeGcp,
) -> None:
    brain = _brain(
        "claude-sonnet-4-5@20250929",
        {"api": "vertex", "region": "us-east5", "project": "kagura-models", "baseline": True},
        {"mode": "cloud", "credential": "gcp-models"},
    )
    root = json.dumps(
        {
            "type": "service_account",
            "project_id": "kagura-models",
            "private_key_id": "key-1",
            "private_key": rsa_pair("gcp")[0],
            "client_email": "kagura-root@kagura-models.iam.gserviceaccount.com",
            "client_id": "1",
            "token_uri": gcp.url + "/token",
        }
    )
    with fake_providers_container(
        docker_client, images["base"], LABEL, SCRIPT, region="us-east5", project="kagura-models"
    ) as fake:
        run = _run(
            docker_client,
            images,
            tmp_path,
            state_dir,
            fake,
            [brain, _gcp_provider(gcp)],
            {"KAGURA_GCP_ROOT_KEY": root, **endpoint_route_env(fake, gcp=gcp.url)},
        )
    calls = _succeeded(run)
    (token,) = gcp.issued  # one lease for the run
    assert {c["auth"] for c in calls} == {"bearer " + key_marker(token)}
    assert {c["path"].rpartition("/")[2] for c in calls} == {
        "claude-sonnet-4-5@20250929:streamRawPredict"
    }
    # Released with the run: the token is revoked at Google's revocation endpoint.
    assert gcp.minted == {}
    _held_nowhere(run, state_dir, [token, rsa_pair("gcp")[0].splitlines()[1]])
