# topology: loopback
# media: 32
#
# linerate with kernel TLS on the stock Debian kernel: tls.ko is not preloaded, as
# on a stock machine; linerate's start-up probe (a TCP_ULP "tls" setsockopt) makes
# the kernel load it. linerate must say kTLS is active, serve a 32 MiB file and
# ranges over TLS 1.3 and 1.2 with matching bytes, and /proc/net/tls_stat must
# count one kTLS socket per connection.
. /vm/lib.sh
. /vm/linerate-tls.sh

linerate_tls_start 127.0.0.1
mode=$(linerate_tls_mode)
[ "$mode" = ktls-tx-rx ] ||
    fail "linerate reports tls_mode=$mode, want ktls-tx-rx: the kernel has CONFIG_TLS=m and tls.ko is available for autoloading"
grep -q '^tls ' /proc/modules || fail "linerate reports $mode but the tls module is not loaded"

tx_before=$(tls_stat TlsTxSw)
rx_before=$(tls_stat TlsRxSw)
fetch_and_compare "https://localhost:$LR_PORT/big.bin" /srv/media/big.bin --cacert "$TLS_DIR/ca.pem" --tlsv1.3
connections=$FETCHES
RANGES="1000000-4999999 tail" fetch_and_compare "https://localhost:$LR_PORT/big.bin" \
    /srv/media/big.bin --cacert "$TLS_DIR/ca.pem" --tlsv1.2 --tls-max 1.2
connections=$((connections + FETCHES))
check_ktls_counters "$tx_before" "$rx_before" "$mode" "$connections"
linerate_stop
