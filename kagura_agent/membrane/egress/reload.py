"""Load a new squid.conf into a running proxy: the one reload of both a warm session's
first configuration (pool.py) and a live run's mid-run grant (:func:`reload_allowlist`).

The proxy keeps running (its container, the socket volume, the agent's forwarder and
every open connection stay). One ``docker exec`` as the proxy user writes the new file
beside the live one, checks it with ``squid -k parse``, renames it over the live one (one
tmpfs: atomic) and sends squid (pid 1 of the container) SIGHUP — its reconfigure, which
re-reads the file and reopens its listening port while established tunnels carry on. A
file that does not parse is refused: the old configuration stays in force.

Ready is squid's next "Accepting HTTP Socket connections" line: the lines already in its
log are counted before the exec, and the reload is done once the followed log holds one
more — right on a proxy's first reload and on every later one.

:func:`start_reload` returns at once with a ``wait()``; the exec and the wait run in a
thread, so a warm run creates and starts its agent container meanwhile (the agent has no
way out until its forwarder starts, after ``wait()``).
"""

from __future__ import annotations

import base64
import contextlib
import threading
from collections.abc import Callable, Mapping
from typing import Any

from kagura_agent.errors import SetupError
from kagura_agent.membrane.egress.policy import EgressPolicy, Network, load_policy
from kagura_agent.membrane.egress.squid import READY_MARKER, render_squid_conf
from kagura_agent.membrane.runtime import docker_errors

CONF = "/run/squid/squid.conf"
_NEXT = CONF + ".next"
PARSE_REFUSED = 78  # the exec's exit status when squid rejects the new file
# Written beside the live file, checked, renamed over it, then squid reconfigures.
_SWAP = (
    'umask 077; printf %s "$KAGURA_SQUID_CONF_B64" | base64 -d > ' + _NEXT + " || exit 1\n"
    "/usr/sbin/squid -k parse -f " + _NEXT + " 2>/tmp/parse.err"
    " || { cat /tmp/parse.err; rm -f " + _NEXT + "; exit " + str(PARSE_REFUSED) + "; }\n"
    "mv " + _NEXT + " " + CONF + " && kill -HUP 1"
)


def start_reload(
    client: Any, proxy_id: str, conf: str, *, user: str, timeout: float = 30.0
) -> Callable[[], None]:
    """Have the running squid of ``proxy_id`` load ``conf``; returns ``wait()``.

    Two daemon round trips here (the log's ready lines so far, the exec's creation): a
    proxy that is gone or stopped fails at once (ContainerError). ``wait()``
    returns once squid listens with the new file, and raises SetupError when squid
    refuses it (the old one stays in force), exits, or is not back within ``timeout``.
    """
    marker = READY_MARKER.encode()
    environment = {"KAGURA_SQUID_CONF_B64": base64.b64encode(conf.encode()).decode()}
    with docker_errors("reloading the egress proxy's configuration"):
        before = client.api.logs(proxy_id, stdout=False, stderr=True).count(marker)
        exec_id = client.api.exec_create(
            proxy_id, ["sh", "-c", _SWAP], user=user, environment=environment
        )["Id"]
    failure: list[str] = []
    stream: list[Any] = []
    done = threading.Event()

    def run() -> None:
        try:
            output = client.api.exec_start(exec_id)
            code = client.api.exec_inspect(exec_id).get("ExitCode")
            if code != 0:
                detail = output.decode(errors="replace")[-400:]
                if code == PARSE_REFUSED:
                    failure.append(f"the new allowlist was refused by squid: {detail}")
                else:
                    failure.append(f"the egress proxy's configuration was not written: {detail}")
                return
            stream.append(
                client.api.logs(proxy_id, stdout=False, stderr=True, stream=True, follow=True)
            )
            seen, pending = 0, b""
            for chunk in stream[0]:
                *lines, pending = (pending + chunk).split(b"\n")
                seen += sum(1 for line in lines if marker in line)
                if seen > before:
                    done.set()
                    return
            failure.append("the egress proxy exited while reloading its configuration")
        except Exception as exc:  # closed on timeout, or the daemon went
            if not done.is_set() and not failure:
                failure.append(f"reloading the egress proxy's configuration: {exc}")

    worker = threading.Thread(target=run, name=f"egress-reload-{proxy_id[:12]}", daemon=True)
    worker.start()

    def wait() -> None:
        worker.join(timeout)
        for opened in stream:
            with contextlib.suppress(Exception):
                opened.close()
        if done.is_set():
            return
        if failure:
            raise SetupError(failure[0])
        raise SetupError(f"the egress proxy did not come back within {timeout:g}s of a reload")

    return wait


def reload_allowlist(
    client: Any,
    proxy: Any,
    egress: Mapping[str, Any],
    *,
    user: str,
    host: tuple[Network, ...],
    timeout: float = 30.0,
) -> EgressPolicy:
    """Put the allowlist of ``egress`` (a plan's egress section) in force in ``proxy``.

    Returns the new policy (the audit classifies by it from now on); ``host`` is the
    addresses of the host the proxy runs on, refused as before. Raises SetupError when the
    configuration is refused or squid does not come back in ``timeout``.
    """
    policy = load_policy(egress).on_host(host)
    conf = render_squid_conf(policy, ["127.0.0.1/32"])
    start_reload(client, proxy.id, conf, user=user, timeout=timeout)()
    return policy
