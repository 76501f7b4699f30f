#!/usr/bin/env bash
# The project's test command: lint, format check, strict typing, then the whole suite.
# Run from anywhere; needs the dev install (bash scripts/install.sh dev).
set -euo pipefail
cd "$(dirname "$0")/.."
echo "== ruff check"
ruff check kagura_agent tests testing bench scripts
echo "== ruff format --check"
ruff format --check kagura_agent tests testing bench scripts
echo "== mypy --strict kagura_agent"
mypy --strict kagura_agent
echo "== pytest"
python -m pytest "$@"
