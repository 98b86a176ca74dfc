# topology: numa2
# media: 64
#
# linerate serves a 64 MiB file and byte ranges over plain HTTP to curl in the
# client namespace; the traffic crosses cable 1 (srv1, the e1000e on node 1).
. /vm/lib.sh

"$LINERATE" serve --root /srv/media --listen 10.1.0.1:0 >/tmp/linerate.out 2>/tmp/linerate.err &
pid=$!
port=$(wait_listening $pid /tmp/linerate.out http 10.1.0.1)
log "linerate listening on 10.1.0.1:$port"

tx_before=$(nic_counter srv1 tx_bytes)
FETCH_NS=client
fetch_and_compare "http://10.1.0.1:$port/big.bin" /srv/media/big.bin
tx=$(($(nic_counter srv1 tx_bytes) - tx_before))
report "srv1 tx_bytes" "$tx for $FETCHED_BYTES body bytes in $FETCHES connections"
[ "$tx" -ge "$FETCHED_BYTES" ] ||
    fail "srv1 sent $tx bytes, fewer than the $FETCHED_BYTES body bytes: traffic did not cross the NIC"

stop_pid $pid
wait $pid || fail "linerate exited with status $? after TERM; stderr: $(cat /tmp/linerate.err)"
