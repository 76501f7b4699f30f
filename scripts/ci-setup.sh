#!/usr/bin/env bash
# CI machine setup: a running Docker Engine, the bootstrapped Debian base, every recipe
# in images/ built. Prints the wall time of each step. Run as root from the repository
# root (or anywhere: it changes to the repository root itself).
set -euo pipefail

cd "$(dirname "$0")/.."
python="${PYTHON:-python3}"

step() {
    local name="$1"; shift
    local started=$SECONDS
    printf '==> %s\n' "$name" >&2
    "$@"
    printf '==> %s: %ss\n' "$name" "$((SECONDS - started))" >&2
    timings+=("$name=$((SECONDS - started))s")
}

timings=()
total_started=$SECONDS
step docker-up bash scripts/docker-up.sh
step images-bootstrap "$python" -m kagura_agent images bootstrap
step images-build "$python" -m kagura_agent images build
# PostgreSQL 15 for the state store's team backend: installed from Debian when missing,
# started once (non-root, temp dir) to prove it runs; the tests start their own.
step postgres bash -c 'd=$(mktemp -d) && bash scripts/postgres-up.sh "$d" && bash scripts/postgres-up.sh --stop "$d" && rm -rf "$d"'
# Debian's docker-registry for images by digest: installed when missing, started once
# (its own user, temp storage, 127.0.0.1) to prove it runs; the tests start their own,
# and a second dockerd (scripts/dockerd2-up.sh) that pulls from it.
step registry bash -c 'd=$(mktemp -d /tmp/kagura-registry.XXXXXX) && bash scripts/registry-up.sh "$d" >/dev/null && bash scripts/registry-up.sh --stop "$d" && rm -rf "$d"'
# The second Docker host (its own dockerd, iptables in its own network namespace): started
# once to prove it runs here; the tests start their own, forwarding the registry into it.
step dockerd2 bash -c 'd=$(mktemp -d /tmp/kagura-dockerd2.XXXXXX) && bash scripts/dockerd2-up.sh "$d" >/dev/null && bash scripts/dockerd2-up.sh --stop "$d" && rm -rf "$d"'
# Debian's chromium (and a font for legible screenshots) for the web console's browser
# tests (tests/test_web_browser.py drives it with Playwright at /usr/bin/chromium; no
# browser is ever downloaded): installed when missing.
step chromium bash -c 'if ! command -v chromium >/dev/null || ! fc-list 2>/dev/null | grep -qi dejavu; then DEBIAN_FRONTEND=noninteractive apt-get update -q >&2 || true; DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium fonts-dejavu-core >&2; fi; chromium --version 2>/dev/null'
"$python" -m kagura_agent images list
printf 'ci-setup timings: %s total=%ss\n' "${timings[*]}" "$((SECONDS - total_started))" >&2
