#!/usr/bin/env bash
# Install kagura-agent from the lock: every dependency at the version and hash that
# requirements/*.txt records (wheels only, so nothing unlocked is built), then this
# checkout itself with the locked build backend (no build isolation, so no unpinned
# setuptools is fetched either).
#
#   bash scripts/install.sh        the command and its core dependencies (requirements/main.txt)
#   bash scripts/install.sh dev    editable, with every extra and the test tools (requirements/all.txt)
#
# Uses the python3 on PATH (a virtualenv's when one is active); PYTHON overrides it.
# scripts/upgrade-deps is the only thing that changes the lock.
set -euo pipefail
cd "$(dirname "$0")/.."
python="${PYTHON:-python3}"

case "${1:-main}" in
    main) lock=requirements/main.txt; self=(.) ;;
    dev) lock=requirements/all.txt; self=(-e .) ;;
    *)
        echo "usage: bash scripts/install.sh [main|dev]" >&2
        exit 2
        ;;
esac

"$python" -m pip install --require-hashes --only-binary :all: -r "$lock"
"$python" -m pip install --no-deps --no-build-isolation "${self[@]}"
