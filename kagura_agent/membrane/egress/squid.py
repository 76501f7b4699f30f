"""Render squid.conf from an :class:`EgressPolicy`, and parse squid's access log lines.

Why squid: its ``dst`` ACL resolves the requested name itself and checks the resolved
addresses, so "a listed name that resolves to a private or metadata address is refused"
is enforced inside the proxy, on the very addresses it is about to connect to (squid
connects to the addresses in the same ipcache entry the ACL checked). tinyproxy filters
only on the name and would need a second, home-made resolver in front of it.

Every ``http_access`` rule is explicit and the last one denies everything; each deny
annotates the transaction with ``kagura_reason`` so the log says why.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from kagura_agent.errors import RefusedError
from kagura_agent.manifest.hosts import is_squid_safe
from kagura_agent.membrane.egress.policy import AllowEntry, EgressPolicy, Network

PROXY_PORT = 3128
LOG_TAG = "KAGURA1"
READY_MARKER = "Accepting HTTP Socket connections"

# Fields are separated by single spaces; the ones a client controls are URL-encoded (%#).
# The last two are the proxy port the request came in on and the URL path; the injecting
# port (modelport.py) writes lines of the same shape, so the audit reads both alike.
LOG_FORMAT = (
    f"{LOG_TAG} %ts.%03tu %>a %#>rm %#>rs %#>rd %>rP %>Hs %Ss %>st %<st %<a %#{{kagura_reason}}note"
    " %>lp %#>rp"
)

_IP_LITERAL_RES = (
    r"^(0x[0-9a-f]+|[0-9]+)(\.(0x[0-9a-f]+|[0-9]+)){0,3}\.?$",
    r"^\[?[0-9a-f:.]*:[0-9a-f:.]*\]?$",
)
# Anything but printable ASCII, newline and tab: a stray \r or NUL would split a directive.
_CONTROL = re.compile(r"[^\x20-\x7e\n\t]")
# The reasons squid annotates a denial with (kagura_reason), the only notes it logs.
DENY_REASONS = ("client", "ip-literal", "private-address", "not-allowed")

_HEADER = """\
# Rendered by kagura-agent from the launch plan's egress section; do not edit.
http_port 127.0.0.1:{port}
visible_hostname kagura-egress
pid_filename none
cache_log stdio:/dev/stderr
coredump_dir /tmp
cache deny all
cache_mem 0 MB
logfile_rotate 0
logformat kagura {log_format}
access_log stdio:/dev/stdout logformat=kagura buffer-size=0KB
buffered_logs off
via off
forwarded_for delete
httpd_suppress_version_string on
shutdown_lifetime 0 seconds
# Larger socket buffers: with the default, CONNECT tunnels ran at ~55% of a direct path.
tcp_recv_bufsize 4 MB
connect_timeout 15 seconds
pinger_enable off
"""


def _domain_acl(name: str, entry: AllowEntry) -> str:
    # Second line of defence behind hosts.normalize_host: nothing but a plain ASCII name
    # (no space, newline or control character) is ever written into a squid directive.
    if not is_squid_safe(entry.host):
        raise RefusedError(f"egress host {entry.host!a} cannot be written into squid.conf")
    # -n: never reverse-resolve an IP-literal request to match a name.
    if entry.wildcard:
        # dstdomain ".example.com" would also match "example.com" itself; the regex
        # requires at least one label in front of the domain.
        pattern = r"^([a-z0-9_-]+\.)+" + re.escape(entry.domain).replace(r"\-", "-") + r"\.?$"
        return f"acl {name} dstdom_regex -n -i {pattern}"
    return f"acl {name} dstdomain -n {entry.host}"


def _ranges(nets: Sequence[Network]) -> str:
    return " ".join(str(n) for n in nets)


def render_squid_conf(policy: EgressPolicy, client_networks: Sequence[str]) -> str:
    """squid.conf for ``policy``; only clients from ``client_networks`` may use the proxy."""
    if not client_networks:
        raise ValueError("render_squid_conf needs the run's internal network range")
    lines = [_HEADER.format(port=PROXY_PORT, log_format=LOG_FORMAT)]
    for reason in DENY_REASONS:
        name = "why_" + reason.replace("-", "_")
        lines.append(f"acl {name} annotate_transaction kagura_reason={reason}")
    lines += [
        f"acl agents src {' '.join(client_networks)}",
        "acl CONNECT method CONNECT",
        "acl plain_http proto HTTP",
        *(f"acl ip_literal dstdom_regex -n -i {r}" for r in _IP_LITERAL_RES),
        "http_access deny !agents why_client",
    ]
    lines += [
        "http_access deny ip_literal why_ip_literal",
    ]
    for i, entry in enumerate(policy.entries):
        # The policy name is plan data: only its plain characters reach the comment.
        policy_name = re.sub(r"[^A-Za-z0-9_.-]", "?", entry.policy) or "-"
        lines.append(f"# entry {i}: {entry.label()} policy={policy_name}")
        lines.append(_domain_acl(f"e{i}_host", entry))
        lines.append(f"acl e{i}_port port {entry.port}")
        how = "CONNECT" if entry.scheme == "https" else "!CONNECT plain_http"
        match = f"e{i}_host e{i}_port {how}"
        forbidden = policy.forbidden_for(entry)
        if forbidden:
            lines.append(f"acl e{i}_forbidden dst {_ranges(forbidden)}")
            lines.append(f"http_access deny {match} e{i}_forbidden why_private_address")
        lines.append(f"http_access allow {match}")
    lines.append("http_access deny all why_not_allowed")
    lines.append("icp_access deny all")
    lines.append("htcp_access deny all")
    lines.append("")
    conf = "\n".join(lines)
    if _CONTROL.search(conf):
        raise RefusedError("the rendered squid.conf contains a control character; refused")
    return conf
