# topology: numa2
# media: 32
#
# Proves the guest kernel's TLS plumbing with a reference peer: Debian's nginx
# (OpenSSL) with `ssl_conf_command Options KTLS` and sendfile serves a 32 MiB file
# and byte ranges over HTTPS to curl in the client namespace, across cable 1. The
# bytes must match and /proc/net/tls_stat must count one software kTLS TX socket
# per connection. tls.ko is not preloaded: nginx's TCP_ULP setsockopt loads it
# through the kernel's module autoloading, as on a stock Debian machine.
. /vm/lib.sh

nginx_start off info 64 "    server {
        listen 10.1.0.1:443 ssl;
        ssl_certificate $TLS_DIR/server.pem;
        ssl_certificate_key $TLS_DIR/server.key;
        ssl_protocols TLSv1.2 TLSv1.3;
        ssl_conf_command Options KTLS;
        root /srv/media;
    }"
pid=$NGINX_PID
FETCH_NS=client
nginx_wait https://10.1.0.1/

tx_sw_before=$(tls_stat TlsTxSw)
rx_sw_before=$(tls_stat TlsRxSw)
nic_before=$(nic_counter srv1 tx_bytes)
fetch_and_compare https://10.1.0.1/big.bin /srv/media/big.bin --cacert "$TLS_DIR/ca.pem"
tls13=$FETCHES
# TLS 1.2 too, which OpenSSL also hands to the kernel (two ranges suffice).
RANGES="1000000-4999999 -1048576" fetch_and_compare https://10.1.0.1/big.bin \
    /srv/media/big.bin --cacert "$TLS_DIR/ca.pem" --tlsv1.2 --tls-max 1.2
connections=$((tls13 + FETCHES))
tx_sw=$(($(tls_stat TlsTxSw) - tx_sw_before))
rx_sw=$(($(tls_stat TlsRxSw) - rx_sw_before))
nic=$(($(nic_counter srv1 tx_bytes) - nic_before))
report "nginx kTLS" "TlsTxSw +$tx_sw TlsRxSw +$rx_sw for $connections connections"
report "srv1 tx_bytes" "$nic"
report "tls_stat" "$(awk '{ printf "%s=%s ", $1, $2 }' /proc/net/tls_stat)"
expect_eq "TlsTxSw increase (one per connection)" "$tx_sw" "$connections"
[ "$nic" -ge "$FETCHED_BYTES" ] || fail "srv1 sent only $nic bytes: traffic did not cross the NIC"
grep -q '^tls ' /proc/modules || fail "tls module not loaded, yet TlsTxSw moved?"

stop_pid $pid
