"""The pieces of mid-run grants without containers: the ask-an-operator primitive (bound to
a fingerprint, deny on silence, a nudge believed only through the approval log) and the
amender (only what the operator's manifests allow, budgets under their ceiling)."""

from __future__ import annotations

import asyncio
import io
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from apply_helpers import make_project, manifest_set, token_provider, write_task

from kagura_agent.apply.midrun.amend import Amender, Refused
from kagura_agent.apply.midrun.grants import GrantTerms, MidRun, amendments
from kagura_agent.apply.records.live import LiveView
from kagura_agent.approvals import Verdict, history, record_decision
from kagura_agent.approvals.midrun import Answer, ChatAsker, NobodyAsker, Question
from kagura_agent.clock import FixedClock, SystemClock
from kagura_agent.cockpit.midrun import MidRunDesk
from kagura_agent.errors import RefusedError, ValidationError
from kagura_agent.membrane.leases import Broker, LeaseRequest
from kagura_agent.membrane.secrets import Redactor
from kagura_agent.plan.build import Compiled, compile_tasks
from kagura_agent.plan.history import record_applied
from kagura_agent.state import StateStore, open_store, state_location

FP = "sha256:" + "a" * 64
OTHER = "sha256:" + "b" * 64


def question(timeout: float = 5.0) -> Question:
    return Question("m-run-1", "egress:second", FP, "grant it?", timeout)


def decide(
    store: StateStore, fingerprint: str, outcome: Any = "approved", request: str = "m-run-1"
) -> None:
    record_decision(
        store,
        Verdict(
            category="egress:second",
            fingerprint=fingerprint,
            outcome=outcome,
            who="slack:U1",
            via="slack",
            request=request,
        ),
        clock=SystemClock(),
    )


def test_an_answer_counts_only_through_the_log_for_exactly_the_asked_plan(
    state_dir: Path,
) -> None:
    asked: list[Question] = []
    asker = ChatAsker(asked.append)

    async def scenario(store: StateStore) -> Any:
        task = asyncio.create_task(asker.ask(store, question(), SystemClock()))
        await asyncio.sleep(0.05)
        asker.nudged("m-run-1")  # a nudge with nothing in the log: ignored
        decide(store, OTHER)  # an approval of another plan, then its nudge: ignored
        asker.nudged("m-run-1")
        await asyncio.sleep(0.05)
        assert not task.done()
        decide(store, FP)
        asker.nudged("m-run-1")
        return await task

    with open_store() as store:
        answer = asyncio.run(scenario(store))
    assert answer.approved and answer.who == "slack:U1" and answer.via == "slack"
    assert [q.request for q in asked] == ["m-run-1"]
    assert asker.ignored == ["m-run-1", "m-run-1"]


def test_a_replayed_approval_from_before_the_question_does_not_count(state_dir: Path) -> None:
    asker = ChatAsker(lambda q: None)

    async def scenario(store: StateStore) -> Any:
        decide(store, FP)  # the same plan approved once already: an old answer
        await asyncio.sleep(1.1)  # the log keeps whole seconds
        task = asyncio.create_task(asker.ask(store, question(timeout=2.0), SystemClock()))
        await asyncio.sleep(0.05)
        asker.nudged("m-run-1")
        return await task

    with open_store() as store:
        answer = asyncio.run(scenario(store))
        log = history(store)
    assert not answer.approved and answer.outcome == "timeout"
    assert answer.said() == "not approved: no answer within 2s"
    assert [d.outcome for d in log] == ["timeout", "approved"]


def test_a_deny_denies_and_a_cockpit_that_goes_away_denies_at_once(state_dir: Path) -> None:
    async def scenario(store: StateStore) -> Any:
        asker = ChatAsker(lambda q: None)
        task = asyncio.create_task(asker.ask(store, question(), SystemClock()))
        await asyncio.sleep(0.05)
        decide(store, FP, "denied")
        asker.nudged("m-run-1")
        denied = await task
        task = asyncio.create_task(asker.ask(store, question(timeout=600), SystemClock()))
        await asyncio.sleep(0.05)
        asker.gone()
        gone = await task
        later = await asker.ask(store, question(timeout=600), SystemClock())
        return denied, gone, later

    with open_store() as store:
        denied, gone, later = asyncio.run(scenario(store))
    assert (denied.approved, denied.outcome, denied.who) == (False, "denied", "slack:U1")
    assert gone.outcome == "timeout" and "went away" in gone.reason
    assert later.outcome == "timeout" and "no cockpit" in later.reason


def test_an_answer_to_another_runs_question_on_the_same_plan_does_not_count(
    state_target: Path | str,
) -> None:
    """Two runs of one task ask for the same thing: the same amended plan and category. An
    operator's approval of run A's question is not run B's, even when B reads the log just
    after it (B's own deny, then A's approval, then B's nudge)."""

    async def scenario(store: StateStore) -> Any:
        asker = ChatAsker(lambda q: None)
        mine = Question("m-runb-1", "egress:second", FP, "grant it?", 5.0)
        task = asyncio.create_task(asker.ask(store, mine, SystemClock()))
        await asyncio.sleep(0.05)
        decide(store, FP, "approved", request="m-runa-1")  # run A's answer alone
        asker.nudged("m-runb-1")
        await asyncio.sleep(0.05)
        assert not task.done()
        decide(store, FP, "denied", request="m-runb-1")  # B's own answer: a deny...
        decide(store, FP, "approved", request="m-runa-1")  # ...then A's lands first
        asker.nudged("m-runb-1")
        return await task

    with open_store() as store:
        answer = asyncio.run(scenario(store))
        log = history(store)
    assert (answer.approved, answer.outcome) == (False, "denied")
    assert [d.request for d in log] == ["m-runa-1", "m-runb-1", "m-runa-1"]


def test_an_answer_in_the_log_without_a_nudge_is_read_there(state_dir: Path) -> None:
    """The web console answers from another process: no nudge, only the log. The asker
    reads the log on its own, and still only for exactly its question."""
    asker = ChatAsker(lambda q: None)

    async def scenario(store: StateStore) -> Any:
        started = asyncio.get_running_loop().time()
        task = asyncio.create_task(asker.ask(store, question(timeout=30), SystemClock()))
        await asyncio.sleep(0.05)
        with open_store() as elsewhere:  # another connection, as another process has
            decide(elsewhere, OTHER)  # another plan's approval: not this question's
            await asyncio.sleep(1.5)
            assert not task.done()
            decide(elsewhere, FP, "approved", request="m-run-2")  # another question's
            await asyncio.sleep(1.5)
            assert not task.done()
            decide(elsewhere, FP)
        answer = await task
        return answer, asyncio.get_running_loop().time() - started

    with open_store() as store:
        answer, waited = asyncio.run(scenario(store))
    assert answer.approved and answer.who == "slack:U1"
    assert waited < 10  # read within a poll, long before the question's 30 s timeout
    assert asker.ignored == []


def test_the_cockpit_records_an_answer_for_its_question(state_dir: Path) -> None:
    desk = MidRunDesk(state_location(), SystemClock())
    item = {"request": "m-run-1", "category": "egress:second", "fingerprint": FP, "timeout": 5}
    assert desk.asked("s-1", "C1:1", item) is not None
    said = desk.answer("m-run-1", approved=True, who="slack:U1", via="slack", nudge=lambda r: None)
    assert said == "m-run-1 egress:second approved by slack:U1"
    with open_store() as store:
        [decision] = history(store)
    assert (decision.request, decision.fingerprint, decision.approved) == ("m-run-1", FP, True)


def test_without_a_terminal_or_a_cockpit_nobody_is_asked_and_it_is_denied(
    state_dir: Path,
) -> None:
    with open_store() as store:
        answer = asyncio.run(NobodyAsker().ask(store, question(), SystemClock()))
        [decision] = history(store)
    assert not answer.approved
    assert decision.fingerprint == FP and decision.outcome == "denied"
    assert "nobody can be asked" in decision.reason


# --- the amender -----------------------------------------------------------------------


def compiled(tmp_path: Path, *documents: dict[str, Any], **spec: Any) -> Compiled:
    folder = manifest_set(tmp_path, *documents)
    project = make_project(tmp_path)
    task = write_task(project, "t", {"brain": "script", "steps": ["true"], **spec})
    [one] = compile_tasks(str(folder), [str(task)])
    return one


def egress_policy(name: str, host: str) -> dict[str, Any]:
    return {"kind": "EgressPolicy", "metadata": {"name": name}, "spec": {"allow": [{"host": host}]}}


@pytest.mark.usefixtures("without_docker")
def test_amendments_come_from_the_manifests_only(tmp_path: Path, state_dir: Path) -> None:
    c = compiled(
        tmp_path,
        egress_policy("second", "second.example.com"),
        egress_policy("wild", "*.wild.example.com"),
    )
    amender = Amender(c, c.plan)
    by_name = amender.capability("egress", "second")
    assert by_name.category == "egress:second"
    assert [ch.render() for ch in by_name.changes] == [
        "+ egress second.example.com:443 (policy second)  (widens)",  # diff marks widening
        "+ class egress:second (needs-approval)",
    ]
    assert by_name.plan["fingerprint"] != c.plan["fingerprint"]
    assert amender.capability("egress", "api.wild.example.com").category == "egress:wild"
    for kind, name, why in [
        ("egress", "elsewhere.example.com", "no EgressPolicy in the operator's manifests allows"),
        ("egress", "wild.example.com", "no EgressPolicy"),  # a wildcard is not its domain
        ("credential", "nosuch/scope", "no CredentialProvider 'nosuch'"),
        ("credential", "anthropic/nosuch", "has no scope 'nosuch'"),
        ("dns", "x", "unknown kind"),
    ]:
        with pytest.raises(Refused, match=why):
            amender.capability(kind, name)
    amender.accept(by_name)
    with pytest.raises(Refused, match="already in this run's plan"):
        amender.capability("egress", "second.example.com")


@pytest.mark.usefixtures("without_docker")
def test_a_host_asked_for_is_granted_through_the_narrowest_policy_allowing_it(
    tmp_path: Path, state_dir: Path
) -> None:
    """The brain names a host: the grant is the policy that allows it by name and the
    fewest other hosts, not whichever allowing policy the catalog lists first."""
    broad = {
        "kind": "EgressPolicy",
        "metadata": {"name": "a-broad"},
        "spec": {
            "allow": [
                {"host": "*.example.com"},
                {"host": "payments.other.test"},
                {"host": "secrets.other.test"},
            ]
        },
    }
    c = compiled(
        tmp_path,
        broad,
        egress_policy("b-wild", "*.example.com"),
        egress_policy("second", "second.example.com"),
    )
    amender = Amender(c, c.plan)
    assert amender.capability("egress", "second.example.com").category == "egress:second"
    # No exact one: the wildcard policy allowing least.
    assert amender.capability("egress", "api.example.com").category == "egress:b-wild"


@pytest.mark.usefixtures("without_docker")
def test_a_policy_denial_is_a_refusal_not_a_question(tmp_path: Path, state_dir: Path) -> None:
    deny = {
        "kind": "Policy",
        "metadata": {"name": "no-second"},
        "spec": {
            "rules": [
                {
                    "name": "no-second",
                    "effect": "deny",
                    "message": "second is never reached",
                    "schema": {
                        "properties": {
                            "egress": {
                                "properties": {
                                    "allow": {
                                        "items": {
                                            "properties": {
                                                "host": {"not": {"const": "second.example.com"}}
                                            }
                                        }
                                    }
                                }
                            }
                        }
                    },
                }
            ]
        },
    }
    c = compiled(tmp_path, egress_policy("second", "second.example.com"), deny)
    with pytest.raises(Refused, match=r"second is never reached|not be applyable|denied"):
        Amender(c, c.plan).capability("egress", "second")


@pytest.mark.usefixtures("without_docker")
def test_a_wall_extension_stops_at_the_ceiling(tmp_path: Path, state_dir: Path) -> None:
    ceiling = {
        "kind": "Policy",
        "metadata": {"name": "cap"},
        "spec": {"ceilings": {"wall_time": "90s"}},
    }
    c = compiled(tmp_path, ceiling, budget={"wall_time": "60s"})
    amender = Amender(c, c.plan)
    longer = amender.budget("wall_seconds", 120)
    assert longer.plan["budget"]["wall_seconds"] == 90  # cut to the ceiling
    assert longer.category == "budget:wall_seconds"
    assert any(ch.section == "budget" for ch in longer.changes)
    amender.accept_budget(longer)
    with pytest.raises(Refused, match="at its ceiling 90s"):
        amender.budget("wall_seconds", 180)
    # A later capability amendment keeps the extended budget.
    assert amender.plan["budget"]["wall_seconds"] == 90


@pytest.mark.usefixtures("without_docker")
def test_a_sub_agents_budget_is_never_extended_past_what_its_parent_left_it(
    tmp_path: Path, state_dir: Path
) -> None:
    folder = manifest_set(tmp_path)
    project = make_project(tmp_path)
    parent_task = write_task(project, "top", {"brain": "script", "steps": ["true"]})
    [parent] = compile_tasks(str(folder), [str(parent_task)])
    with open_store() as store:
        record_applied(store, parent.plan, "2026-12-01T00:00:00Z")
    left = {"turns": 3, "wall_time": "300s"}
    spec = {"brain": "script", "steps": ["true"], "parent": {"task": "top", "budget": left}}
    sub = make_project(project, "sub")
    [child] = compile_tasks(str(folder), [str(write_task(sub, "sub", spec))])
    assert child.plan["applyable"], child.plan["refusals"]
    budget = child.plan["budget"]
    assert (budget["turns"], budget["wall_seconds"]) == (3, 300)
    amender = Amender(child, child.plan)
    # The parent's 10m would allow more; what it left this child is the most.
    with pytest.raises(Refused, match="budget wall_seconds is at what its parent left it, 5m"):
        amender.budget("wall_seconds", 600)
    with pytest.raises(Refused, match="budget turns is at what its parent left it, 3"):
        amender.budget("turns", 6)


@pytest.mark.usefixtures("without_docker")
def test_a_plan_its_manifests_no_longer_reproduce_cannot_be_amended(
    tmp_path: Path, state_dir: Path
) -> None:
    c = compiled(tmp_path, egress_policy("second", "second.example.com"))
    with pytest.raises(Refused, match="without its manifests"):
        Amender(None, c.plan).capability("egress", "second")
    other = {**c.plan, "fingerprint": OTHER}
    with pytest.raises(Refused, match="not what its manifests compile to"):
        Amender(c, other).capability("egress", "second")  # type: ignore[arg-type]


# --- lease budgets -----------------------------------------------------------------------


class StubAsker:
    """Answers every question the same way, recording it in the log as an operator would."""

    def __init__(self, outcome: Any) -> None:
        self.outcome = outcome
        self.asked: list[Question] = []

    async def ask(self, store: StateStore, q: Question, clock: Any) -> Answer:
        self.asked.append(q)
        decision = record_decision(
            store,
            Verdict(
                category=q.category,
                fingerprint=q.fingerprint,
                outcome=self.outcome,
                who="test:op",
                via="test",
            ),
            clock=clock,
        )
        return Answer.of(decision)


def _lease_run(tmp_path: Path, outcome: Any) -> tuple[Any, Any, Any, StubAsker, StateStore]:
    c = compiled(
        tmp_path,
        token_provider(),
        credentials=[{"provider": "token", "scope": "use"}],
    )
    [entry] = [e for e in c.plan["credentials"] if e["category"] == "credential:token/use"]
    store = open_store()
    clock = FixedClock(datetime.now(UTC))
    lease = Broker(store, run_id="run-units", clock=clock).acquire(
        LeaseRequest.from_plan({**entry, "class": "approved"})
    )
    asker = StubAsker(outcome)
    live = LiveView(Redactor(), stream=io.StringIO(), as_json=True)
    midrun = MidRun(
        store=store,
        run_id="run-units",
        live=live,
        clock=clock,
        terms=GrantTerms(asker=asker, amender=Amender(c, c.plan), timeout=30),
    )
    midrun.leases.append(lease)
    return midrun, lease, clock, asker, store


@pytest.mark.usefixtures("without_docker")
def test_a_lease_budget_about_to_run_out_is_extended_when_approved(
    tmp_path: Path, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KAGURA_TEST_TOKEN", "kagura-units-token-" + "u" * 20)
    midrun, lease, clock, asker, store = _lease_run(tmp_path, "approved")
    assert (lease.budget.seconds, lease.budget.renewals) == (900, 0)
    asyncio.run(midrun.check_leases())
    assert asker.asked == []  # 15 minutes left: not yet
    clock.advance(timedelta(minutes=12))  # 3 minutes left, no renewals: held to its end
    assert lease.tick() is None and not lease.closed
    asyncio.run(midrun.check_leases())
    assert asker.asked == []  # asked 2 minutes before it fails closed
    clock.advance(timedelta(minutes=1))
    asyncio.run(midrun.check_leases())
    [question] = asker.asked
    assert question.category == "budget:credential:token/use"
    assert (
        "~ credential token:use renewals 0 → 1  (widens)\n"
        "~ credential token:use budget 15m → 30m  (widens)" in question.text
    )
    assert "runs out in 110s" in question.text
    assert (lease.budget.seconds, lease.budget.renewals) == (1800, 1)
    clock.advance(timedelta(minutes=2))
    assert lease.tick() is not None  # renewed inside the extended budget, not exhausted
    [row] = amendments(store, "run-units")
    assert (row["category"], row["outcome"], row["who"]) == (
        "budget:credential:token/use",
        "granted",
        "test:op",
    )
    asyncio.run(midrun.check_leases())
    assert len(asker.asked) == 1  # asked once per budget
    # The extended budget nears its end in turn: asked again before it fails closed.
    clock.advance(lease.held_until - clock.now() - timedelta(seconds=100))
    asyncio.run(midrun.check_leases())
    assert len(asker.asked) == 2 and lease.budget.seconds == 2700
    assert [row["outcome"] for row in amendments(store, "run-units")] == ["granted", "granted"]
    lease.release()
    store.close()


@pytest.mark.usefixtures("without_docker")
def test_the_brains_lease_at_the_proxy_is_asked_about_too(
    tmp_path: Path, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The brain's credential held by the proxy (an STS key for Bedrock, a GCP token for
    Vertex: apply/midrun/injected.py) is never in ``leases`` (those are delivered into the
    container); its budget is asked about all the same. Before: never asked, the run
    stopped when it ran out."""
    monkeypatch.setenv("KAGURA_TEST_TOKEN", "kagura-units-token-" + "u" * 20)
    midrun, lease, clock, asker, store = _lease_run(tmp_path, "approved")
    midrun.leases.remove(lease)
    midrun.at_proxy.append(lease)
    clock.advance(timedelta(minutes=13))
    asyncio.run(midrun.check_leases())
    [question] = asker.asked
    assert question.category == "budget:credential:token/use"
    assert (lease.budget.seconds, lease.budget.renewals) == (1800, 1)
    assert midrun.leases == []  # nothing joined the container's leases
    lease.release()
    store.close()


@pytest.mark.usefixtures("without_docker")
def test_an_unanswered_lease_budget_lets_the_lease_run_out(
    tmp_path: Path, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KAGURA_TEST_TOKEN", "kagura-units-token-" + "u" * 20)
    midrun, lease, clock, asker, store = _lease_run(tmp_path, "timeout")
    clock.advance(timedelta(minutes=13))
    asyncio.run(midrun.check_leases())
    assert len(asker.asked) == 1 and lease.budget.seconds == 900
    clock.advance(timedelta(seconds=109))
    assert lease.tick() is None  # held to its last 10 seconds
    clock.advance(timedelta(seconds=1))
    with pytest.raises(RefusedError, match="budget exhausted"):
        lease.tick()
    [row] = amendments(store, "run-units")
    assert row["outcome"] == "timeout"
    store.close()


@pytest.mark.usefixtures("without_docker")
def test_with_nobody_to_ask_a_lease_budget_is_denied_and_runs_out(
    tmp_path: Path, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """apply with no terminal and outside serve: the question is denied on the record,
    saying nobody could be asked, and the lease fails closed at its end."""
    monkeypatch.setenv("KAGURA_TEST_TOKEN", "kagura-units-token-" + "u" * 20)
    midrun, lease, clock, _, store = _lease_run(tmp_path, "approved")
    midrun.asker = NobodyAsker()
    clock.advance(timedelta(minutes=13))
    asyncio.run(midrun.check_leases())
    [row] = amendments(store, "run-units")
    assert (row["outcome"], row["who"]) == ("denied", "nobody")
    assert "nobody can be asked" in row["detail"]
    clock.advance(timedelta(seconds=110))
    with pytest.raises(RefusedError, match="budget exhausted"):
        lease.tick()
    store.close()


class NoProxy:
    def reload(self, egress: dict[str, Any]) -> None:
        raise AssertionError("a denied request reloaded the proxy")


@pytest.mark.usefixtures("without_docker")
def test_what_the_brain_writes_into_a_request_is_stored_scrubbed(
    tmp_path: Path, state_dir: Path
) -> None:
    """The brain holds a credential and puts it in a request's name and reason: the run's
    record of mid-run requests (and the question an operator reads) never keeps it."""
    secret = "Held-Token-4e5f6a7b8c9d"
    c = compiled(tmp_path, egress_policy("second", "second.example.com"))
    redactor = Redactor()
    redactor.add(secret)
    store = open_store()
    asker = StubAsker("denied")
    midrun = MidRun(
        store=store,
        run_id="run-scrub",
        live=LiveView(redactor, stream=io.StringIO(), as_json=True),
        clock=FixedClock(datetime.now(UTC)),
        terms=GrantTerms(asker=asker, amender=Amender(c, c.plan), timeout=30),
    )
    midrun.egress = NoProxy()  # the run has a proxy (a denied request never reloads it)
    asked = asyncio.run(midrun.request("egress", "second", f"the key is {secret}"))
    refused = asyncio.run(midrun.request("egress", f"{secret.lower()}.evil.test", "exfil"))
    assert not asked[0] and not refused[0]
    rows = amendments(store, "run-scrub")
    assert [r["outcome"] for r in rows] == ["denied", "refused"]
    stored = json.dumps(rows) + json.dumps([q.text for q in asker.asked])
    assert secret.lower() not in stored.lower(), stored
    assert "(sensitive)" in rows[0]["reason"] and "(sensitive)" in rows[1]["name"]
    store.close()


@pytest.mark.parametrize("scope", ["Read", "read ", " read", "re ad", "read\u200b"])
def test_a_scope_name_differing_only_in_case_or_whitespace_is_refused(
    tmp_path: Path, state_dir: Path, scope: str
) -> None:
    """Two scopes a person reads as one ("read" and "Read ") cannot both exist: a scope
    name is a lowercase DNS label, so an approval of one is never shown as the other."""
    provider = token_provider()
    provider["spec"]["scopes"] = {"read": {"description": "narrow"}, scope: {"description": "x"}}
    with pytest.raises(ValidationError) as caught:
        compiled(tmp_path, provider, credentials=[{"provider": "token", "scope": "read"}])
    assert any("scopes" in str(d) for d in caught.value.diagnostics), caught.value.diagnostics


class _CountingAsker:
    """Answers every question the same way after a pause; counts what it was asked."""

    def __init__(self, approved: bool) -> None:
        self.approved = approved
        self.asked: list[Question] = []

    async def ask(self, store: StateStore, question: Question, clock: Any) -> Answer:
        self.asked.append(question)
        await asyncio.sleep(0.05)
        outcome = "approved" if self.approved else "denied"
        return Answer(self.approved, outcome, "slack:U1", "slack")


def _q(category: str, fingerprint: str = FP, request: str = "m-run-1") -> Question:
    return Question(request, category, fingerprint, "grant it?", 5.0)


def test_identical_pending_questions_are_put_once(state_dir: Path) -> None:
    """25 identical requests at once: one question, one answer for all 25."""
    from kagura_agent.approvals.midrun import Questions

    asker = _CountingAsker(approved=True)
    questions = Questions()

    async def scenario(store: StateStore) -> list[Answer]:
        return await asyncio.gather(
            *(questions.ask(asker, store, _q("egress:second"), SystemClock()) for _ in range(25))
        )

    with open_store() as store:
        answers = asyncio.run(scenario(store))
        assert len(asker.asked) == 1 and all(a.approved for a in answers)
        # Approved: the same question again is the same answer, unasked.
        again = asyncio.run(questions.ask(asker, store, _q("egress:second"), SystemClock()))
        assert again.approved and len(asker.asked) == 1


def test_a_denied_category_is_not_asked_again_this_run(state_dir: Path) -> None:
    from kagura_agent.approvals.midrun import NotAsked, Questions

    asker = _CountingAsker(approved=False)
    questions = Questions()
    with open_store() as store:
        first = asyncio.run(questions.ask(asker, store, _q("egress:second"), SystemClock()))
        assert not first.approved
        # Another plan, another request id: the same category stays denied, unasked —
        # for a request the budget questions apply raises itself too.
        for limited in (True, False):
            with pytest.raises(NotAsked, match="egress:second was denied by slack:U1 via slack"):
                asyncio.run(
                    questions.ask(
                        asker,
                        store,
                        _q("egress:second", OTHER, "m-run-2"),
                        SystemClock(),
                        limited=limited,
                    )
                )
        assert len(asker.asked) == 1 and questions.not_asked == 2


def test_the_agents_questions_are_rate_limited(state_dir: Path) -> None:
    """Three questions in five minutes; the fourth is refused unasked until the first
    leaves the window. A budget question apply raises itself is not counted."""
    from kagura_agent.approvals.midrun import QUESTION_WINDOW, NotAsked, Questions

    now = [1000.0]
    asker = _CountingAsker(approved=True)
    questions = Questions(monotonic=lambda: now[0])
    with open_store() as store:
        for category in ("egress:a", "egress:b", "egress:c"):
            asyncio.run(questions.ask(asker, store, _q(category), SystemClock()))
        with pytest.raises(NotAsked, match="asked its operator 3 questions in the last 300s"):
            asyncio.run(questions.ask(asker, store, _q("egress:d"), SystemClock()))
        budget = _q("budget:wall_time")
        assert asyncio.run(
            questions.ask(asker, store, budget, SystemClock(), limited=False)
        ).approved
        now[0] += QUESTION_WINDOW + 1
        assert asyncio.run(questions.ask(asker, store, _q("egress:d"), SystemClock())).approved
    assert [q.category for q in asker.asked] == [
        "egress:a", "egress:b", "egress:c", "budget:wall_time", "egress:d"
    ]  # fmt: skip


@pytest.mark.usefixtures("without_docker")
def test_a_run_calling_request_access_in_a_loop_is_bounded(tmp_path: Path, state_dir: Path) -> None:
    """Refused requests ask nobody but each is a line and a record: past MAX_REQUESTS a
    run's are refused without either (said once), so a loop of them neither floods the
    live view nor grows the state store without end."""
    from kagura_agent.apply.midrun import grants as midrun_module

    c = compiled(tmp_path)
    out = io.StringIO()
    store = open_store()
    midrun = MidRun(
        store=store,
        run_id="run-loop",
        live=LiveView(Redactor(), stream=out, as_json=True),
        clock=FixedClock(datetime.now(UTC)),
        terms=GrantTerms(asker=StubAsker("denied"), amender=Amender(c, c.plan), timeout=30),
    )
    limit = midrun_module.MAX_REQUESTS

    async def loop() -> list[tuple[bool, str]]:
        return [await midrun.request("egress", "nowhere.test", "again") for _ in range(limit + 50)]

    try:
        said = asyncio.run(loop())
        rows = amendments(store, "run-loop")
    finally:
        store.close()
    assert not any(granted for granted, _ in said)
    assert said[-1][1] == f"refused: this run made the {limit} requests it may"
    assert len(rows) == limit
    notes = [json.loads(line)["message"] for line in out.getvalue().splitlines()]
    assert sum("mid-run request" in n and "nowhere.test" in n for n in notes) == limit
    assert sum("the rest are refused without being shown or recorded" in n for n in notes) == 1


class _TurnChannel:
    """The brain channel as watch_wall sees it: whether the turn is sent, what it was told."""

    def __init__(self) -> None:
        self.turn_sent = asyncio.Event()
        self.extended: list[float] = []

    async def send_credentials(self, lease: str, bundle: Any) -> None: ...

    async def revoke_credentials(self, lease: str) -> None: ...

    async def extend_wall(self, number: int, wall_seconds: float) -> tuple[bool, str]:
        self.extended.append(wall_seconds)
        return True, ""


@pytest.mark.usefixtures("without_docker")
def test_a_wall_extension_waits_for_the_turn_to_be_sent(tmp_path: Path, state_dir: Path) -> None:
    """A 12 s budget is asked about at once (the answer floor is longer), but only once
    the turn is on its way: an extension granted before reached a container with no turn
    to extend ("approved, but the container did not take the new deadline", seen in CI)."""
    c = compiled(tmp_path, budget={"wall_time": "12s"})
    store = open_store()
    asker = StubAsker("approved")
    midrun = MidRun(
        store=store,
        run_id="run-wall",
        live=LiveView(Redactor(), stream=io.StringIO(), as_json=True),
        clock=FixedClock(datetime.now(UTC)),
        terms=GrantTerms(asker=asker, amender=Amender(c, c.plan), timeout=30),
    )
    channel = _TurnChannel()
    midrun.attach(channel)

    async def scenario() -> None:
        watching = asyncio.create_task(midrun.watch_wall())
        await asyncio.sleep(0.3)
        assert asker.asked == [] and channel.extended == []  # no turn yet: nothing asked
        channel.turn_sent.set()
        for _ in range(100):
            if channel.extended:
                break
            await asyncio.sleep(0.02)
        watching.cancel()
        await asyncio.gather(watching, return_exceptions=True)

    asyncio.run(scenario())
    # (Asked again at once for 48 s: 24 s is still inside the answer floor.)
    assert asker.asked[0].category == "budget:wall_seconds"
    assert channel.extended[0] == 24.0
    store.close()
