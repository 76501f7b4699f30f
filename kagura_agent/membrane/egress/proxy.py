"""How an egress proxy container is made and when it is ready (cold and pooled sessions).

The proxy runs squid from kagura/egress-proxy as Debian's ``proxy`` user on a read-only
root with a few tmpfs directories, every capability dropped; socat in it listens on a
Unix socket in a small tmpfs volume that the agent's container mounts read-only.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

from kagura_agent.errors import SetupError
from kagura_agent.membrane.egress.audit import LOG_FILE_SIZE, LOG_FILES
from kagura_agent.membrane.egress.squid import READY_MARKER
from kagura_agent.membrane.runtime import docker_errors

PROXY_USER = "13:13"  # Debian's `proxy` user
_TMPFS = "rw,nosuid,nodev,noexec,uid=13,gid=13,mode=0700,size="
# squid needs a few writable directories on its read-only root.
PROXY_TMPFS = {
    "/run/squid": _TMPFS + "1048576",
    "/tmp": _TMPFS + "16777216",
    "/var/spool/squid": _TMPFS + "16777216",
    "/var/log/squid": _TMPFS + "1048576",
    # nginx of the key-injecting port: its files, and request bodies past 1 MiB.
    "/run/kagura-inject": _TMPFS + "83886080",
}
# Where the socket volume is mounted: read-write in the proxy (socat creates the socket),
# read-only in the agent (connecting to a socket needs no write access to the mount).
PROXY_SOCKET_DIR = "/run/kagura-egress"
AGENT_SOCKET_DIR = "/run/kagura/egress"
SOCKET_NAME = "proxy.sock"
INJECT_SOCKET_NAME = "inject.sock"
# The volume holds one socket: a tiny tmpfs owned by the proxy user, readable by all.
VOLUME_OPTS = {"type": "tmpfs", "device": "tmpfs", "o": "size=65536,uid=13,gid=13,mode=0755"}


def proxy_create_kwargs(
    *,
    name: str,
    labels: dict[str, str],
    environment: dict[str, str],
    network: str,
    mounts: list[Any],
    stdin_open: bool,
    extra_hosts: dict[str, str],
) -> dict[str, Any]:
    """docker-py ``containers.create`` keywords of an egress proxy (cold or pooled)."""
    import docker.types

    return {
        "name": name,
        "labels": labels,
        "environment": environment,
        "stdin_open": stdin_open,
        "user": PROXY_USER,
        "network": network,
        "mounts": mounts,
        "read_only": True,
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges:true"],
        "tmpfs": PROXY_TMPFS,
        "pids_limit": 64,
        "mem_limit": 512 * 1024 * 1024,
        "extra_hosts": extra_hosts,
        # json-file, kept to audit.LOG_KEEP bytes: the audit re-reads the log at teardown
        # (up to audit.LOG_CEILING bytes, where the run is stopped as a flood; far below
        # what is kept, so no line is rotated away before and the numbering holds).
        "log_config": docker.types.LogConfig(
            type="json-file",
            config={"max-size": str(LOG_FILE_SIZE), "max-file": str(LOG_FILES)},
        ),
    }


def wait_for_ready(client: Any, proxy_id: str, what: str, timeout: float) -> None:
    """Follow squid's stderr until it says it listens (one request, no polling).

    Polling logs + inspect every 20 ms cost the daemon ~100 requests a second per
    starting run; with 20 runs starting on two cores squid takes seconds to come up
    and the polls alone kept dockerd busy. The followed stream ends when the proxy
    exits, which is how a crash is seen at once.
    """
    marker = READY_MARKER.encode()
    found, ended = threading.Event(), threading.Event()
    with docker_errors("waiting for the egress proxy"):
        stream = client.api.logs(proxy_id, stdout=False, stderr=True, stream=True, follow=True)

    def follow() -> None:
        seen = b""
        try:
            for chunk in stream:
                seen = (seen + chunk)[-65536:]
                if marker in seen:
                    found.set()
                    return
        except Exception:  # closed on timeout, or the daemon went: judged below
            pass
        finally:
            ended.set()

    reader = threading.Thread(target=follow, name=f"egress-ready-{what}", daemon=True)
    reader.start()
    ended.wait(timeout)
    with contextlib.suppress(Exception):
        stream.close()
    if found.is_set():
        return
    with docker_errors("waiting for the egress proxy"):
        logs = client.api.logs(proxy_id, stdout=False, stderr=True).decode(errors="replace")
        if READY_MARKER in logs:
            return
        state = client.api.inspect_container(proxy_id)["State"]
    if not state.get("Running"):
        tail = "\n".join(logs.splitlines()[-15:])
        raise SetupError(
            f"the egress proxy of {what} exited (status {state.get('ExitCode')}):\n{tail}"
        )
    raise SetupError(f"the egress proxy of {what} not ready in {timeout}s")
