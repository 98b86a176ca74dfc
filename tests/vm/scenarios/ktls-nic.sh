# topology: numa2
# media: 32
#
# kTLS across the emulated NICs: linerate listens on srv1 (the e1000e on node 1),
# curl fetches from the client namespace over cable 1; bytes match, kTLS counters
# move by one socket per connection, and srv1 carried at least the body bytes.
. /vm/lib.sh
. /vm/linerate-tls.sh

linerate_tls_start 10.1.0.1
mode=$(linerate_tls_mode)
[ "$mode" = ktls-tx-rx ] || fail "linerate reports tls_mode=$mode, want ktls-tx-rx"

tx_before=$(tls_stat TlsTxSw)
rx_before=$(tls_stat TlsRxSw)
nic_before=$(nic_counter srv1 tx_bytes)
FETCH_NS=client
fetch_and_compare "https://10.1.0.1:$LR_PORT/big.bin" /srv/media/big.bin --cacert "$TLS_DIR/ca.pem"
nic=$(($(nic_counter srv1 tx_bytes) - nic_before))
report "srv1 tx_bytes" "$nic for $FETCHED_BYTES body bytes"
[ "$nic" -ge "$FETCHED_BYTES" ] || fail "srv1 sent only $nic bytes: traffic did not cross the NIC"
check_ktls_counters "$tx_before" "$rx_before" "$mode" "$FETCHES"
linerate_stop
