"""Placement (pure): which queues a runner honours; and the job engine stays lazy."""

from __future__ import annotations

import subprocess
import sys

import pytest

from kagura_agent.errors import UsageError
from kagura_agent.team.placement import capacity, queue_name


def test_a_runner_listens_only_to_queues_it_can_honour() -> None:
    plain = capacity(2, ["runc"], ["self-host"], ["runc", "io.containerd.runc.v2"])
    assert plain.queues() == ["kagura.self-host.runc"]
    both = capacity(4, ["runc", "runsc"], ["shared", "self-host"], ["runc", "runsc"])
    # Shared tenancy only on gVisor/microVM runtimes, whatever the runner says.
    assert both.queues() == [
        "kagura.self-host.runc",
        "kagura.self-host.runsc",
        "kagura.shared.runsc",
    ]
    assert queue_name("shared", "runc") not in both.queues()
    assert capacity(1, [], [], ["runc"]).queues() == ["kagura.self-host.runc"]


def test_a_runner_cannot_advertise_what_its_daemon_lacks() -> None:
    with pytest.raises(UsageError) as caught:
        capacity(0, ["kata"], ["shared", "elsewhere"], ["runc"])
    message = caught.value.message
    assert "concurrency must be at least 1" in message
    assert "kata not installed in this Docker daemon (it has: runc)" in message
    assert "unknown tenancy elsewhere" in message
    with pytest.raises(UsageError, match="shared tenancy needs a runsc or kata runtime"):
        capacity(1, ["runc"], ["shared"], ["runc"])


def test_validate_and_plan_do_not_load_the_job_engine() -> None:
    code = (
        "import sys, kagura_agent.cli.main as m, kagura_agent.cli.plan,"
        " kagura_agent.cli.validate, kagura_agent.plan.build;"
        " m.build_parser();"
        " print([n for n in ('procrastinate', 'psycopg') if n in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
