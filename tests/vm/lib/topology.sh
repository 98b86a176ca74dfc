# Machine topologies a scenario can ask for with its `# topology:` header.
# Sourced by tests/vm/run. A topology is a function `topology_<name>` that calls
# topo_machine once and topo_cable for each cable; those fill:
#   QEMU_TOPO    qemu arguments (machine, CPUs, memory, NUMA nodes, PCI, NICs)
#   TOPO_NICS    "name=mac=node" per NIC, the node qemu was told (-1: none); the guest
#                renames each NIC by its MAC, so scenarios use stable names
#   TOPO_DRIVERS kernel modules the NICs need
#   TOPO_NODES   number of NUMA nodes
#
# Network layout every topology gets (set up by guest/init):
#   cable N = two qemu hub ports joined like a crossover cable:
#     srvN (server side, root network namespace)  10.N.0.1/24
#     cliN (client side, namespace "client")      10.N.0.2/24
#   so a client in the namespace reaches a server on 10.N.0.1 only through the
#   emulated NICs of cable N, never through loopback.

QEMU_TOPO=()
TOPO_NICS=""
TOPO_DRIVERS=""
TOPO_NODES=1
TOPO_EXPANDERS=" "

# topo_machine NODES CPUS_PER_NODE MEM_MIB_PER_NODE: a q35 machine (microvm ignores
# -numa) with NODES NUMA nodes, each with its own CPUs and memory.
topo_machine() {
    local nodes=$1 cpus=$2 mem=$3 n first last
    TOPO_NODES=$nodes
    QEMU_TOPO+=(-machine q35 -m $((nodes * mem)) -smp $((nodes * cpus)))
    [ "$nodes" -gt 1 ] || return 0
    for ((n = 0; n < nodes; n++)); do
        first=$((n * cpus))
        last=$((first + cpus - 1))
        QEMU_TOPO+=(-object "memory-backend-ram,id=mem$n,size=${mem}M"
            -numa "node,nodeid=$n,cpus=$first-$last,memdev=mem$n")
    done
}

# Sets TOPO_BUS to the qemu bus for a NIC on NUMA node $1 ("-" for the root complex, which
# the guest sees as node -1), adding a PCIe expander bridge for that node the first
# time: only devices behind an expander with numa_node=N report node N in sysfs.
topo_bus_for_node() {
    local node=$1 port=$2
    if [ "$node" = - ]; then
        TOPO_BUS=pcie.0
        return
    fi
    case $TOPO_EXPANDERS in
    *" $node "*) ;;
    *)
        QEMU_TOPO+=(-device "pxb-pcie,id=pxb$node,bus_nr=$((32 + 32 * node)),numa_node=$node,bus=pcie.0")
        TOPO_EXPANDERS="$TOPO_EXPANDERS$node "
        ;;
    esac
    QEMU_TOPO+=(-device "pcie-root-port,id=rp$port,bus=pxb$node,chassis=$((port + 1)),slot=1")
    TOPO_BUS=rp$port
}

topo_driver() {
    case $1 in
    e1000e) echo e1000e ;;
    virtio-net-pci) echo "virtio_pci virtio_net" ;;
    igb) echo igb ;;
    *) die "topology: no driver known for NIC model $1" ;;
    esac
}

# topo_cable N SERVER_MODEL SERVER_NODE CLIENT_MODEL: cable N (see above) with the
# server NIC on NUMA node SERVER_NODE ("-" for none) and the client NIC on the root
# complex. Models are qemu device names (e1000e, virtio-net-pci).
topo_cable() {
    local n=$1 smodel=$2 snode=$3 cmodel=$4 smac cmac
    smac=$(printf '52:54:00:4c:%02x:01' "$n")
    cmac=$(printf '52:54:00:4c:%02x:02' "$n")
    topo_bus_for_node "$snode" "$n"
    QEMU_TOPO+=(-netdev "hubport,id=srv$n,hubid=$n"
        -device "$smodel,netdev=srv$n,mac=$smac,bus=$TOPO_BUS,romfile="
        -netdev "hubport,id=cli$n,hubid=$n"
        -device "$cmodel,netdev=cli$n,mac=$cmac,bus=pcie.0,romfile=")
    TOPO_NICS="$TOPO_NICS srv$n=$smac=${snode/-/-1} cli$n=$cmac=-1"
    TOPO_DRIVERS="$TOPO_DRIVERS $(topo_driver "$smodel") $(topo_driver "$cmodel")"
}

# topo_disk IMAGE NODE: the raw disk image IMAGE as a virtio-blk disk (the guest's
# /dev/vda) behind the PCIe expander of NUMA node NODE.
topo_disk() {
    local image=$1 node=$2
    topo_bus_for_node "$node" 9
    QEMU_TOPO+=(-drive "file=$image,format=raw,if=none,id=disk0,cache=unsafe"
        -device "virtio-blk-pci,drive=disk0,bus=$TOPO_BUS,romfile=")
}

# One node, two CPUs, no NIC: for scenarios that only use loopback (boots faster:
# no NIC driver, no link to wait for).
topology_loopback() {
    topo_machine 1 2 1024
}

# One node, two CPUs, one cable whose server NIC is an e1000e.
topology_numa1() {
    topo_machine 1 2 1024
    topo_cable 0 e1000e - virtio-net-pci
}

# Two nodes with one CPU and 512 MiB each; cable 0's server NIC (e1000e) sits on
# node 0, cable 1's on node 1. The e1000e is the emulated NIC whose interrupt
# coalescing (ethtool -C rx-usecs) can be set; the virtio-net client side is cheaper
# to emulate.
topology_numa2() {
    topo_machine 2 1 512
    topo_cable 0 e1000e 0 virtio-net-pci
    topo_cable 1 e1000e 1 virtio-net-pci
}
