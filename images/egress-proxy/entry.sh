#!/bin/sh
# Write the rendered configuration to the tmpfs, check it, then run squid in the
# foreground (no daemon, no kids) so the container lives exactly as long as squid does.
set -eu
: "${KAGURA_SQUID_CONF_B64:?the egress proxy needs KAGURA_SQUID_CONF_B64}"
conf_dir=/run/squid
conf="$conf_dir/squid.conf"
umask 077
printf '%s' "$KAGURA_SQUID_CONF_B64" | base64 -d >"$conf"
unset KAGURA_SQUID_CONF_B64
/usr/sbin/squid -k parse -f "$conf" 2>/dev/null || {
    echo "kagura-egress: invalid squid configuration" >&2
    /usr/sbin/squid -k parse -f "$conf" >&2 || true
    exit 78
}
exec /usr/sbin/squid -N -f "$conf"
