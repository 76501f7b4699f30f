"""A Policy can require user namespaces (userns-remap or rootless Docker): a plan on a
daemon with neither is refused (exit 6), not warned about; without the requirement the
shared-uid warning is said once per daemon, not in every plan."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from apply_helpers import cli_env, kagura, make_project, manifest_set, write_task

from kagura_agent.apply.run.freshness import check_fresh
from kagura_agent.errors import RefusedError
from kagura_agent.membrane.isolation import notice_once
from kagura_agent.plan.build import plan_tasks

HELLO = {"steps": ["echo hello > out.txt"]}
IMAGE = "sha256:" + "2" * 64
PLAIN = {"userns_remap": False, "rootless": False, "runtimes": ["runc"], "version": "27"}
REQUIRE = {
    "kind": "Policy",
    "metadata": {"name": "userns"},
    "spec": {"user_namespaces": "required"},
}
REFUSED = "a Policy requires user namespaces (user_namespaces: required)"
SHARED_UID = "uses neither userns-remap nor rootless mode"


def _facts(tmp_path: Path, daemon: dict[str, Any] | None, name: str = "facts") -> str:
    facts: dict[str, Any] = {
        "image_digests": {"kagura/agent:0.1.0": IMAGE},
        "project_owner": [1000, 1000],
    }
    if daemon is not None:
        facts["daemon"] = daemon
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(facts))
    return str(path)


def _plan_cli(
    tmp_path: Path, state_dir: Path, daemon: dict[str, Any] | None, *policies: dict[str, Any]
) -> Any:
    manifests = manifest_set(tmp_path, *policies)
    task = write_task(make_project(tmp_path), "t", HELLO)
    args = [
        "plan",
        "--json",
        "--manifests",
        str(manifests),
        "--facts",
        _facts(tmp_path, daemon),
        str(task),
    ]
    return kagura(args, cli_env(state_dir))


@pytest.mark.usefixtures("without_docker")
@pytest.mark.parametrize(
    ("daemon", "why"),
    [
        (PLAIN, "a container's uid is the same uid on the host"),
        (None, "the Docker daemon did not say whether it does"),
    ],
    ids=["shared-uid", "daemon-unknown"],
)
def test_a_policy_that_requires_user_namespaces_refuses_a_daemon_without(
    tmp_path: Path, state_dir: Path, daemon: dict[str, Any] | None, why: str
) -> None:
    done = _plan_cli(tmp_path, state_dir, daemon, REQUIRE)
    assert done.returncode == 6, done.stderr
    (result,) = json.loads(done.stdout)["plans"]
    refusals = result["admission"]["refusals"]
    assert [r["code"] for r in refusals] == ["userns-required"], refusals
    assert refusals[0]["message"].startswith(REFUSED) and why in refusals[0]["message"]
    assert result["plan"]["applyable"] is False
    assert "Traceback" not in done.stderr


@pytest.mark.usefixtures("without_docker")
@pytest.mark.parametrize("mode", ["userns_remap", "rootless"])
def test_a_daemon_with_user_namespaces_satisfies_the_requirement(
    tmp_path: Path, state_dir: Path, mode: str
) -> None:
    done = _plan_cli(tmp_path, state_dir, {**PLAIN, mode: True}, REQUIRE)
    assert done.returncode == 0, done.stderr
    (result,) = json.loads(done.stdout)["plans"]
    assert result["admission"]["applyable"] is True
    assert result["plan"]["refusals"] == []


@pytest.mark.usefixtures("without_docker")
def test_without_the_requirement_the_plan_carries_no_shared_uid_warning(
    tmp_path: Path, state_dir: Path
) -> None:
    done = _plan_cli(tmp_path, state_dir, PLAIN)
    assert done.returncode == 0, done.stderr
    (result,) = json.loads(done.stdout)["plans"]
    assert result["admission"]["applyable"] is True
    assert not [w for w in result["plan"]["warnings"] if SHARED_UID in w]
    assert SHARED_UID not in done.stderr  # --facts: not this host's daemon, nothing said


@pytest.mark.usefixtures("without_docker")
def test_a_plan_made_on_a_remapped_daemon_is_refused_on_one_without(
    tmp_path: Path, state_dir: Path
) -> None:
    """apply re-plans with this host's facts: the refusal appears, the saved plan is stale."""
    manifests = manifest_set(tmp_path, REQUIRE)
    task = write_task(make_project(tmp_path), "t", HELLO)
    remapped = _facts(tmp_path, {**PLAIN, "userns_remap": True}, "remapped")
    (saved,) = plan_tasks(str(manifests), [str(task)], facts_file=remapped)
    assert saved["applyable"] is True
    (here,) = plan_tasks(str(manifests), [str(task)], facts_file=_facts(tmp_path, PLAIN, "plain"))
    with pytest.raises(RefusedError, match="requires user namespaces") as error:
        check_fresh(saved, here)
    assert error.value.exit_code == 6


def test_the_shared_uid_notice_is_said_once_per_daemon(tmp_path: Path) -> None:
    told = tmp_path / "told"
    info = {"ID": "AAAA:BBBB", "SecurityOptions": ["name=seccomp,profile=default"]}
    first = notice_once(PLAIN, info, told)
    assert first is not None and SHARED_UID in first and "user_namespaces: required" in first
    assert notice_once(PLAIN, info, told) is None
    assert notice_once(PLAIN, {**info, "ID": "CCCC:DDDD"}, told) is not None  # another daemon
    remapped = {**info, "ID": "EEEE", "SecurityOptions": ["name=userns"]}
    assert notice_once({**PLAIN, "userns_remap": True}, remapped, told) is None
    assert notice_once(None, {**info, "ID": "FFFF"}, told) is None  # no container: nothing


def test_plan_says_it_once_for_this_daemon(
    tmp_path: Path, state_dir: Path, docker_client: Any
) -> None:
    """On this host's daemon (neither userns-remap nor rootless here): the first plan says
    it on stderr, the next does not (doctor's check says it every time)."""
    from kagura_agent.membrane.images import daemon_info
    from kagura_agent.membrane.isolation import isolated, isolation_report

    info = daemon_info()
    assert info is not None and docker_client.ping(), "Docker is not answering"
    if isolated(isolation_report(info)):
        pytest.fail("this test needs a daemon without user namespaces (the CI daemon has none)")
    manifests = manifest_set(tmp_path)
    task = write_task(make_project(tmp_path), "t", HELLO)
    env = cli_env(state_dir)
    args = ["plan", "--allow-unapplyable", "--manifests", str(manifests), str(task)]
    first = kagura(args, env)
    second = kagura(args, env)
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    assert first.stderr.count(SHARED_UID) == 1, first.stderr
    assert SHARED_UID not in second.stderr + second.stdout + first.stdout, second.stderr
