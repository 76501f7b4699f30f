#!/usr/bin/env bash
# CI machine setup: the Debian packages the suite uses, a running Docker Engine, the
# bootstrapped Debian base, every recipe in images/ built. Prints the wall time of each
# step. Run as root (it changes to the repository root itself).
#   bash scripts/ci-setup.sh            everything
#   bash scripts/ci-setup.sh packages   only the Debian packages
# PostgreSQL, the registry and the second dockerd are not started here: the tests start
# their own (tests/postgres.py, tests/daemon2.py), and fail in CI when they cannot.
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

# The Debian packages the suite uses, installed in one apt-get run when missing: Docker
# Engine and debootstrap (the images), PostgreSQL 15, docker-registry, iproute2 (the second
# dockerd), chromium (the web console's browser tests). The tests start their own servers; each script installs its package only when
# it is still missing, which never happens after this (parallel test workers would race
# on dpkg's lock).
packages() {
    local missing=()
    command -v dockerd >/dev/null 2>&1 || missing+=(docker.io)
    command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
    [ -x /usr/lib/postgresql/15/bin/initdb ] || missing+=(postgresql-15)
    command -v docker-registry >/dev/null 2>&1 || missing+=(docker-registry)
    command -v ip >/dev/null 2>&1 || missing+=(iproute2)
    # Debian's chromium and a font for legible screenshots: the web console's browser tests
    # (tests/test_web_browser.py drives /usr/bin/chromium with Playwright; no browser is
    # ever downloaded).
    command -v chromium >/dev/null 2>&1 || missing+=(chromium)
    fc-list 2>/dev/null | grep -qi dejavu || missing+=(fonts-dejavu-core)
    if [ "${#missing[@]}" -eq 0 ]; then
        return 0
    fi
    echo "installing ${missing[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >&2
    apt-get install -y -q --no-install-recommends "${missing[@]}" >&2
    # The packages start servers of their own (postgresql on 5432, docker-registry on
    # :5000); the tests never use them.
    pg_ctlcluster 15 main stop >/dev/null 2>&1 || true
    if [ -x /etc/init.d/docker-registry ]; then
        /etc/init.d/docker-registry stop >/dev/null 2>&1 || true
    fi
}

timings=()
total_started=$SECONDS
if [ "${1:-}" = packages ]; then
    # .ci/run runs this beside pip install: both mostly wait on downloads.
    step packages packages
    exit 0
fi
step packages packages
step docker-up bash scripts/docker-up.sh
step images-bootstrap "$python" -m kagura_agent images bootstrap
step images-build "$python" -m kagura_agent images build
"$python" -m kagura_agent images list
printf 'ci-setup timings: %s total=%ss\n' "${timings[*]}" "$((SECONDS - total_started))" >&2
