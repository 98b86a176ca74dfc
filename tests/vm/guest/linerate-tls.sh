# Helpers for the scenarios that drive linerate's HTTPS (ktls, ktls-absent,
# ktls-nic), sourced after /vm/lib.sh. Written against linerate's HTTPS interface:
#   linerate serve --root DIR --tls-listen ADDR:PORT --cert FILE --key FILE
#   stdout: "listening https://ADDR:PORT" per TLS address
#   stderr: one line at start-up containing tls_mode=ktls-tx-rx or tls_mode=userspace
#           (kernel TLS is used for both directions or not at all)
# A binary without --tls-listen fails these scenarios (it exits at start-up and
# wait_listening prints its error); it never skips them.

# linerate_tls_start ADDR [SERVE_OPTIONS...]: starts linerate with one TLS listener
# on ADDR (port chosen by the kernel) and any more `serve` options; sets LR_PID and
# LR_PORT.
linerate_tls_start() {
    local addr=$1
    shift
    "$LINERATE" serve --root /srv/media --tls-listen "$addr:0" \
        --cert "$TLS_DIR/server.pem" --key "$TLS_DIR/server.key" "$@" \
        >/tmp/linerate.out 2>/tmp/linerate.err &
    LR_PID=$!
    LR_PORT=$(wait_listening $LR_PID /tmp/linerate.out https "$addr")
    log "linerate listening on https://$addr:$LR_PORT"
}

# linerate_tls_mode: prints the mode from linerate's start-up log, which must name
# it exactly once.
linerate_tls_mode() {
    local n line
    n=$(grep -c 'tls_mode=' /tmp/linerate.err || true)
    [ "$n" = 1 ] || fail "linerate logged tls_mode= $n times, want once; stderr: $(cat /tmp/linerate.err)"
    line=$(grep 'tls_mode=' /tmp/linerate.err)
    report "linerate start-up" "$line"
    echo "$line" | sed 's/.*tls_mode=\([a-z-]*\).*/\1/'
}

# linerate_stop: TERM, and linerate must exit 0.
linerate_stop() {
    local status=0
    kill "$LR_PID"
    wait "$LR_PID" || status=$?
    [ "$status" = 0 ] || fail "linerate exited with status $status after TERM; stderr: $(cat /tmp/linerate.err)"
}

# http_request METHOD TARGET [FIELD...]: appends an HTTP/1.1 request for localhost
# with the given fields ("Name: value") to /tmp/pipeline.req.
http_request() {
    local method=$1 target=$2
    shift 2
    printf '%s %s HTTP/1.1\r\nHost: localhost\r\n' "$method" "$target" >>/tmp/pipeline.req
    for field in "$@"; do printf '%s\r\n' "$field" >>/tmp/pipeline.req; done
    printf '\r\n' >>/tmp/pipeline.req
}

# tls_pipeline ADDR PORT VERSION_OPTION OUT: one TLS connection to ADDR:PORT (name
# localhost, verified against the test CA) that writes all of /tmp/pipeline.req at
# once and saves every byte read until the server closes in OUT. openssl s_client
# reads its standard input in 16 KiB blocks and writes each block with one SSL_write,
# so a request file under 16 KiB leaves in one TLS record; -quiet also makes it keep
# reading after the end of its input. VERSION_OPTION: -tls1_3 or -tls1_2.
tls_pipeline() {
    local size
    size=$(file_size /tmp/pipeline.req)
    [ "$size" -lt 16384 ] || fail "/tmp/pipeline.req is $size bytes: more than one TLS record"
    timeout 120 /usr/bin/openssl s_client -quiet -connect "$1:$2" -servername localhost \
        -CAfile "$TLS_DIR/ca.pem" -verify_return_error "$3" </tmp/pipeline.req >"$4" 2>/tmp/s_client.err ||
        fail "openssl s_client $3 to $1:$2 failed: $(cat /tmp/s_client.err)"
}

# check_ktls_counters TX_BEFORE RX_BEFORE MODE CONNECTIONS: MODE is ktls-tx-rx, and
# /proc/net/tls_stat counted one software kTLS TX socket and one RX socket per
# connection; no record failed to decrypt.
check_ktls_counters() {
    local tx rx
    tx=$(($(tls_stat TlsTxSw) - $1))
    rx=$(($(tls_stat TlsRxSw) - $2))
    report "linerate kTLS" "mode $3, TlsTxSw +$tx TlsRxSw +$rx for $4 connections"
    expect_eq "tls_mode" "$3" ktls-tx-rx
    expect_eq "TlsTxSw increase (one per connection)" "$tx" "$4"
    expect_eq "TlsRxSw increase (one per connection)" "$rx" "$4"
    expect_eq "TlsDecryptError" "$(tls_stat TlsDecryptError)" 0
}
