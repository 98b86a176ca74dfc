//! NUMA topology and the silo plan.
//!
//! [`Topology::discover`] reads the machine from sysfs (through [`Host`], so fixture
//! trees work the same): nodes with their CPUs (only those the process may run on)
//! and distances, each NIC's and each disk's node and each NIC's interrupts with
//! their CPU affinity. A device whose node is missing or -1 is *unknown* and
//! produces a warning; the `[numa]` configuration can pretend a device is on a node
//! (`nic_nodes`, `disk_nodes`), as boards that report NICs on only some nodes need.
//!
//! [`Plan::new`] turns it into silos: one domain per node (or `split_domains` fake
//! domains per node, for testing), workers placed on the domain's CPUs with each
//! domain's workers numbered contiguously (each may run on any CPU of its domain, or
//! on its own CPU only: `numa.pin`), the domain's NICs and disks. The server
//! creates workers and listeners in plan order, so a worker's index is also its
//! listener's position in each `SO_REUSEPORT` group, which the steering program
//! (`server::listen::steering`) relies on.

use std::path::Path;

use serde::Serialize;

use crate::config::{Numa, Pin, Steering};
use crate::sysfs::{format_cpu_list, Host};

/// A NUMA node as seen by this process.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Node {
    pub id: u32,
    /// CPUs of the node that the process may run on.
    pub cpus: Vec<u32>,
    /// Distance to each node, in node order (empty when sysfs does not say).
    pub distances: Vec<u32>,
}

/// An interrupt and the CPUs it may be delivered to.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Irq {
    pub irq: u32,
    pub cpus: Vec<u32>,
}

/// A NIC or a disk.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Device {
    pub name: String,
    pub node: Option<u32>,
    /// The node came from the configuration, not from sysfs.
    pub remapped: bool,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub irqs: Vec<Irq>,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Topology {
    pub nodes: Vec<Node>,
    pub nics: Vec<Device>,
    pub disks: Vec<Device>,
    pub warnings: Vec<String>,
}

impl Topology {
    /// Reads the machine under `host`, keeping only `allowed` CPUs (the affinity
    /// mask, which also reflects the cgroup's cpuset).
    pub fn discover(host: &Host, allowed: &[u32], numa: &Numa) -> Topology {
        let mut warnings = Vec::new();
        let mut nodes: Vec<Node> = host
            .nodes()
            .into_iter()
            .map(|(id, cpus)| Node {
                id,
                cpus: cpus.into_iter().filter(|c| allowed.contains(c)).collect(),
                distances: host.node_distances(id),
            })
            .collect();
        // CPUs the process may use that no node lists (a kernel without NUMA
        // directories): put them on node 0.
        let listed: Vec<u32> = nodes.iter().flat_map(|n| n.cpus.clone()).collect();
        let orphans: Vec<u32> = allowed.iter().copied().filter(|c| !listed.contains(c)).collect();
        if !orphans.is_empty() {
            match nodes.iter_mut().find(|n| n.id == 0) {
                Some(n) => n.cpus.extend(&orphans),
                None => nodes.push(Node { id: 0, cpus: orphans, distances: Vec::new() }),
            }
        }
        let node_ids: Vec<u32> = nodes.iter().map(|n| n.id).collect();
        let mut place = |kind: &str, name: &str, found: Option<u32>, remap: Option<&u32>| -> (Option<u32>, bool) {
            if let Some(&n) = remap {
                if !node_ids.contains(&n) {
                    warnings
                        .push(format!("numa.{kind}_nodes: {name} mapped to node {n}, which does not exist; ignored"));
                } else {
                    return (Some(n), true);
                }
            }
            if let [only] = node_ids[..] {
                // One node: there is nowhere else the device could be.
                return (Some(only), false);
            }
            if found.is_none() {
                warnings.push(format!(
                    "{kind} {name}: sysfs gives no NUMA node (missing or -1); treated as unknown (set numa.{kind}_nodes.{name} to place it)"
                ));
            }
            (found.filter(|n| node_ids.contains(n)), false)
        };
        let nics: Vec<Device> = host
            .nics()
            .into_iter()
            .map(|nic| {
                let (node, remapped) = place("nic", &nic.name, nic.node, numa.nic_nodes.get(&nic.name));
                let irqs =
                    nic.irqs.iter().map(|&irq| Irq { irq, cpus: host.irq_affinity(irq).unwrap_or_default() }).collect();
                Device { name: nic.name, node, remapped, irqs }
            })
            .collect();
        let disks: Vec<Device> = host
            .disks()
            .into_iter()
            .map(|(name, found)| {
                let (node, remapped) = place("disk", &name, found, numa.disk_nodes.get(&name));
                Device { name, node, remapped, irqs: Vec::new() }
            })
            .collect();
        for (kind, map, devices) in [("nic", &numa.nic_nodes, &nics), ("disk", &numa.disk_nodes, &disks)] {
            for name in map.keys().filter(|n| !devices.iter().any(|d| &d.name == *n)) {
                warnings.push(format!("numa.{kind}_nodes: no {kind} named {name} on this machine"));
            }
        }
        // Interrupts served from another node's CPUs cost a crossing per packet.
        for nic in &nics {
            let Some(node) = nic.node else { continue };
            let Some(own) = nodes.iter().find(|n| n.id == node) else { continue };
            let mut foreign_irqs = Vec::new();
            let mut foreign_cpus = Vec::new();
            for irq in &nic.irqs {
                let foreign: Vec<u32> =
                    irq.cpus.iter().copied().filter(|c| listed_node(&nodes, *c).is_some_and(|n| n != node)).collect();
                if !foreign.is_empty() {
                    foreign_irqs.push(irq.irq);
                    foreign_cpus.extend(foreign);
                }
            }
            if !foreign_irqs.is_empty() && !own.cpus.is_empty() {
                warnings.push(format!(
                    "nic {}: IRQs {} may run on CPUs {} outside its node {} (CPUs {}): set their smp_affinity_list to the NIC's node (see `linerate tune`)",
                    nic.name,
                    format_cpu_list(&foreign_irqs),
                    format_cpu_list(&foreign_cpus),
                    node,
                    format_cpu_list(&own.cpus)
                ));
            }
        }
        nodes.retain(|n| !n.cpus.is_empty() || nics.iter().chain(&disks).any(|d| d.node == Some(n.id)));
        Topology { nodes, nics, disks, warnings }
    }
}

fn listed_node(nodes: &[Node], cpu: u32) -> Option<u32> {
    nodes.iter().find(|n| n.cpus.contains(&cpu)).map(|n| n.id)
}

/// One silo.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Domain {
    /// Position in [`Plan::domains`].
    pub index: usize,
    pub node: u32,
    pub cpus: Vec<u32>,
    /// Worker indexes, contiguous.
    pub workers: Vec<usize>,
    pub nics: Vec<String>,
    pub disks: Vec<String>,
}

/// Where one worker runs.
#[derive(Clone, Copy, Debug, Serialize, PartialEq, Eq)]
pub struct Slot {
    pub cpu: u32,
    pub domain: usize,
    pub node: u32,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Plan {
    pub domains: Vec<Domain>,
    /// Worker `i` runs at `workers[i]`.
    pub workers: Vec<Slot>,
    /// `domain-cbpf`, `cpu-cbpf` or `reuseport-hash` (when nothing is left to
    /// steer: one worker, or `domain` steering with one domain that has workers).
    pub steering: &'static str,
    /// Where a worker may run (`numa.pin` resolved): `Cpu`, its slot's CPU only, or
    /// `Domain`, any CPU of its slot's domain.
    pub pin: Pin,
    pub warnings: Vec<String>,
}

impl Plan {
    /// Plans `workers` workers (0: one per CPU) over the topology.
    pub fn new(topo: &Topology, workers: usize, numa: &Numa) -> Plan {
        let split = numa.split_domains.max(1);
        let mut domains: Vec<Domain> = Vec::new();
        for node in topo.nodes.iter().filter(|n| !n.cpus.is_empty()) {
            let mut cpus = node.cpus.clone();
            cpus.sort_unstable();
            let parts = split.min(cpus.len());
            for p in 0..parts {
                let chunk = cpus[p * cpus.len() / parts..(p + 1) * cpus.len() / parts].to_vec();
                let first_of_node = p == 0;
                let devices = |list: &[Device]| -> Vec<String> {
                    if !first_of_node {
                        return Vec::new();
                    }
                    list.iter().filter(|d| d.node == Some(node.id)).map(|d| d.name.clone()).collect()
                };
                domains.push(Domain {
                    index: domains.len(),
                    node: node.id,
                    cpus: chunk,
                    workers: Vec::new(),
                    nics: devices(&topo.nics),
                    disks: devices(&topo.disks),
                });
            }
        }
        // CPUs in domain order; workers spread over them in contiguous blocks so each
        // domain's (and each CPU's) workers have consecutive indexes.
        let ordered: Vec<(u32, usize, u32)> =
            domains.iter().flat_map(|d| d.cpus.iter().map(move |&c| (c, d.index, d.node))).collect();
        let count = if workers == 0 { ordered.len().max(1) } else { workers };
        let mut slots = Vec::with_capacity(count);
        for i in 0..count {
            let (cpu, domain, node) = ordered.get(i * ordered.len() / count).copied().unwrap_or((0, 0, 0));
            slots.push(Slot { cpu, domain, node });
            if let Some(d) = domains.get_mut(domain) {
                d.workers.push(i);
            }
        }
        let staffed = domains.iter().filter(|d| !d.workers.is_empty()).count();
        let steering = match numa.steering {
            Steering::Cpu if count > 1 => "cpu-cbpf",
            Steering::Domain if staffed > 1 => "domain-cbpf",
            _ => "reuseport-hash",
        };
        let mut warnings = topo.warnings.clone();
        for d in domains.iter().filter(|d| d.workers.is_empty()) {
            warnings.push(format!(
                "domain {} (node {}) has no worker: connections arriving there are spread over all workers",
                d.index, d.node
            ));
        }
        Plan { domains, workers: slots, steering, pin: numa.resolved_pin(), warnings }
    }

    /// The CPUs worker `index` may run on.
    pub fn worker_cpus(&self, index: usize) -> Vec<usize> {
        let slot = self.workers[index];
        match (self.pin, self.domains.get(slot.domain)) {
            (Pin::Domain, Some(d)) => d.cpus.iter().map(|&c| c as usize).collect(),
            _ => vec![slot.cpu as usize],
        }
    }

    /// The domain each CPU belongs to (index = CPU).
    pub fn cpu_domains(&self) -> Vec<Option<usize>> {
        let max = self.domains.iter().flat_map(|d| d.cpus.iter()).max().map_or(0, |&c| c as usize + 1);
        let mut map = vec![None; max];
        for d in &self.domains {
            for &c in &d.cpus {
                map[c as usize] = Some(d.index);
            }
        }
        map
    }

    /// The plan as `linerate topo` prints it.
    pub fn render_text(&self, topo: &Topology) -> String {
        let mut out = String::new();
        out.push_str(&format!("steering: {}\n", self.steering));
        out.push_str(match self.pin {
            Pin::Cpu => "workers: each on its own CPU (pin cpu)\n",
            _ => "workers: each on any CPU of its domain (pin domain)\n",
        });
        for d in &self.domains {
            let distances = topo.nodes.iter().find(|n| n.id == d.node).map(|n| &n.distances);
            out.push_str(&format!(
                "domain {} node {}: cpus {}  workers {}  nics [{}]  disks [{}]{}\n",
                d.index,
                d.node,
                format_cpu_list(&d.cpus),
                if d.workers.is_empty() {
                    "-".into()
                } else {
                    format!("{}-{}", d.workers[0], d.workers[d.workers.len() - 1])
                },
                d.nics.join(" "),
                d.disks.join(" "),
                distances.filter(|d| !d.is_empty()).map_or(String::new(), |d| format!("  distances {d:?}"))
            ));
        }
        for nic in &topo.nics {
            let node = nic.node.map_or("unknown".to_string(), |n| n.to_string());
            let irqs: Vec<String> =
                nic.irqs.iter().map(|i| format!("{}->{}", i.irq, format_cpu_list(&i.cpus))).collect();
            out.push_str(&format!(
                "nic {}: node {}{}  irqs {}\n",
                nic.name,
                node,
                if nic.remapped { " (configured)" } else { "" },
                if irqs.is_empty() { "-".into() } else { irqs.join(" ") }
            ));
        }
        for disk in &topo.disks {
            let node = disk.node.map_or("unknown".to_string(), |n| n.to_string());
            out.push_str(&format!(
                "disk {}: node {}{}\n",
                disk.name,
                node,
                if disk.remapped { " (configured)" } else { "" }
            ));
        }
        for w in &self.warnings {
            out.push_str(&format!("warning: {w}\n"));
        }
        out
    }
}

/// `linerate topo`: the machine the server would see and the silo plan it would use
/// with `config` and `workers`, read from the sysfs and procfs trees under `sysroot`
/// (`/`: this host, restricted to the CPUs the process may run on; anything else: a
/// fixture tree, every CPU it lists).
pub fn plan_for(config: &crate::config::Config, workers: usize, sysroot: &Path) -> anyhow::Result<(Topology, Plan)> {
    let allowed: Vec<u32> = if sysroot == Path::new("/") {
        linerate_sys::allowed_cpus()?.into_iter().map(|c| c as u32).collect()
    } else {
        // A fixture tree: every CPU it lists.
        Host::new(sysroot).nodes().into_iter().flat_map(|(_, cpus)| cpus).collect()
    };
    let topo = Topology::discover(&Host::new(sysroot), &allowed, &config.numa);
    let plan = Plan::new(&topo, workers, &config.numa);
    Ok((topo, plan))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    /// A sysfs/procfs tree: nodes with cpulists, NICs with node and IRQs, disks.
    struct Fixture {
        dir: tempfile::TempDir,
    }

    impl Fixture {
        fn new() -> Fixture {
            Fixture { dir: tempfile::tempdir().unwrap() }
        }
        fn write(&self, rel: &str, text: &str) {
            let p = self.dir.path().join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        }
        fn node(&self, n: u32, cpus: &str, distance: &str) {
            self.write(&format!("sys/devices/system/node/node{n}/cpulist"), cpus);
            self.write(&format!("sys/devices/system/node/node{n}/distance"), distance);
        }
        fn nic(&self, name: &str, node: i32, irqs: &[(u32, &str)]) {
            self.write(&format!("sys/class/net/{name}/device/numa_node"), &node.to_string());
            self.write(&format!("sys/class/net/{name}/device/uevent"), "DRIVER=mlx5_core\n");
            for (irq, cpus) in irqs {
                self.write(&format!("sys/class/net/{name}/device/msi_irqs/{irq}"), "msix");
                self.write(&format!("proc/irq/{irq}/smp_affinity_list"), cpus);
            }
        }
        fn disk(&self, name: &str, node: i32) {
            self.write(&format!("sys/block/{name}/device/numa_node"), &node.to_string());
        }
        fn host(&self) -> Host {
            Host::new(self.dir.path())
        }
    }

    /// A 4-node board: NICs on nodes 0 and 2 only, disks uneven, one NIC whose
    /// IRQs point at the wrong node, one disk with node -1.
    fn board4() -> Fixture {
        let f = Fixture::new();
        f.node(0, "0-3", "10 21 31 31");
        f.node(1, "4-7", "21 10 31 31");
        f.node(2, "8-11", "31 31 10 21");
        f.node(3, "12-15", "31 31 21 10");
        f.nic("eth0", 0, &[(40, "0-3"), (41, "1")]);
        f.nic("eth1", 2, &[(50, "0")]);
        f.write("sys/class/net/lo/statistics/rx_bytes", "0");
        f.disk("nvme0n1", 0);
        f.disk("nvme1n1", 0);
        f.disk("nvme2n1", 3);
        f.disk("sda", -1);
        f
    }

    fn all_cpus(n: u32) -> Vec<u32> {
        (0..n).collect()
    }

    #[test]
    fn four_node_board() {
        let f = board4();
        let t = Topology::discover(&f.host(), &all_cpus(16), &Numa::default());
        assert_eq!(t.nodes.len(), 4);
        assert_eq!(t.nodes[2].cpus, vec![8, 9, 10, 11]);
        assert_eq!(t.nodes[3].distances, vec![31, 31, 21, 10]);
        let nic = |n: &str| t.nics.iter().find(|d| d.name == n).unwrap().clone();
        assert_eq!(nic("eth0").node, Some(0));
        assert_eq!(nic("eth1").node, Some(2));
        assert_eq!(nic("eth1").irqs, vec![Irq { irq: 50, cpus: vec![0] }]);
        assert!(t.nics.iter().all(|n| n.name != "lo"), "only interfaces with a device");
        let sda = t.disks.iter().find(|d| d.name == "sda").unwrap();
        assert_eq!(sda.node, None);
        assert!(t.warnings.iter().any(|w| w.contains("disk sda") && w.contains("unknown")), "{:?}", t.warnings);
        assert!(t.warnings.iter().any(|w| w.contains("eth1") && w.contains("IRQs 50")), "{:?}", t.warnings);
        assert!(!t.warnings.iter().any(|w| w.contains("eth0")), "{:?}", t.warnings);

        let plan = Plan::new(&t, 0, &Numa::default());
        assert_eq!(plan.domains.len(), 4);
        assert_eq!(plan.workers.len(), 16);
        assert_eq!(plan.domains[0].nics, vec!["eth0"]);
        assert!(plan.domains[1].nics.is_empty(), "no NIC on node 1");
        assert_eq!(plan.domains[0].disks, vec!["nvme0n1", "nvme1n1"]);
        assert_eq!(plan.domains[3].disks, vec!["nvme2n1"]);
        assert_eq!(plan.domains[2].workers, vec![8, 9, 10, 11]);
        assert_eq!(plan.workers[9], Slot { cpu: 9, domain: 2, node: 2 });
        assert_eq!(plan.steering, "domain-cbpf");
        assert_eq!(plan.pin, Pin::Domain);
        assert_eq!(plan.worker_cpus(9), vec![8, 9, 10, 11], "any CPU of its domain");
        let cpu = Numa { steering: Steering::Cpu, ..Numa::default() };
        let plan = Plan::new(&t, 0, &cpu);
        assert_eq!(plan.steering, "cpu-cbpf");
        assert_eq!((plan.pin, plan.worker_cpus(9)), (Pin::Cpu, vec![9]), "steered by CPU: its own CPU");
        let pinned = Plan::new(&t, 0, &Numa { pin: Pin::Cpu, ..Numa::default() });
        assert_eq!((pinned.steering, pinned.worker_cpus(9)), ("domain-cbpf", vec![9]));
    }

    #[test]
    fn pretend_mappings_and_affinity() {
        let f = board4();
        let mut numa = Numa::default();
        numa.nic_nodes.insert("eth1".into(), 1);
        numa.disk_nodes.insert("sda".into(), 2);
        numa.nic_nodes.insert("nope0".into(), 1);
        numa.disk_nodes.insert("nvme0n1".into(), 9);
        // The process may use node 0 and half of node 1 only.
        let t = Topology::discover(&f.host(), &[0, 1, 2, 3, 4, 5], &numa);
        let eth1 = t.nics.iter().find(|d| d.name == "eth1").unwrap();
        assert_eq!((eth1.node, eth1.remapped), (Some(1), true));
        assert!(t.warnings.iter().any(|w| w.contains("nope0")), "{:?}", t.warnings);
        assert!(t.warnings.iter().any(|w| w.contains("node 9")), "{:?}", t.warnings);
        let plan = Plan::new(&t, 0, &numa);
        // Nodes 2 and 3 keep their devices but have no CPUs here: no domain.
        assert_eq!(plan.domains.iter().map(|d| d.node).collect::<Vec<_>>(), vec![0, 1]);
        assert_eq!(plan.domains[1].cpus, vec![4, 5]);
        assert_eq!(plan.domains[1].nics, vec!["eth1"]);
        assert_eq!(plan.workers.len(), 6);
    }

    #[test]
    fn workers_fewer_or_more_than_cpus_stay_contiguous_per_domain() {
        let f = Fixture::new();
        f.node(0, "0-1", "10 20");
        f.node(1, "2-3", "20 10");
        let t = Topology::discover(&f.host(), &all_cpus(4), &Numa::default());
        let p = Plan::new(&t, 2, &Numa::default());
        assert_eq!(p.workers.iter().map(|s| s.cpu).collect::<Vec<_>>(), vec![0, 2], "one per domain");
        let p = Plan::new(&t, 8, &Numa::default());
        assert_eq!(p.domains[0].workers, vec![0, 1, 2, 3]);
        assert_eq!(p.workers.iter().map(|s| s.cpu).collect::<Vec<_>>(), vec![0, 0, 1, 1, 2, 2, 3, 3]);
        let p = Plan::new(&t, 1, &Numa::default());
        assert_eq!(p.steering, "reuseport-hash");
        assert!(p.warnings.iter().any(|w| w.contains("domain 1")), "{:?}", p.warnings);
    }

    #[test]
    fn split_into_fake_domains() {
        let f = Fixture::new();
        f.node(0, "0-3", "10");
        f.nic("eth0", 0, &[]);
        let numa = Numa { split_domains: 2, ..Numa::default() };
        let t = Topology::discover(&f.host(), &all_cpus(4), &numa);
        assert!(t.warnings.is_empty(), "{:?}", t.warnings);
        let p = Plan::new(&t, 0, &numa);
        assert_eq!(p.domains.len(), 2);
        assert_eq!((p.domains[0].cpus.clone(), p.domains[1].cpus.clone()), (vec![0, 1], vec![2, 3]));
        assert_eq!(p.domains[0].nics, vec!["eth0"]);
        assert_eq!(p.cpu_domains(), vec![Some(0), Some(0), Some(1), Some(1)]);
        assert!(p.render_text(&t).contains("domain 1 node 0: cpus 2-3  workers 2-3"));
    }

    #[test]
    fn one_node_laptop_and_missing_node_dirs() {
        let f = Fixture::new();
        f.write("sys/devices/system/cpu/online", "0-3");
        f.nic("wlan0", -1, &[]);
        let t = Topology::discover(&f.host(), &all_cpus(4), &Numa::default());
        assert_eq!(t.nodes.len(), 1);
        assert_eq!(t.nodes[0].cpus, vec![0, 1, 2, 3]);
        // One node: the NIC can only be there, and that is not worth a warning.
        assert_eq!(t.nics[0].node, Some(0));
        assert!(t.warnings.is_empty(), "{:?}", t.warnings);
        // One domain: steering by domain has nothing to choose; by CPU it still does.
        assert_eq!(Plan::new(&t, 0, &Numa::default()).steering, "reuseport-hash");
        let cpu = Numa { steering: Steering::Cpu, ..Numa::default() };
        assert_eq!(Plan::new(&t, 0, &cpu).steering, "cpu-cbpf");
        let live = Topology::discover(&Host::new(Path::new("/")), &[0], &Numa::default());
        assert!(live.nodes.iter().any(|n| n.cpus.contains(&0)));
    }
}
