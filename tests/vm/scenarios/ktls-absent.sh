# topology: loopback
# media: 32
#
# The same kernel without a tls module (its file removed before anything could
# load it, so the TCP_ULP setsockopt fails as on a kernel without CONFIG_TLS):
# linerate must detect it, say tls_mode=userspace once, and serve the same bytes
# through its user-space TLS.
. /vm/lib.sh
. /vm/linerate-tls.sh

grep -q '^tls ' /proc/modules && fail "tls is already loaded; cannot test its absence"
rm -f $(find /lib/modules -name tls.ko)
[ ! -e /proc/net/tls_stat ] || fail "/proc/net/tls_stat exists without the tls module?"

linerate_tls_start 127.0.0.1
mode=$(linerate_tls_mode)
expect_eq "tls_mode without a tls module" "$mode" userspace
fetch_and_compare "https://localhost:$LR_PORT/big.bin" /srv/media/big.bin --cacert "$TLS_DIR/ca.pem" --tlsv1.3
RANGES="1000000-4999999 tail" fetch_and_compare "https://localhost:$LR_PORT/big.bin" \
    /srv/media/big.bin --cacert "$TLS_DIR/ca.pem" --tlsv1.2 --tls-max 1.2
grep -q '^tls ' /proc/modules && fail "the tls module got loaded"
linerate_stop
