"""Tests put this folder first on PYTHONPATH (testing.fake_anthropic.route_env): every
``kagura-agent`` process they start then sends its runs' model calls to the fake upstream
named in KAGURA_TEST_MODEL_UPSTREAM, and so does every child apply it starts (those run
isolated and ignore PYTHONPATH: route_from_env hands the route to their start code)."""

from testing.fake_anthropic import route_from_env

route_from_env()
