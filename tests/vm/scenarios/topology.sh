# topology: numa2
#
# The guest's sysfs shows the topology qemu was asked for, in the files linerate's
# topology code reads: nodes and their CPUs, the distance table, each NIC's node.
# (Once `linerate topo --json` exists, its plan is checked here too.)
. /vm/lib.sh

nodes=$(ls -d /sys/devices/system/node/node[0-9]* | sed 's|.*/node||' | sort -n | tr '\n' ' ')
report nodes "$nodes"
expect_eq "NUMA nodes" "$nodes" "0 1 "
report online "$(cat /sys/devices/system/node/online)"

# One CPU per node, in order; distances are qemu's defaults (10 local, 20 remote).
for n in 0 1; do
    dir=/sys/devices/system/node/node$n
    cpus=$(cat "$dir/cpulist")
    distance=$(cat "$dir/distance")
    mem_kib=$(awk '/MemTotal/ { print $4 }' "$dir/meminfo")
    report "node$n" "cpulist=$cpus distance=[$distance] memtotal_kib=$mem_kib"
    expect_eq "node$n cpulist" "$cpus" "$n"
    [ -e "$dir/cpu$n" ] || fail "$dir/cpu$n missing"
    # Each node has 512 MiB; the kernel keeps some, so accept 400-512 MiB.
    [ "$mem_kib" -gt 409600 ] && [ "$mem_kib" -le 524288 ] ||
        fail "node$n MemTotal $mem_kib KiB, want about 512 MiB"
done
expect_eq "node0 distance" "$(cat /sys/devices/system/node/node0/distance)" "10 20"
expect_eq "node1 distance" "$(cat /sys/devices/system/node/node1/distance)" "20 10"

# NICs: the node in sysfs is the one qemu's expander bridge was given (-1 for
# NICs on the root complex). For virtio-net, `device` points at the virtio device,
# whose parent is the PCI function holding numa_node.
for nic in $NICS; do
    name=${nic%%=*}
    want=${nic##*=}
    ns=""
    case $name in cli*) ns=in_client ;; esac
    dev=$($ns readlink -f "/sys/class/net/$name/device")
    if [ -e "$dev/numa_node" ]; then
        node_file=$dev/numa_node
    else
        node_file=$dev/../numa_node
    fi
    got=$($ns cat "$node_file")
    driver=$(basename "$($ns readlink -f "/sys/class/net/$name/device/driver")")
    report "nic $name" "numa_node=$got driver=$driver pci=$($ns readlink -f "$node_file" | sed 's|/numa_node||; s|.*/||')"
    expect_eq "$name numa_node" "$got" "$want"
    # What the topology code will also read for the NIC's CPUs: local_cpulist.
    if [ "$want" != -1 ]; then
        local_cpus=$($ns cat "$(dirname "$node_file")/local_cpulist")
        report "nic $name local_cpulist" "$local_cpus"
        expect_eq "$name local_cpulist" "$local_cpus" "$want"
    fi
done
log "sysfs matches the requested topology"
