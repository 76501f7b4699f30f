"""The key-injecting port: nginx with a model-call policy, beside squid in the egress proxy.

The agent talks plain HTTP to ``http://127.0.0.1:INJECT_PORT`` (its forwarder relays that
to the proxy's second socket); in the proxy container nginx listens there and runs
images/egress-proxy/kagura_model_port.lua on every request before it forwards anything:
the path as sent, the ``anthropic-beta`` values and the JSON body are checked against the
plan's model-call policy (:class:`ModelCallPolicy`), the call is counted and capped when
it starts (:class:`CallLimits`), the agent's credentials are dropped and the operator's
key set, and the key is taken out of every response. squid keeps the forward port.

Why nginx with Lua (Debian's nginx and libnginx-mod-http-lua): squid cannot read request
bodies, and a model call's body is where the provider is asked to reach out (server-side
tools, MCP connectors, URLs to fetch). Measured on this project's machine against the
same streaming fake (docs/egress.md has the figures): nginx adds ~0.3-0.5 ms a call at the
median, squid's reverse proxy ~1.2-1.4 ms, mitmproxy ~3.5-4 ms with a p99 past 10 ms; and
nginx passes a stream on as it comes (``proxy_buffering off``).

What is rendered here is the configuration (no secret): nginx.conf, the policy file the
Lua module reads, and the limits file the host rewrites when a budget is extended
(:func:`set_limits`). The key arrives on the proxy's stdin, as before (entry.sh).
"""

from __future__ import annotations

import json
import re
import socket
import time
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kagura_agent.errors import RefusedError, SetupError
from kagura_agent.manifest.hosts import is_squid_safe
from kagura_agent.membrane.runtime import docker_errors

INJECT_PORT = 3129
INJECT_DIR = "/run/kagura-inject"
# Stands for the upstream's address in nginx.conf; entry.sh resolves the host
# (KAGURA_INJECT_HOST) when the proxy starts and writes the address there. A host that
# does not resolve then leaves 127.0.0.1, where nothing listens: calls fail, logged.
UPSTREAM_ADDRESS = "__KAGURA_UPSTREAM_ADDRESS__"
LIMITS_FILE = f"{INJECT_DIR}/limits.json"
# The authorities nginx checks the upstream's certificate against: the system's, or the
# endpoint's own (entry.sh writes KAGURA_INJECT_CA_B64 there).
SYSTEM_AUTHORITIES = "/etc/ssl/certs/ca-certificates.crt"
ENDPOINT_AUTHORITIES = f"{INJECT_DIR}/endpoint-ca.pem"
POLICY_FILE = f"{INJECT_DIR}/policy.json"
# The Lua module writes the generation of the policy it loaded here (at start and on
# every reload), so the host knows when a mid-run policy is in force.
LOADED_FILE = f"{INJECT_DIR}/policy.loaded"
# The reasons the port gives a refusal in its log line (kagura_model_port.lua).
MODEL_REASONS = (
    "not-model-call",
    "upgrade",
    "beta",
    "body",
    "server-tool",
    "mcp",
    "url-source",
    "file-reference",
    "budget",
    "concurrency",
    "limits",
    "credential",
)
# How each allowed call was counted, in the log line's status field.
CALL_KINDS = ("MODEL_TURN", "MODEL_SIDE", "MODEL_FREE", "MODEL_FILES")
# A request the port answered itself (nothing forwarded, no credential used, not counted):
# the Bedrock CLI's inference-profile discovery (kagura_upstream.lua).
LOCAL_KIND = "MODEL_LOCAL"
# How many model calls may be under way at once when no policy says otherwise: the CLI
# runs a few sub-agents side by side; a flood of parallel calls is no agent's need.
DEFAULT_CONCURRENCY = 4
# Calls without tools (a title, a summary, a check) each turn may make: counted apart
# from the turns, capped at this many per turn of the budget.
SIDE_CALLS_PER_TURN = 1
# Token counting is free of charge; still capped, at this many per turn.
FREE_CALLS_PER_TURN = 4
# The paths the port offers, by endpoint API (kagura_upstream.lua); a policy with files
# adds the Files API's (Anthropic only).
MESSAGE_PATHS = ("POST /v1/messages", "POST /v1/messages/count_tokens")
API_PATHS: Mapping[str, tuple[str, ...]] = {
    "anthropic": MESSAGE_PATHS,
    "bedrock": (
        "POST /model/{model}/invoke",
        "POST /model/{model}/invoke-with-response-stream",
        "GET /inference-profiles (answered by the port: an empty list)",
    ),
    "vertex": (
        "POST /v1/projects/{project}/locations/{region}/publishers/anthropic/models/{model}:rawPredict",
        "POST .../models/{model}:streamRawPredict",
        "POST .../models/count-tokens:rawPredict",
    ),
}
FILE_PATHS = (
    "GET /v1/files",
    "POST /v1/files",
    "GET /v1/files/{id}",
    "DELETE /v1/files/{id}",
    "GET /v1/files/{id}/content",
)
# Server-side tools a policy can allow, by family (the API's type without its date).
SERVER_TOOLS = (
    "web_search",
    "web_fetch",
    "code_execution",
    "tool_search_tool_regex",
    "tool_search_tool_bm25",
)
# anthropic-beta families that change how the model answers and open no way out: what
# the bundled Claude Code CLI sends. Anything else is refused unless a policy allows it.
# (Measured on Claude Code 2.1.337: claude-code, interleaved-thinking, context-management,
# per-turn-control, mid-conversation-tool-changes, thinking-token-count, advanced-tool-use
# (its ToolSearch is a client tool), effort, thinking-display-updates; the rest are the
# families its source names for the first-party API.)
LOCAL_BETAS = (
    "claude-code",
    "interleaved-thinking",
    "context-1m",
    "context-management",
    "structured-outputs",
    "effort",
    "prompt-caching-scope",
    "fast-mode",
    "redact-thinking",
    "token-efficient-tools",
    "fine-grained-tool-streaming",
    "task-budgets",
    "per-turn-control",
    "mid-conversation-tool-changes",
    "thinking-token-count",
    "thinking-display-updates",
    "advanced-tool-use",
    # The same feature's name on Bedrock (in the body's anthropic_beta) and on Vertex.
    "tool-search-tool",
)
# What the CLI adds with a subscription's OAuth token (CLAUDE_CODE_OAUTH_TOKEN): the
# beta that makes the API take the token, and the longer prompt-cache lifetime.
OAUTH_BETAS = ("oauth", "extended-cache-ttl")
# Betas that open egress by the provider: allowed only with the feature they serve.
FEATURE_BETAS: Mapping[str, tuple[str, ...]] = {
    "web_search": ("web-search",),
    "web_fetch": ("web-fetch",),
    "code_execution": ("code-execution", "skills"),
    "mcp": ("mcp-client",),
    "files": ("files-api",),
}
_TOKEN = re.compile(r"[A-Za-z0-9._~+/=:-]{1,4096}")
_BETA = re.compile(r"[a-z0-9][a-z0-9-]{0,80}")


@dataclass(frozen=True)
class Injection:
    """An upstream HTTP API whose credential the proxy adds, so the agent never holds it.

    nginx sends each request that passes the policy to ``host:port`` (over TLS when
    ``tls``, the certificate checked against the system's CAs, or ``ca_pem`` alone when it
    is set), under ``base_path``, with
    the credential as ``auth`` says (kagura_upstream.lua: ``x-api-key``, ``bearer``,
    ``oauth`` or ``sigv4``), dropping any credential the agent sent. ``api`` is the wire
    protocol the port speaks for it (the brain's model endpoint: plan/endpoint.py). The
    secret is in no configuration: it reaches the proxy on its stdin and stays on the
    proxy's tmpfs (entry.sh); a renewed lease replaces it there (:func:`set_key`).
    """

    host: str
    port: int = 443
    tls: bool = True
    api: str = "anthropic"
    auth: str = "x-api-key"
    base_path: str = ""
    region: str | None = None
    project: str | None = None
    ca_pem: str | None = None  # the authorities trusted for it alone (a private CA), PEM

    @property
    def header(self) -> str:
        """The header that carries the credential upstream."""
        return "x-api-key" if self.auth == "x-api-key" else "authorization"

    @classmethod
    def for_endpoint(cls, endpoint: Mapping[str, Any]) -> Injection:
        """The injection of a plan's ``brain.model_endpoint`` (a local one: plain HTTP to its
        container, on the network the proxy joins for it)."""
        local = endpoint.get("local")
        if local is not None:
            return cls(host=str(local["container"]), port=int(local["port"]), tls=False)
        parts = urllib.parse.urlsplit(str(endpoint["url"]))
        return cls(
            host=str(parts.hostname),
            port=parts.port or 443,
            tls=True,
            api=str(endpoint["api"]),
            auth=str(endpoint["auth"]),
            base_path=parts.path.rstrip("/"),
            region=endpoint.get("region"),
            project=endpoint.get("project"),
            ca_pem=endpoint["ca"]["pem"] if endpoint.get("ca") else None,
        )


# The Anthropic API, whose key the proxy injects for the default Claude brain.
ANTHROPIC_API = Injection(host="api.anthropic.com", port=443, tls=True)
_AUTHS = ("x-api-key", "bearer", "oauth", "sigv4")
_APIS = tuple(API_PATHS)
_PATH = re.compile(r"(/[A-Za-z0-9._~-]+)*")
_REGION = re.compile(r"[a-z0-9][a-z0-9-]{0,30}[a-z0-9]")


@dataclass(frozen=True)
class ModelCallPolicy:
    """What a model call may ask the provider to do beyond answering (each is egress by
    the provider on the agent's behalf), from the plan's ``egress.model_calls``."""

    server_tools: tuple[str, ...] = ()
    mcp_servers: tuple[str, ...] = ()  # hosts of MCP connectors the provider may reach
    url_sources: bool = False  # images and documents the provider fetches by URL
    files: bool = False  # the Files API and file references
    betas: tuple[str, ...] = field(default=LOCAL_BETAS)
    concurrency: int = DEFAULT_CONCURRENCY

    @classmethod
    def from_plan(cls, section: Mapping[str, Any] | None) -> ModelCallPolicy:
        """The policy of a plan's ``egress.model_calls`` (the default one when absent)."""
        if section is None:
            return cls()
        return cls(
            server_tools=tuple(section["server_tools"]),
            mcp_servers=tuple(section["mcp_servers"]),
            url_sources=bool(section["url_sources"]),
            files=bool(section["files"]),
            betas=tuple(section["betas"]),
            concurrency=int(section["concurrency"]),
        )

    def lua_config(self, injection: Injection, generation: int = 0) -> str:
        """The policy file the Lua module reads at start and on a reload (no secret in it);
        ``generation`` counts the policies a run has had (0: the planned one)."""
        bad = [b for b in self.betas if not _BETA.fullmatch(b)]
        bad += [t for t in self.server_tools if t not in SERVER_TOOLS]
        bad += [h for h in self.mcp_servers if not is_squid_safe(h)]
        bad += [x for x in (injection.api,) if x not in _APIS]
        bad += [x for x in (injection.auth,) if x not in _AUTHS]
        bad += [x for x in (injection.base_path,) if not _PATH.fullmatch(x)]
        bad += [x for x in (injection.region, injection.project) if x and not _REGION.fullmatch(x)]
        if injection.api != "anthropic" and not (
            injection.region and _REGION.fullmatch(injection.region)
        ):
            bad.append(f"{injection.api} needs a region")
        if injection.api == "vertex" and not injection.project:
            bad.append("vertex needs a project")
        if bad:
            raise RefusedError(f"the model-call policy cannot be configured: {bad[:3]}")
        exact = sorted(b for b in self.betas if re.search(r"-\d{4}-?\d\d-?\d\d$", b))
        families = sorted(b for b in self.betas if b not in exact)
        # Vertex: the CLI sends web-search's beta on every call; a feature beta the policy
        # does not allow is dropped there rather than refused (kagura_upstream.lua).
        drop = sorted(
            {f for fs in FEATURE_BETAS.values() for f in fs} - set(self.betas)
            if injection.api == "vertex"
            else set()
        )
        return json.dumps(
            {
                "upstream_host": injection.host,
                "upstream_port": injection.port,
                "api": injection.api,
                "auth": injection.auth,
                "base_path": injection.base_path,
                "region": injection.region,
                "project": injection.project,
                "drop_beta_families": drop,
                "server_tools": sorted(self.server_tools),
                "mcp_servers": sorted(h.lower() for h in self.mcp_servers),
                "url_sources": self.url_sources,
                "files": self.files,
                "betas": exact,
                "beta_families": families,
                "generation": generation,
            },
            sort_keys=True,
        )


@dataclass(frozen=True)
class CallLimits:
    """The caps on model calls, counted when each starts: turn calls (with tools) at the
    turn budget, side calls (without) and token counts at a few per turn, and all of them
    at ``concurrency`` under way at once. ``None``: no cap (no turn budget)."""

    turn: int | None
    side: int | None
    free: int | None
    concurrency: int

    @classmethod
    def for_budget(cls, turns: int | None, concurrency: int) -> CallLimits:
        if not turns:
            return cls(None, None, None, concurrency)
        return cls(turns, turns * SIDE_CALLS_PER_TURN, turns * FREE_CALLS_PER_TURN, concurrency)

    def to_json(self) -> str:
        return json.dumps(
            {
                "turn": self.turn,
                "side": self.side,
                "free": self.free,
                "files": None,
                "concurrency": self.concurrency,
            },
            sort_keys=True,
        )


def check_secret(secret: str) -> None:
    """The injected credential goes to the proxy as one line: a plain token only."""
    if not _TOKEN.fullmatch(secret):
        raise RefusedError("the injected credential is not a plain token; refused")


_NGINX = """\
# Rendered by kagura-agent from the launch plan; do not edit.
load_module /usr/lib/nginx/modules/ndk_http_module.so;
load_module /usr/lib/nginx/modules/ngx_http_lua_module.so;
worker_processes 1;
daemon off;
pid {dir}/nginx.pid;
error_log stderr error;
events {{ worker_connections 256; }}
http {{
    access_log off;
    server_tokens off;
    lua_package_path "/usr/local/share/kagura/?.lua;;";
    lua_shared_dict kagura_calls 1m;
    init_by_lua_block {{
        require("kagura_model_port").init("{dir}/policy.json", "{dir}/key")
    }}
    client_body_temp_path {dir}/body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    # The Messages API takes at most 32 MB a request; bodies past 1 MiB wait on tmpfs.
    client_max_body_size 32m;
    client_body_buffer_size 1m;
    client_header_buffer_size 16k;
    large_client_header_buffers 4 64k;
    keepalive_requests 10000;
    # The address is the upstream's, resolved once when the proxy starts (entry.sh): nginx
    # would refuse to start on a name that does not resolve at that moment.
    upstream model_api {{
        server {address}:{port};
        keepalive 8;
    }}
    server {{
        listen 127.0.0.1:{listen};
        log_by_lua_block {{ require("kagura_model_port").log() }}
        location / {{
            set $kagura_target "";
            access_by_lua_block {{ require("kagura_model_port").access() }}
            header_filter_by_lua_block {{ require("kagura_model_port").header_filter() }}
            body_filter_by_lua_block {{ require("kagura_model_port").body_filter() }}
            proxy_pass {scheme}://model_api$kagura_target;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host {host};
            # Responses uncompressed, so no key can hide from the scrubbing in a gzip.
            proxy_set_header Accept-Encoding "";
            # A stream is passed on as it comes; the request is read whole first (it is
            # checked before anything is sent).
            proxy_buffering off;
            proxy_request_buffering on;
            proxy_redirect off;
            proxy_read_timeout 600s;
            proxy_send_timeout 600s;
{tls}        }}
    }}
}}
"""
_TLS = """\
            proxy_ssl_server_name on;
            proxy_ssl_name {host};
            proxy_ssl_verify on;
            proxy_ssl_verify_depth 4;
            proxy_ssl_trusted_certificate {authorities};
            proxy_ssl_protocols TLSv1.2 TLSv1.3;
"""


def render_nginx_conf(injection: Injection) -> str:
    """nginx.conf of the injecting port for ``injection`` (no secret, no policy in it)."""
    if not is_squid_safe(injection.host) or not 0 < injection.port < 65536:
        raise RefusedError(f"injection upstream {injection.host!a} cannot be configured")
    authorities = ENDPOINT_AUTHORITIES if injection.ca_pem else SYSTEM_AUTHORITIES
    tls = _TLS.format(host=injection.host, authorities=authorities) if injection.tls else ""
    return _NGINX.format(
        dir=INJECT_DIR,
        address=UPSTREAM_ADDRESS,
        host=injection.host,
        port=injection.port,
        listen=INJECT_PORT,
        scheme="https" if injection.tls else "http",
        tls=tls,
    )


# Written beside the live file and renamed over it (one tmpfs: atomic), so the Lua
# module never reads half a file.
_SET_LIMITS = (
    f'umask 077; printf %s "$KAGURA_LIMITS" > {LIMITS_FILE}.next'
    f" && mv {LIMITS_FILE}.next {LIMITS_FILE}"
)


def set_limits(client: Any, proxy_id: str, limits: CallLimits, *, user: str) -> None:
    """Put ``limits`` in force in a running proxy (a budget extended mid-run): the next
    call is counted against them; the counts so far are kept."""
    with docker_errors("setting the model-call limits of the egress proxy"):
        exec_id = client.api.exec_create(
            proxy_id,
            ["sh", "-c", _SET_LIMITS],
            user=user,
            environment={"KAGURA_LIMITS": limits.to_json()},
        )["Id"]
        output = client.api.exec_start(exec_id)
        code = client.api.exec_inspect(exec_id).get("ExitCode")
    if code != 0:
        detail = output.decode(errors="replace")[-300:]
        raise SetupError(f"the model-call limits were not written: {detail}")


# The new policy beside the live file, renamed over it, then nginx reloaded (HUP): the
# master re-runs the Lua module's init, which reads the policy and writes its generation
# to LOADED_FILE; open connections finish on the old workers, and the call counts (a
# shared dictionary) survive the reload.
_SET_POLICY = (
    f'umask 077; printf %s "$KAGURA_POLICY" > {POLICY_FILE}.next'
    f" && mv {POLICY_FILE}.next {POLICY_FILE}"
    f' && kill -HUP "$(cat {INJECT_DIR}/nginx.pid)"'
)


def set_policy(
    client: Any,
    proxy_id: str,
    policy: ModelCallPolicy,
    injection: Injection,
    generation: int,
    *,
    user: str,
    timeout: float = 15.0,
) -> None:
    """Put a mid-run model-call policy in force in a running proxy's injecting port, and
    return only once nginx has loaded it; a SetupError when it did not (the old policy
    then stays in force: nothing new passes)."""
    config = policy.lua_config(injection, generation)
    with docker_errors("putting the model-call policy in force at the injecting port"):
        exec_id = client.api.exec_create(
            proxy_id, ["sh", "-c", _SET_POLICY], user=user, environment={"KAGURA_POLICY": config}
        )["Id"]
        output = client.api.exec_start(exec_id)
        code = client.api.exec_inspect(exec_id).get("ExitCode")
        if code != 0:
            detail = output.decode(errors="replace")[-300:]
            raise SetupError(f"the model-call policy was not written: {detail}")
        deadline = time.monotonic() + timeout
        while True:
            exec_id = client.api.exec_create(proxy_id, ["cat", LOADED_FILE], user=user)["Id"]
            loaded = client.api.exec_start(exec_id).decode(errors="replace").strip()
            if loaded == str(generation):
                return
            if time.monotonic() > deadline:
                raise SetupError(
                    "the injecting port did not load the new model-call policy in"
                    f" {timeout:.0f} s (it loaded generation {loaded or 'none'});"
                    " the policy in force before still holds"
                )
            time.sleep(0.05)


# The credential read from stdin, written beside the live file and renamed over it.
_SET_KEY = (
    f"umask 077; IFS= read -r line && printf '%s\\n' \"$line\" > {INJECT_DIR}/key.next"
    f" && mv {INJECT_DIR}/key.next {INJECT_DIR}/key"
)


def set_key(client: Any, proxy_id: str, secret: str, *, user: str) -> None:
    """Put a renewed credential in force in a running proxy: the next call carries it.

    It travels on the exec's stdin, never in its command line or environment (an exec's
    configuration is readable with ``docker inspect``)."""
    check_secret(secret)
    with docker_errors("renewing the egress proxy's injected credential"):
        exec_id = client.api.exec_create(proxy_id, ["sh", "-c", _SET_KEY], user=user, stdin=True)[
            "Id"
        ]
        wrapper = client.api.exec_start(exec_id, socket=True)
        sock = getattr(wrapper, "_sock", wrapper)
        try:
            sock.sendall(secret.encode() + b"\n")
            sock.shutdown(socket.SHUT_WR)
            while sock.recv(4096):  # until the command ends
                pass
        finally:
            sock.close()
        code = client.api.exec_inspect(exec_id).get("ExitCode")
        for _ in range(100):  # the stream ends a moment before the exec is recorded done
            if code is not None:
                break
            time.sleep(0.02)
            code = client.api.exec_inspect(exec_id).get("ExitCode")
    if code != 0:
        raise SetupError("the renewed credential was not written in the egress proxy")
