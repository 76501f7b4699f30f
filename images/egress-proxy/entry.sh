#!/bin/sh
# Write the rendered configuration to the tmpfs, check it, then run squid in the
# foreground (no daemon, no kids) so the container lives exactly as long as squid does.
# With KAGURA_EGRESS_SOCKET set, socat first listens on that Unix socket (the agent's only
# way out) and forwards every connection to squid on loopback.
set -eu
: "${KAGURA_SQUID_CONF_B64:?the egress proxy needs KAGURA_SQUID_CONF_B64}"
conf_dir=/run/squid
conf="$conf_dir/squid.conf"
umask 077
printf '%s' "$KAGURA_SQUID_CONF_B64" | base64 -d >"$conf"
unset KAGURA_SQUID_CONF_B64
# A credential the proxy injects arrives as one squid.conf line on stdin (never in the
# environment, so never in `docker inspect`); the configuration includes that file.
if [ -n "${KAGURA_EGRESS_INJECT_SOCKET:-}" ]; then
    IFS= read -r line || true
    printf '%s\n' "$line" >/run/squid/inject.conf
    unset line
fi
/usr/sbin/squid -k parse -f "$conf" 2>/dev/null || {
    echo "kagura-egress: invalid squid configuration" >&2
    /usr/sbin/squid -k parse -f "$conf" >&2 || true
    exit 78
}
if [ -n "${KAGURA_EGRESS_SOCKET:-}" ]; then
    # mode 0666: the agent runs under its own uid; only containers given the volume see it.
    socat -b 262144 "UNIX-LISTEN:$KAGURA_EGRESS_SOCKET,fork,unlink-early,mode=0666,backlog=256" \
        TCP4:127.0.0.1:3128,nodelay &
fi
if [ -n "${KAGURA_EGRESS_INJECT_SOCKET:-}" ]; then
    socat -b 262144 "UNIX-LISTEN:$KAGURA_EGRESS_INJECT_SOCKET,fork,unlink-early,mode=0666,backlog=64" \
        TCP4:127.0.0.1:3129,nodelay &
fi
exec /usr/sbin/squid -N -f "$conf"
