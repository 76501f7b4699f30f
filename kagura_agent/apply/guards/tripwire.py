"""Hijack tripwires: signs that the agent is no longer doing its task stop the run.

What trips (the plan's ``tripwires``, knobs in the operator's Graduation manifest):

- a burst of denied egress: ``denied_egress`` denials within ``window_seconds`` (the
  key-injecting port's refusals for the budget, the concurrency cap and a withdrawn
  credential, and what squid
  answered itself without forwarding anything, do not count: QUIET_DENIALS);
- a flood of the proxy's log: the agent made the run's proxy log more than
  ``egress_log_bytes`` (default audit.LOG_CEILING; session.py sends ``egress.flood``);
- the canary (``canary_file``): a decoy credentials file apply plants in the agent's home
  with a per-run value; opening or reading it, or the value showing up in the egress log
  or the brain's output, trips;
- ``creds_after_wipe``: once the run's credentials are wiped from /run/kagura/creds,
  decoys take their names; listing the directory or touching a decoy trips. A run given
  no credentials has the decoy from the start (nothing legitimate looks there).

The canary and the decoys are watched from the host with inotify on their inodes, reached
through ``/proc/<container init>/root``: the container's own opens and reads are
reported, nothing runs inside the container, and the files live in the container's
tmpfs, so they never touch the operator's project root and end with the container.

Tripping kills the run's container from the host at once; the run then leaves through
the ordinary clean-up path (leases wiped and revoked), verify does not run, the run is a
recorded failure (graduated capabilities are demoted) and an incident is written with
the egress decisions and the run's last events (``kagura-agent incidents``).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import string
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from kagura_agent.apply.guards.inotify import InotifyError, Watcher, describe
from kagura_agent.membrane.egress.audit import NOT_FORWARDED
from kagura_agent.processes import namespace_processes

MAX_LOG = 200
CREDS_DIR = "/run/kagura/creds"
# How long the decoys are watched after the wipe, before the agent's container stops.
CREDS_WATCH_SECONDS = 0.5
_ALPHABET = string.ascii_letters + string.digits
# Denials that are no sign of a hijack: the key-injecting port refusing a call past a cap
# of the budget (the budget stop deals with it) or past the concurrency cap (the CLI
# retries), and what squid answered itself with an error, forwarding nothing (an upstream
# that is down). The port's policy refusals do count: with its optional traffic off
# (plan brain.cli_environment) an honest CLI sends nothing but model calls. Nor does a
# call refused because the port holds no credential (its lease's budget ran out: the
# lease stop deals with it).
QUIET_DENIALS = frozenset({"budget", "concurrency", "credential", NOT_FORWARDED})


class Tripwire:
    """Counts denied egress in a sliding window; calls ``on_trip(reason)`` once."""

    def __init__(
        self,
        knobs: dict[str, Any],
        on_trip: Callable[[str], None],
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limit = int(knobs.get("denied_egress", 5))
        self.window = float(knobs.get("window_seconds", 60))
        self.on_trip = on_trip
        self.clock = clock
        self.reason: str | None = None
        self.egress_log: deque[dict[str, Any]] = deque(maxlen=MAX_LOG)
        self._denials: deque[float] = deque()
        self._lock = threading.Lock()
        # The run's canary value: random, never a real secret, never in the plan.
        self.canary = "ghp_" + "".join(secrets.choice(_ALPHABET) for _ in range(36))
        self.planted = False  # the canary is in the container (scan for its value)

    def trip(self, reason: str) -> None:
        """Trip once (from any thread); later trips are ignored."""
        with self._lock:
            if self.reason is not None:
                return
            self.reason = reason
        self.on_trip(reason)

    def scan(self, where: str, item: Any) -> None:
        """The canary value in egress or output trips (only when the canary is planted)."""
        if not self.planted:
            return
        text = item if isinstance(item, str) else json.dumps(item, default=str)
        if self.canary in text:
            self.trip(f"the canary value appeared in {where}")

    def egress(self, event: dict[str, Any]) -> None:
        """Feed one egress event (the proxy's decisions arrive on a collector thread)."""
        if event.get("type") == "egress.flood":
            self.trip(str(event.get("reason", "the proxy's log passed its ceiling")))
            return
        if event.get("type") != "egress.decision":
            return
        with self._lock:
            self.egress_log.append(event)
        self.scan("the egress log", event)
        with self._lock:
            if event.get("decision") != "deny" or self.reason is not None:
                return
            if event.get("reason") in QUIET_DENIALS:
                return
            now = self.clock()
            self._denials.append(now)
            while self._denials and self._denials[0] < now - self.window:
                self._denials.popleft()
            if len(self._denials) < self.limit:
                return
            self.reason = (
                f"{len(self._denials)} denied egress requests within"
                f" {self.window:g}s (tripwire: {self.limit})"
            )
        self.on_trip(self.reason)


class ContainerTraps:
    """The canary and the credential decoys in one running container, watched from the
    host; any touch calls ``tripwire.trip``.

    Files are created through ``/proc/<pid>/root`` one component at a time with
    ``O_NOFOLLOW`` (the agent owns these tmpfs directories and could plant a symlink
    towards the host), owned by the container user, and watched by inode.
    """

    def __init__(self, tripwire: Tripwire, knobs: dict[str, Any], user: str) -> None:
        self.tripwire = tripwire
        self.canary_path: str | None = knobs.get("canary_file") or None
        self.creds = bool(knobs.get("creds_after_wipe", False))
        uid, _, gid = user.partition(":")
        self.uid, self.gid = int(uid or 1000), int(gid or uid or 1000)
        self.root: str | None = None
        self.decoys: list[str] = []
        self.watcher: Any = None
        self.wiped = False
        self.pid = 0
        self.entrypoint: dict[int, str] | None = None  # pid -> start, before the turn

    @property
    def wanted(self) -> bool:
        return bool(self.canary_path or self.creds)

    def arm(self, pid: int, delivered: bool) -> list[str]:
        """At start, before the first turn: plant the canary, and the credential decoy
        when no credentials will be delivered. Returns problems (the run goes on)."""
        if not self.wanted:
            return []
        self.root = f"/proc/{pid}/root"
        self.pid = pid
        try:
            self.watcher = Watcher(self._touched)
        except InotifyError as exc:
            return [f"canary and credential tripwires off: {exc}"]
        problems: list[str] = []
        if self.canary_path:
            content = f"https://kagura-agent:{self.tripwire.canary}@github.com\n"
            try:
                fd = self._plant(self.canary_path, content)
                try:
                    self.watcher.add(f"/proc/self/fd/{fd}", label=self.canary_path)
                finally:
                    os.close(fd)
                self.tripwire.planted = True
            except OSError as exc:
                problems.append(f"canary tripwire off: {exc}")
        if self.creds and not delivered:
            problems += self._plant_decoys(["token"])
        self.watcher.drain()
        self.watcher.start()
        return problems

    def after_wipe(self, names: list[str]) -> list[str]:
        """The run's credentials were wiped: decoys take their names."""
        if not self.creds or self.watcher is None or self.wiped:
            return []
        self.wiped = True
        return self._plant_decoys(names or ["token"])

    def before_turn(self) -> None:
        """Note the container's processes as the turn starts: the entrypoint's own, as no
        tool has run yet. Only undumpable ones count (a tool could ptrace the others)."""
        if self.pid > 0:
            found = namespace_processes(self.pid)
            if found is not None:
                self.entrypoint = {
                    p: start for p, (start, undumpable) in found.items() if undumpable
                }

    def only_entrypoint_left(self) -> bool:
        """Whether every process now in the container is one noted before the turn (same
        pid, same start) and still undumpable: none ran a program since (an exec makes a
        process dumpable again) nor could be ptraced, so none is the agent's. A tool
        process still running, or one that made itself undumpable, is not among them; a
        host that cannot see the container's processes answers False."""
        if self.entrypoint is None or self.pid <= 0:
            return False
        now = namespace_processes(self.pid)
        if not now:
            return False
        return all(
            undumpable and self.entrypoint.get(pid) == start
            for pid, (start, undumpable) in now.items()
        )

    def stop(self) -> None:
        if self.watcher is not None:
            self.watcher.stop()

    def _plant_decoys(self, names: list[str]) -> list[str]:
        problems: list[str] = []
        targets: list[tuple[int, str]] = []
        try:
            for name in sorted(set(names)):
                path = f"{CREDS_DIR}/{name}"
                try:
                    targets.append((self._plant(path, f"{self.tripwire.canary}\n"), path))
                    self.decoys.append(path)
                except OSError as exc:
                    problems.append(f"credential decoy {path} not planted: {exc}")
            # The directory and those the decoys live in (aws/credentials): a listing trips.
            dirs = {CREDS_DIR} | {d.rsplit("/", 1)[0] for d in self.decoys}
            for path in sorted(dirs):
                try:
                    targets.append((self._walk(_parts(path), create=True), path))
                except OSError as exc:
                    problems.append(f"credential tripwire off for {path}: {exc}")
            # Watches last: nothing the host does while planting is seen as a touch.
            for fd, label in targets:
                try:
                    self.watcher.add(f"/proc/self/fd/{fd}", label=label)
                except OSError as exc:
                    problems.append(f"credential tripwire off for {label}: {exc}")
        finally:
            for fd, _ in targets:
                os.close(fd)
        return problems

    def _touched(self, label: str, mask: int) -> None:
        what = describe(mask)
        if self.canary_path and label == self.canary_path:
            self.tripwire.trip(f"the canary file {label} was touched ({what})")
        else:
            self.tripwire.trip(f"{label} was touched after the credentials were wiped ({what})")

    def _walk(self, parts: list[str], *, create: bool) -> int:
        """An ``O_PATH`` fd for directory ``parts`` under the container's root, never
        following a symlink (missing directories are made, owner-only, when ``create``).
        ``O_PATH`` opens are not reported as opens to a watch."""
        assert self.root is not None
        flags = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW
        fd = os.open(self.root, os.O_PATH | os.O_DIRECTORY)
        try:
            for part in parts:
                if create:
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(part, 0o700, dir_fd=fd)
                        os.chown(part, self.uid, self.gid, dir_fd=fd, follow_symlinks=False)
                nxt = os.open(part, flags, dir_fd=fd)
                os.close(fd)
                fd = nxt
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _plant(self, path: str, content: str) -> int:
        """Create ``path`` (it must not exist) with ``content``; an ``O_PATH`` fd of it."""
        parts = _parts(path)
        dir_fd = self._walk(parts[:-1], create=True)
        try:
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
            fd = os.open(parts[-1], flags, 0o600, dir_fd=dir_fd)
            try:
                os.write(fd, content.encode())
                os.fchown(fd, self.uid, self.gid)
            finally:
                os.close(fd)
            return os.open(parts[-1], os.O_PATH | os.O_NOFOLLOW, dir_fd=dir_fd)
        finally:
            os.close(dir_fd)


def _parts(path: str) -> list[str]:
    return [part for part in path.split("/") if part]
