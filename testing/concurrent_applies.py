"""N ``kagura-agent apply`` processes started together, each with its own egress allowlist.

Used by bench/concurrency.py (20 runs) and tests/test_concurrency.py (5 runs).

Run ``i`` has its own project root and its own EgressPolicy ``conc-i`` that allows only
``run-i.test:8080`` (plain HTTP through the proxy); every run shares one fresh state
directory. One upstream container (python's http.server) is attached to every run's
outbound network as soon as apply creates it, under the aliases of *all* runs' hosts:
every name resolves from every proxy, so when run ``i``'s agent is refused
``run-(i+1).test`` it is squid's allowlist of run ``i`` that refuses it, not DNS. The
task's step waits for a marker the harness writes after attaching (so no proxy caches a
DNS miss), fetches its own host a few times with pauses (I/O-bound), then tries the next
run's host and records the HTTP status it got.

While the runs go, a sampler reads every apply process's RSS (the process and its
children, from /proc) and every proxy container's memory cgroup (cgroup v1 or v2), and
keeps the peak of each.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from kagura_agent.membrane import images
from kagura_agent.membrane.egress import owner
from kagura_agent.membrane.hardening import LABEL_RUN

REPO = Path(__file__).resolve().parents[1]
PORT = 8080
LABEL = {"dev.kagura.test": "concurrency"}
PRIVATE = ["172.16.0.0/12", "10.0.0.0/8", "192.168.0.0/16"]
BLOB_KB = 512
FETCHES = 4
SERVE = (
    f"cd /tmp && head -c {BLOB_KB}K /dev/urandom > blob && echo ready"
    f" && exec python3 -m http.server {PORT} --bind 0.0.0.0"
)


def host(i: int) -> str:
    return f"run-{i}.test"


@dataclass
class Outcome:
    index: int
    exit_code: int | None = None
    wall_ms: float = 0.0
    output: str = ""
    own_ok: bool = False
    other_status: str = ""
    allowed_hosts: set[str] = field(default_factory=set)
    denied_hosts: set[str] = field(default_factory=set)
    peak_rss_kb: int = 0
    proxy_peak_kb: int = 0
    proxy_rss_kb: int = 0
    apply_cpu_ms: float = 0.0
    proxy_cpu_ms: float = 0.0
    agent_cpu_ms: float = 0.0
    stamps: list[tuple[float, str]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and self.own_ok

    def crosstalk(self, n: int) -> list[str]:
        """What proves a leak between runs ([] when this run saw only its own allowlist)."""
        other = host((self.index + 1) % n)
        problems = []
        if self.other_status != "403":
            problems.append(f"{other} answered {self.other_status!r} (want 403 from the proxy)")
        if self.allowed_hosts - {host(self.index)}:
            problems.append(f"allowed {sorted(self.allowed_hosts)}")
        if self.denied_hosts != {other}:
            problems.append(f"denied {sorted(self.denied_hosts)} (want only {other})")
        return problems


def _manifests(base: Path, n: int) -> Path:
    folder = base / "manifests"
    shutil.copytree(REPO / "manifests", folder)
    docs = [
        {
            "apiVersion": "kagura.dev/v1",
            "kind": "EgressPolicy",
            "metadata": {"name": f"conc-{i}"},
            "spec": {
                "allow": [
                    {"host": host(i), "ports": [PORT], "http": True, "allow_addresses": PRIVATE}
                ]
            },
        }
        for i in range(n)
    ]
    (folder / "zz-concurrency.yml").write_text(yaml.safe_dump_all(docs, sort_keys=False))
    return folder


def _step(i: int, n: int) -> str:
    own = f"http://{host(i)}:{PORT}/blob"
    other = f"http://{host((i + 1) % n)}:{PORT}/blob"
    return (
        "for t in $(seq 1200); do test -e .upstream-ready && break; sleep 0.1; done; "
        f"for k in $(seq {FETCHES}); do curl -sf -o /dev/null {own} || exit 7; sleep 0.25; done; "
        "echo ok > own.txt; "
        f"curl -s -o /dev/null -w '%{{http_code}}' {other} > other.txt; true"
    )


def _project(base: Path, i: int, n: int) -> Path:
    root = base / f"project-{i}"
    root.mkdir(parents=True)
    task = {
        "apiVersion": "kagura.dev/v1",
        "kind": "Task",
        "metadata": {"name": f"conc-{i}"},
        "spec": {"egress": [f"conc-{i}"], "steps": [_step(i, n)]},
    }
    (root / "task.yml").write_text(yaml.safe_dump(task, sort_keys=False))
    if os.geteuid() == 0:
        for path in (root, root / "task.yml"):
            os.chown(path, 1000, 1000)
    else:
        root.chmod(0o777)
    return root


def _tree_rss_kb(pid: int) -> int:
    """RSS of ``pid`` and its direct children, kB (0 once gone)."""
    total = 0
    pids = [pid]
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as children:
            pids += [int(p) for p in children.read().split()]
    except OSError:
        return 0
    for p in pids:
        try:
            with open(f"/proc/{p}/status") as status:
                for line in status:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
        except OSError:
            continue
    return total


def _cpu_ms(pid: int) -> float:
    """CPU time of ``pid`` and its reaped children so far (user + system), ms; 0 if gone."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(f) for f in fields[11:15]) * 1000 / os.sysconf("SC_CLK_TCK")


def _cgroup_cpu_ms(container_id: str) -> float:
    """CPU time charged to a container's cgroup so far, ms (0 if unreadable)."""
    for path, scale in (
        (f"/sys/fs/cgroup/cpuacct/docker/{container_id}/cpuacct.usage", 1e-6),
        (f"/sys/fs/cgroup/system.slice/docker-{container_id}.scope/cpu.stat", 1e-3),
    ):
        try:
            text = Path(path).read_text()
        except OSError:
            continue
        if path.endswith("cpu.stat"):
            text = text.split("usage_usec", 1)[1].split()[0]
        return int(text) * scale
    return 0.0


def daemon_cpu_ms() -> float:
    """CPU time of dockerd, containerd and the shims so far, ms (shared with everyone)."""
    total = 0.0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            name = (entry / "comm").read_text().strip()
        except OSError:
            continue
        if name in ("dockerd", "containerd") or name.startswith("containerd-shim"):
            total += _cpu_ms(int(entry.name))
    return total


def _cgroup_memory_kb(container_id: str) -> tuple[int, int]:
    """(peak usage, current rss) of a container's memory cgroup, kB; (0, 0) if unreadable."""
    for base in (
        f"/sys/fs/cgroup/memory/docker/{container_id}",
        f"/sys/fs/cgroup/system.slice/docker-{container_id}.scope",
    ):
        peak_file = "memory.max_usage_in_bytes" if "/memory/" in base else "memory.peak"
        try:
            peak = int(Path(base, peak_file).read_text()) // 1024
            stat = dict(line.split() for line in Path(base, "memory.stat").read_text().splitlines())
            rss = int(stat.get("total_rss", stat.get("anon", 0))) // 1024
            return peak, rss
        except (OSError, ValueError):
            continue
    return 0, 0


class _Watcher(threading.Thread):
    """Attach the upstream to each run's outbound network; sample memory; until stopped."""

    def __init__(self, client: Any, upstream: Any, procs: dict[int, Any], roots: list[Path]):
        super().__init__(daemon=True)
        self.client, self.upstream, self.procs, self.roots = client, upstream, procs, roots
        self.stop = threading.Event()
        self.attached: set[str] = set()
        self.rss: dict[int, int] = {}
        self.proxy: dict[int, tuple[int, int]] = {}
        self.cpu: dict[int, float] = {}
        self.container_cpu: dict[tuple[int, str], float] = {}
        self.error: BaseException | None = None
        self.aliases = [host(i) for i in range(len(roots))]
        self.runs: dict[str, int] = {}  # run id -> index, learnt from the proxies' labels

    def _index(self, labels: dict[str, str]) -> int | None:
        parts = labels.get(owner.LABEL_OWNER, "").rsplit(":", 2)
        if len(parts) == 3 and parts[1].isdigit():
            return self.procs.get(int(parts[1]))
        return None

    def _attach(self) -> None:
        label = f"{owner.LABEL_COMPONENT}={owner.COMPONENT_OUTBOUND}"
        for net in self.client.api.networks(filters={"label": label}):
            index = self._index(net.get("Labels") or {})
            if index is None or net["Id"] in self.attached:
                continue
            try:
                self.client.api.connect_container_to_network(
                    self.upstream.id, net["Id"], aliases=self.aliases
                )
            except Exception:
                continue  # the run is already tearing it down
            self.attached.add(net["Id"])
            (self.roots[index] / ".upstream-ready").write_text("go\n")

    def _sample(self) -> None:
        for pid, index in self.procs.items():
            self.rss[index] = max(self.rss.get(index, 0), _tree_rss_kb(pid))
            self.cpu[index] = max(self.cpu.get(index, 0.0), _cpu_ms(pid))
        for summary in self.client.api.containers(filters={"label": "dev.kagura.run"}):
            labels = summary.get("Labels") or {}
            kind = "proxy" if owner.LABEL_OWNER in labels else "agent"
            index = (
                self._index(labels) if kind == "proxy" else self.runs.get(labels.get(LABEL_RUN, ""))
            )
            if index is None:
                continue
            key = (index, kind)
            self.container_cpu[key] = max(
                self.container_cpu.get(key, 0.0), _cgroup_cpu_ms(summary["Id"])
            )
            if kind == "proxy":
                self.runs[labels.get(LABEL_RUN, "")] = index
                peak, rss = _cgroup_memory_kb(summary["Id"])
                old = self.proxy.get(index, (0, 0))
                self.proxy[index] = (max(old[0], peak), max(old[1], rss))

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                self._attach()
                self._sample()
                self.stop.wait(0.1)
        except BaseException as exc:  # reported by run_concurrent
            self.error = exc


def _events(output: str) -> tuple[set[str], set[str]]:
    allowed, denied = set(), set()
    for line in output.splitlines():
        line = line.strip()
        if not (line.startswith("{") and line.endswith("}")):
            continue
        try:
            item = json.loads(line)
        except ValueError:
            continue
        if item.get("kind") == "egress" and item.get("host"):
            (allowed if item.get("decision") == "allow" else denied).add(str(item["host"]))
    return allowed, denied


def run_concurrent(
    client: Any, base: Path, n: int, *, timeout: float = 600, env: dict[str, str] | None = None
) -> list[Outcome]:
    """Start ``n`` applies at once on a fresh state directory under ``base``; their outcomes."""
    manifests = _manifests(base, n)
    roots = [_project(base, i, n) for i in range(n)]
    state = base / "state"
    run_env = {**(env or os.environ), "KAGURA_AGENT_STATE_DIR": str(state), "NO_COLOR": "1"}
    upstream = client.containers.run(
        images.image_ref("base"),
        ["sh", "-c", SERVE],
        detach=True,
        labels=LABEL,
        user="1000:1000",
        network_mode="none",
    )
    outcomes = [Outcome(i) for i in range(n)]
    procs: dict[int, Any] = {}
    popen: list[subprocess.Popen[str]] = []
    watcher: _Watcher | None = None
    try:
        deadline = time.monotonic() + 30
        while b"ready" not in upstream.logs():
            assert time.monotonic() < deadline, "upstream never started"
            time.sleep(0.05)
        # Disconnected from "none" so it can join the runs' bridges.
        client.api.disconnect_container_from_network(upstream.id, "none")
        started = time.perf_counter()
        for i, root in enumerate(roots):
            argv = [sys.executable, "-m", "kagura_agent", "apply", "--yes", "--json"]
            argv += ["--manifests", str(manifests), "--approve", f"egress:conc-{i}"]
            argv += [str(root / "task.yml")]
            proc = subprocess.Popen(
                argv,
                env=run_env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                cwd=REPO,
            )
            popen.append(proc)
            procs[proc.pid] = i
        watcher = _Watcher(client, upstream, procs, roots)
        watcher.start()
        readers = []
        for i, proc in enumerate(popen):

            def collect(i: int = i, proc: subprocess.Popen[str] = proc) -> None:
                assert proc.stdout is not None
                lines = []
                for line in proc.stdout:
                    lines.append(line)
                    outcomes[i].stamps.append(((time.perf_counter() - started) * 1000, line))
                proc.wait()
                outcomes[i].wall_ms = (time.perf_counter() - started) * 1000
                outcomes[i].exit_code = proc.returncode
                outcomes[i].output = "".join(lines)

            reader = threading.Thread(target=collect, daemon=True)
            reader.start()
            readers.append(reader)
        for reader in readers:
            reader.join(timeout=max(1.0, started + timeout - time.perf_counter()))
    finally:
        if watcher is not None:
            watcher.stop.set()
            watcher.join(timeout=10)
        for proc in popen:
            if proc.poll() is None:
                proc.kill()
        upstream.remove(force=True)
    if watcher is not None and watcher.error is not None:
        raise watcher.error
    for outcome, root in zip(outcomes, roots, strict=True):
        own = root / "own.txt"
        other = root / "other.txt"
        outcome.own_ok = own.exists() and own.read_text().strip() == "ok"
        outcome.other_status = other.read_text().strip() if other.exists() else ""
        outcome.allowed_hosts, outcome.denied_hosts = _events(outcome.output)
        if watcher is not None:
            outcome.peak_rss_kb = watcher.rss.get(outcome.index, 0)
            outcome.proxy_peak_kb, outcome.proxy_rss_kb = watcher.proxy.get(outcome.index, (0, 0))
            outcome.apply_cpu_ms = watcher.cpu.get(outcome.index, 0.0)
            outcome.proxy_cpu_ms = watcher.container_cpu.get((outcome.index, "proxy"), 0.0)
            outcome.agent_cpu_ms = watcher.container_cpu.get((outcome.index, "agent"), 0.0)
    return outcomes
