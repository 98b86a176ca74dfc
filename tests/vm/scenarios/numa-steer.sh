# topology: numa2
# media: 8
#
# NUMA siloing across the emulated NICs. Each NIC's interrupts go to its own node's
# CPU (srv0 -> CPU 0 on node 0, srv1 -> CPU 1 on node 1), as `linerate tune` would
# set them; a client in the namespace connects through each NIC in turn. The server
# runs two workers per node, so the steering program's in-domain spreading runs in
# the kernel: every connection must be served by a worker of the node whose NIC it
# entered (X-Linerate-Worker), both of that node's workers must get some, none may
# be counted as crossing domains; each worker's buffers must
# be on its own node (/status, from the kernel's page lookup); `linerate topo`
# must show the plan, and a configuration that pretends srv1 is on node 0 must move
# it there.
. /vm/lib.sh

# Interrupt affinity: each NIC's vectors on its node's CPU.
for n in 0 1; do
    irqs=$(ls /sys/class/net/srv$n/device/msi_irqs 2>/dev/null || true)
    [ -n "$irqs" ] || irqs=$(awk -v i="srv$n" '$NF ~ i { sub(":", "", $1); print $1 }' /proc/interrupts)
    [ -n "$irqs" ] || fail "no interrupts found for srv$n"
    for irq in $irqs; do
        echo $n >/proc/irq/$irq/smp_affinity_list 2>/dev/null || log "IRQ $irq of srv$n: affinity not settable"
    done
    report "srv$n IRQs" "$(for i in $irqs; do printf '%s->%s ' $i "$(cat /proc/irq/$i/smp_affinity_list)"; done)"
done

# The plan, as the server will use it.
"$LINERATE" topo >/tmp/topo.txt
report "linerate topo" "$(tr '\n' ';' </tmp/topo.txt)"
grep -q "^steering: domain-cbpf" /tmp/topo.txt || fail "steering is not domain-cbpf: $(cat /tmp/topo.txt)"
grep -q "^domain 0 node 0: cpus 0  workers 0-0  nics \[srv0\]" /tmp/topo.txt || fail "domain 0 plan: $(cat /tmp/topo.txt)"
grep -q "^domain 1 node 1: cpus 1  workers 1-1  nics \[srv1\]" /tmp/topo.txt || fail "domain 1 plan: $(cat /tmp/topo.txt)"
"$LINERATE" topo --json | grep -q '"steering": "domain-cbpf"' || fail "topo --json has no steering"

# A pretend mapping moves srv1 to node 0.
printf '[numa.nic_nodes]\nsrv1 = 0\n' >/tmp/remap.toml
"$LINERATE" topo --config /tmp/remap.toml >/tmp/topo-remap.txt
grep -q "^domain 0 node 0: .*nics \[srv0 srv1\]" /tmp/topo-remap.txt || fail "remapped plan: $(cat /tmp/topo-remap.txt)"
grep -q "^nic srv1: node 0 (configured)" /tmp/topo-remap.txt || fail "remapped nic: $(cat /tmp/topo-remap.txt)"

"$LINERATE" serve --root /srv/media --listen 0.0.0.0:0 --admin 127.0.0.1:9090 --debug-headers --workers 4 \
    >/tmp/linerate.out 2>/tmp/linerate.err &
pid=$!
port=$(wait_listening $pid /tmp/linerate.out http 0.0.0.0)
log "linerate listening on port $port"

# worker_of_response URL: "WORKER NODE" from the X-Linerate-Worker field.
worker_of_response() {
    in_client "$CURL" -sS --max-time 60 -r 0-262143 -o /dev/null -D - "$1" |
        sed -n 's/^X-Linerate-Worker: \([0-9]*\) .* node=\([0-9]*\).*/\1 \2/p' | tr -d '\r'
}
per_nic=16
for n in 0 1; do
    workers=""
    for i in $(seq 1 $per_nic); do
        got=$(worker_of_response "http://10.$n.0.1:$port/big.bin")
        expect_eq "node serving connection $i through srv$n" "${got#* }" "$n"
        workers="$workers ${got% *}"
    done
    seen=$(echo $workers | tr ' ' '\n' | sort -u | tr '\n' ' ')
    report "through srv$n" "$per_nic of $per_nic connections served on node $n, by workers $seen"
    [ "$(echo $seen | wc -w)" = 2 ] || fail "connections through srv$n reached workers $seen, not both of node $n"
done

status=$("$CURL" -sS http://127.0.0.1:9090/status)
crossed=$(echo "$status" | awk -F': ' '/"cross_domain_connections"/ { gsub(",", "", $2); print $2; exit }')
expect_eq "connections accepted in another domain than the one they entered" "$crossed" 0
# Each worker object lists "node" then "buffer_node".
pairs=$(echo "$status" | awk -F': ' '
    /"workers"/ { in_workers = 1 }
    in_workers && /"node":/ { gsub(",", "", $2); node = $2 }
    in_workers && /"buffer_node":/ { gsub(",", "", $2); printf "%s=%s ", node, $2 }')
report "worker node=buffer_node" "$pairs"
[ -n "$pairs" ] || fail "no buffer_node in /status: $status"
for p in $pairs; do
    [ "${p%=*}" = "${p#*=}" ] || fail "a worker's buffers are not on its node: $pairs"
done

stop_pid $pid
wait $pid || fail "linerate exited with status $? after TERM; stderr: $(cat /tmp/linerate.err)"
