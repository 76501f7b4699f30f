"""Removing a container that another remover is already removing is not an error."""

from __future__ import annotations

from typing import Any

import docker.errors
import pytest

from kagura_agent.membrane.runtime import ContainerError, DockerRuntime


class _Api:
    """The two docker-py API calls ``remove`` makes, with the daemon's answers."""

    def __init__(self, remove_error: Exception, gone_after: int) -> None:
        self.remove_error = remove_error
        self.inspections = 0
        self.gone_after = gone_after

    def remove_container(self, container_id: str, force: bool, v: bool) -> None:
        raise self.remove_error

    def inspect_container(self, container_id: str) -> dict[str, Any]:
        self.inspections += 1
        if self.inspections >= self.gone_after:
            raise docker.errors.NotFound("gone", explanation="No such container")
        return {"Id": container_id}


class _Client:
    def __init__(self, api: _Api) -> None:
        self.api = api


def test_removal_already_in_progress_waits_until_gone() -> None:
    busy = docker.errors.APIError(
        "conflict", explanation="removal of container abc is already in progress"
    )
    api = _Api(busy, gone_after=3)
    DockerRuntime(_Client(api)).remove("abc")
    assert api.inspections == 3


def test_other_conflicts_still_raise() -> None:
    other = docker.errors.APIError("conflict", explanation="something else went wrong")
    with pytest.raises(ContainerError, match="something else"):
        DockerRuntime(_Client(_Api(other, gone_after=1))).remove("abc")
