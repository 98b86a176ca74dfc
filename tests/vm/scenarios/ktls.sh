# topology: loopback
# media: 32
#
# linerate with kernel TLS on the stock Debian kernel: tls.ko is not preloaded, as
# on a stock machine; linerate's start-up probe (a TCP_ULP "tls" setsockopt) makes
# the kernel load it. linerate must say kTLS is active, serve a 32 MiB file and
# ranges over TLS 1.3 and 1.2 with matching bytes, and /proc/net/tls_stat must
# count one kTLS socket per connection.
#
# Then the same bytes on every path, over TLS 1.3 and TLS 1.2 each:
#   - Pipelining: seven requests written in one TLS record on one connection
#     (openssl s_client): GET range, HEAD, GET whole (a 4 MiB file: more than the
#     socket takes at once, so the server waits to write with requests pending),
#     GET four ranges (multipart), HEAD with a Range field, GET suffix, HEAD with
#     Connection: close. The answers come in order, each starting where the one
#     before ended (a HEAD answer carries no body byte, or the stream would fall
#     out of step); the bodies are the file's bytes, the multipart parts exactly
#     the ranges asked for; every HEAD answer has the GET's status and fields (all
#     but Date; a Range field is for GET only, RFC 9110 section 14.2, so a HEAD
#     with one gets the whole file's 200); nothing follows the last answer, and the
#     server then closes.
#   - HEAD then GET on one connection, each sent once the answer before is in
#     (curl reuses the connection): the HEAD has the GET's fields and nothing after
#     its head (curl would otherwise not reuse the connection), and the GET that
#     follows gets the bytes of its range.
#
# Last, signed URLs over kTLS: with an nginx secure_link rule on every path, a link
# signed by openssl gets the file's bytes (sendfile on the kTLS socket), an unsigned
# or tampered one 403 and an expired one 410.
. /vm/lib.sh
. /vm/linerate-tls.sh

FILE=/srv/media/big.bin
# A second file, 4 MiB cut from the middle of the first, for whole-file answers.
WHOLE=/srv/media/whole.bin
dd if=$FILE of=$WHOLE bs=1048576 skip=8 count=4 2>/dev/null
sha_range $FILE 8388608 12582911 >$WHOLE.sha256

linerate_tls_start 127.0.0.1
mode=$(linerate_tls_mode)
[ "$mode" = ktls-tx-rx ] ||
    fail "linerate reports tls_mode=$mode, want ktls-tx-rx: the kernel has CONFIG_TLS=m and tls.ko is available for autoloading"
grep -q '^tls ' /proc/modules || fail "linerate reports $mode but the tls module is not loaded"

tx_before=$(tls_stat TlsTxSw)
rx_before=$(tls_stat TlsRxSw)
fetch_and_compare "https://localhost:$LR_PORT/big.bin" $FILE --cacert "$TLS_DIR/ca.pem" --tlsv1.3
connections=$FETCHES
RANGES="1000000-4999999 tail" fetch_and_compare "https://localhost:$LR_PORT/big.bin" \
    $FILE --cacert "$TLS_DIR/ca.pem" --tlsv1.2 --tls-max 1.2
connections=$((connections + FETCHES))

SIZE=$(file_size $FILE)
WHOLE_SIZE=$(file_size $WHOLE)
URL=https://localhost:$LR_PORT/whole.bin

# without_date HEAD_FILE: the lines of a response head, status line included, but Date.
without_date() { grep -v '^Date: ' "$1"; }

# expect_range N WHAT FIRST LAST: response N of /tmp/stream is a 206 with
# Content-Range FIRST-LAST and the file's bytes FIRST..LAST.
expect_range() {
    local n=$1 what=$2 first=$3 last=$4
    expect_eq "$what: status" "$(eval echo \$RESP_STATUS_$n)" 206
    expect_eq "$what: Content-Range" "$(resp_field "$n" Content-Range)" "bytes $first-$last/$SIZE"
    expect_eq "$what: Content-Length" "$(resp_field "$n" Content-Length)" $((last - first + 1))
    expect_eq "$what: sha256 of the body" "$(resp_body "$n" /tmp/stream | sha256sum | cut -d' ' -f1)" \
        "$(sha_range $FILE "$first" "$last")"
}

# head_then_get LABEL CURL_VERSION_OPTIONS...: HEAD, then GET of one range, of the
# whole-file answers' file on one connection; the HEAD's head must equal the whole
# GET's (/tmp/get.f, from pipeline).
SEQ_RANGE=2000000-2999999
head_then_get() {
    local label=$1 got
    shift
    got=$("$CURL" -sS --max-time 120 --cacert "$TLS_DIR/ca.pem" "$@" -I -D /tmp/seq-head.h \
        -o /dev/null -w '%{http_code} %{num_connects} ' "$URL" \
        --next -sS --max-time 120 --cacert "$TLS_DIR/ca.pem" "$@" -r $SEQ_RANGE \
        -o /tmp/body -w '%{http_code} %{num_connects}' "$URL") ||
        fail "$label: curl HEAD, then GET on the same connection, failed ('$got')"
    # A new connection for the GET would mean curl found the first one unusable.
    expect_eq "$label: HEAD, GET: status and new connections" "$got" "200 1 206 0"
    without_date /tmp/seq-head.h >/tmp/head.f
    cmp -s /tmp/head.f /tmp/get.f ||
        fail "$label: HEAD and GET heads differ: HEAD: $(cat -v /tmp/head.f) GET: $(cat -v /tmp/get.f)"
    expect_eq "$label: GET after HEAD: sha256 of the body" "$(sha256sum /tmp/body | cut -d' ' -f1)" \
        "$(sha_range $WHOLE ${SEQ_RANGE%-*} ${SEQ_RANGE#*-})"
    log "$label: HEAD then GET $SEQ_RANGE on one connection: same fields, bytes match"
}

PARTS="100-199 2500000-2599999 16777000-16777999 33554000-33554431"
: >/tmp/pipeline.req
http_request GET /big.bin "Range: bytes=1000000-1999999"
http_request HEAD /whole.bin
http_request GET /whole.bin
http_request GET /big.bin "Range: bytes=$(echo $PARTS | tr ' ' ,)"
http_request HEAD /whole.bin "Range: bytes=3000000-3000999"
http_request GET /big.bin "Range: bytes=-864"
http_request HEAD /whole.bin "Connection: close"

# pipeline LABEL VERSION_OPTION: the pipelined requests on one connection, checked.
pipeline() {
    local label=$1 t0 boundary
    t0=$(uptime_secs)
    tls_pipeline 127.0.0.1 "$LR_PORT" "$2" /tmp/stream
    split_responses /tmp/stream GET HEAD GET GET HEAD GET HEAD
    expect_range 1 "$label: GET range" 1000000 1999999

    expect_eq "$label: HEAD: status" "$RESP_STATUS_2" 200
    expect_eq "$label: HEAD: Content-Length" "$(resp_field 2 Content-Length)" "$WHOLE_SIZE"
    expect_eq "$label: GET whole: status" "$RESP_STATUS_3" 200
    without_date /tmp/resp.2.head >/tmp/head.f
    without_date /tmp/resp.3.head >/tmp/get.f
    cmp -s /tmp/head.f /tmp/get.f ||
        fail "$label: HEAD and GET heads differ: HEAD: $(cat -v /tmp/head.f) GET: $(cat -v /tmp/get.f)"
    expect_eq "$label: GET whole: sha256 of the body" "$(resp_body 3 /tmp/stream | sha256sum | cut -d' ' -f1)" \
        "$(sha_range $WHOLE 0 $((WHOLE_SIZE - 1)))"

    expect_eq "$label: GET multipart: status" "$RESP_STATUS_4" 206
    boundary=$(resp_field 4 Content-Type)
    case $boundary in
    "multipart/byteranges; boundary="?*) boundary=${boundary#*boundary=} ;;
    *) fail "$label: GET multipart: Content-Type '$boundary', want multipart/byteranges; boundary=..." ;;
    esac
    resp_body 4 /tmp/stream >/tmp/body
    check_parts /tmp/body $FILE "$boundary" $PARTS

    # Ranges are for GET only: the whole file's fields.
    expect_eq "$label: HEAD with Range: status" "$RESP_STATUS_5" 200
    without_date /tmp/resp.5.head >/tmp/head.f
    cmp -s /tmp/head.f /tmp/get.f ||
        fail "$label: HEAD with Range and GET heads differ: HEAD: $(cat -v /tmp/head.f) GET: $(cat -v /tmp/get.f)"
    expect_range 6 "$label: GET suffix" $((SIZE - 864)) $((SIZE - 1))

    expect_eq "$label: last HEAD: status" "$RESP_STATUS_7" 200
    expect_eq "$label: last HEAD: Connection" "$(resp_field 7 Connection)" close
    grep -v -e '^Connection: ' -e '^Date: ' /tmp/resp.7.head >/tmp/head.f
    cmp -s /tmp/head.f /tmp/get.f ||
        fail "$label: last HEAD and GET heads differ: HEAD: $(cat -v /tmp/head.f) GET: $(cat -v /tmp/get.f)"
    log "$label: 7 pipelined requests, $(file_size /tmp/stream) bytes in $(awk "BEGIN { print $(uptime_secs) - $t0 }") s: in step, bytes match"
}

pipeline "TLS 1.3" -tls1_3
head_then_get "TLS 1.3" --tlsv1.3
pipeline "TLS 1.2" -tls1_2
head_then_get "TLS 1.2" --tlsv1.2 --tls-max 1.2
connections=$((connections + 4))
report "HEAD and pipelining over kTLS" "TLS 1.3 and 1.2: HEAD = GET, 7 pipelined requests in step, bytes match"

check_ktls_counters "$tx_before" "$rx_before" "$mode" "$connections"
linerate_stop

cat >/tmp/signed.toml <<'CONF'
[[signed]]
prefix = "/"
mode = "secure_link"
expression = "$secure_link_expires$uri$remote_addr vm-secret"
CONF
linerate_tls_start 127.0.0.1 --config /tmp/signed.toml
mode=$(linerate_tls_mode)
tx_before=$(tls_stat TlsTxSw)
rx_before=$(tls_stat TlsRxSw)
# md5_link TEXT: nginx's secure_link hash of TEXT (base64url MD5, no padding).
md5_link() { printf '%s' "$1" | /usr/bin/openssl md5 -binary | /usr/bin/openssl base64 | tr +/ -_ | tr -d =; }
exp=$(($(date +%s) + 600))
RANGES="whole 1000000-4999999" fetch_and_compare \
    "https://localhost:$LR_PORT/big.bin?md5=$(md5_link "$exp/big.bin127.0.0.1 vm-secret")&expires=$exp" \
    $FILE --cacert "$TLS_DIR/ca.pem"
connections=$FETCHES
# signed_status WHAT TARGET WANT: a request for TARGET over kTLS gets status WANT.
signed_status() {
    local code
    code=$("$CURL" -sS --max-time 30 --cacert "$TLS_DIR/ca.pem" -o /dev/null -w '%{http_code}' \
        "https://localhost:$LR_PORT$2") || fail "curl, $1 signed URL, failed"
    expect_eq "$1 signed URL over kTLS: status" "$code" "$3"
    connections=$((connections + 1))
}
old=$(($(date +%s) - 10))
signed_status unsigned /big.bin 403
signed_status expired "/big.bin?md5=$(md5_link "$old/big.bin127.0.0.1 vm-secret")&expires=$old" 410
signed_status tampered "/big.bin?md5=$(md5_link "$exp/big.bin127.0.0.1 vm-secret")&expires=$((exp + 1))" 403
report "signed URLs over kTLS" "signed: bytes match; unsigned 403, expired 410, tampered 403"
check_ktls_counters "$tx_before" "$rx_before" "$mode" "$connections"
linerate_stop
