"""Tests put this folder first on PYTHONPATH (testing.fake_anthropic.route_env): every
``kagura-agent`` process they start, and every child apply a dispatch starts, then sends
its runs' model calls to the fake upstream named in KAGURA_TEST_MODEL_UPSTREAM."""

from testing.fake_anthropic import route_from_env

route_from_env()
