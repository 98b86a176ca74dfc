#!/bin/sh
# Guest-side check of `linerate tune dim` on an emulated e1000e (qemu -device e1000e).
#
# Usage: dim-e1000e.sh IFACE PEER
#   IFACE  the guest's e1000e interface (e.g. enp0s3)
#   PEER   an address reachable through IFACE where `iperf3 -s` runs (the host side
#          of the harness) and that answers ping
#
# Needs on PATH: linerate, ethtool, iperf3, ping (iputils), awk, grep; run as root.
# Every step is bounded (ping counts and deadlines, iperf3 -t, controller --duration).
#
# What it checks, printing what it saw:
#   1. with e1000e's own dynamic throttling on (rx-usecs 1..4, the default is 3) the
#      controller stands aside and changes nothing;
#   2. with --take-over: bulk traffic into the guest (iperf3 -R) raises rx-usecs
#      above what ping-pong had, and ping-pong afterwards lowers it again;
#   3. on SIGTERM the controller exits 0 and rx-usecs is back to its original value.
# Exit status: 0 when every check holds, 1 otherwise.
set -u

if [ $# -ne 2 ]; then
    echo "usage: $0 IFACE PEER" >&2
    exit 1
fi
IF=$1
PEER=$2
fails=0

for t in linerate ethtool iperf3 ping awk grep; do
    if ! command -v "$t" >/dev/null 2>&1; then
        echo "FAIL: $t is not on PATH"
        exit 1
    fi
done

rx_usecs() { ethtool -c "$IF" | awk '/^rx-usecs:/ { print $2 }'; }
check() {
    if eval "$1"; then
        echo "ok: $2"
    else
        echo "FAIL: $2"
        fails=$((fails + 1))
    fi
}
# Request/response traffic for about N seconds (100 pings a second).
ping_pong() { ping -q -i 0.01 -c $(($1 * 100)) -w $(($1 + 5)) "$PEER" >/dev/null 2>&1; }

driver=$(ethtool -i "$IF" | awk '/^driver:/ { print $2 }')
if [ "$driver" != e1000e ]; then
    echo "FAIL: $IF has driver '$driver', expected e1000e"
    exit 1
fi
orig=$(rx_usecs)
echo "original rx-usecs: $orig"

# 1. Stand aside while the driver adapts by itself.
if [ "$orig" -ge 1 ] && [ "$orig" -le 4 ]; then
    out=$(linerate tune dim --iface "$IF" --count 3 2>&1)
    echo "$out"
    check 'echo "$out" | grep -q "standing aside"' "stands aside while e1000e's own throttling (rx-usecs $orig) is on"
    check '[ "$(rx_usecs)" = "$orig" ]' "rx-usecs untouched by the stand-aside run"
else
    echo "note: rx-usecs $orig is a static timer; skipping the stand-aside check"
fi

# 2. Take over and follow the traffic.
log=$(mktemp)
linerate tune dim --iface "$IF" --take-over --interval 100ms --duration 120s >"$log" 2>&1 &
pid=$!
sleep 2
ping_pong 8
rr1=$(rx_usecs)
echo "after ping-pong: rx-usecs $rr1"
iperf3 -c "$PEER" -R -t 20 >/dev/null 2>&1 &
bulk_pid=$!
bulk=0
for _ in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18; do
    sleep 1
    v=$(rx_usecs)
    [ "$v" -gt "$bulk" ] && bulk=$v
done
wait "$bulk_pid"
echo "during bulk: highest rx-usecs $bulk"
ping_pong 20
rr2=$(rx_usecs)
echo "after ping-pong again: rx-usecs $rr2"
kill -TERM "$pid"
wait "$pid"
rc=$?
after=$(rx_usecs)
echo "--- controller log"
cat "$log"
rm -f "$log"
echo "---"

check '[ "$bulk" -gt "$rr1" ]' "bulk raised rx-usecs ($rr1 -> $bulk)"
check '[ "$rr2" -lt "$bulk" ]' "ping-pong lowered it again ($bulk -> $rr2)"
check '[ "$rc" -eq 0 ]' "controller exited 0 on SIGTERM (got $rc)"
check '[ "$after" = "$orig" ]' "original rx-usecs restored ($after, was $orig)"

if [ "$fails" -eq 0 ]; then
    echo "dim-e1000e: all checks passed"
    exit 0
fi
echo "dim-e1000e: $fails check(s) failed"
exit 1
