#!/usr/bin/env bash
# A second, separate Docker daemon on this machine: another "Docker host" for tests of
# plans and images that travel. It has its own API socket, data root (so no images and
# no containers of the first daemon), exec root (and so its own containerd; its own
# containerd namespaces even where a system containerd is shared) and pid file, and a
# bridge of its own (kagura-d2br, made here) with no iptables rules, so it never touches the
# first daemon's networks. Not `--bridge none`: a daemon started so deletes the host's
# docker0, the first daemon's default bridge (and every build and default-network run on
# it fails until that daemon restarts). Containers on it run with network "none" (what agent
# containers get); the egress proxy's internal networks need the first daemon's iptables.
# Prints one line on stdout: its DOCKER_HOST (unix://DIR/docker.sock).
#
#   bash scripts/dockerd2-up.sh [DIR]        start (DIR defaults to /tmp/kagura-dockerd2)
#   bash scripts/dockerd2-up.sh --stop DIR   stop it (its containers stop with it)
#
# Needs root and dockerd (scripts/docker-up.sh installs docker.io). Idempotent: when the
# daemon in DIR already answers, it only prints the address. Loopback registries
# (127.0.0.0/8) are insecure-allowed by default, so it pulls from scripts/registry-up.sh.
# Environment: DOCKER_UP_TIMEOUT (seconds to wait for the API, default 60).
set -euo pipefail

say() { printf 'dockerd2-up: %s\n' "$*" >&2; }

if [ "${1:-}" = "--stop" ]; then
    dir="${2:?usage: dockerd2-up.sh --stop DIR}"
    if [ -f "$dir/docker.pid" ]; then
        pid="$(cat "$dir/docker.pid")"
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 1 150); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.2
        done
    fi
    exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
    say "needs root (dockerd)"
    exit 1
fi
command -v dockerd >/dev/null || bash "$(dirname "$0")/docker-up.sh" >&2

dir="${1:-/tmp/kagura-dockerd2}"
mkdir -p "$dir/data" "$dir/exec"
chmod 700 "$dir"
host="unix://$dir/docker.sock"

if DOCKER_HOST="$host" docker info >/dev/null 2>&1; then
    say "already answers"
    echo "$host"
    exit 0
fi

bridge="kagura-d2br"
if ! ip link show "$bridge" >/dev/null 2>&1; then
    command -v ip >/dev/null || apt-get install -y -q iproute2 >&2
    ip link add "$bridge" type bridge
    ip addr add 10.213.213.1/24 dev "$bridge"
    ip link set "$bridge" up
fi

say "starting a second dockerd (log: $dir/dockerd.log)"
setsid dockerd \
    --host "$host" \
    --data-root "$dir/data" \
    --exec-root "$dir/exec" \
    --pidfile "$dir/docker.pid" \
    --containerd-namespace kagura-dockerd2 \
    --containerd-plugins-namespace kagura-dockerd2-plugins \
    --bridge "$bridge" \
    --iptables=false \
    --ip-masq=false \
    >"$dir/dockerd.log" 2>&1 </dev/null &

deadline=$((SECONDS + ${DOCKER_UP_TIMEOUT:-60}))
until DOCKER_HOST="$host" docker info >/dev/null 2>&1; do
    if [ "$SECONDS" -ge "$deadline" ]; then
        say "error: the second dockerd did not answer; last lines of its log:"
        tail -n 20 "$dir/dockerd.log" >&2 || true
        exit 1
    fi
    sleep 0.3
done
say "second Docker Engine answers at $host"
echo "$host"
