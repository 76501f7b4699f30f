#!/usr/bin/env bash
# A second, separate Docker daemon on this machine: another "Docker host" for tests of
# plans, images and egress that travel. It has its own API socket, data root (so no images
# and no containers of the first daemon), exec root (and so its own containerd; its own
# containerd namespaces even where a system containerd is shared), pid file, and its own
# network namespace (kagura-d2-<hash of DIR>, made here). It runs as a full Docker host:
# iptables on, its own docker0 (10.213.213.1/24), user networks from 10.214.0.0/16, its
# own DOCKER / DOCKER-ISOLATION chains and NAT rules. All of that lives in its namespace's
# netfilter tables, so it can never touch the first daemon's docker0 or chains (two
# iptables-managing daemons in one namespace would: each rebuilds the DOCKER chains it
# finds). The namespace has no uplink: its containers reach each other and its own
# gateways, nothing on this machine's namespace.
# Its dockerd runs under `nsenter --net` (only the network namespace changes; not
# `ip netns exec`, which remounts /sys and hides the cgroup mounts dockerd needs).
# Prints one line on stdout: its DOCKER_HOST (unix://DIR/docker.sock).
#
#   bash scripts/dockerd2-up.sh [DIR [127.0.0.1:PORT ...]]   start (DIR: /tmp/kagura-dockerd2)
#   bash scripts/dockerd2-up.sh --stop DIR                    stop it, its forwards, its netns
#
# Each 127.0.0.1:PORT (a registry from scripts/registry-up.sh) is forwarded into the
# namespace's loopback (scripts/netns-forward.py), so the daemon pulls
# 127.0.0.1:PORT/repo@sha256:… — the very name the first daemon pushed to and plans pin.
# Loopback registries are insecure-allowed by default, so no TLS is needed.
# Needs root, dockerd, ip and nsenter (scripts/docker-up.sh installs docker.io).
# Idempotent: when the daemon in DIR already answers, it only adds missing forwards and
# prints the address. Environment: DOCKER_UP_TIMEOUT (seconds to wait for the API, default 60).
set -euo pipefail

say() { printf 'dockerd2-up: %s\n' "$*" >&2; }
here="$(cd "$(dirname "$0")" && pwd)"

netns_of() { printf 'kagura-d2-%s' "$(printf '%s' "$(realpath -m "$1")" | sha256sum | cut -c1-10)"; }

stop_pid() {
    local pid="$1"
    kill "$pid" 2>/dev/null || return 0
    for _ in $(seq 1 150); do
        kill -0 "$pid" 2>/dev/null || return 0
        sleep 0.2
    done
}

if [ "${1:-}" = "--stop" ]; then
    dir="${2:?usage: dockerd2-up.sh --stop DIR}"
    if [ -f "$dir/docker.pid" ]; then
        stop_pid "$(cat "$dir/docker.pid")"
    fi
    for pidfile in "$dir"/forward-*.pid; do
        [ -f "$pidfile" ] || continue
        stop_pid "$(cat "$pidfile")"
        rm -f "$pidfile"
    done
    ns="$(netns_of "$dir")"
    if [ -e "/run/netns/$ns" ]; then
        ip netns delete "$ns" 2>/dev/null || true
    fi
    exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
    say "needs root (dockerd, network namespaces)"
    exit 1
fi
command -v dockerd >/dev/null || bash "$here/docker-up.sh" >&2
command -v ip >/dev/null || apt-get install -y -q iproute2 >&2

dir="${1:-/tmp/kagura-dockerd2}"
shift || true
mkdir -p "$dir/data" "$dir/exec"
chmod 700 "$dir"
host="unix://$dir/docker.sock"
ns="$(netns_of "$dir")"
nspath="/run/netns/$ns"

if [ ! -e "$nspath" ]; then
    ip netns add "$ns"
fi
ip -n "$ns" link set lo up

forward() {
    local address="$1" port pidfile
    case "$address" in
        127.*:*) port="${address##*:}" ;;
        *) say "error: only loopback addresses are forwarded (got $address)"; exit 1 ;;
    esac
    pidfile="$dir/forward-$port.pid"
    if [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
        return 0
    fi
    setsid python3 "$here/netns-forward.py" "$nspath" "$port" \
        >"$dir/forward-$port.log" 2>&1 </dev/null &
    echo $! >"$pidfile"
    for _ in $(seq 1 100); do
        grep -q ready "$dir/forward-$port.log" 2>/dev/null && return 0
        kill -0 "$(cat "$pidfile")" 2>/dev/null || break
        sleep 0.05
    done
    say "error: the forward of $address into $ns did not start:"
    cat "$dir/forward-$port.log" >&2
    exit 1
}
for address in "$@"; do
    forward "$address"
done

if DOCKER_HOST="$host" docker info >/dev/null 2>&1; then
    say "already answers"
    echo "$host"
    exit 0
fi

say "starting a second dockerd in network namespace $ns (log: $dir/dockerd.log)"
nsenter --net="$nspath" setsid dockerd \
    --host "$host" \
    --data-root "$dir/data" \
    --exec-root "$dir/exec" \
    --pidfile "$dir/docker.pid" \
    --containerd-namespace kagura-dockerd2 \
    --containerd-plugins-namespace kagura-dockerd2-plugins \
    --bip 10.213.213.1/24 \
    --default-address-pool base=10.214.0.0/16,size=24 \
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
