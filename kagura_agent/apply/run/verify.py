"""The independent success check: the task's verify commands, run by the host.

The brain's container is stopped first — every process in it gone, a ``setsid``
lingerer too, since its PID namespace ends with its init. The commands then run, through
Docker's exec API, in a fresh container from the same image with the same mounts (the
project root), as the plan's container user in the project root: no network, no
environment, no credentials (its /run/kagura is a new, empty tmpfs) and no brain
channel. Their exit codes — never the agent's report — decide success. Each command is
bounded by ``timeout`` inside the container.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Callable

from kagura_agent import hostproc
from kagura_agent.apply.run.context import ApplyRuntime, VerifyResult
from kagura_agent.errors import KaguraError
from kagura_agent.plan.model import Plan

VERIFY_SECONDS = 300
OUTPUT_CAP = 4000
STOP_SECONDS = 30


def stop_agent(runtime: ApplyRuntime, container_id: str) -> str | None:
    """Kill the agent's container and wait until it has exited; a problem, or None.

    SIGKILL to its init ends the PID namespace: the kernel kills every process left in
    it, whatever session or process group it put itself in.
    """
    try:
        if runtime.state(container_id).running:
            runtime.kill(container_id)
        # Returns once the container has exited; still running after STOP_SECONDS raises.
        runtime.wait(container_id, timeout=STOP_SECONDS)
    except KaguraError as exc:
        # Gone already (the agent took it down) is stopped; anything else is a problem.
        if "not found" in exc.message:
            return None
        return f"could not stop the agent's container: {exc.message}"
    return None


def verify_in_fresh_container(
    runtime: ApplyRuntime,
    plan: Plan,
    run_id: str,
    commands: list[str],
    *,
    on_container: Callable[[str], None] | None = None,
) -> list[VerifyResult]:
    """Run ``commands`` in a new verify container, removed afterwards (also on error).

    Fail closed: a verify container that cannot be made or started fails every command
    (exit code -1), which the run records as a failure — never an error that skips
    recording.
    """
    hardening = plan["hardening"]
    try:
        container_id = runtime.create(plan, run_id, role="verify")
    except KaguraError as exc:
        return [(c, -1, f"verify could not run: {exc.message}") for c in commands]
    if on_container is not None:
        on_container(container_id)  # the run's disk watch may stop it
    try:
        runtime.start(container_id)
        return verify_in_container(
            runtime, container_id, commands, hardening["workdir"], hardening["user"]
        )
    except KaguraError as exc:
        return [(c, -1, f"verify could not run: {exc.message}") for c in commands]
    finally:
        # Labelled with the run: should this fail, the next apply's sweep removes it.
        with contextlib.suppress(KaguraError):
            runtime.remove(container_id, force=True)


def verify_in_container(
    runtime: ApplyRuntime, container_id: str, commands: list[str], workdir: str, user: str
) -> list[VerifyResult]:
    """Run each command in a running container; one that cannot run counts as failed
    (exit code -1)."""
    results: list[VerifyResult] = []
    for command in commands:
        argv = ["timeout", str(VERIFY_SECONDS), "bash", "-c", command]
        try:
            code, output = runtime.exec(container_id, argv, user=user, workdir=workdir)
        except KaguraError as exc:
            results.append((command, -1, f"verify could not run: {exc.message}"))
            continue
        results.append((command, code, output.decode("utf-8", "replace")[-OUTPUT_CAP:]))
    return results


def verify_on_host(commands: list[str], workdir: str, env: dict[str, str]) -> list[VerifyResult]:
    """For ``runtime: host`` plans (the operator allowed an unsandboxed brain): each
    command in ``workdir`` (the project root: what the agent left there is what is
    checked) with ``env`` only."""
    results: list[VerifyResult] = []
    for command in commands:
        try:
            done = hostproc.run(
                ["bash", "-c", command],
                cwd=workdir,
                env=env,
                capture_output=True,
                text=True,
                timeout=VERIFY_SECONDS,
            )
            results.append((command, done.returncode, (done.stdout + done.stderr)[-OUTPUT_CAP:]))
        except subprocess.TimeoutExpired:
            results.append((command, 124, "verify timed out"))
    return results
