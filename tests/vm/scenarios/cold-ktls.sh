# topology: numa1
# disk: - 4 8
# modules: tls virtio_pci virtio_blk crc32c_generic ext4
# timeout: 240
#
# The cold catalogue over kernel TLS: titles on an ext4 disk (virtio-blk) that are
# not in the page cache, served over HTTPS with kernel TLS (sendfile on a kTLS
# socket) to the client namespace through cable 0. The guest's kernel (6.1) has no
# cachestat(2), so linerate checks residency with preadv2(RWF_NOWAIT) probes and
# must say so once. Every fetch starts with the disk's pages dropped from the page
# cache (busybox dd has no iflag=nocache: vm.drop_caches) and must:
#   - return exactly the file's bytes (sha256 of each range against the file);
#   - run the cold path: linerate_page_cache_bytes_total{source="filled"} grows,
#     and resident + filled grow by exactly the body bytes sent;
#   - be served from disk: /dev/vda reads grow by at least the cold bytes sent.
# Fetches: a whole title (TLS 1.3), one range across four 2 MiB windows (TLS 1.2),
# a multipart range mixing a part read into the page cache just before with cold
# parts (TLS 1.3), and a cold range over plain HTTP. Then no disk error is counted
# and /proc/net/tls_stat counted one kTLS socket each way per HTTPS connection.
# Each title serves one fetch only: linerate trusts a window it found resident for
# a second, and a trusted window evicted meanwhile would be read by sendfile itself.
. /vm/lib.sh
. /vm/linerate-tls.sh

DISK=/srv/disk
ADMIN=127.0.0.1:9090
CA=$TLS_DIR/ca.pem
SERVER=10.0.0.1
WINDOW=2097152 # fill.window_bytes
FETCH_NS=client

mkdir -p $DISK
mount -t ext4 /dev/vda $DISK || fail "cannot mount the test disk"
SIZE=$(file_size $DISK/title1.bin)
[ "$SIZE" = 8388608 ] || fail "title1.bin is $SIZE bytes, want 8 MiB (the ranges below assume it)"

# metric SERIES: the value of SERIES (name and labels as written) in /metrics.
metric() {
    "$CURL" -sS --max-time 10 -o /tmp/metrics "http://$ADMIN/metrics" || fail "GET http://$ADMIN/metrics failed"
    awk -v s="$1" 'index($0, s " ") == 1 { printf "%.0f\n", $2; found = 1 } END { if (!found) exit 1 }' \
        /tmp/metrics || fail "no $1 in /metrics: $(cat /tmp/metrics)"
}
FILLED='linerate_page_cache_bytes_total{source="filled"}'
RESIDENT='linerate_page_cache_bytes_total{source="resident"}'

# disk_read_bytes: bytes read from /dev/vda since boot, by anyone.
disk_read_bytes() { awk '{ printf "%.0f\n", $3 * 512 }' /sys/block/vda/stat; }

# evict: drops the disk's (clean) pages from the page cache.
evict() {
    sync
    echo 1 >/proc/sys/vm/drop_caches
}

# begin_fetch: the counters before a fetch (after any eviction and warming).
begin_fetch() {
    F0=$(metric "$FILLED")
    R0=$(metric "$RESIDENT")
    D0=$(disk_read_bytes)
    T0=$(uptime_secs)
}

# end_fetch NAME TRANSPORT BODY COLD MIN_FILLED MIN_RESIDENT: checks the counters'
# growth since begin_fetch for a fetch of BODY body bytes, COLD of which were not
# in the page cache, and MIN_RESIDENT of which were. At least MIN_FILLED of them
# must have waited for a fill: those of cold windows nothing could have read ahead
# (a range's first window; the fill pool reads the next window of a range while
# the connection waits, so later windows may be resident when their turn comes).
# Adds a row to the report.
end_fetch() {
    local secs filled resident disk
    secs=$(awk "BEGIN { printf \"%.1f\", $(uptime_secs) - $T0 }")
    filled=$(($(metric "$FILLED") - F0))
    resident=$(($(metric "$RESIDENT") - R0))
    disk=$(($(disk_read_bytes) - D0))
    log "$1: $3 body bytes in $secs s; filled +$filled, resident +$resident, disk read +$disk"
    report_line "| $1 | $2 | $3 | $filled | $resident | $disk | $secs |"
    [ "$filled" -ge "$5" ] && [ "$filled" -gt 0 ] ||
        fail "$1: $FILLED grew by $filled, want at least $5: the cold path did not run"
    expect_eq "$1: growth of resident + filled bytes (the body)" $((filled + resident)) "$3"
    [ "$resident" -ge "$6" ] || fail "$1: resident bytes grew by $resident, want at least $6 (read just before)"
    [ "$disk" -ge "$4" ] || fail "$1: /dev/vda read $disk bytes, want at least the $4 cold bytes served"
}

# fetch_cold NAME TRANSPORT URL FILE RANGE CURL_OPTIONS...: evicts, then fetches
# RANGE ("whole" or FIRST-LAST) of URL from the client namespace and checks its
# status, bytes and counters (end_fetch).
fetch_cold() {
    local name=$1 transport=$2 url=$3 file=$4 range=$5 first last want code len first_window
    shift 5
    case $range in
    whole) first=0 last=$((SIZE - 1)) want=200 ;;
    *) first=${range%-*} last=${range#*-} want=206 ;;
    esac
    len=$((last - first + 1))
    first_window=$(((first / WINDOW + 1) * WINDOW))
    [ $first_window -le $last ] || first_window=$((last + 1))
    evict
    begin_fetch
    code=$(fetch_one "$url" "$range" "$@") || fail "$name: curl $range $url failed (code '$code')"
    expect_eq "$name: status" "$code" $want
    expect_eq "$name: body bytes" "$(file_size /tmp/body)" $len
    expect_eq "$name: sha256 of $file $first-$last" "$(sha256sum /tmp/body | cut -d' ' -f1)" \
        "$(sha_range "$file" "$first" "$last")"
    end_fetch "$name" "$transport" $len $len $((first_window - first)) 0
}

# The expected sums first: computing them reads the files into the page cache,
# which each fetch then empties.
RANGE=1000000-7000000
PARTS="100-199 2500000-2599999 5000000-5099999 8388000-8388607"
WARM_PART=2500000-2599999
PLAIN=2000000-6999999
sha_range $DISK/title1.bin 0 $((SIZE - 1)) >/dev/null
sha_range $DISK/title2.bin ${RANGE%-*} ${RANGE#*-} >/dev/null
for r in $PARTS; do sha_range $DISK/title3.bin ${r%-*} ${r#*-} >/dev/null; done
sha_range $DISK/title4.bin ${PLAIN%-*} ${PLAIN#*-} >/dev/null

"$LINERATE" serve --root $DISK --listen $SERVER:0 --tls-listen $SERVER:0 \
    --cert "$TLS_DIR/server.pem" --key "$TLS_DIR/server.key" --admin $ADMIN \
    >/tmp/linerate.out 2>/tmp/linerate.err &
LR_PID=$!
TLS_PORT=$(wait_listening $LR_PID /tmp/linerate.out https $SERVER)
HTTP_PORT=$(wait_listening $LR_PID /tmp/linerate.out http $SERVER)
log "linerate listening on https://$SERVER:$TLS_PORT and http://$SERVER:$HTTP_PORT"
mode=$(linerate_tls_mode)
[ "$mode" = ktls-tx-rx ] ||
    fail "linerate reports tls_mode=$mode, want ktls-tx-rx: the kernel has CONFIG_TLS=m and tls is loaded"
tx_before=$(tls_stat TlsTxSw)
rx_before=$(tls_stat TlsRxSw)

report_line "| fetch (each from an evicted page cache) | transport | body bytes | filled bytes | resident bytes | /dev/vda read bytes | s |"
report_line "|---|---|---|---|---|---|---|"
fetch_cold "whole title" "kTLS 1.3" "https://$SERVER:$TLS_PORT/title1.bin" $DISK/title1.bin whole \
    --cacert "$CA" --tlsv1.3
fetch_cold "range $RANGE" "kTLS 1.2" "https://$SERVER:$TLS_PORT/title2.bin" $DISK/title2.bin $RANGE \
    --cacert "$CA" --tlsv1.2 --tls-max 1.2

# Multipart: the second part is read into the page cache first, with one read of
# its bytes (a longer read would make the kernel read ahead into the third part's
# window); the other parts are cold, each in a window of its own.
name="multipart, 1 of 4 parts resident"
evict
dd if=$DISK/title3.bin of=/dev/null bs=$((${WARM_PART#*-} - ${WARM_PART%-*} + 1)) count=1 \
    iflag=skip_bytes skip=${WARM_PART%-*} 2>/dev/null
begin_fetch
ranges=$(echo $PARTS | tr ' ' ,)
got=$(in_client "$CURL" -sS --max-time 120 -o /tmp/body -w '%{http_code} %{content_type}' -r "$ranges" \
    --cacert "$CA" "https://$SERVER:$TLS_PORT/title3.bin") || fail "$name: curl -r $ranges failed ('$got')"
case $got in
"206 multipart/byteranges; boundary="*) ;;
*) fail "$name: got '$got', want '206 multipart/byteranges; boundary=...'" ;;
esac
check_parts /tmp/body $DISK/title3.bin "${got#*boundary=}" $PARTS
body=0
for r in $PARTS; do body=$((body + ${r#*-} - ${r%-*} + 1)); done
warm=$((${WARM_PART#*-} - ${WARM_PART%-*} + 1))
end_fetch "$name" "kTLS 1.3" $body $((body - warm)) $((body - warm)) $warm

fetch_cold "range $PLAIN" "plain HTTP" "http://$SERVER:$HTTP_PORT/title4.bin" $DISK/title4.bin $PLAIN

grep -q 'no cachestat(2)' /tmp/linerate.err ||
    fail "linerate did not log its fallback to RWF_NOWAIT probes on Linux $(uname -r); stderr: $(cat /tmp/linerate.err)"
report "residency check" "$(grep -o 'no cachestat(2).*' /tmp/linerate.err)"
expect_eq "linerate_errors_total{kind=\"disk\"}" "$(metric 'linerate_errors_total{kind="disk"}')" 0
report "linerate totals" "filled $(metric "$FILLED") B, resident $(metric "$RESIDENT") B, fills $(awk '$1 ~ /^linerate_fills_total/ { n += $2 } END { printf "%.0f", n }' /tmp/metrics)"
check_ktls_counters "$tx_before" "$rx_before" "$mode" 3
linerate_stop
