# topology: numa1
#
# `linerate tune dim` against a real driver: the guest's e1000e (srv0), whose
# receive timer the controller sets through the ethtool ioctl and `ethtool -c`
# reads back. What is checked here does not depend on how fast TCG runs:
#   1. with e1000e's own dynamic throttling on (rx-usecs 1-4) it stands aside and
#      changes nothing;
#   2. from a static timer (500 µs) and no traffic, the idle decay walks down the
#      e1000e table (256 128 64 10 µs, clamped to what e1000e accepts) one step per
#      idle second to the lowest timer; e1000e rejects the frame cap, so the
#      controller must fall back to writing the timer alone; SIGTERM restores 500;
#   3. with --take-over, traffic starts the search: the first window with traffic
#      is compared with the empty one before it and the controller probes one step
#      right (10 -> 64 µs); idle brings it back to 10; SIGTERM restores the dynamic
#      mode.
# Whether bulk traffic makes it choose longer timers *because they save
# interrupts* is scenario dim-traffic, which cannot pass honestly under TCG (see
# there).
. /vm/lib.sh
. /vm/dim.sh

IF=srv0
driver=$("$ETHTOOL" -i $IF | awk '/^driver:/ { print $2 }')
expect_eq "driver of $IF" "$driver" e1000e
orig=$(rx_usecs $IF)
report "$IF rx-usecs at boot" "$orig"
case $orig in
1 | 2 | 3 | 4) ;;
*) fail "e1000e should come up in its own dynamic mode (rx-usecs 1-4), reads $orig" ;;
esac

# 1. The driver adapts by itself: stand aside.
out=$("$LINERATE" tune dim --iface $IF --count 3 2>&1) || fail "stand-aside run failed: $out"
log "$out"
echo "$out" | grep -q "standing aside: rx-usecs $orig selects e1000e's own dynamic interrupt throttling" ||
    fail "expected the controller to stand aside, got: $out"
expect_eq "rx-usecs after standing aside" "$(rx_usecs $IF)" "$orig"

# 2. A static timer and an idle link: the idle decay, the frame-cap fallback, restore.
"$ETHTOOL" -C $IF rx-usecs 500
expect_eq "rx-usecs set by ethtool" "$(rx_usecs $IF)" 500
dim_start --iface $IF --interval 100ms --duration 60s
seen=$(wait_rx_usecs $IF 10 15)
report "idle decay from rx-usecs 500, read back" "$seen"
dim_stop
expect_eq "rx-usecs restored after SIGTERM" "$(rx_usecs $IF)" 500
# The tuner starts at the table entry nearest to 500 (256); each idle second moves
# one step left and writes it, the timer alone ("rx-frames (not supported)").
writes=$(sed -n 's/^[0-9.]*s srv0: rx-usecs \([0-9]*\) rx-frames (not supported) .*/\1/p' /tmp/dim.out | tr '\n' ' ')
expect_eq "timer-only writes while idle (controller log)" "$writes" "128 64 10 "
# What the driver reported on the way (polled every 0.2 s): those values, in order.
echo "$seen" | awk '{ for (i = 1; i <= NF; i++) if ($i !~ /^(500|128|64|10)$/ || (i > 1 && $i >= $(i - 1))) exit 1 }' ||
    fail "rx-usecs read back while idle: $seen, want a descending part of 500 128 64 10"

# 3. Take over the dynamic mode; traffic starts the search, idle ends it.
"$ETHTOOL" -C $IF rx-usecs "$orig"
dim_start --iface $IF --take-over --interval 100ms --duration 60s
irq0=$(rx_interrupts $IF)
# Ping-pong: about 2000 round trips a second under TCG, one receive interrupt or
# more each, so windows of 64 interrupts close.
ping_pong 3
values=$(watch_rx_usecs $IF $TRAFFIC | sort -n | uniq | tr '\n' ' ')
wait $TRAFFIC || fail "ping from the client namespace failed: $(cat /tmp/ping.out)"
report "rx-usecs under ping-pong" "values $values($(($(rx_interrupts $IF) - irq0)) receive interrupts; $(tail -n1 /tmp/ping.out))"
highest=$(echo $values | awk '{ print $NF }')
[ "$highest" -ge 64 ] || fail "traffic did not start the search: rx-usecs values $values"
for v in $values; do
    case " $orig 10 64 128 256 " in
    *" $v "*) ;;
    *) fail "rx-usecs $v is not in the controller's e1000e table (10 64 128 256)" ;;
    esac
done
seen=$(wait_rx_usecs $IF 10 10)
report "idle after ping-pong" "$seen"
dim_stop
expect_eq "rx-usecs restored after SIGTERM (the driver's dynamic mode)" "$(rx_usecs $IF)" "$orig"
