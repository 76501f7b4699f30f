"""Sub-agents at run time: the host side of the brain's ``dispatch`` tool.

    the brain's request (over the channel) → checked (names, paths, sizes)
    → the context it chose handed over (patterns.dispatch: load_context, handoff)
    → what the parent has left (apply/midrun/allotment.py: turns, dollars, wall, lease time,
      less what its other children hold; an even share among free child slots)
    → a child Task written to the state directory, its project root a folder of the
      parent's, that share as ``spec.parent.budget`` → planned from the operator's
      manifests with the running parent's plan as the ceiling (the planner's narrowing
      check; plan/budget.py cuts each limit to the share) → refused with every reason, or
    → approvals asked where the parent asks (its terminal) → the plan saved
    → ``kagura-agent apply PLAN --yes --json`` as its own process: its own container,
      egress proxy, leases, lock and record, exactly what an operator's shell would run
    → its output memory read back (patterns.dispatch.child_outputs) → the tool's answer.

Children run at once up to the plan's ``budget.children`` (Policy ``ceilings.children``);
more wait for a free slot, and are planned (from what is left then) once they have one.
A run asks for at most ``budget.children_total`` in all, and one as deep as sub-agents may
nest (``budget.max_depth``) dispatches none: past either, every request is refused.
A cancelled dispatch (the parent's channel stopping: a kill, Ctrl-C, SIGTERM, its wall
budget) sends the child SIGINT, apply's own clean-up path;
``close``, on the parent's ExitStack, waits for every child to finish that and kills one
that overruns, so a parent never leaves a child running.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

from kagura_agent.apply.guards.parentdeath import child_environment
from kagura_agent.apply.midrun.allotment import Allotments, Left, lease_grants, left
from kagura_agent.apply.midrun.child_request import ChildRequest, Refused, make_workdir
from kagura_agent.apply.records.progress import (
    Progress,
    SubAgent,
    SubAgentPhase,
    SubAgentsStopping,
    SubAgentStep,
)
from kagura_agent.apply.run.context import RunContext
from kagura_agent.approvals.asking import (
    ApprovalRequest,
    obtain_approvals,
    operator_name,
    tty_prompt,
)
from kagura_agent.approvals.midrun import Asker, NotAsked, Question, Questions
from kagura_agent.clock import iso
from kagura_agent.errors import KaguraError, ValidationError
from kagura_agent.hostproc import kagura_argv, kagura_environment, popen
from kagura_agent.membrane.secrets import Redactor
from kagura_agent.memory.model import MemoryStore
from kagura_agent.paths import state_dir
from kagura_agent.patterns.dispatch import child_outputs, handoff, load_context
from kagura_agent.plan import planfile
from kagura_agent.plan.build import plan_tasks
from kagura_agent.plan.history import record_applied
from kagura_agent.plan.model import Budget, Plan
from kagura_agent.state import open_store

T = TypeVar("T")
POLL_SECONDS = 0.2
# A child told to stop cleans up like any interrupted apply (container, proxy, leases);
# past this it is killed and the sweeper of the next apply finishes the job.
STOP_GRACE_SECONDS = 90.0

MIGRATIONS = [
    """
    CREATE TABLE dispatches (
        parent_run TEXT NOT NULL,
        number INTEGER NOT NULL,
        task TEXT NOT NULL,
        child_run TEXT,
        fingerprint TEXT,
        outcome TEXT NOT NULL,
        output_memory TEXT,
        reasons TEXT NOT NULL DEFAULT '[]',
        at TEXT NOT NULL,
        PRIMARY KEY (parent_run, number)
    );
    CREATE INDEX dispatches_child ON dispatches(child_run);
    """
]


@dataclass
class ChildRecord:
    """One dispatch of this run, as the parent's record keeps it."""

    number: int
    task: str
    outcome: str = "planning"  # planning | running | success | failed | refused | interrupted…
    run: str | None = None
    fingerprint: str | None = None
    output_memory: str | None = None
    reasons: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "number": self.number,
            "task": self.task,
            "outcome": self.outcome,
            "run": self.run,
            "fingerprint": self.fingerprint,
            "output_memory": self.output_memory,
            "reasons": list(self.reasons),
        }


class ChildDispatcher:
    """Serves one parent run's dispatch requests (a ``brain.channel.Dispatcher``)."""

    def __init__(self, ctx: RunContext, memory: MemoryStore) -> None:
        self.ctx = ctx
        self.memory = memory
        self.children: list[ChildRecord] = []
        self._numbers = itertools.count(1)
        self._slots: asyncio.Semaphore | None = None
        self._procs: dict[int, tuple[subprocess.Popen[bytes], ChildRecord, Path]] = {}
        self._tty = threading.Lock()  # one approval question at a time on the terminal
        self._asking = asyncio.Lock()
        self._parent_recorded = False
        self._folder = state_dir() / "dispatch" / ctx.run_id
        # What the children hold and used: the parent's own (its budget checks count it).
        self._held = ctx.midrun.children if ctx.midrun is not None else Allotments()
        self._started = time.monotonic()  # the brain starts now: its wall budget runs

    async def dispatch(self, request: Mapping[str, Any]) -> dict[str, Any]:
        number = next(self._numbers)
        plan = self.ctx.plan
        record = ChildRecord(number, f"{plan['task']['name']}-{number}")
        self.children.append(record)
        try:
            child = ChildRequest.parse(request, record.task)
            record.task = child.name
            refused = _may_not_dispatch(plan["budget"], number)  # every request counts
            if refused:
                raise Refused(refused)
            _refuse_carried_credentials(child, self.ctx.live.redactor)
            answer = await self._run(child, record, plan["budget"]["children"])
        except Refused as exc:
            self._held.release(number)
            record.outcome, record.reasons = "refused", exc.reasons
            record.fingerprint = exc.fingerprint or record.fingerprint
            self.ctx.live.emit(SubAgent(record.task, "refused", str(exc)))
            answer = {"outcome": "refused", "task": record.task, "reasons": exc.reasons}
        except asyncio.CancelledError:
            record.outcome = "interrupted"
            self._log(record)
            raise
        self._log(record)
        return answer

    async def _run(self, child: ChildRequest, record: ChildRecord, limit: int) -> dict[str, Any]:
        # A child is planned once a slot is free, from what is left then: planned while
        # its siblings held every slot, it would find their shares gone and be refused.
        if self._slots is None:
            self._slots = asyncio.Semaphore(limit)
        if self._slots.locked():
            self.ctx.live.emit(SubAgent(child.name, "waits", str(limit)))
        async with self._slots:
            return await self._plan_and_apply(child, record, limit)

    async def _plan_and_apply(
        self, child: ChildRequest, record: ChildRecord, limit: int
    ) -> dict[str, Any]:
        plan = self.ctx.plan
        share = self._share(limit)
        # Held from now on: a sibling dispatched meanwhile shares only the rest.
        self._held.reserve(record.number, share.turns, share.cost_usd)
        context = self._hand_over(child)
        task_path = self._write_task(child, context, share)
        if not self._parent_recorded:
            # The running parent's plan is what its children narrow: record it as applied
            # now, so planning the child (and apply's freshness check) reads this plan.
            record_applied(self.ctx.store, plan, iso(self.ctx.clock.now()))
            self._parent_recorded = True
        child_plan = await _in_thread(_plan_child, plan, str(task_path))
        record.fingerprint = child_plan["fingerprint"]
        reasons = _unapplyable(child_plan)
        if reasons:
            raise Refused(reasons, child_plan["fingerprint"])
        limits = child_plan["budget"]
        self._held.reserve(record.number, limits["turns"], limits["cost_usd"])
        since = self.ctx.clock.now()
        if self.ctx.midrun is not None:
            midrun = self.ctx.midrun
            await self._ask(child_plan, record.number, midrun.asker, midrun.questions)
        else:
            await _in_thread(self._approve, child_plan)
        plan_path = task_path.with_suffix(".plan.json")
        planfile.save(child_plan, plan_path)
        self.ctx.live.emit(SubAgentStep(child.name, "starting", plan=child_plan["fingerprint"]))
        record.outcome = "running"
        result = await self._apply(record, plan_path, iso(since))
        self._held.settle(record.number, result)
        return self._answer(record, result)

    def _share(self, slots: int) -> Left:
        """This child's share of what the parent has left (apply/midrun/allotment.py); Refused
        when nothing is."""
        midrun = self.ctx.midrun
        budget = (midrun.plan if midrun is not None else self.ctx.plan)["budget"]
        pool = left(
            budget,
            turns=midrun.spent_turns if midrun is not None else 0,
            usd=midrun.spent_usd if midrun is not None else 0.0,
            calls=midrun.model_calls if midrun is not None else None,
            held=self._held.held,
            elapsed=time.monotonic() - self._started,
        )
        share = pool.shared(slots - self._held.holding)
        short = pool.shortfall() or share.shortfall()
        if short:
            raise Refused(short)
        return share

    def _hand_over(self, child: ChildRequest) -> list[str]:
        """The memories the parent chose, if it may read them; its notes as new memories."""
        include = self.ctx.plan["task"]["context"]["include_untrusted"]
        try:
            found = load_context(self.memory, child.context)
        except KeyError as exc:
            raise Refused([str(exc.args[0])]) from None
        hidden = [m.id for m in found if m.untrusted and not include]
        if hidden:
            # As the memory tools answer: a memory the run may not read does not exist.
            raise Refused([f"no memory {memory_id} this run may read" for memory_id in hidden])
        ids = [m.id for m in found]
        if child.notes:
            handed = handoff(self.memory, parent_run=self.ctx.run_id, context=child.notes)
            ids += handed["context_memories"]
        return ids

    def _write_task(self, child: ChildRequest, context: list[str], share: Left) -> Path:
        plan = self.ctx.plan
        root = make_workdir(plan["task"]["project_root"], child.workdir)
        parent = {
            "task": plan["task"]["name"],
            "context": context,
            "depth": plan["budget"]["depth"] + 1,
            "budget": share.to_spec(),
        }
        spec: dict[str, Any] = {
            "kind": child.name,
            "brain": plan["brain"]["name"],
            "image": plan["image"]["name"],
            "memory": plan["memory"]["name"],
            "project_root": str(root),
            "parent": parent,
            "egress": list(child.egress if child.egress is not None else _baseline_egress(plan)),
        }
        if plan["brain"]["engine"] == "script":
            if not child.steps:
                raise Refused(["a child of the script brain needs steps"])
            spec["steps"] = list(child.steps)
        else:
            spec["prompt"] = child.prompt
        if child.credentials:
            broker = self.ctx.midrun.broker if self.ctx.midrun is not None else None
            leases = broker.leases if broker is not None else []
            try:
                spec["credentials"] = lease_grants(child.credentials, leases, self.ctx.clock.now())
            except ValueError as exc:
                raise Refused([str(exc)]) from None
        if child.verify:
            spec["verify"] = list(child.verify)
        document = {
            "apiVersion": "kagura.dev/v1",
            "kind": "Task",
            "metadata": {"name": child.name, "description": child.prompt[:200]},
            "spec": spec,
        }
        self._folder.mkdir(parents=True, exist_ok=True)
        path = self._folder / f"{child.name}.yml"
        path.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
        return path

    async def _ask(self, child_plan: Plan, number: int, asker: Asker, questions: Questions) -> None:
        """Ask where the run asks its mid-run questions (approvals/midrun.py): the serve
        cockpit's thread (Approve / Deny, the decision in the approval log), the parent's
        terminal, or nobody (refused, saying so). Bound to the child plan's intent."""
        needed = [a["category"] for a in child_plan["approvals"] if a["class"] == "needs-approval"]
        if not needed:
            return
        name, fingerprint = child_plan["task"]["name"], child_plan["fingerprint"]
        intent = child_plan["intent"]  # approvals bind to the intent, as apply's do
        reasons = {a["category"]: a["reason"] for a in child_plan["approvals"]}
        self.ctx.live.emit(SubAgentStep(name, "approval", ", ".join(needed), intent))
        run = self.ctx.run_id.removeprefix("run-")[:12]
        async with self._asking:  # one question at a time
            for index, category in enumerate(needed, start=1):
                question = Question(
                    request=f"m-{run}-d{number}" + (f"-{index}" if index > 1 else ""),
                    category=category,
                    fingerprint=intent,
                    text=f"sub-agent {name}: Grant {category} to plan {intent[:19]}…?"
                    f" ({reasons[category]})",
                    timeout=self.ctx.approval_timeout,
                )
                try:
                    answer = await questions.ask(asker, self.ctx.store, question, self.ctx.clock)
                except NotAsked as exc:
                    raise Refused([f"{category}: nobody was asked: {exc}"], fingerprint) from None
                if not answer.approved:
                    raise Refused([f"{category} was not approved: {answer.said()}"], fingerprint)

    def _approve(self, child_plan: Plan) -> None:
        """Without the run's asker (an apply driven in-process): ask on the terminal, as
        apply does; nobody to ask refuses."""
        # Bound to the child plan's intent, as apply's approvals are.
        request = ApprovalRequest.for_plan(
            child_plan, who=self.ctx.who or operator_name(), timeout=self.ctx.approval_timeout
        )
        if not request.categories:
            return
        name, fingerprint = child_plan["task"]["name"], child_plan["fingerprint"]
        self.ctx.live.emit(
            SubAgentStep(name, "approval", ", ".join(request.categories), fingerprint)
        )
        with self._tty, open_store() as store:  # this thread's own connection
            try:
                obtain_approvals(
                    store,
                    request,
                    prompt_fn=tty_prompt if self.ctx.interactive else None,
                    clock=self.ctx.clock,
                )
            except KaguraError as exc:
                raise Refused([exc.message], fingerprint) from None

    async def _apply(self, record: ChildRecord, plan_path: Path, since: str) -> dict[str, Any]:
        """``kagura-agent apply PLAN`` as its own process; its JSON result."""
        argv = kagura_argv("apply", "--yes", "--json", "--approvals-since", since, str(plan_path))
        out, err = plan_path.with_suffix(".out"), plan_path.with_suffix(".err")
        # The child's root lies inside ours: our lock on it is held for the child.
        env = kagura_environment(
            base=child_environment(parent_root=self.ctx.plan["task"]["project_root"])
        )
        with out.open("wb") as stdout, err.open("wb") as stderr:
            # Its own session: the terminal's Ctrl-C reaches the parent, which stops it.
            # It stops with this process even when this one is killed with SIGKILL.
            proc = popen(
                argv, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr,
                start_new_session=True, env=env,
            )  # fmt: skip
        self._procs[record.number] = (proc, record, out)
        relay = _Relay(err, record, self.ctx.live)
        try:
            while proc.poll() is None:
                relay.pump()
                await asyncio.sleep(POLL_SECONDS)
        except asyncio.CancelledError:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGINT)  # apply's clean-up path; close() waits
            raise
        relay.pump()
        self._procs.pop(record.number, None)
        result = _last_json(out.read_text(encoding="utf-8", errors="replace"))
        if result is None:
            record.reasons = relay.errors or [f"apply exited {proc.returncode}"]
            return {"exit_code": proc.returncode, "outcome": "failed"}
        if result.get("errors"):
            record.reasons = [str(e.get("message")) for e in result["errors"]]
        return result

    def _answer(self, record: ChildRecord, result: Mapping[str, Any]) -> dict[str, Any]:
        record.run = result.get("run_id") or None
        record.outcome = str(result.get("outcome") or "failed")
        record.output_memory = result.get("output_memory") or None
        answer: dict[str, Any] = {
            "outcome": record.outcome,
            "task": record.task,
            "run": record.run,
            "output_memory": record.output_memory,
        }
        for output in child_outputs(self.memory, [record.output_memory or ""]):
            answer["summary"] = output.summary
            answer["trust"] = "untrusted" if output.untrusted else "trusted"
            if output.details.get("answer"):
                answer["answer"] = output.details["answer"]
        if record.reasons:
            answer["reasons"] = record.reasons
        self.ctx.live.emit(
            SubAgent(
                record.task,
                "ended",
                f"{record.outcome}: run {record.run}, output memory {record.output_memory}",
            )
        )
        return answer

    def _log(self, record: ChildRecord) -> None:
        """The parent → child link in the state store (the child's plan links back)."""
        store = self.ctx.store
        with contextlib.suppress(KaguraError):
            store.migrate("dispatch", MIGRATIONS)
            with store.transaction() as conn:
                conn.execute(
                    "INSERT INTO dispatches(parent_run, number, task, child_run,"
                    " fingerprint, outcome, output_memory, reasons, at)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
                    " ON CONFLICT(parent_run, number) DO UPDATE SET task = excluded.task,"
                    " child_run = excluded.child_run, fingerprint = excluded.fingerprint,"
                    " outcome = excluded.outcome, output_memory = excluded.output_memory,"
                    " reasons = excluded.reasons, at = excluded.at",
                    (
                        self.ctx.run_id,
                        record.number,
                        record.task,
                        record.run,
                        record.fingerprint,
                        record.outcome,
                        record.output_memory,
                        json.dumps(record.reasons),
                        iso(self.ctx.clock.now()),
                    ),
                )

    def close(self) -> None:
        """Stop every child still running (SIGINT: its own clean-up), wait, kill overruns."""
        running, self._procs = list(self._procs.values()), {}
        if not running:
            return
        self.ctx.live.emit(SubAgentsStopping(len(running)))
        for proc, _, _ in running:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGINT)
        for proc, record, out in running:
            try:
                proc.wait(STOP_GRACE_SECONDS)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                self.ctx.live.emit(SubAgent(record.task, "killed"))
            # An interrupted apply still prints its result: the child's run, for the record.
            result = _last_json(out.read_text(encoding="utf-8", errors="replace")) or {}
            record.run = result.get("run_id") or record.run
            record.outcome = str(result.get("outcome") or "interrupted")
            self._log(record)
        self.ctx.live.emit(SubAgentsStopping(len(running), stopped=True))


class _Relay:
    """The child's live events (``apply --json`` stderr), as notes in the parent's view."""

    def __init__(self, path: Path, record: ChildRecord, progress: Progress) -> None:
        self.path, self.record, self.progress = path, record, progress
        self.offset = 0
        self.errors: list[str] = []

    def pump(self) -> None:
        with self.path.open("rb") as stream:
            stream.seek(self.offset)
            data = stream.read()
        complete = data[: data.rfind(b"\n") + 1]
        self.offset += len(complete)
        for line in complete.decode("utf-8", errors="replace").splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                if line.startswith("error:"):
                    self.errors.append(line.removeprefix("error:").strip())
                continue
            if isinstance(event, dict) and event.get("kind") == "phase":
                self.progress.emit(SubAgentPhase(self.record.task, str(event.get("message", ""))))


def _may_not_dispatch(budget: Budget, number: int) -> list[str]:
    """Why the run may not dispatch its ``number``-th sub-agent: the plan's dispatch
    limits (plan/budget.py: Policy ceilings depth, children, children_total)."""
    depth, deepest = budget["depth"], budget["max_depth"]
    if depth >= deepest:
        if depth == 0:
            return ["this run may not dispatch sub-agents (Policy ceilings.depth 0)"]
        return [
            f"this run is a sub-agent {depth} deep, as deep as sub-agents may nest"
            f" (Policy ceilings.depth {deepest}): it may not dispatch"
        ]
    if budget["children"] < 1:
        return ["this run may not dispatch sub-agents (Policy ceilings.children)"]
    total = budget["children_total"]
    if number > total:
        return [
            f"this run has asked for {number} sub-agents, past the {total} it may ask for in"
            " all (Policy ceilings.children_total)"
        ]
    return []


def _plan_child(parent: Plan, task_path: str) -> Plan:
    manifests = parent["inputs"].get("manifests_dir") or None
    try:
        [child] = plan_tasks(manifests, [task_path])
    except ValidationError as exc:
        raise Refused([d.message for d in exc.diagnostics]) from None
    except KaguraError as exc:
        raise Refused([exc.message]) from None
    return child


def _unapplyable(child: Plan) -> list[str]:
    """Why the child cannot run: each way it widens its parent first, then the rest."""
    link = child["task"].get("parent")
    narrowing = (link["narrowing"] if link else None) or []
    widening = [f"the child asks for more than its parent: {v}" for v in narrowing]
    others = [r["message"] for r in child["refusals"] if r["code"] != "child-widens-parent"]
    if not widening and not others and not child["applyable"]:
        others = ["the child's plan is not applyable"]
    return widening + others


def _baseline_egress(plan: Plan) -> list[str]:
    """The parent's egress policies that need nobody's approval (its brain's API, say)."""
    return [
        a["category"].removeprefix("egress:")
        for a in plan["approvals"]
        if a["category"].startswith("egress:") and a["class"] == "baseline"
    ]


def _last_json(stdout: str) -> dict[str, Any] | None:
    start = stdout.rfind("\n{\n")
    start = 0 if stdout.startswith("{\n") and start < 0 else start + 1
    if start < 0 or not stdout.strip():
        return None
    try:
        value = json.loads(stdout[start:])
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


async def _in_thread(fn: Callable[..., T], *args: Any) -> T:
    """``fn`` in a daemon thread: unlike the loop's executor, the interpreter's exit (a
    killed parent) never waits for one still blocked on a question."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def run() -> None:
        value: Any = None
        error: BaseException | None = None
        try:
            value = fn(*args)
        except BaseException as exc:  # handed to the awaiting task, raised there
            error = exc
        with contextlib.suppress(RuntimeError):  # the loop is gone: nobody waits
            loop.call_soon_threadsafe(_settle, future, value, error)

    threading.Thread(target=run, daemon=True).start()
    return await future


def _settle(future: asyncio.Future[Any], value: Any, error: BaseException | None) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(value)


def _refuse_carried_credentials(child: ChildRequest, redactor: Redactor) -> None:
    """A credential reaches a sub-agent only as a lease of the child's own plan: a request
    whose text carries one this run holds (in any case) is refused before its task is
    written (the state directory would keep it, and the child would hold it unleased)."""
    texts = [
        child.prompt,
        child.workdir,
        *(child.steps or ()),
        *child.verify,
        *child.notes,
        *child.context,
        *(child.egress or ()),
        *(value for grant in child.credentials for value in grant.values()),
    ]
    if any(redactor.scrub_any_case(text) != text for text in texts):
        raise Refused(
            [
                "the request carries a credential this run holds; a sub-agent gets its own"
                " through its plan (credentials: [{provider, scope}])"
            ]
        )
