#!/usr/bin/env bash
# A throwaway PostgreSQL 15 for team mode and its tests: Debian's server binaries, run as a
# non-root user, with its data directory and socket in a temporary folder, listening on
# 127.0.0.1 only. Prints one line, the connection URL, on stdout.
#
#   bash scripts/postgres-up.sh [DIR]        start (DIR defaults to a new temp folder)
#   bash scripts/postgres-up.sh --stop DIR   stop the server started in DIR
#
# As root it installs Debian's `postgresql` package when the binaries are missing and runs
# the server as the package's `postgres` user; as anyone else it runs as that user.
# Environment: KAGURA_PG_PORT (default: a free port), KAGURA_PG_VERSION (default 15).
set -euo pipefail

version="${KAGURA_PG_VERSION:-15}"
bin="/usr/lib/postgresql/${version}/bin"

as_owner() {
    if [ "$(id -u)" -eq 0 ]; then
        runuser -u postgres -- "$@"
    else
        "$@"
    fi
}

if [ "${1:-}" = "--stop" ]; then
    dir="${2:?usage: postgres-up.sh --stop DIR}"
    as_owner "$bin/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null
    exit 0
fi

if [ ! -x "$bin/initdb" ]; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "postgres-up: $bin/initdb not found; install Debian's postgresql-$version" >&2
        exit 1
    fi
    echo "postgres-up: installing postgresql-$version from Debian" >&2
    DEBIAN_FRONTEND=noninteractive apt-get update -q >&2 || true
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "postgresql-$version" >&2
    # The package starts a cluster of its own on 5432; ours never uses it.
    pg_ctlcluster "$version" main stop >/dev/null 2>&1 || true
fi

dir="${1:-$(mktemp -d /tmp/kagura-pg.XXXXXX)}"
mkdir -p "$dir"
if [ "$(id -u)" -eq 0 ]; then
    chown postgres: "$dir"
fi
chmod 700 "$dir"

port="${KAGURA_PG_PORT:-$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}"

if [ ! -f "$dir/data/PG_VERSION" ]; then
    as_owner "$bin/initdb" -D "$dir/data" -U kagura --auth=trust -E UTF8 --no-locale >"$dir/initdb.log" 2>&1 || {
        cat "$dir/initdb.log" >&2
        exit 1
    }
fi
as_owner "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
    -o "-c listen_addresses=127.0.0.1 -p $port -k $dir -c fsync=off -c max_connections=200" start >/dev/null || {
    cat "$dir/server.log" >&2
    exit 1
}
as_owner "$bin/createdb" -h 127.0.0.1 -p "$port" -U kagura kagura 2>/dev/null || true
echo "postgresql://kagura@127.0.0.1:$port/kagura"
