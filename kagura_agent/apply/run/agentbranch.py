"""One run's side of the agent's branch (``spec.commits: branch``; kagura_agent/agentgit).

Three moments of the container run (apply/run/container.py):

- ``seed``: right after the agent's container starts, before the brain's turn: its
  repository made from the operator's HEAD (a failure stops the run: the plan promised
  the branch);
- ``export``: when the brain's turn is over, its credentials wiped, before its container
  is stopped (the repository is a tmpfs of that container): its refs and one bundle,
  into a host folder of this run's;
- ``take``: after verify, every container of the run gone: the checked commits fetched
  into the operator's repository as ``kagura/<task>/<run>`` — or not, saying why. A run
  the host stopped (a tripwire, the disk budget) brings nothing back.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path

from kagura_agent.agentgit.export import Exported, export_branch
from kagura_agent.agentgit.importer import Imported, import_branch
from kagura_agent.agentgit.seed import seed_argv
from kagura_agent.apply.records.progress import AgentRepository, BranchTaken, BranchTaking
from kagura_agent.apply.run.context import ApplyRuntime, RunContext
from kagura_agent.errors import KaguraError, SetupError
from kagura_agent.plan.commits import branch_of


class AgentBranch:
    """The run's branch; inert when the plan has no ``commits`` section."""

    def __init__(self, ctx: RunContext) -> None:
        self.ctx = ctx
        self.section = ctx.plan.get("commits")
        self.branch = branch_of(self.section, ctx.run_id) if self.section else ""
        self._folder: Path | None = None
        self._exported: Exported | None = None

    @property
    def active(self) -> bool:
        return self.section is not None and not self.section["problem"]

    def seed(self, runtime: ApplyRuntime, container_id: str) -> None:
        """Make the agent's repository in its started container (before its turn)."""
        if not self.active or self.section is None:
            return
        argv = seed_argv(str(self.section["seed"]), self.branch, self.section["object_format"])
        user = self.ctx.plan["hardening"]["user"]
        try:
            code, output = runtime.exec(container_id, argv, user=user, workdir="/")
        except KaguraError as exc:
            raise SetupError(f"could not make the agent's repository: {exc.message}") from None
        if code != 0:
            said = output.decode("utf-8", "replace").strip()[-300:]
            raise SetupError(f"could not make the agent's repository (exit {code}): {said}")
        self.ctx.live.emit(AgentRepository(self.branch, str(self.section["seed"])))

    async def export(self, runtime: ApplyRuntime, container_id: str) -> None:
        """Take its refs and its branch out of the still-running container."""
        if not self.active or self.section is None:
            return
        self._folder = Path(tempfile.mkdtemp(prefix="kagura-commits-"))
        self._exported = await asyncio.to_thread(
            export_branch,
            runtime,
            container_id,
            user=self.ctx.plan["hardening"]["user"],
            seed=str(self.section["seed"]),
            branch=self.branch,
            limit=int(self.section["bundle_bytes"]),
            folder=self._folder,
            note=lambda _line: self.ctx.live.emit(BranchTaking(self.branch)),
        )

    def take(self, stopped: str | None) -> Imported | None:
        """Import the branch (every container gone); None when the task asked for none."""
        if self.section is None:
            return None
        try:
            if self.section["problem"]:
                result = Imported(self.branch, "refused", why=str(self.section["problem"]))
            elif stopped:
                result = Imported(
                    self.branch, "refused", why=f"the host stopped the run ({stopped})"
                )
            elif self._exported is None:
                result = Imported(
                    self.branch, "refused", why="its container ended before its turn did"
                )
            else:
                self.ctx.live.emit(BranchTaking(self.branch, checking=True))
                result = import_branch(
                    self.section, self.ctx.plan["task"]["project_root"], self.branch, self._exported
                )
        finally:
            self.close()
        summary = result.summary(self.ctx.plan["task"]["project_root"])
        self.ctx.live.emit(BranchTaken(summary, result.status == "imported"))
        return result

    def close(self) -> None:
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None
