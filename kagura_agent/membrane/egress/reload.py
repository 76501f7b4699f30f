"""Reload a running proxy's allowlist in place: a mid-run grant of one more egress entry.

The proxy keeps running (its container, the socket volume, the agent's forwarder and
every open connection stay): the new squid.conf is rendered from the amended plan's
egress section exactly as at start, written over the one on the proxy's tmpfs by a
``docker exec`` as the proxy user, checked with ``squid -k parse``, and squid is sent
SIGHUP — its reconfigure, which re-reads the file and reopens its listening port while
established tunnels carry on. Ready is the next "Accepting HTTP Socket connections" line
on squid's stderr (counted, so the start's own line does not pass for it).

A new configuration that does not parse is refused and the old one stays in force.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Mapping
from typing import Any

from kagura_agent.errors import SetupError
from kagura_agent.membrane.egress.policy import EgressPolicy, load_policy
from kagura_agent.membrane.egress.squid import READY_MARKER, Injection, render_squid_conf
from kagura_agent.membrane.runtime import docker_errors

CONF = "/run/squid/squid.conf"
# Written beside the live file, checked, then renamed over it (one filesystem: atomic).
_SWAP = (
    'umask 077; printf %s "$KAGURA_SQUID_CONF_B64" | base64 -d > /run/squid/squid.conf.next'
    " && /usr/sbin/squid -k parse -f /run/squid/squid.conf.next 2>/tmp/parse.err"
    " && mv /run/squid/squid.conf.next " + CONF + " || { cat /tmp/parse.err; exit 78; }"
)


def reload_allowlist(
    client: Any,
    proxy: Any,
    egress: Mapping[str, Any],
    injection: Injection | None,
    *,
    user: str,
    timeout: float = 30.0,
) -> EgressPolicy:
    """Put the allowlist of ``egress`` (a plan's egress section) in force in ``proxy``.

    Returns the new policy (the audit classifies by it from now on). Raises SetupError
    when the configuration cannot be written or squid does not come back in ``timeout``.
    """
    policy = load_policy(egress)
    conf = render_squid_conf(policy, ["127.0.0.1/32"], injection)
    before = _ready_lines(proxy)
    with docker_errors("reloading the egress proxy's allowlist"):
        code, output = proxy.exec_run(
            ["sh", "-c", _SWAP],
            user=user,
            environment={"KAGURA_SQUID_CONF_B64": base64.b64encode(conf.encode()).decode()},
        )
        if code != 0:
            detail = output.decode(errors="replace")[-400:]
            raise SetupError(f"the amended allowlist was refused by squid: {detail}")
        client.api.kill(proxy.id, signal="SIGHUP")
    deadline = time.monotonic() + timeout
    while _ready_lines(proxy) <= before:
        if time.monotonic() > deadline:
            raise SetupError(f"the egress proxy did not come back within {timeout:g}s of a reload")
        time.sleep(0.05)
    return policy


def _ready_lines(proxy: Any) -> int:
    with docker_errors("reading the egress proxy's log"):
        return int(
            proxy.logs(stdout=False, stderr=True).decode(errors="replace").count(READY_MARKER)
        )
