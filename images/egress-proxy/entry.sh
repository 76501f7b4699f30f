#!/bin/sh
# Write the rendered configuration to the tmpfs, check it, then run squid in the
# foreground (no daemon, no kids) so the container lives exactly as long as squid does.
# With KAGURA_EGRESS_SOCKET set, socat first listens on that Unix socket (the agent's only
# way out) and forwards every connection to squid on loopback.
#
# With KAGURA_INJECT_CONF_B64 set (a run whose model key is injected), nginx first comes
# up on 127.0.0.1:3129 with the model-call policy and limits, and the key arrives as one
# line on stdin (never in the environment, so never in `docker inspect`); socat listens
# on KAGURA_EGRESS_INJECT_SOCKET for it. squid starts only once nginx listens, so squid's
# ready line means both are.
set -eu
: "${KAGURA_SQUID_CONF_B64:?the egress proxy needs KAGURA_SQUID_CONF_B64}"
conf_dir=/run/squid
conf="$conf_dir/squid.conf"
umask 077
printf '%s' "$KAGURA_SQUID_CONF_B64" | base64 -d >"$conf"
unset KAGURA_SQUID_CONF_B64
if [ -n "${KAGURA_EGRESS_INJECT_SOCKET:-}" ] && [ -z "${KAGURA_INJECT_CONF_B64:-}" ]; then
    # A host of an older kagura-agent injects through squid's own reverse-proxy port:
    # its credential line arrives on stdin for the file its squid.conf includes.
    IFS= read -r line || true
    printf '%s\n' "$line" >/run/squid/inject.conf
    unset line
fi
/usr/sbin/squid -k parse -f "$conf" 2>/dev/null || {
    echo "kagura-egress: invalid squid configuration" >&2
    /usr/sbin/squid -k parse -f "$conf" >&2 || true
    exit 78
}
if [ -n "${KAGURA_INJECT_CONF_B64:-}" ]; then
    inject=/run/kagura-inject
    mkdir -p "$inject/body" "$inject/proxy" "$inject/fastcgi" "$inject/uwsgi" "$inject/scgi"
    # The upstream's address, resolved now (nginx would not start on a name that does not
    # resolve); none: loopback, where nothing listens, so calls fail and are logged.
    address=$(getent ahostsv4 "${KAGURA_INJECT_HOST:-}" 2>/dev/null | awk 'NR == 1 { print $1 }')
    printf '%s' "$KAGURA_INJECT_CONF_B64" | base64 -d \
        | sed "s/__KAGURA_UPSTREAM_ADDRESS__/${address:-127.0.0.1}/" >"$inject/nginx.conf"
    printf '%s' "$KAGURA_INJECT_POLICY_B64" | base64 -d >"$inject/policy.json"
    printf '%s' "$KAGURA_INJECT_LIMITS_B64" | base64 -d >"$inject/limits.json"
    if [ -n "${KAGURA_INJECT_CA_B64:-}" ]; then
        # The endpoint's own authorities (a private CA), trusted for it in place of the
        # system's: nginx.conf names this file then.
        printf '%s' "$KAGURA_INJECT_CA_B64" | base64 -d >"$inject/endpoint-ca.pem"
    fi
    unset KAGURA_INJECT_CONF_B64 KAGURA_INJECT_POLICY_B64 KAGURA_INJECT_LIMITS_B64 KAGURA_INJECT_CA_B64
    IFS= read -r line || true
    printf '%s\n' "$line" >"$inject/key"
    unset line
    /usr/sbin/nginx -c "$inject/nginx.conf" -e stderr &
    tries=0
    until [ -s "$inject/nginx.pid" ]; do
        tries=$((tries + 1))
        if [ "$tries" -gt 200 ] || ! kill -0 $! 2>/dev/null; then
            echo "kagura-egress: the key-injecting port did not start" >&2
            exit 78
        fi
        sleep 0.05
    done
fi
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
