"""The Docker runtime: hardened containers from a launch plan, through docker-py.

This is the adapter boundary for Docker: docker-py and requests exceptions are
translated here into the project's errors (SetupError when the daemon cannot be reached,
RefusedError for a plan we will not run, KaguraError otherwise) and never leak upward.
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from kagura_agent.errors import ExitCode, KaguraError, RefusedError, SetupError
from kagura_agent.membrane import binds, hardening, mounts
from kagura_agent.membrane.egress import forwarder, owner
from kagura_agent.membrane.images import (
    image_present,
    inspect_image,
    local_image_digest,
    refused_by_socket,
    unreachable_hint,
)
from kagura_agent.membrane.isolation import check_tenancy, isolation_report
from kagura_agent.membrane.placeholders import create_missing
from kagura_agent.membrane.roots import check_project_root
from kagura_agent.plan.model import Plan

# Keys of hardening.container_kwargs that belong to the container config; the rest go to
# the host config.
_CREATE_KEYS = frozenset(
    {
        "image",
        "command",
        "user",
        "working_dir",
        "labels",
        "environment",
        "stdin_open",
        "tty",
        "stop_signal",
        "stop_timeout",
        "name",
        "entrypoint",
    }
)


def daemon_isolation_report(client: Any) -> dict[str, Any]:
    """``isolation.isolation_report`` for a live docker-py client (errors become SetupError)."""
    with docker_errors("reading docker info"):
        info = client.info()
    return isolation_report(info)


class ContainerError(KaguraError):
    """Docker refused or failed an operation (the daemon answered; exit 3 like setup)."""

    exit_code = ExitCode.SETUP


@contextlib.contextmanager
def docker_errors(action: str) -> Iterator[None]:
    """Translate docker-py / requests exceptions raised while doing ``action``."""
    import docker.errors
    import requests.exceptions

    try:
        yield
    except docker.errors.NotFound as exc:
        raise ContainerError(f"{action}: not found ({exc.explanation or exc})") from exc
    except docker.errors.APIError as exc:
        raise ContainerError(f"{action}: {exc.explanation or exc}") from exc
    except (
        docker.errors.DockerException,
        requests.exceptions.ConnectionError,
        ConnectionError,
        FileNotFoundError,
    ) as exc:
        if refused_by_socket(exc):
            raise SetupError(
                f"{action}: the Docker socket refuses this user (permission denied)",
                hint=unreachable_hint(denied=True),
            ) from exc
        raise SetupError(
            f"{action}: Docker Engine unreachable ({exc})", hint=unreachable_hint()
        ) from exc


def connect(timeout: int = 60) -> Any:
    """A docker-py client for the local daemon (SetupError when it does not answer)."""
    import docker

    with docker_errors("connecting to Docker"):
        # from_env asks the daemon for its API version (one round trip): that answer is
        # the proof it is reachable, so no separate ping.
        client = docker.from_env(timeout=timeout)
    return client


def check_image_digest(plan: Plan) -> str:
    """Return the plan's image ID after checking this daemon holds exactly that image.

    Refuses (exit 6, naming the image) when the image was unresolved at plan time or the
    pinned ID is not here (another build behind the tag, or never pulled). The tag is not
    consulted: the plan pins the image, and the container is created from its ID.
    """
    image = plan["image"]
    ref, planned = image["ref"], image["digest"]
    hint = f"run `kagura-agent images build {image['name']}`, then plan again"
    if not planned:
        raise RefusedError(f"image {ref} had no local digest when the plan was made", hint=hint)
    if not image_present(planned):
        local = local_image_digest(ref)
        here = f"{ref} is {local} here" if local else f"{ref} is not here"
        raise RefusedError(
            f"image {ref} differs on this Docker host: the plan pins {planned}, {here}",
            hint=(
                f"push it (`kagura-agent images push {image['name']}`) and plan again"
                if not image["pull"]
                else "plan again to review the image this host has"
            ),
        )
    return str(planned)


def check_proxy_digest(plan: Plan) -> str | None:
    """The plan's egress proxy image ID after checking this daemon holds exactly it.

    None when the plan has no proxy or pinned none (planned where the proxy was not
    built: the proxy's own start says so). Refuses (exit 6) as ``check_image_digest``.
    """
    proxy = plan["egress"].get("proxy")
    if not proxy or not proxy["digest"]:
        return None
    ref, planned = proxy["ref"], proxy["digest"]
    if not image_present(planned):
        local = local_image_digest(ref)
        here = f"{ref} is {local} here" if local else f"{ref} is not here"
        raise RefusedError(
            f"egress proxy image {ref} differs on this Docker host: the plan pins {planned},"
            f" {here}",
            hint=(
                "push it (an Image manifest built from images/egress-proxy with a repository,"
                " `kagura-agent images push NAME`) and plan again"
                if not proxy["pull"]
                else "plan again to review the proxy image this host has"
            ),
        )
    return str(planned)


def check_plan_mounts(plan: Plan) -> None:
    """Re-check every bind mount against the host file system right before launch.

    The project root's hard rules are checked again too (the file system may have moved
    since the plan); ownership and declared workspace roots were settled by the plan.
    """
    root = plan["task"]["project_root"]
    problem = check_project_root(root, allowed=[root])
    if problem:
        raise RefusedError(problem)
    create_missing(plan)  # absent host inputs, held empty (apply removes them after)
    for mount in plan["mounts"]:
        problem = mounts.check_mount(mount["source"], root, writable=mount["mode"] == "rw")
        if problem:
            raise RefusedError(problem)


def split_kwargs(kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Split flat kwargs into (create_container kwargs, create_host_config kwargs)."""
    create = {k: v for k, v in kwargs.items() if k in _CREATE_KEYS}
    host = {k: v for k, v in kwargs.items() if k not in _CREATE_KEYS}
    return create, host


def _with_forwarder(
    image_id: str, command: list[str] | None, forward: Sequence[tuple[str, int]]
) -> list[str]:
    """The image's entrypoint and command (or ``command``), behind the forwarder's launcher."""
    found = inspect_image(image_id)
    if found is None:
        raise SetupError(f"image {image_id} could not be inspected")
    config = found.get("Config") or {}
    argv = [*(config.get("Entrypoint") or []), *(command or config.get("Cmd") or [])]
    if not argv:
        raise SetupError(f"image {image_id} has no entrypoint or command to run")
    return forwarder.launcher(forward, argv)


class DockerRuntime:
    """Create, start, attach to, wait for, stop and remove plan containers."""

    def __init__(self, client: Any | None = None, *, owner_key: str = "") -> None:
        """``owner_key``: the state store the runs are recorded in (state.owner_key); each
        container then carries it and its creating process, for the crash sweeps."""
        self.client = client if client is not None else connect()
        self.owner_key = owner_key
        # What create checked of each container's bind sources, compared at start.
        self._binds: dict[str, list[binds.Identity]] = {}

    def create(
        self,
        plan: Plan,
        run_id: str,
        *,
        command: list[str] | None = None,
        environment: dict[str, str] | None = None,
        network: str | None = None,
        egress_mounts: Sequence[Mapping[str, Any]] | None = None,
        role: str = "agent",
        forward: Sequence[tuple[str, int]] = (),
    ) -> str:
        """Create the plan's container (not started); returns its id. The keywords are
        those of :class:`~kagura_agent.membrane.hardening.ContainerSpec`."""
        return self.create_container(
            hardening.ContainerSpec(
                plan,
                run_id,
                role=role,
                command=command,
                environment=environment or {},
                network=network,
                egress_mounts=egress_mounts or (),
                forward=forward,
            )
        )

    def create_container(self, spec: hardening.ContainerSpec) -> str:
        """Create the container ``spec`` describes (not started); returns its id.

        ``spec.forward`` (the egress forwarder's (socket, port) pairs): the container's own
        command starts the forwarder before the image's entrypoint (forwarder.launcher),
        so the agent's way out listens from its start, with no ``docker exec``.

        Checks, in order: tenancy gate, image digest, mounts; then the hardening floor
        in ``container_kwargs``. The container is created from the image ID, not the tag,
        so a re-tag between the check and the create cannot swap the image.
        """
        plan, run_id = spec.plan, spec.run_id
        check_tenancy(plan["hardening"])
        image_id = check_image_digest(plan)
        check_plan_mounts(plan)
        try:
            identities = binds.source_identities(plan, spec.role)
        except (ValueError, OSError) as exc:
            raise RefusedError(str(exc)) from None
        kwargs = hardening.container_kwargs(spec)
        if self.owner_key:
            kwargs["labels"] = {
                **kwargs["labels"],
                hardening.LABEL_STORE: self.owner_key,
                owner.LABEL_OWNER: owner.current_owner(),
            }
        if spec.forward:
            kwargs["entrypoint"] = _with_forwarder(image_id, kwargs.get("command"), spec.forward)
            kwargs["command"] = None
        create, host = split_kwargs(kwargs)
        api = self.client.api
        with docker_errors(f"creating the container for run {run_id}"):
            host_config = api.create_host_config(**host)
            # use_config_proxy=False: ~/.docker/config.json proxies must not leak in.
            result = api.create_container(
                host_config=host_config,
                use_config_proxy=False,
                **create,
            )
        self._binds[str(result["Id"])] = identities
        return str(result["Id"])

    def start(self, container_id: str) -> None:
        """Start a created container; RefusedError (the container killed) when one of its
        bind mounts is not the folder ``create`` checked (membrane/binds.py)."""
        with docker_errors(f"starting container {container_id[:12]}"):
            self.client.api.start(container_id)
        expected = self._binds.pop(container_id, None)
        if not expected:
            return
        pid = int(self.inspect(container_id)["State"].get("Pid") or 0)
        problems = binds.mismatches(
            expected, pid, lambda targets: self._stat_inside(container_id, targets)
        )
        if problems:
            with contextlib.suppress(ContainerError):
                self.kill(container_id)
            raise RefusedError("; ".join(problems))

    def _stat_inside(self, container_id: str, targets: list[str]) -> list[str] | None:
        """``DEV:INO`` of each target, seen from inside; None when it runs no more."""
        api = self.client.api
        argv = ["stat", "-c", "%d:%i", "--", *targets]
        try:
            with docker_errors(f"checking the mounts of container {container_id[:12]}"):
                exec_id = api.exec_create(
                    container_id, argv, stdout=True, stderr=False, workdir=hardening.START_DIR
                )["Id"]
                output = api.exec_start(exec_id, demux=False) or b""
        except ContainerError:
            if self.inspect(container_id)["State"].get("Running"):
                raise
            return None
        return bytes(output).decode("ascii", "replace").split()

    def attach_socket(self, container_id: str) -> socket.socket:
        """A raw socket on the container's stdin/stdout/stderr (call before ``start``).

        Writes go to the process's stdin; ``shutdown(SHUT_WR)`` sends EOF. Reads return
        Docker's multiplexed stream (8-byte frame headers, since there is no TTY); use
        ``kagura_agent.membrane.attach.read_frames`` to demultiplex.
        """
        params = {"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1}
        with docker_errors(f"attaching to container {container_id[:12]}"):
            wrapper = self.client.api.attach_socket(container_id, params=params)
        raw = getattr(wrapper, "_sock", wrapper)
        return raw  # type: ignore[no-any-return]

    def wait(self, container_id: str, timeout: float | None = None) -> dict[str, Any]:
        """Wait for the container to exit: ``{"exit_code": int, "oom_killed": bool}``."""
        import requests.exceptions

        try:
            with docker_errors(f"waiting for container {container_id[:12]}"):
                result = self.client.api.wait(container_id, timeout=timeout)
        except requests.exceptions.ReadTimeout as exc:
            raise ContainerError(f"container {container_id[:12]} still running") from exc
        state = self.inspect(container_id)["State"]
        return {
            "exit_code": int(result.get("StatusCode", state.get("ExitCode", -1))),
            "oom_killed": bool(state.get("OOMKilled")),
            "error": (result.get("Error") or {}).get("Message") or state.get("Error") or "",
        }

    def inspect(self, container_id: str) -> dict[str, Any]:
        """``docker inspect`` of the container."""
        with docker_errors(f"inspecting container {container_id[:12]}"):
            return self.client.api.inspect_container(container_id)  # type: ignore[no-any-return]

    def logs(self, container_id: str) -> bytes:
        """Everything the container wrote to stdout and stderr."""
        with docker_errors(f"reading logs of container {container_id[:12]}"):
            return bytes(self.client.api.logs(container_id, stdout=True, stderr=True))

    def stop(self, container_id: str, timeout: int | None = None) -> None:
        """SIGTERM, then SIGKILL after ``timeout`` (default: the container's stop timeout)."""
        with docker_errors(f"stopping container {container_id[:12]}"):
            self.client.api.stop(container_id, timeout=timeout)

    def kill(self, container_id: str, signal: str = "SIGKILL") -> None:
        """Send a signal to the container's init process."""
        with docker_errors(f"killing container {container_id[:12]}"):
            self.client.api.kill(container_id, signal=signal)

    def remove(self, container_id: str, *, force: bool = True) -> None:
        """Remove the container (and its anonymous volumes); absent is not an error."""
        import docker.errors

        try:
            with docker_errors(f"removing container {container_id[:12]}"):
                self.client.api.remove_container(container_id, force=force, v=True)
        except ContainerError as exc:
            cause = exc.__cause__
            if isinstance(cause, docker.errors.NotFound):
                return
            # Another remover (a concurrent sweep, the daemon) got there first: wait for it.
            if "already in progress" in str(getattr(cause, "explanation", "") or cause):
                self._wait_gone(container_id)
                return
            raise

    def _wait_gone(self, container_id: str, timeout: float = 30.0) -> None:
        import docker.errors

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with docker_errors(f"waiting for container {container_id[:12]} to go"):
                    self.client.api.inspect_container(container_id)
            except ContainerError as exc:
                if isinstance(exc.__cause__, docker.errors.NotFound):
                    return
                raise
            time.sleep(0.1)
        raise ContainerError(f"container {container_id[:12]} is still being removed")

    def list(self, labels: dict[str, str] | None = None, *, all: bool = True) -> list[str]:
        """Ids of containers carrying every given label (any value when the value is "")."""
        wanted = [k if not v else f"{k}={v}" for k, v in (labels or {}).items()]
        wanted = wanted or [hardening.LABEL_RUN]
        with docker_errors("listing containers"):
            found = self.client.api.containers(all=all, filters={"label": wanted})
        return [str(c["Id"]) for c in found]
