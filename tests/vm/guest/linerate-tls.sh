# Helpers for the scenarios that drive linerate's HTTPS (ktls, ktls-absent,
# ktls-nic), sourced after /vm/lib.sh. Written against linerate's HTTPS interface:
#   linerate serve --root DIR --tls-listen ADDR:PORT --cert FILE --key FILE
#   stdout: "listening https://ADDR:PORT" per TLS address
#   stderr: one line at start-up containing tls_mode=ktls-tx-rx or tls_mode=userspace
#           (kernel TLS is used for both directions or not at all)
# A binary without --tls-listen fails these scenarios (it exits at start-up and
# wait_listening prints its error); it never skips them.

# linerate_tls_start ADDR: starts linerate with one TLS listener on ADDR (port
# chosen by the kernel); sets LR_PID and LR_PORT.
linerate_tls_start() {
    "$LINERATE" serve --root /srv/media --tls-listen "$1:0" \
        --cert "$TLS_DIR/server.pem" --key "$TLS_DIR/server.key" \
        >/tmp/linerate.out 2>/tmp/linerate.err &
    LR_PID=$!
    LR_PORT=$(wait_listening $LR_PID /tmp/linerate.out https "$1")
    log "linerate listening on https://$1:$LR_PORT"
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
