"""A Brain's model endpoint on this machine (``endpoint.local``: manifest/endpoint.py):
a container on an internal Docker network that the run's proxy joins. The plan says so in
every view (golden case tests/plans/sdk-local), a diff sees a changed network, and a
mistake is a located validation error."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml
from golden import PLANS, golden_plan

from kagura_agent.cli.main import main
from kagura_agent.membrane.egress.modelport import Injection
from kagura_agent.plan.build import plan_tasks
from kagura_agent.plan.diff import diff_plans
from kagura_agent.plan.render import render_markdown


def test_the_plan_names_the_network_the_proxy_joins_and_plain_http_to_the_container() -> None:
    plan = golden_plan("sdk-local")
    endpoint = plan["brain"]["model_endpoint"]
    assert endpoint["url"] == "http://model-server:8080"
    assert endpoint["local"] == {
        "network": "models-internal",
        "container": "model-server",
        "port": 8080,
    }
    assert endpoint["category"] == "model-endpoint:model-server"
    assert endpoint["class"] == "needs-approval"  # a new endpoint: the first plan asks
    assert plan["egress"]["model_calls"]["upstream"] == "http://model-server:8080"
    assert plan["egress"]["allow"] == []  # nothing of it on the forward port
    # The proxy's injection: plain HTTP to the container (no TLS on a local network).
    assert Injection.for_endpoint(endpoint) == Injection(host="model-server", port=8080, tls=False)
    # A URL endpoint carries no such field (and stays https).
    gateway = golden_plan("sdk-gateway")["brain"]["model_endpoint"]
    assert "local" not in gateway and Injection.for_endpoint(gateway).tls is True


def test_every_view_says_the_endpoint_is_on_this_machine() -> None:
    plan = golden_plan("sdk-local")
    text = (PLANS / "sdk-local" / "expected.txt").read_text()
    assert "endpoint     http://model-server:8080 (Anthropic Messages API)" in text
    assert (
        "ON THIS MACHINE: container model-server on Docker network models-internal,"
        " which the proxy alone joins"
    ) in text
    assert "ON THIS MACHINE: container model-server" in render_markdown(plan)
    changes = [c.render() for c in diff_plans(golden_plan("sdk-gateway"), plan)]
    assert (
        "+ model endpoint http://model-server:8080 (api anthropic, auth x-api-key"
        " model-server/api, network models-internal)  (widens)"
    ) in changes


def _case(tmp_path: Path, local: dict[str, object]) -> Path:
    """The sdk-local case with another ``endpoint.local``."""
    folder = tmp_path / "case"
    shutil.copytree(PLANS / "sdk-local", folder)
    brains = folder / "manifests" / "brains.yml"
    documents = list(yaml.safe_load_all(brains.read_text()))
    documents[1]["spec"]["endpoint"] = {"local": local}
    brains.write_text(yaml.safe_dump_all(documents))
    return folder


def test_a_changed_network_is_a_change_of_the_plan(tmp_path: Path) -> None:
    folder = _case(tmp_path, {"network": "other-net", "container": "model-server", "port": 8080})
    (plan,) = plan_tasks(
        str(folder / "manifests"),
        [str(folder / "task.yml")],
        facts_file=str(folder / "facts.json"),
    )
    changes = [c.render() for c in diff_plans(golden_plan("sdk-local"), plan)]
    assert (
        "~ model endpoint http://model-server:8080 network models-internal → other-net  (widens)"
    ) in changes


@pytest.mark.parametrize(
    ("endpoint", "where", "message"),
    [
        (
            {"local": {"network": "bridge", "container": "m", "port": 80}},
            "$.spec.endpoint.local.network",
            "'bridge' is not a network a local endpoint may name",
        ),
        (
            {"local": {"network": "kagura-egress-r1-outbound", "container": "m", "port": 80}},
            "$.spec.endpoint.local.network",
            "kagura's run networks are refused",
        ),
        (
            {
                "url": "https://x.example.com",
                "local": {"network": "n", "container": "m", "port": 1},
            },
            "$.spec.endpoint.url",
            "name the endpoint by url or by local, not both",
        ),
        (
            {"local": {"network": "n", "container": "m", "port": 0}},
            "$.spec.endpoint.local.port",
            "0 is less than the minimum of 1",
        ),
        (
            {"local": {"network": "n", "container": "-m", "port": 80}},
            "$.spec.endpoint.local.container",
            "'-m' is not valid here",
        ),
        (
            {"local": {"network": "n", "container": "m_1", "port": 80}},
            "$.spec.endpoint.local.container",
            "'m_1' is not valid here",
        ),
        (
            {"local": {"network": "n", "container": "10.0.0.1", "port": 80}},
            "$.spec.endpoint.local.container",
            "name the container, not an address",
        ),
        (
            {"local": {"network": "n", "port": 80}},
            "$.spec.endpoint.local",
            "'container' is required",
        ),
    ],
)
def test_a_mistake_is_a_located_error(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    endpoint: dict[str, object],
    where: str,
    message: str,
) -> None:
    folder = tmp_path / "case"
    shutil.copytree(PLANS / "sdk-local", folder)
    brains = folder / "manifests" / "brains.yml"
    documents = list(yaml.safe_load_all(brains.read_text()))
    documents[1]["spec"]["endpoint"] = endpoint
    brains.write_text(yaml.safe_dump_all(documents))
    code = main(["validate", "--manifests", str(folder / "manifests")])
    err = capsys.readouterr().err
    assert code == 2, err
    [line] = [line for line in err.splitlines() if where + " " in line]
    assert line.startswith(f"{brains}:") and message in line, err
