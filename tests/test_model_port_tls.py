"""The key-injecting port's TLS hop to the model's host, from the outside.

In production the port sends each model call to api.anthropic.com:443 (or a gateway)
over TLS, checking the host's certificate, and adds the operator's key on the way. The
tests cannot reach the real host; here a fake Messages API answers as
``api.anthropic.com`` over TLS with an identity from an authority made for the test, and
the run's real proxy (membrane/egress, EgressSession as apply starts it) trusts that
authority in place of the public ones — the only change from production. From inside an
unprivileged agent container, through the agent's forwarder:

- a call reaches the host over TLS, naming it (SNI), with the operator's key, and its
  stream comes back;
- an impostor — a certificate from another authority, or one for another name — gets no
  request at all: the key never leaves for a host that could not prove who it is.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_model_port import CALL, CANARY, Port, open_port, request

from kagura_agent.membrane.egress import owner
from kagura_agent.membrane.egress.modelport import Injection
from testing.egress_images import ensure_egress_images
from testing.fake_messages_api import fake_messages_api_container, key_marker
from testing.tls import Authority

pytestmark = pytest.mark.usefixtures("docker_client")

HOST = "api.anthropic.com"  # the name the port asks for and checks, as in production
TEST_LABEL = {"dev.kagura.test": "model-port-tls"}
SCRIPT = {"default": {"text": "over TLS"}}
# Where the proxy image keeps the authorities it trusts (nginx proxy_ssl_trusted_certificate).
TRUST_STORE = "/etc/ssl/certs/ca-certificates.crt"


@pytest.fixture(scope="module")
def images(docker_client: Any) -> dict[str, str]:
    return ensure_egress_images(docker_client)


@pytest.fixture(scope="module")
def authority() -> Authority:
    return Authority.make("kagura test authority")


class _Trusting:
    """A Docker client whose egress proxy trusts ``bundle`` (a file of PEM authorities)
    in place of the image's public ones; nothing else changes."""

    def __init__(self, client: Any, bundle: Path) -> None:
        self._client = client
        self._bundle = bundle

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    @property
    def containers(self) -> Any:
        return _TrustingContainers(self._client.containers, self._bundle)


class _TrustingContainers:
    def __init__(self, containers: Any, bundle: Path) -> None:
        self._containers = containers
        self._bundle = bundle

    def __getattr__(self, name: str) -> Any:
        return getattr(self._containers, name)

    def create(self, image: str, *args: Any, **kwargs: Any) -> Any:
        import docker.types

        labels = kwargs.get("labels") or {}
        if labels.get(owner.LABEL_COMPONENT) == owner.COMPONENT_PROXY:
            trust = docker.types.Mount(TRUST_STORE, str(self._bundle), type="bind", read_only=True)
            kwargs["mounts"] = [*(kwargs.get("mounts") or []), trust]
        return self._containers.create(image, *args, **kwargs)


@contextlib.contextmanager
def tls_port(
    client: Any, images: dict[str, str], tmp_path: Path, trusted: Authority, identity: bytes
) -> Iterator[Port]:
    """A run's proxy injecting CANARY towards a fake that presents ``identity`` over TLS
    as HOST, trusting ``trusted`` only; an agent container whose forwarder reaches it."""
    bundle = tmp_path / "trusted.pem"
    bundle.write_bytes(trusted.pem)
    bundle.chmod(0o644)
    with fake_messages_api_container(
        client, images["base"], TEST_LABEL, SCRIPT, tls_pem=identity
    ) as upstream:
        assert upstream.tls_port is not None
        injection = Injection(host=HOST, port=upstream.tls_port, tls=True)
        trusting = _Trusting(client, bundle)
        with open_port(
            client, images, upstream=upstream, injection=injection, proxy_client=trusting
        ) as port:
            yield port


def test_a_call_crosses_the_tls_hop_with_the_operators_key(
    docker_client: Any, images: dict[str, str], authority: Authority, tmp_path: Path
) -> None:
    with tls_port(docker_client, images, tmp_path, authority, authority.identity(HOST)) as port:
        reply = port.send(request(CALL, headers={"x-api-key": "sk-ant-agents-own"}))
        assert reply.statuses == [200], reply.text
        assert "over TLS" in reply.body and "message_stop" in reply.body
        [record] = port.records()
        # The operator's key, and only it; the host named in the handshake and the request.
        assert record["headers"].get("x-api-key") == key_marker(CANARY), record["headers"]
        assert record["headers"].get("host") == HOST
        assert port.fake.server_names() == [HOST]
        assert CANARY not in reply.text


@pytest.mark.parametrize("impostor", ["another authority", "another name"])
def test_an_impostor_of_the_model_host_gets_no_request(
    docker_client: Any, images: dict[str, str], authority: Authority, tmp_path: Path, impostor: str
) -> None:
    """The port checks the certificate before it sends anything: a host that cannot prove
    it is the model's never sees the call, nor the key."""
    if impostor == "another authority":
        identity = Authority.make("an impostor's authority").identity(HOST)
    else:
        identity = authority.identity("api.anthropic.example")
    with tls_port(docker_client, images, tmp_path, authority, identity) as port:
        reply = port.send(request(CALL))
        assert reply.statuses and reply.statuses[0] >= 500, reply.text
        assert port.records() == []  # no request reached it: the handshake was refused
        assert set(port.fake.server_names()) == {HOST}  # asked for by name, and refused
        assert CANARY not in reply.text
