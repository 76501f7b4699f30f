"""A local model endpoint (a Brain's ``endpoint.local``) on the product path: plain
``kagura-agent apply``, no test runtime. The run's proxy joins the endpoint's network and
the real Claude Code CLI's calls reach it through the key-injecting port; from inside the
agent's container the endpoint is out of reach by name, by address and through the
forward port. A network that is missing or not internal is refused before anything starts.
"""

from __future__ import annotations

import copy
import json
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from apply_helpers import REPO, cli_env, last_json, make_project, manifest_set, write_task
from conformance import brain_events, dump
from golden import golden_plan

from kagura_agent.errors import RefusedError
from kagura_agent.membrane.egress.local import proxy_networks
from kagura_agent.plan.model import Plan
from testing.agent_test_image import ensure_agent_test_image
from testing.egress_images import ensure_egress_images
from testing.fake_messages_api import fake_messages_api_container, key_marker

pytestmark = pytest.mark.usefixtures("docker_client")

TOKEN = "local-endpoint-token-" + "q" * 24
CANARY = "sk-ant-canary-local-" + "z" * 32
LABEL = {"dev.kagura.test": "local-endpoint"}

# Run in the agent's container by the CLI's Bash tool; the task's prompt names the
# endpoint's container and address (``{last_user}``: the script cannot know them).
PROBE = """
import json, socket, sys, urllib.request, urllib.error
name, address = sys.argv[1].split()[1:3]
def attempt(label, fn):
    try:
        print(label + "=" + str(fn()))
    except urllib.error.HTTPError as exc:
        print(label + "=" + str(exc.code))
    except Exception as exc:
        print(label + "=FAIL:" + type(exc).__name__)
attempt("name", lambda: socket.getaddrinfo(name, 8080)[0][4][0])
attempt("address", lambda: socket.create_connection((address, 8080), timeout=3) and "OPEN")
forward = urllib.request.build_opener(urllib.request.ProxyHandler({"http": "http://127.0.0.1:3128"}))
body = json.dumps({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "PROBE"}]}).encode()
headers = {"content-type": "application/json", "anthropic-version": "2023-06-01"}
attempt("forward", lambda: forward.open(urllib.request.Request("http://" + name + ":8080/v1/messages", body, headers), timeout=10).status)
direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))
attempt("port", lambda: direct.open(urllib.request.Request("http://127.0.0.1:3129/v1/messages", body, headers), timeout=10).status)
"""

COMMAND = f"python3 - '{{last_user}}' <<'EOF'\n{PROBE}\nEOF"
SCRIPT = {
    "conversations": [
        {
            "match": "TASK-LOCAL",
            "turns": [
                {"tools": [{"name": "Bash", "input": {"command": COMMAND}}]},
                {"text": "probed: {last_tool_result}"},
            ],
        }
    ]
}


def _brain(network: str, container: str) -> dict[str, Any]:
    return {
        "kind": "Brain",
        "metadata": {"name": "local"},
        "spec": {
            "engine": "sdk",
            "model": "claude-sonnet-4-5",
            "permission_mode": "bypassPermissions",
            "runtime": "container",
            "auth": {"mode": "api-key", "credential": "local-model"},
            "endpoint": {
                "local": {"network": network, "container": container, "port": 8080},
                "baseline": True,
            },
            "budget": {"turns": 10, "wall_time": "5m", "cost_usd": 1},
        },
    }


PROVIDER = {
    "kind": "CredentialProvider",
    "metadata": {"name": "local-model"},
    "spec": {
        "type": "static",
        "standing": True,
        "secret": "env:LOCAL_MODEL_TOKEN",
        "static": {"env": "ANTHROPIC_API_KEY"},
        "baseline_scopes": ["api"],
        "scopes": {"api": {"description": "the local model"}},
    },
}


def test_the_agent_reaches_a_local_endpoint_only_through_the_injecting_port(
    docker_client: Any, tmp_path: Path, state_dir: Path
) -> None:
    real = ensure_agent_test_image(docker_client, real_cli=True)
    base = ensure_egress_images(docker_client)["base"]
    with fake_messages_api_container(docker_client, base, LABEL, SCRIPT) as fake:
        name = f"kagura-test-local-model-{secrets.token_hex(4)}"
        fake.container.rename(name)  # Docker's own names hold "_", no host name has
        image = {
            "kind": "Image",
            "metadata": {"name": "agent-real"},
            "spec": {"recipe": "images/agent", "tag": real, "baseline": True},
        }
        folder = manifest_set(tmp_path, image, _brain(fake.network, name), PROVIDER)
        project = make_project(tmp_path)
        task = write_task(
            project,
            "local",
            {
                "image": "agent-real",
                "brain": "local",
                "prompt": f"TASK-LOCAL {name} {fake.address}",
                "egress": [],
            },
        )
        argv = [sys.executable, "-m", "kagura_agent", "apply", "--yes", "--json"]
        argv += ["--manifests", str(folder), str(task)]
        env = cli_env(state_dir, LOCAL_MODEL_TOKEN=TOKEN, ANTHROPIC_API_KEY=CANARY)
        done = subprocess.run(argv, env=env, cwd=REPO, capture_output=True, text=True, timeout=300)
        records = fake.records()
        result = last_json(done.stdout) if done.stdout.strip() else {}
        after = docker_client.containers.get(fake.container.id)
        attached = set(after.attrs["NetworkSettings"]["Networks"])
        on_network = list(docker_client.networks.get(fake.network).attrs["Containers"])
    assert done.returncode == 0, done.stderr[-5000:]
    events = brain_events([json.loads(x) for x in done.stderr.splitlines() if x.startswith("{")])
    [output] = [e["output"] for e in events if e["type"] == "tool_result"]
    lines = dict(line.split("=", 1) for line in output.split() if "=" in line)
    assert lines["name"].startswith("FAIL:"), output  # no name for it in the container
    assert lines["address"].startswith("FAIL:"), output  # no route to it
    assert lines["forward"] == "403", output  # the forward port's floor refuses it
    assert lines["port"] == "200", output  # the injecting port is the way there
    assert result["outcome"] == "success", dump(result)
    # Every call arrived with the operator's credential set by the proxy, never the canary.
    posts = [r for r in records if r["method"] == "POST"]
    assert posts and {r["headers"].get("x-api-key") for r in posts} == {key_marker(TOKEN)}
    assert any("PROBE" in json.dumps(r["body"]) for r in posts)  # the probe's, via the port
    for text in (done.stdout, done.stderr, json.dumps(records)):
        assert CANARY not in text and TOKEN not in text
    # The run's proxy left the network with the run; the endpoint is still alone on it.
    assert attached == {fake.network} and on_network == [fake.container.id]


def _local_plan(network: str, container: str) -> Plan:
    """The golden sdk-local plan, its endpoint on ``network``/``container``."""
    plan = copy.deepcopy(golden_plan("sdk-local"))
    local = plan["brain"]["model_endpoint"]["local"]
    local["network"], local["container"] = network, container
    return plan


def test_a_missing_or_open_network_or_an_absent_container_is_refused(
    docker_client: Any,
) -> None:
    suffix = secrets.token_hex(4)
    missing = f"kagura-test-local-missing-{suffix}"
    with pytest.raises(RefusedError, match=f"Docker network '{missing}' does not exist"):
        proxy_networks(docker_client, _local_plan(missing, "model"))
    labels = {**LABEL, "dev.kagura.test.run": suffix}
    open_net = docker_client.networks.create(f"kagura-test-local-open-{suffix}", labels=labels)
    sealed = docker_client.networks.create(
        f"kagura-test-local-sealed-{suffix}", internal=True, labels=labels
    )
    try:
        with pytest.raises(RefusedError, match="is not internal, so joining it would give"):
            proxy_networks(docker_client, _local_plan(open_net.name, "model"))
        with pytest.raises(RefusedError, match="no running container 'model' is on network"):
            proxy_networks(docker_client, _local_plan(sealed.name, "model"))
        assert proxy_networks(docker_client, golden_plan("sdk-gateway")) == ()
    finally:
        open_net.remove()
        sealed.remove()
