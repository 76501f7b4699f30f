"""The key-injecting port's TLS hop to the model's host, from the outside.

In production the port sends each model call to api.anthropic.com:443 (or a gateway)
over TLS, checking the host's certificate against the system's authorities, or against
the Brain's own (``endpoint.ca``: a gateway behind a private authority) alone, and adds
the operator's key on the way. The tests cannot reach the real host; here a fake Messages
API answers as ``api.anthropic.com`` over TLS with an identity from an authority made for
the test, which the Brain names as its endpoint's ``ca``; the run's real proxy
(membrane/egress, EgressSession as apply starts it). From inside an unprivileged agent
container, through the agent's forwarder:

- a call reaches the host over TLS, naming it (SNI), with the operator's key, and its
  stream comes back;
- an impostor — a certificate from another authority, or one for another name — gets no
  request at all: the key never leaves for a host that could not prove who it is;
- without the Brain's ``ca`` the system's authorities decide, and the test's authority
  is not among them: the same host gets no request.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
from test_model_port import CALL, CANARY, Port, open_port, request

from kagura_agent.manifest.endpoint import read_authorities
from kagura_agent.membrane.egress.modelport import Injection
from testing.egress_images import ensure_egress_images
from testing.fake_messages_api import fake_messages_api_container, key_marker
from testing.tls import Authority

pytestmark = pytest.mark.usefixtures("docker_client")

HOST = "api.anthropic.com"  # the name the port asks for and checks, as in production
TEST_LABEL = {"dev.kagura.test": "model-port-tls"}
SCRIPT = {"default": {"text": "over TLS"}}


@pytest.fixture(scope="module")
def images(docker_client: Any) -> dict[str, str]:
    return ensure_egress_images(docker_client)


@pytest.fixture(scope="module")
def authority() -> Authority:
    return Authority.make("kagura test authority")


@contextlib.contextmanager
def tls_port(
    client: Any, images: dict[str, str], trusted: Authority | None, identity: bytes
) -> Iterator[Port]:
    """A run's proxy injecting CANARY towards a fake that presents ``identity`` over TLS
    as HOST, with ``trusted`` as the endpoint's authority (None: the system's); an agent
    container whose forwarder reaches it."""
    ca = None
    if trusted is not None:
        authorities, problem = read_authorities(trusted.pem.decode())
        assert authorities is not None, problem
        ca = authorities.pem
    with fake_messages_api_container(
        client, images["base"], TEST_LABEL, SCRIPT, tls_pem=identity
    ) as upstream:
        assert upstream.tls_port is not None
        injection = Injection(host=HOST, port=upstream.tls_port, tls=True, ca_pem=ca)
        with open_port(client, images, upstream=upstream, injection=injection) as port:
            yield port


def test_a_call_crosses_the_tls_hop_with_the_operators_key(
    docker_client: Any, images: dict[str, str], authority: Authority
) -> None:
    with tls_port(docker_client, images, authority, authority.identity(HOST)) as port:
        reply = port.send(request(CALL, headers={"x-api-key": "sk-ant-agents-own"}))
        assert reply.statuses == [200], reply.text
        assert "over TLS" in reply.body and "message_stop" in reply.body
        [record] = port.records()
        # The operator's key, and only it; the host named in the handshake and the request.
        assert record["headers"].get("x-api-key") == key_marker(CANARY), record["headers"]
        assert record["headers"].get("host") == HOST
        assert port.fake.server_names() == [HOST]
        assert CANARY not in reply.text


@pytest.mark.parametrize("impostor", ["another authority", "another name", "no ca named"])
def test_an_impostor_of_the_model_host_gets_no_request(
    docker_client: Any, images: dict[str, str], authority: Authority, impostor: str
) -> None:
    """The port checks the certificate before it sends anything: a host that cannot prove
    it is the model's never sees the call, nor the key. With no ``ca`` named, the system's
    authorities decide, and a private authority is not one of them."""
    trusted: Authority | None = authority
    identity = authority.identity(HOST)
    if impostor == "another authority":
        identity = Authority.make("an impostor's authority").identity(HOST)
    elif impostor == "another name":
        identity = authority.identity("api.anthropic.example")
    else:
        trusted = None
    with tls_port(docker_client, images, trusted, identity) as port:
        reply = port.send(request(CALL))
        assert reply.statuses and reply.statuses[0] >= 500, reply.text
        assert port.records() == []  # no request reached it: the handshake was refused
        assert set(port.fake.server_names()) == {HOST}  # asked for by name, and refused
        assert CANARY not in reply.text
