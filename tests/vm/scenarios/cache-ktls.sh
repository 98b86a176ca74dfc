# topology: loopback
# media: 32
# timeout: 240
#
# The pull-through cache over kernel TLS. nginx in the guest is the origin (plain
# HTTP on 127.0.0.1, root /srv/media, its own access log); linerate stands in front
# of it ([[origin]] prefix /vod/, 1 MiB slices, a cache directory in the guest's
# tmpfs) and serves HTTPS with kernel TLS. Each of fetch_and_compare's ranges of
# the 32 MiB file is fetched twice over TLS 1.3, then once more over TLS 1.2:
#   - first pass, misses: every body exact, sent from each slice's file as the
#     fill writes it (sendfile on the kTLS socket), and the origin asked for each
#     slice it touches once (the whole file's 32 slices, no more);
#   - second and third passes, hits: every body exact, the origin's log does not
#     grow, and the cache counts the bytes as hits;
#   - every body byte went out on the kTLS path (linerate_body_bytes_total
#     {transport="ktls"} grows by all of them, "usertls" by none), and
#     /proc/net/tls_stat counted one kTLS socket each way per connection.
. /vm/lib.sh
. /vm/linerate-tls.sh

FILE=/srv/media/big.bin
ADMIN=127.0.0.1:9090
ORIGIN_PORT=8081
SLICE=1048576
ORIGIN_LOG=/tmp/nginx/access.log

# metric SERIES: the value of SERIES (name and labels as written) in /metrics.
metric() {
    "$CURL" -sS --max-time 10 -o /tmp/metrics "http://$ADMIN/metrics" || fail "GET http://$ADMIN/metrics failed"
    awk -v s="$1" 'index($0, s " ") == 1 { printf "%.0f\n", $2; found = 1 } END { if (!found) exit 1 }' \
        /tmp/metrics || fail "no $1 in /metrics: $(cat /tmp/metrics)"
}
origin_requests() { wc -l <"$ORIGIN_LOG" | tr -d ' '; }

nginx_start off warn 64 "
    server {
        listen 127.0.0.1:$ORIGIN_PORT;
        root /srv/media;
        access_log $ORIGIN_LOG;
    }"
nginx_wait "http://127.0.0.1:$ORIGIN_PORT/big.bin"
: >"$ORIGIN_LOG"

mkdir -p /tmp/cache
cat >/tmp/linerate.toml <<CONF
[[origin]]
prefix = "/vod/"
urls = ["http://127.0.0.1:$ORIGIN_PORT/"]

[cache]
slice_bytes = $SLICE

[[cache.dirs]]
path = "/tmp/cache"
max_size_bytes = 268435456
min_free_bytes = 0
CONF
linerate_tls_start 127.0.0.1 --config /tmp/linerate.toml --admin $ADMIN
mode=$(linerate_tls_mode)

URL=https://localhost:$LR_PORT/vod/big.bin
tx_before=$(tls_stat TlsTxSw)
rx_before=$(tls_stat TlsRxSw)
ktls0=$(metric 'linerate_body_bytes_total{transport="ktls"}')
user0=$(metric 'linerate_body_bytes_total{transport="usertls"}')

fetch_and_compare "$URL" $FILE --cacert "$TLS_DIR/ca.pem" --tlsv1.3
connections=$FETCHES
bytes=$FETCHED_BYTES
misses=$(metric 'linerate_cache_requests_total{status="miss"}')
asked=$(origin_requests)
# The whole file's fetch touches every slice; the HEAD-less first request of the
# object asks for its first slice, which is the object's head too.
report "misses over kTLS" "$FETCHES fetches, $bytes bytes exact; $misses cache misses, $asked origin requests"
expect_eq "origin requests for the first pass (one per slice)" "$asked" $(($(file_size $FILE) / SLICE))
[ "$misses" -ge 1 ] || fail "no cache miss counted on the first pass"

hits0=$(metric 'linerate_cache_bytes_total{source="hit"}')
fetch_and_compare "$URL" $FILE --cacert "$TLS_DIR/ca.pem" --tlsv1.3
connections=$((connections + FETCHES))
bytes=$((bytes + FETCHED_BYTES))
hit_bytes=$FETCHED_BYTES
fetch_and_compare "$URL" $FILE --cacert "$TLS_DIR/ca.pem" --tlsv1.2 --tls-max 1.2
connections=$((connections + FETCHES))
bytes=$((bytes + FETCHED_BYTES))
hit_bytes=$((hit_bytes + FETCHED_BYTES))
hits=$(($(metric 'linerate_cache_bytes_total{source="hit"}') - hits0))
report "hits over kTLS" "$hit_bytes bytes exact, $hits counted as hits, origin requests still $(origin_requests)"
expect_eq "origin requests after the hits" "$(origin_requests)" "$asked"
expect_eq "bytes served as hits" "$hits" "$hit_bytes"

ktls=$(($(metric 'linerate_body_bytes_total{transport="ktls"}') - ktls0))
user=$(($(metric 'linerate_body_bytes_total{transport="usertls"}') - user0))
report "send path" "kTLS $ktls bytes, user-space TLS $user bytes, of $bytes body bytes"
expect_eq "body bytes on the kTLS path" "$ktls" "$bytes"
expect_eq "body bytes on the user-space TLS path" "$user" 0
check_ktls_counters "$tx_before" "$rx_before" "$mode" "$connections"

linerate_stop
stop_pid $NGINX_PID
