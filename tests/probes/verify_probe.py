"""Run as a verify command: what can verify see of the agent's run? Writes JSON to argv[1].

Records the container's hostname, whether a file the agent's lingerer keeps rewriting
still changes, every process and what it runs, the network interfaces, whether the
proxy the agent used answers, what PID 1's stdin is, and every place a canary credential
could hide (environment of every readable process, /run, /tmp, /home/agent).
"""

import json
import os
import socket
import sys
import time
from urllib.parse import urlsplit

canary = sys.argv[2]


def text(path):
    try:
        with open(path, "rb") as handle:
            return handle.read().decode(errors="replace")
    except OSError as exc:
        return f"<{type(exc).__name__}>"


def processes():
    found = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            found[name] = text(f"/proc/{name}/cmdline").replace("\0", " ").strip()
    return found


def canary_hits():
    hits = [f"/proc/{p}/environ" for p in processes() if canary in text(f"/proc/{p}/environ")]
    for top in ("/run", "/tmp", "/home/agent"):
        for folder, _, files in os.walk(top):
            hits += [
                os.path.join(folder, f) for f in files if canary in text(os.path.join(folder, f))
            ]
    return hits


def proxy_answers():
    proxy = text("agent-proxy").strip()
    if not proxy:
        return "no proxy recorded"
    where = urlsplit(proxy)
    try:
        socket.create_connection((where.hostname, where.port or 80), timeout=3).close()
        return "connected"
    except OSError as exc:
        return type(exc).__name__


before = text("watched")
time.sleep(1.5)
report = {
    "hostname": socket.gethostname(),
    "watched_changed": text("watched") != before,
    "processes": processes(),
    "interfaces": sorted(os.listdir("/sys/class/net")),
    "proxy": proxy_answers(),
    "pid1_stdin": os.readlink("/proc/1/fd/0") if os.access("/proc/1/fd/0", os.F_OK) else "?",
    "run_kagura": sorted(os.path.join(d, f) for d, _, fs in os.walk("/run/kagura") for f in fs),
    "canary": canary_hits(),
}
with open(sys.argv[1], "w") as out:
    json.dump(report, out)
