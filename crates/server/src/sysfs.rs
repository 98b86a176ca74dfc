//! Read and write access to a sysfs/procfs tree under a root directory (`/` on a
//! live host, a fixture or a captured snapshot in tests), and the hardware facts
//! the topology and the host checks share: NUMA nodes, their CPUs and distances,
//! NICs with their nodes and interrupts, block devices with their nodes.

use std::collections::BTreeSet;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

/// A host seen through its `/proc` and `/sys` files, under `root`.
#[derive(Clone, Debug)]
pub struct Host {
    root: PathBuf,
}

/// A network interface backed by a device (not `lo`, bridges, veth...).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Nic {
    pub name: String,
    pub driver: String,
    /// NUMA node of the device; `None` when the firmware does not say (-1).
    pub node: Option<u32>,
    pub rx_queues: u32,
    pub tx_queues: u32,
    /// Interrupts of the device, ordered by number.
    pub irqs: Vec<u32>,
}

impl Host {
    pub fn new(root: impl Into<PathBuf>) -> Host {
        Host { root: root.into() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn is_live(&self) -> bool {
        self.root == Path::new("/")
    }

    /// The absolute path of `rel` (e.g. `proc/sys/net/core/somaxconn`).
    pub fn path(&self, rel: &str) -> PathBuf {
        self.root.join(rel.trim_start_matches('/'))
    }

    pub fn exists(&self, rel: &str) -> bool {
        self.path(rel).exists()
    }

    /// The file's contents without the trailing newline.
    pub fn read(&self, rel: &str) -> io::Result<String> {
        let s = fs::read_to_string(self.path(rel))?;
        Ok(s.trim_end_matches('\n').to_string())
    }

    pub fn read_u64(&self, rel: &str) -> io::Result<u64> {
        let s = self.read(rel)?;
        s.trim().parse().map_err(|_| io::Error::new(io::ErrorKind::InvalidData, format!("{rel}: not a number: {s:?}")))
    }

    /// Writes a value the way `echo value > file` does.
    pub fn write(&self, rel: &str, value: &str) -> io::Result<()> {
        fs::write(self.path(rel), format!("{value}\n"))
    }

    /// Names in a directory, sorted; empty when it does not exist.
    pub fn list(&self, rel: &str) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(self.path(rel))
            .map(|d| d.filter_map(|e| e.ok()).filter_map(|e| e.file_name().into_string().ok()).collect())
            .unwrap_or_default();
        v.sort();
        v
    }

    /// Online NUMA nodes and their CPUs; one node with every online CPU when the
    /// kernel has no NUMA support.
    pub fn nodes(&self) -> Vec<(u32, Vec<u32>)> {
        let mut nodes: Vec<(u32, Vec<u32>)> = self
            .list("sys/devices/system/node")
            .iter()
            .filter_map(|n| n.strip_prefix("node")?.parse::<u32>().ok())
            .filter_map(|n| {
                Some((n, parse_cpu_list(&self.read(&format!("sys/devices/system/node/node{n}/cpulist")).ok()?)?))
            })
            .collect();
        nodes.sort();
        if nodes.is_empty() {
            let cpus =
                self.read("sys/devices/system/cpu/online").ok().and_then(|s| parse_cpu_list(&s)).unwrap_or_default();
            nodes.push((0, cpus));
        }
        nodes
    }

    pub fn node_cpus(&self, node: u32) -> Vec<u32> {
        self.nodes().into_iter().find(|(n, _)| *n == node).map(|(_, c)| c).unwrap_or_default()
    }

    /// Every interface that has a device behind it.
    pub fn nics(&self) -> Vec<Nic> {
        self.list("sys/class/net").into_iter().filter_map(|name| self.nic(&name)).collect()
    }

    pub fn nic(&self, name: &str) -> Option<Nic> {
        if !self.exists(&format!("sys/class/net/{name}/device")) {
            return None;
        }
        self.interface(name)
    }

    /// Any interface, with or without a device (veth, bridges): what `nic` reads,
    /// with an empty driver and no interrupts when there is no device.
    pub fn interface(&self, name: &str) -> Option<Nic> {
        let base = format!("sys/class/net/{name}");
        if name.is_empty() || name.contains('/') || !self.exists(&base) {
            return None;
        }
        let driver = self
            .read(&format!("{base}/device/uevent"))
            .ok()
            .and_then(|u| u.lines().find_map(|l| l.strip_prefix("DRIVER=").map(str::to_string)))
            .unwrap_or_default();
        // virtio devices: `device` is the virtio device; its parent PCI function
        // carries the node.
        let node = [format!("{base}/device/numa_node"), format!("{base}/device/../numa_node")]
            .iter()
            .find_map(|p| self.read(p).ok().and_then(|s| s.trim().parse::<i64>().ok()));
        let queues = self.list(&format!("{base}/queues"));
        let count = |prefix: &str| queues.iter().filter(|q| q.starts_with(prefix)).count() as u32;
        Some(Nic {
            name: name.to_string(),
            driver,
            node: node.and_then(|n| u32::try_from(n).ok()),
            rx_queues: count("rx-"),
            tx_queues: count("tx-"),
            irqs: self.nic_irqs(name),
        })
    }

    /// Interrupts of a NIC: its MSI/MSI-X vectors (on the device, or on the parent
    /// PCI function for virtio), else the `/proc/interrupts` lines that name it.
    fn nic_irqs(&self, name: &str) -> Vec<u32> {
        let base = format!("sys/class/net/{name}/device");
        for dir in [format!("{base}/msi_irqs"), format!("{base}/../msi_irqs")] {
            let irqs: BTreeSet<u32> = self.list(&dir).iter().filter_map(|s| s.parse().ok()).collect();
            if !irqs.is_empty() {
                return irqs.into_iter().collect();
            }
        }
        self.interrupts().into_iter().filter(|l| l.name_mentions(name)).map(|l| l.irq).collect()
    }

    /// Distances from `node` to every node, in node order (`node*/distance`).
    pub fn node_distances(&self, node: u32) -> Vec<u32> {
        self.read(&format!("sys/devices/system/node/node{node}/distance"))
            .map(|s| s.split_whitespace().filter_map(|d| d.parse().ok()).collect())
            .unwrap_or_default()
    }

    /// Block devices with a device behind them (not loop, ram, dm), and the NUMA
    /// node of that device (`None` when unknown or -1).
    pub fn disks(&self) -> Vec<(String, Option<u32>)> {
        self.list("sys/block")
            .into_iter()
            .filter(|name| self.exists(&format!("sys/block/{name}/device")))
            .map(|name| {
                let node =
                    // NVMe and SCSI: on the device; virtio-blk: on the PCI function above it.
                    [format!("sys/block/{name}/device/numa_node"), format!("sys/block/{name}/device/../numa_node")]
                        .iter()
                        .find_map(|p| self.read(p).ok().and_then(|s| s.trim().parse::<i64>().ok()))
                        .and_then(|n| u32::try_from(n).ok());
                (name, node)
            })
            .collect()
    }

    /// CPUs an interrupt may be delivered to (`/proc/irq/N/smp_affinity_list`).
    pub fn irq_affinity(&self, irq: u32) -> Option<Vec<u32>> {
        parse_cpu_list(&self.read(&format!("proc/irq/{irq}/smp_affinity_list")).ok()?)
    }

    /// The numbered lines of `/proc/interrupts`.
    pub fn interrupts(&self) -> Vec<InterruptLine> {
        self.read("proc/interrupts").map(|s| parse_interrupts(&s)).unwrap_or_default()
    }

    /// Names of running processes (`/proc/PID/comm`).
    pub fn process_names(&self) -> Vec<String> {
        self.list("proc")
            .iter()
            .filter(|p| p.bytes().all(|b| b.is_ascii_digit()))
            .filter_map(|p| self.read(&format!("proc/{p}/comm")).ok())
            .collect()
    }

    /// The running kernel's release (`uname -r`).
    pub fn kernel_release(&self) -> Option<String> {
        self.read("proc/sys/kernel/osrelease").ok().map(|s| s.trim().to_string())
    }
}

/// One line of `/proc/interrupts` with a numeric IRQ.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InterruptLine {
    pub irq: u32,
    /// Count per CPU, in CPU order.
    pub per_cpu: Vec<u64>,
    /// The action name (last column), e.g. `eth0-rx-0`, `virtio2-input.0`.
    pub name: String,
}

impl InterruptLine {
    /// True when the action name is `iface` or starts with `iface-`/`iface_`/`iface@`.
    pub fn name_mentions(&self, iface: &str) -> bool {
        self.name
            .split([' ', ','])
            .any(|n| n == iface || n.strip_prefix(iface).is_some_and(|rest| rest.starts_with(['-', '_', '@', ':'])))
    }
}

pub fn parse_interrupts(text: &str) -> Vec<InterruptLine> {
    let mut lines = text.lines();
    let cpus = lines.next().map_or(0, |h| h.split_whitespace().count());
    lines
        .filter_map(|line| {
            let (irq, rest) = line.split_once(':')?;
            let irq = irq.trim().parse().ok()?;
            let mut fields = rest.split_whitespace();
            let per_cpu: Vec<u64> = fields.by_ref().take(cpus).map_while(|f| f.parse().ok()).collect();
            // Chip name, hwirq and trigger come next; the action names are the rest
            // after the trigger ("edge"/"fasteoi"), which we find as the last column
            // group: take the final whitespace-separated token(s) after the trigger.
            let rest: Vec<&str> = fields.collect();
            let trigger = rest.iter().position(|f| f.ends_with("edge") || f.ends_with("level") || f.contains("eoi"));
            let name = match trigger {
                Some(i) => rest[i + 1..].join(" "),
                None => rest.last().map(|s| s.to_string()).unwrap_or_default(),
            };
            Some(InterruptLine { irq, per_cpu, name })
        })
        .collect()
}

/// Parses a CPU list like `0-3,8,10-11`.
pub fn parse_cpu_list(s: &str) -> Option<Vec<u32>> {
    let mut cpus = Vec::new();
    for part in s.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (u32, u32) = (a.trim().parse().ok()?, b.trim().parse().ok()?);
                if b < a || b - a > 65_536 {
                    return None;
                }
                cpus.extend(a..=b);
            }
            None => cpus.push(part.trim().parse().ok()?),
        }
    }
    Some(cpus)
}

/// Formats CPUs as a list with ranges (`0-3,8`).
pub fn format_cpu_list(cpus: &[u32]) -> String {
    let mut sorted = cpus.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut out = Vec::new();
    let mut i = 0;
    while i < sorted.len() {
        let start = sorted[i];
        while i + 1 < sorted.len() && sorted[i + 1] == sorted[i] + 1 {
            i += 1;
        }
        out.push(if sorted[i] == start { start.to_string() } else { format!("{start}-{}", sorted[i]) });
        i += 1;
    }
    out.join(",")
}

/// Parses a hex CPU mask as sysfs prints it (`00000000,0000000f`).
pub fn parse_cpu_mask(s: &str) -> Option<Vec<u32>> {
    let hex: String = s.trim().chars().filter(|c| *c != ',').collect();
    let mut cpus = Vec::new();
    for (i, c) in hex.chars().rev().enumerate() {
        let nibble = c.to_digit(16)?;
        for bit in 0..4 {
            if nibble & (1 << bit) != 0 {
                cpus.push(i as u32 * 4 + bit);
            }
        }
    }
    Some(cpus)
}

/// Formats CPUs as a hex mask with a comma every 32 bits, as sysfs expects.
pub fn format_cpu_mask(cpus: &[u32]) -> String {
    let words = cpus.iter().max().map_or(1, |m| *m as usize / 32 + 1);
    let mut w = vec![0u32; words];
    for &c in cpus {
        w[c as usize / 32] |= 1 << (c % 32);
    }
    let mut parts: Vec<String> = w.iter().rev().map(|x| format!("{x:08x}")).collect();
    if let Some(first) = parts.first_mut() {
        let trimmed = first.trim_start_matches('0');
        *first = if trimmed.is_empty() { "0".to_string() } else { trimmed.to_string() };
    }
    parts.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_and_masks_round_trip() {
        assert_eq!(parse_cpu_list("0-3,8,10-11").unwrap(), vec![0, 1, 2, 3, 8, 10, 11]);
        assert_eq!(format_cpu_list(&[11, 0, 1, 2, 3, 8, 10]), "0-3,8,10-11");
        assert_eq!(parse_cpu_list("3-1"), None);
        assert_eq!(parse_cpu_list(""), Some(vec![]));
        assert_eq!(parse_cpu_mask("00000000,0000000f").unwrap(), vec![0, 1, 2, 3]);
        assert_eq!(parse_cpu_mask("0").unwrap(), Vec::<u32>::new());
        assert_eq!(format_cpu_mask(&[0, 1, 2, 3]), "f");
        assert_eq!(format_cpu_mask(&[33]), "2,00000000");
        assert_eq!(format_cpu_mask(&[]), "0");
        assert_eq!(parse_cpu_mask(&format_cpu_mask(&[5, 40, 63])).unwrap(), vec![5, 40, 63]);
    }

    #[test]
    fn interrupts_lines_parse_with_names() {
        let text = "           CPU0       CPU1\n  0:         44          0   IO-APIC   2-edge      timer\n 38:          0      14264 PCI-MSIX-0000:00:03.0   1-edge      virtio2-input.0\n 40:  5 6  IR-PCI-MSIX-0000:3b:00.0    0-edge      eth0-TxRx-0\nNMI:          0          0   Non-maskable interrupts\n";
        let l = parse_interrupts(text);
        assert_eq!(l.len(), 3);
        assert_eq!(l[1].name, "virtio2-input.0");
        assert_eq!(l[1].per_cpu, vec![0, 14264]);
        assert_eq!(l[2].per_cpu, vec![5, 6]);
        assert!(l[2].name_mentions("eth0"));
        assert!(!l[2].name_mentions("eth"));
    }
}
