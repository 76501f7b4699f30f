#!/usr/bin/env bash
# A throwaway image registry for images by digest: Debian's docker-registry (the CNCF
# distribution registry), run as a non-root user, storing blobs in a temporary folder,
# listening on 127.0.0.1 only. Prints one line on stdout: the registry's HOST:PORT.
#
#   bash scripts/registry-up.sh [DIR]        start (DIR defaults to a new temp folder)
#   bash scripts/registry-up.sh --stop DIR   stop the registry started in DIR
#
# As root it installs Debian's `docker-registry` package when the binary is missing and
# runs the registry as the package's `docker-registry` user (`nobody` if there is none);
# as anyone else it runs as that user. A loopback registry needs no TLS: Docker treats
# 127.0.0.0/8 as an insecure registry by default.
# DIR and every folder above it must be reachable by that user (not under a private
# /tmp/pytest-of-root, say).
# Environment: KAGURA_REGISTRY_PORT (default: a free port).
set -euo pipefail

say() { printf 'registry-up: %s\n' "$*" >&2; }

if [ "${1:-}" = "--stop" ]; then
    dir="${2:?usage: registry-up.sh --stop DIR}"
    if [ -f "$dir/registry.pid" ]; then
        kill "$(cat "$dir/registry.pid")" 2>/dev/null || true
        rm -f "$dir/registry.pid"
    fi
    exit 0
fi

bin="$(command -v docker-registry || true)"
if [ -z "$bin" ]; then
    if [ "$(id -u)" -ne 0 ]; then
        say "docker-registry not found; install Debian's docker-registry package"
        exit 1
    fi
    say "installing docker-registry from Debian"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >&2 || true
    apt-get install -y -q --no-install-recommends docker-registry >&2
    # The package may start a registry of its own on :5000; ours never uses it.
    if [ -x /etc/init.d/docker-registry ]; then
        /etc/init.d/docker-registry stop >/dev/null 2>&1 || true
    fi
    bin="$(command -v docker-registry)"
fi

user=""
if [ "$(id -u)" -eq 0 ]; then
    user=docker-registry
    id "$user" >/dev/null 2>&1 || user=nobody
fi

dir="${1:-$(mktemp -d /tmp/kagura-registry.XXXXXX)}"
mkdir -p "$dir/storage"
if [ -n "$user" ]; then
    chown -R "$user" "$dir"
fi
chmod 700 "$dir"

port="${KAGURA_REGISTRY_PORT:-$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}"

cat >"$dir/config.yml" <<EOF
version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: $dir/storage
  delete:
    enabled: true
http:
  addr: 127.0.0.1:$port
EOF

# setsid and setpriv exec (no fork): $! is the registry itself, for --stop.
if [ -n "$user" ]; then
    setsid setpriv --reuid="$user" --regid="$(id -g "$user")" --init-groups \
        "$bin" serve "$dir/config.yml" >"$dir/registry.log" 2>&1 </dev/null &
else
    setsid "$bin" serve "$dir/config.yml" >"$dir/registry.log" 2>&1 </dev/null &
fi
echo $! >"$dir/registry.pid"

pid="$(cat "$dir/registry.pid")"
for _ in $(seq 1 100); do
    if ! kill -0 "$pid" 2>/dev/null; then
        break  # it exited: say why below
    fi
    if python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$port/v2/', timeout=1)" 2>/dev/null; then
        echo "127.0.0.1:$port"
        exit 0
    fi
    sleep 0.1
done
say "error: the registry did not answer on 127.0.0.1:$port; its log:"
cat "$dir/registry.log" >&2
exit 1
