#!/usr/bin/env bash
# Make a Docker Engine answer on this machine, idempotently.
#
# - installs docker.io (and debootstrap, used by `kagura-agent images bootstrap`) from the
#   Debian archive already configured on the machine when they are missing;
# - starts dockerd in the background when the API does not answer;
# - waits until `docker info` answers, or fails with a clear message.
#
# Safe to run twice; does nothing when the daemon already answers and the tools exist.
# Environment: DOCKER_UP_TIMEOUT (seconds to wait for the API, default 60),
#              DOCKERD_LOG (where dockerd's output goes, default /tmp/dockerd.log).
set -euo pipefail

timeout_s="${DOCKER_UP_TIMEOUT:-60}"
log="${DOCKERD_LOG:-/tmp/dockerd.log}"

say() { printf 'docker-up: %s\n' "$*" >&2; }

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else
        say "need root to run: $*"; exit 1
    fi
}

missing=()
command -v docker >/dev/null 2>&1 || missing+=(docker.io)
command -v dockerd >/dev/null 2>&1 || missing+=(docker.io)
command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
if [ "${#missing[@]}" -gt 0 ]; then
    # Deduplicate (docker.io may be listed twice).
    mapfile -t pkgs < <(printf '%s\n' "${missing[@]}" | sort -u)
    say "installing ${pkgs[*]} with apt-get"
    export DEBIAN_FRONTEND=noninteractive
    as_root apt-get update -q
    as_root apt-get install -y -q --no-install-recommends "${pkgs[@]}"
fi

if docker info >/dev/null 2>&1; then
    say "Docker Engine already answers"
    exit 0
fi

dockerd_running() {
    # pgrep (procps) is not on every minimal machine; /proc is.
    local comm
    for comm in /proc/[0-9]*/comm; do
        [ "$(cat "$comm" 2>/dev/null)" = dockerd ] && return 0
    done
    return 1
}

if dockerd_running; then
    say "dockerd is running but not answering yet; waiting"
else
    say "starting dockerd (log: $log)"
    # setsid: the daemon must outlive this script and the CI step that ran it.
    as_root setsid dockerd >"$log" 2>&1 </dev/null &
fi

deadline=$((SECONDS + timeout_s))
until docker info >/dev/null 2>&1; do
    if [ "$SECONDS" -ge "$deadline" ]; then
        say "error: Docker Engine did not answer within ${timeout_s}s; last lines of $log:"
        tail -n 20 "$log" >&2 || true
        exit 1
    fi
    sleep 0.5
done
say "Docker Engine answers ($(docker version --format '{{.Server.Version}}'))"
