"""The sdk brain's model endpoint: where its model calls go and how their credential travels.

One reader of a Brain's ``endpoint`` and ``auth`` for the sdk engine (validate reports its
problems, the planner takes the value). The Claude Code CLI talks to the run's
key-injecting port only; the port forwards each call to the endpoint with the operator's
credential, which never enters the container:

=========  ===========================  ====================================================
api        credential (auth.mode)       how it travels from the port (``auth``)
=========  ===========================  ====================================================
anthropic  static key (api-key)         ``x-api-key``, or ``Authorization: Bearer`` for a
                                        gateway that takes it so (``endpoint.header``)
anthropic  on this machine (``local``)  as above, over plain HTTP to a container on an
                                        internal Docker network the proxy alone joins
anthropic  static OAuth token           ``Authorization: Bearer`` with the ``oauth`` beta,
           (subscription)               as the CLI sends a Claude subscription's token
bedrock    leased AWS STS key (cloud)   the port signs each call (SigV4, service bedrock)
vertex     leased GCP token (cloud)     ``Authorization: Bearer``
=========  ===========================  ====================================================

The default is the Anthropic API with an API key: a brain that names no endpoint.

A url endpoint behind a private authority (a corporate gateway) names that authority's
certificate in ``ca`` (PEM): the run's proxy then checks the endpoint's certificate against
it alone, in place of the system's authorities. Each certificate must be an authority's
(CA:TRUE); a private key anywhere in it is refused without being repeated.

A ``local`` endpoint is a container on this machine (a scripted demo model, a model server
of the operator's): no URL, since the floor refuses private addresses and address
literals; instead the Brain names the Docker network and the container, the run's proxy
joins that network (the agent's container never does) and its key-injecting port is the
only way there. The network must be internal (checked at apply: membrane/endpoints.py),
so joining it gives the proxy no route it did not have
(membrane/egress/local.py checks it).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import ipaddress
import re
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from kagura_agent.manifest.hosts import normalize_host
from kagura_agent.membrane.endpoints import endpoint_problems

Api = Literal["anthropic", "bedrock", "vertex"]
AuthKind = Literal["x-api-key", "bearer", "oauth", "sigv4"]
Problem = tuple[tuple[str | int, ...], str]

# Docker networks a local endpoint may not name: Docker's own (joining one would give the
# proxy a route it does not have) and those of kagura's runs and pooled proxies.
RESERVED_NETWORKS = ("bridge", "host", "none", "default")
RESERVED_PREFIXES = ("kagura-egress-", "kagura-pool-")

ANTHROPIC_URL = "https://api.anthropic.com"
# Brain auth modes whose credential is leased and injected at the proxy (in a container).
INJECTED_MODES = ("api-key", "subscription", "cloud")
# The provider type each cloud API's credential must come from.
CLOUD_PROVIDERS: dict[str, str] = {"bedrock": "aws-sts", "vertex": "gcp"}
API_NAMES: dict[str, str] = {
    "anthropic": "Anthropic Messages API",
    "bedrock": "Amazon Bedrock",
    "vertex": "Google Vertex AI",
}


_PEM_BLOCK = re.compile(r"-----BEGIN ([A-Z0-9 ]+)-----(.*?)-----END \1-----", re.DOTALL)


@dataclass(frozen=True)
class Authorities:
    """The authorities a url endpoint's certificate must chain to (the Brain's ``ca``):
    their certificates as PEM, and each one's sha256 fingerprint (of its DER form)."""

    pem: str
    sha256: tuple[str, ...]


@dataclass(frozen=True)
class LocalUpstream:
    """A model endpoint on this machine: ``container``:``port`` on Docker ``network``."""

    network: str
    container: str
    port: int


@dataclass(frozen=True)
class BrainEndpoint:
    """Where an sdk brain's model calls go (``url``: scheme, host, port and base path)."""

    api: Api
    host: str
    port: int
    base_path: str  # the gateway's path prefix ("" or "/anthropic")
    region: str | None
    project: str | None
    auth: AuthKind
    named: bool  # the Brain names it (False: the default Anthropic API)
    baseline: bool
    local: LocalUpstream | None = None
    ca: Authorities | None = None

    @property
    def url(self) -> str:
        if self.local is not None:
            return f"http://{self.local.container}:{self.local.port}"
        port = "" if self.port == 443 else f":{self.port}"
        return f"https://{self.host}{port}{self.base_path}"

    @property
    def category(self) -> str:
        """The capability a run asks for when it sends its model calls here."""
        return f"model-endpoint:{self.host}"


def default_url(api: Api, region: str | None) -> str:
    """The public endpoint of ``api`` (in ``region``)."""
    if api == "bedrock":
        return f"https://bedrock-runtime.{region}.amazonaws.com"
    if api == "vertex":
        return (
            "https://aiplatform.googleapis.com"
            if region == "global"
            else f"https://{region}-aiplatform.googleapis.com"
        )
    return ANTHROPIC_URL


def _form(spec: Mapping[str, Any]) -> dict[str, Any]:
    """The endpoint as its object form (a URL alone is an Anthropic-compatible gateway)."""
    raw = spec.get("endpoint")
    if raw is None:
        return {}
    if isinstance(raw, str):
        return {"api": "anthropic", "url": raw}
    return dict(raw)


def read_endpoint(spec: Mapping[str, Any]) -> tuple[BrainEndpoint | None, list[Problem]]:
    """The endpoint of an sdk Brain's ``spec`` (None when its auth injects nothing), and
    its problems as (path under spec, message); pure (no DNS)."""
    form = _form(spec)
    auth = spec.get("auth", {"mode": "none"})
    mode = auth["mode"]
    api: Api = form.get("api", "anthropic")
    at: tuple[str | int, ...] = ("endpoint",)
    problems: list[Problem] = []
    wants = {
        "api-key": ("anthropic",),
        "subscription": ("anthropic",),
        "cloud": ("bedrock", "vertex"),
    }
    if mode in wants and api not in wants[mode]:
        problems.append(
            (
                ("auth", "mode"),
                f"auth.mode {mode} does not fit endpoint api {api}"
                f" (it needs {' or '.join(wants[mode])})",
            )
        )
    if mode == "none" and form:
        problems.append((("auth",), "a model endpoint needs auth (api-key, subscription or cloud)"))
    for key, needed in (("region", ("bedrock", "vertex")), ("project", ("vertex",))):
        if key in form and api not in needed:
            problems.append(((*at, key), f"{key} applies to endpoint api {' or '.join(needed)}"))
        elif key not in form and api in needed:
            problems.append((at, f"endpoint api {api} needs {key}"))
    if "header" in form and (api != "anthropic" or mode != "api-key"):
        problems.append(((*at, "header"), "header applies to api anthropic with auth.mode api-key"))
    if "local" in form:
        if "ca" in form:
            problems.append(
                ((*at, "ca"), "ca applies to a url endpoint (a local one is plain HTTP)")
            )
        return _local(form, mode, wants, problems)
    ca, problem = (None, "") if "ca" not in form else read_authorities(str(form["ca"]))
    if problem:
        problems.append(((*at, "ca"), problem))
    url = str(form.get("url") or default_url(api, form.get("region")))
    parts, problem = _url(url)
    if problem:
        written = isinstance(spec.get("endpoint"), dict) and "url" in form
        problems.append(((*at, "url") if written else at, problem))
    if problems or mode not in wants or parts is None:
        return None, problems
    host, port, path = parts
    return (
        BrainEndpoint(
            api=api,
            host=host,
            port=port,
            base_path=path,
            region=form.get("region"),
            project=form.get("project"),
            auth=_auth_kind(mode, api, form.get("header")),
            named=bool(form),
            baseline=bool(form.get("baseline", not form)),
            ca=ca,
        ),
        [],
    )


def read_authorities(text: str) -> tuple[Authorities | None, str]:
    """The authorities in ``text`` (PEM certificates), or the problem with it. The text is
    never repeated in a problem: a key pasted by mistake must not reach a log."""
    if "PRIVATE KEY" in text:
        return (
            None,
            "holds a private key: give the authority's certificate only (and replace that key)",
        )
    blocks = _PEM_BLOCK.findall(text)
    if not blocks:
        return (
            None,
            "no certificate in it (PEM: -----BEGIN CERTIFICATE----- ... -----END CERTIFICATE-----)",
        )
    ders = []
    for number, (label, body) in enumerate(blocks, 1):
        if label != "CERTIFICATE":
            return None, f"block {number} is a {label}, not a CERTIFICATE"
        try:
            ders.append(base64.b64decode("".join(body.split()), validate=True))
        except (binascii.Error, ValueError):
            return None, f"certificate {number} is not valid base64"
    import ssl

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    try:
        context.load_verify_locations(cadata=b"".join(ders))
    except ssl.SSLError:
        return None, "a certificate in it cannot be read (not an X.509 certificate)"
    stats = context.cert_store_stats()
    if stats["x509"] != len(ders):
        return None, "a certificate in it is given twice"
    if stats["x509_ca"] != len(ders):
        return (
            None,
            "a certificate in it is not an authority's (CA:TRUE): give the authority that signs the endpoint's certificate",
        )
    pem = "".join(
        "-----BEGIN CERTIFICATE-----\n"
        + "\n".join(chunk[i : i + 64] for i in range(0, len(chunk), 64))
        + "\n-----END CERTIFICATE-----\n"
        for chunk in (base64.b64encode(der).decode() for der in ders)
    )
    return Authorities(pem, tuple(hashlib.sha256(der).hexdigest() for der in ders)), ""


def _local(
    form: Mapping[str, Any],
    mode: str,
    wants: Mapping[str, tuple[str, ...]],
    problems: list[Problem],
) -> tuple[BrainEndpoint | None, list[Problem]]:
    """A ``local`` endpoint (the schema has checked its fields' shapes)."""
    at: tuple[str | int, ...] = ("endpoint", "local")
    local = form["local"]
    if form.get("api", "anthropic") != "anthropic":
        problems.append((("endpoint", "api"), "a local endpoint speaks api anthropic"))
    if "url" in form:
        problems.append((("endpoint", "url"), "name the endpoint by url or by local, not both"))
    network = str(local.get("network", ""))
    if network in RESERVED_NETWORKS or network.startswith(RESERVED_PREFIXES):
        problems.append(
            (
                (*at, "network"),
                f"{network!r} is not a network a local endpoint may name"
                " (Docker's own networks and kagura's run networks are refused):"
                " name an internal network made for the endpoint",
            )
        )
    container = str(local.get("container", ""))
    if container.replace(".", "").isdigit():
        problems.append(((*at, "container"), "name the container, not an address"))
    if problems or mode not in wants:
        return None, problems
    upstream = LocalUpstream(network, str(local["container"]), int(local["port"]))
    endpoint = BrainEndpoint(
        api="anthropic",
        host=upstream.container,
        port=upstream.port,
        base_path="",
        region=None,
        project=None,
        auth=_auth_kind(mode, "anthropic", form.get("header")),
        named=True,
        baseline=bool(form.get("baseline", False)),
        local=upstream,
    )
    return endpoint, []


def _auth_kind(mode: str, api: Api, header: object) -> AuthKind:
    if mode == "subscription":
        return "oauth"
    if api == "bedrock":
        return "sigv4"
    if api == "vertex" or header == "authorization":
        return "bearer"
    return "x-api-key"


def _url(url: str) -> tuple[tuple[str, int, str] | None, str]:
    """(host, port, base path) of an endpoint URL, or the problem with it."""
    try:
        parts = urllib.parse.urlsplit(url)
        literal = parts.hostname or ""
    except ValueError:
        return None, "not a URL"
    if parts.scheme != "https":
        return None, "must be https (the credential travels to it)"
    try:
        ipaddress.ip_address(literal.strip("[]"))
        return None, "name the endpoint's host, not an address"
    except ValueError:
        pass
    found = endpoint_problems({"endpoint": url})
    if found:
        return None, "; ".join(found.values())
    host, problem = normalize_host(literal)
    if host is None or host.startswith("*."):
        return None, problem or "a wildcard is no endpoint"
    path = parts.path.rstrip("/")
    if any(seg in (".", "..") or not seg for seg in path.split("/")[1:]):
        return None, "the path must be plain (no empty, . or .. segments)"
    if not all(c.isalnum() or c in "/-_.~" for c in path):
        return None, "the path may hold letters, digits and - _ . ~ only"
    return (host, parts.port or 443, path), ""
