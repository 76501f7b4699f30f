"""The independent success check: the task's verify commands, run by the host.

They run inside the run's container (as the plan's container user, in the project root) through Docker's
exec API after the brain has finished; their exit codes — never the agent's report —
decide success. Each command is bounded by ``timeout`` inside the container.
"""

from __future__ import annotations

import subprocess
from typing import Any

from kagura_agent.errors import KaguraError
from kagura_agent.membrane.runtime import docker_errors

VERIFY_SECONDS = 300
OUTPUT_CAP = 4000


def verify_in_container(
    runtime: Any, container_id: str, commands: list[str], workdir: str, user: str
) -> list[tuple[str, int, str]]:
    """Run each command; one that cannot run at all counts as failed (exit code -1).

    Fail closed: the agent can take its own container down (kill its brain, or leave a
    process behind that does it after the turn). That must make the run a recorded
    failure, which demotes graduated capabilities — never an error that skips recording.
    """
    results = []
    api = runtime.client.api
    for command in commands:
        argv = ["timeout", str(VERIFY_SECONDS), "bash", "-c", command]
        try:
            with docker_errors(f"running verify {command!r}"):
                exec_id = api.exec_create(
                    container_id, argv, user=user, workdir=workdir, stdout=True, stderr=True
                )["Id"]
                output = api.exec_start(exec_id, demux=False) or b""
                code = api.exec_inspect(exec_id).get("ExitCode")
        except KaguraError as exc:
            results.append((command, -1, f"verify could not run: {exc.message}"))
            continue
        text = output.decode("utf-8", "replace")[-OUTPUT_CAP:]
        results.append((command, int(code if code is not None else -1), text))
    return results


def verify_on_host(commands: list[str], workdir: str) -> list[tuple[str, int, str]]:
    """For ``runtime: host`` plans (the operator allowed an unsandboxed brain)."""
    results = []
    for command in commands:
        try:
            done = subprocess.run(
                ["bash", "-c", command],
                cwd=workdir,
                capture_output=True,
                text=True,
                timeout=VERIFY_SECONDS,
            )
            results.append((command, done.returncode, (done.stdout + done.stderr)[-OUTPUT_CAP:]))
        except subprocess.TimeoutExpired:
            results.append((command, 124, "verify timed out"))
    return results
