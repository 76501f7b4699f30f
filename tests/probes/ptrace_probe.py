"""Run by an agent tool inside the agent container: try to reach the entrypoint.

For every process running kagura_agent.brain.entrypoint (PID 1 and the server it forks)
it tries what a hijacked tool would: ptrace attach, read its memory and environment,
list its fds, open its stdin (credential bundles) and stdout (the brain channel). As a
control it tries the same on a child of its own, where they must work — so a probe that
cannot succeed anywhere does not pass for a membrane. Writes JSON to argv[1].
"""

import ctypes
import json
import os
import subprocess
import sys

PTRACE_ATTACH, PTRACE_DETACH = 16, 17
libc = ctypes.CDLL(None, use_errno=True)


def attempt(action):
    try:
        action()
        return "ok"
    except OSError as exc:
        return type(exc).__name__


def ptrace_attach(pid):
    if libc.ptrace(PTRACE_ATTACH, pid, None, None) != 0:
        raise OSError(ctypes.get_errno(), "ptrace")
    os.waitpid(pid, 0)
    libc.ptrace(PTRACE_DETACH, pid, None, None)


def read(path, size=64):
    with open(path, "rb") as handle:
        handle.read(size)


def read_mem(pid):
    with open(f"/proc/{pid}/mem", "rb") as handle:
        with open(f"/proc/{pid}/maps") as maps_file:
            maps = maps_file.readline()
        handle.seek(int(maps.split("-")[0], 16))
        handle.read(16)


def write_channel(pid):
    with open(f"/proc/{pid}/fd/1", "wb", buffering=0) as handle:
        handle.write(b"")


def probes(pid):
    return {
        "ptrace": attempt(lambda: ptrace_attach(pid)),
        "mem": attempt(lambda: read_mem(pid)),
        "environ": attempt(lambda: read(f"/proc/{pid}/environ")),
        "fd-list": attempt(lambda: os.listdir(f"/proc/{pid}/fd")),
        "stdin": attempt(lambda: read(f"/proc/{pid}/fd/0", 0)),
        "stdout": attempt(lambda: write_channel(pid)),
    }


def entrypoints():
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/cmdline", "rb") as handle:
                    cmdline = handle.read()
            except OSError:
                continue
            if b"kagura_agent.brain.entrypoint" in cmdline:
                found.append(int(name))
    return sorted(found)


control = subprocess.Popen(["sleep", "30"], stdout=subprocess.PIPE)
report = {
    "entrypoints": {pid: probes(pid) for pid in entrypoints()},
    "control": probes(control.pid),
}
control.kill()
with open(sys.argv[1], "w") as out:
    json.dump(report, out)
