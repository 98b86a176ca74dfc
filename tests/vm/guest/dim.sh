# Helpers for the DIM scenarios (dim, dim-traffic), sourced after /vm/lib.sh.
# They drive `linerate tune dim` (crates/server/src/tune/dim.rs) against the
# e1000e of cable 0 (srv0) and read back what the driver really holds with
# `ethtool -c`.

# rx_usecs IF: the receive interrupt timer the driver reports.
rx_usecs() { "$ETHTOOL" -c "$1" | awk '/^rx-usecs:/ { print $2 }'; }

# rx_interrupts IF: interrupts of IF's receive vectors (IF-rx-N), all CPUs summed.
# That is what the controller counts for e1000e (its other vectors are TX and link).
rx_interrupts() {
    awk -v p="$1-rx-" 'index($NF, p) == 1 {
        for (i = 2; i <= NF && $i ~ /^[0-9]+$/; i++) s += $i
    } END { print s + 0 }' /proc/interrupts
}

# ping_pong SECONDS: ping-pong into IF from the client namespace for SECONDS, one
# request outstanding and the next sent when the reply comes (busybox ping -A), so
# the rate follows the round-trip time; in the background, its PID in TRAFFIC. It
# succeeds when replies came (busybox ping exits 1 when its deadline stops it
# before its count, which is the normal end here).
ping_pong() {
    {
        in_client ping -q -A -c $(($1 * 5000)) -w "$1" 10.0.0.1 >/tmp/ping.out 2>&1 || true
        grep -q ' [1-9][0-9]* packets received' /tmp/ping.out
    } &
    TRAFFIC=$!
}

# dim_start ARGS...: starts `linerate tune dim ARGS` (stdout /tmp/dim.out, stderr
# /tmp/dim.err); sets DIM_PID and waits until it printed its first line (what it
# drives and from which setting), so that it has taken its first sample.
dim_start() {
    local i=0
    rm -f /tmp/dim.out /tmp/dim.err
    "$LINERATE" tune dim "$@" >/tmp/dim.out 2>/tmp/dim.err &
    DIM_PID=$!
    until [ -s /tmp/dim.out ]; do
        alive $DIM_PID || fail "linerate tune dim $* exited at start: $(cat /tmp/dim.out /tmp/dim.err)"
        i=$((i + 1))
        [ $i -le 100 ] || fail "linerate tune dim $* printed nothing within 10 s"
        sleep 0.1
    done
    log "controller: $(head -n1 /tmp/dim.out)"
}

# dim_stop: SIGTERM; the controller must exit 0 and say it restored the original
# settings.
dim_stop() {
    local status=0
    kill -TERM $DIM_PID
    wait $DIM_PID || status=$?
    log "controller log: $(tr '\n' '|' </tmp/dim.out) stderr: $(cat /tmp/dim.err)"
    expect_eq "linerate tune dim exit status after SIGTERM" "$status" 0
    grep -q 'original settings restored' /tmp/dim.out ||
        fail "the controller did not report restoring the original settings: $(cat /tmp/dim.out)"
}

# watch_rx_usecs IF PID: prints IF's rx-usecs every 0.2 s while PID runs (30 s at
# most), one value per line.
watch_rx_usecs() {
    local i=0
    while alive "$2" && [ $i -lt 150 ]; do
        rx_usecs "$1"
        sleep 0.2
        i=$((i + 1))
    done
}

# wait_rx_usecs IF WANT SECONDS: polls IF's rx-usecs until it reads WANT; prints
# the distinct values seen on the way (oldest first). Fails after SECONDS.
wait_rx_usecs() {
    local seen="" last="" v i=0
    while :; do
        v=$(rx_usecs "$1")
        [ "$v" = "$last" ] || seen="$seen $v"
        last=$v
        [ "$v" != "$2" ] || break
        i=$((i + 1))
        [ $i -le $(($3 * 5)) ] || fail "$1: rx-usecs did not reach $2 within $3 s (values seen:$seen)"
        sleep 0.2
    done
    echo "${seen# }"
}
