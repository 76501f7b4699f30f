"""Missing test resources: a skip on a laptop, a failure in CI (KAGURA_REQUIRE_DOCKER=1)."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def missing(reason: str) -> NoReturn:
    """Skip with ``reason`` — or fail, where CI promised the resource (Docker, images)."""
    if os.environ.get("KAGURA_REQUIRE_DOCKER") == "1":
        pytest.fail(f"KAGURA_REQUIRE_DOCKER=1 but {reason}")
    pytest.skip(reason)
