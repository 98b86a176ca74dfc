# topology: numa2
# disk: 1 16 2
# modules: virtio_blk crc32c_generic ext4
# timeout: 600
# default: no
#
# The NUMA siloing measurements (docs/performance/numa-vm.md): 2 nodes with one CPU
# each, a NIC on each node with its interrupts on its own node's CPU, and an ext4
# disk on node 1 holding 16 titles of 2 MiB. For each mode the page cache is
# dropped, linerate starts with every response's pages sampled, and a client
# fetches random titles, then /status gives:
#   in-domain %     connections accepted by a worker of the domain whose NIC (and
#                   interrupt CPU) received them
#   remote-page %   served bytes whose page-cache pages sat on another node than
#                   the serving worker's
#   crossings/byte  remote pages plus connections served across domains, per byte
# Modes: siloing off (reuseport hash), on (domain steering, network-centric pages),
# disk-centric with clients on both NICs, and disk-centric with clients entering on
# the disk's node (srv1) only. Targets: on >= 99% in-domain (off about 50%);
# on <= 55% remote pages; disk-centric through srv1 <= 5% remote pages.
. /vm/lib.sh

for n in 0 1; do
    irqs=$(ls /sys/class/net/srv$n/device/msi_irqs 2>/dev/null || true)
    [ -n "$irqs" ] || fail "no MSI interrupts for srv$n"
    for irq in $irqs; do echo $n >/proc/irq/$irq/smp_affinity_list; done
done
mkdir -p /srv/disk
mount -t ext4 /dev/vda /srv/disk || fail "cannot mount the test disk"
"$LINERATE" topo >/tmp/topo.txt
grep -q "^disk vda: node 1" /tmp/topo.txt || fail "the disk is not seen on node 1: $(cat /tmp/topo.txt)"

TITLES=16
REQUESTS=48

# json_total KEY: a number from the totals of /status.
json_total() {
    echo "$STATUS" | awk -F': ' -v k="\"$1\"" '$1 ~ k { gsub(",", "", $2); print $2; exit }'
}

# measure NAME STEERING PLACEMENT NICS: one run; prints a table row, sets
# IN_DOMAIN and REMOTE (percent, integers).
measure() {
    local name=$1 steering=$2 placement=$3 nics=$4 pid port i n title accepted crossed sampled remote crossing
    sync
    echo 3 >/proc/sys/vm/drop_caches
    printf '[numa]\nsteering = "%s"\nplacement = "%s"\npage_sample = 1.0\n' "$steering" "$placement" >/tmp/numa.toml
    "$LINERATE" serve --config /tmp/numa.toml --root /srv/disk --listen 0.0.0.0:0 --admin 127.0.0.1:9090 \
        >/tmp/linerate.out 2>/tmp/linerate.err &
    pid=$!
    port=$(wait_listening $pid /tmp/linerate.out http 0.0.0.0)
    i=0
    while [ $i -lt $REQUESTS ]; do
        title=$((RANDOM % TITLES + 1))
        case $nics in
        both) n=$((i % 2)) ;;
        *) n=$nics ;;
        esac
        in_client "$CURL" -sS --fail --max-time 60 -o /dev/null "http://10.$n.0.1:$port/title$title.bin" ||
            fail "$name: fetch of title$title through srv$n failed"
        i=$((i + 1))
    done
    STATUS=$("$CURL" -sS http://127.0.0.1:9090/status)
    stop_pid $pid
    wait $pid || fail "$name: linerate exited with status $?; stderr: $(cat /tmp/linerate.err)"
    accepted=$(json_total connections_accepted)
    crossed=$(json_total cross_domain_connections)
    sampled=$(json_total page_sampled_bytes)
    remote=$(json_total remote_page_bytes)
    crossing=$(json_total crossing_bytes)
    [ "$accepted" = $REQUESTS ] || fail "$name: $accepted connections accepted, want $REQUESTS"
    [ "$sampled" -gt 0 ] || fail "$name: no page samples"
    IN_DOMAIN=$((100 * (accepted - crossed) / accepted))
    REMOTE=$((100 * remote / sampled))
    report_line "| $name | $(awk "BEGIN { printf \"%.1f\", 100 * ($accepted - $crossed) / $accepted }") | $(awk "BEGIN { printf \"%.1f\", 100 * $remote / $sampled }") | $(awk "BEGIN { printf \"%.3f\", $crossing / $sampled }") |"
}

report_line "| mode | connections in receiving domain % | bytes from remote-node pages % | crossings per byte |"
report_line "|---|---|---|---|"
measure "siloing off (reuseport hash), both NICs" hash network both
off_in=$IN_DOMAIN
measure "siloing on, network-centric, both NICs" domain network both
on_in=$IN_DOMAIN on_remote=$REMOTE
measure "disk-centric (disk on node 1), both NICs" domain disk both
measure "disk-centric (disk on node 1), clients on srv1" domain disk 1
disk_remote=$REMOTE

[ "$on_in" -ge 99 ] || fail "siloing on: $on_in% of connections in their receiving domain, want >= 99%"
[ "$off_in" -le 85 ] || fail "siloing off: $off_in% in their receiving domain: the hash did not spread them (is steering really off?)"
[ "$on_remote" -le 55 ] || fail "network-centric: $on_remote% of bytes from remote pages, want <= 55%"
[ "$disk_remote" -le 5 ] || fail "disk-centric with disk and NIC on one node: $disk_remote% remote, want <= 5%"
