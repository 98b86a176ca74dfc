//! Per-queue receive counters for the DIM controller: packets and bytes
//! from the driver's statistics (`ethtool -S` names such as `rx_queue_3_packets`,
//! `rx3_bytes`, `rx-3.packets`) or, without per-queue names, the device totals in
//! `/sys/class/net/IF/statistics`; interrupts from `/proc/interrupts`.
//!
//! Not done: the netdev netlink family's `qstats-get` (per-queue counters with
//! standard names, Linux 6.9+, implemented by a few drivers). The driver statistics
//! cover the same drivers, and the interrupt counts come from `/proc/interrupts`
//! either way.

use std::collections::BTreeMap;

use crate::sysfs::{Host, InterruptLine};

/// Cumulative counters of one receive queue (or of the whole device).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct QueueCounters {
    pub packets: u64,
    pub bytes: u64,
    pub interrupts: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Packets,
    Bytes,
}

/// Reads `rx<sep><N><sep>packets|bytes` with the separators drivers use; `None`
/// for anything else (errors, drops, XDP, TX, device totals).
fn parse_rx_stat(name: &str) -> Option<(u32, Kind)> {
    let rest = name.strip_prefix("rx")?;
    let rest = ["_queue_", "-queue-", "_q", "-", "_", ""].iter().find_map(|p| {
        let r = rest.strip_prefix(p)?;
        r.starts_with(|c: char| c.is_ascii_digit()).then_some(r)
    })?;
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    let queue: u32 = rest[..digits].parse().ok()?;
    let kind = match rest[digits..].trim_start_matches(['_', '.', '-']) {
        "packets" => Kind::Packets,
        "bytes" => Kind::Bytes,
        _ => return None,
    };
    Some((queue, kind))
}

/// Per-queue packets and bytes from driver statistics; empty unless every queue
/// found has both.
pub(super) fn per_queue_from_stats(stats: &[(String, u64)]) -> BTreeMap<u32, QueueCounters> {
    let mut out: BTreeMap<u32, (Option<u64>, Option<u64>)> = BTreeMap::new();
    for (name, value) in stats {
        if let Some((q, kind)) = parse_rx_stat(name) {
            let e = out.entry(q).or_default();
            match kind {
                Kind::Packets => e.0 = Some(*value),
                Kind::Bytes => e.1 = Some(*value),
            }
        }
    }
    if out.values().any(|(p, b)| p.is_none() || b.is_none()) {
        return BTreeMap::new();
    }
    out.into_iter()
        .map(|(q, (p, b))| (q, QueueCounters { packets: p.unwrap_or(0), bytes: b.unwrap_or(0), interrupts: 0 }))
        .collect()
}

/// The receive queue an interrupt line serves, from its action name:
/// `eth0-rx-2`, `eth0-TxRx-2`, `virtio1-input.2`, `mlx5_comp2@pci:...`, `eth0-2`.
/// Transmit-only vectors (`eth0-tx-0`, `virtio1-output.0`) give `None`.
fn rx_queue_of(line: &InterruptLine) -> Option<u32> {
    let name = line.name.split('@').next().unwrap_or(&line.name);
    let lower = name.to_ascii_lowercase();
    if (lower.contains("-tx-") || lower.contains("output")) && !lower.contains("txrx") {
        return None;
    }
    let digits: String =
        name.chars().rev().take_while(char::is_ascii_digit).collect::<Vec<_>>().into_iter().rev().collect();
    if digits.is_empty() || digits.len() == name.len() {
        return None;
    }
    let head = &name[..name.len() - digits.len()];
    let ok = ["-rx-", "-txrx-", "-input.", "_comp", "-"].iter().any(|s| head.to_ascii_lowercase().ends_with(s));
    if ok {
        digits.parse().ok()
    } else {
        None
    }
}

/// Interrupt lines of `iface` (by name, or by the IRQ numbers the device owns).
pub(super) fn nic_interrupts(host: &Host, iface: &str, irqs: &[u32], bus_or_virtio: &[String]) -> Vec<InterruptLine> {
    host.interrupts()
        .into_iter()
        .filter(|l| {
            l.name_mentions(iface)
                || irqs.contains(&l.irq)
                || bus_or_virtio.iter().any(|b| !b.is_empty() && l.name.contains(b.as_str()))
        })
        .collect()
}

/// Receive interrupts per queue; queues whose vector cannot be told apart are absent.
pub(super) fn interrupts_per_queue(lines: &[InterruptLine]) -> BTreeMap<u32, u64> {
    let mut out = BTreeMap::new();
    for l in lines {
        if let Some(q) = rx_queue_of(l) {
            *out.entry(q).or_insert(0) += l.per_cpu.iter().sum::<u64>();
        }
    }
    out
}

/// All receive interrupts of the device: the per-queue vectors when there are
/// any, otherwise every line of the device (a single MSI or legacy interrupt).
pub(super) fn interrupts_total(lines: &[InterruptLine]) -> u64 {
    let per_queue = interrupts_per_queue(lines);
    if per_queue.is_empty() {
        lines.iter().map(|l| l.per_cpu.iter().sum::<u64>()).sum()
    } else {
        per_queue.values().sum()
    }
}

/// Device totals from sysfs.
pub(super) fn device_totals(host: &Host, iface: &str) -> Option<(u64, u64)> {
    let base = format!("sys/class/net/{iface}/statistics");
    Some((host.read_u64(&format!("{base}/rx_packets")).ok()?, host.read_u64(&format!("{base}/rx_bytes")).ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sysfs::parse_interrupts;

    #[test]
    fn driver_stat_names_of_several_drivers() {
        assert_eq!(parse_rx_stat("rx_queue_3_packets"), Some((3, Kind::Packets)));
        assert_eq!(parse_rx_stat("rx3_bytes"), Some((3, Kind::Bytes)));
        assert_eq!(parse_rx_stat("rx-12.packets"), Some((12, Kind::Packets)));
        assert_eq!(parse_rx_stat("rx_q0_bytes"), Some((0, Kind::Bytes)));
        for other in ["rx_packets", "rx0_xdp_packets", "rx_queue_0_drops", "tx_queue_0_packets", "rx3_csum_bytes"] {
            assert_eq!(parse_rx_stat(other), None, "{other}");
        }
    }

    #[test]
    fn per_queue_stats_need_both_counters() {
        let s = |n: &str, v| (n.to_string(), v);
        let full =
            per_queue_from_stats(&[s("rx0_packets", 5), s("rx0_bytes", 500), s("rx1_packets", 7), s("rx1_bytes", 700)]);
        assert_eq!(full.len(), 2);
        assert_eq!(full[&1], QueueCounters { packets: 7, bytes: 700, interrupts: 0 });
        assert!(per_queue_from_stats(&[s("rx0_packets", 5)]).is_empty());
    }

    #[test]
    fn interrupt_names_map_to_receive_queues() {
        let text = "  CPU0 CPU1\n 40: 1 2 PCI-MSIX 0-edge eth0-rx-0\n 41: 3 4 PCI-MSIX 1-edge eth0-tx-0\n 42: 5 6 PCI-MSIX 2-edge eth0\n 50: 1 1 PCI-MSIX 0-edge eth1-TxRx-3\n 60: 2 0 PCI-MSIX 1-edge virtio2-input.1\n 61: 2 0 PCI-MSIX 2-edge virtio2-output.1\n 70: 9 0 PCI-MSIX 3-edge mlx5_comp7@pci:0000:3b:00.0\n";
        let lines = parse_interrupts(text);
        let q: Vec<Option<u32>> = lines.iter().map(rx_queue_of).collect();
        assert_eq!(q, vec![Some(0), None, None, Some(3), Some(1), None, Some(7)]);
        let eth0: Vec<InterruptLine> = lines.iter().filter(|l| l.name_mentions("eth0")).cloned().collect();
        assert_eq!(interrupts_per_queue(&eth0), BTreeMap::from([(0, 3)]));
        assert_eq!(interrupts_total(&eth0), 3, "only the receive vector");
        let msi = parse_interrupts("  CPU0\n 128: 77 PCI-MSI 0-edge enp0s31f6\n");
        assert_eq!(interrupts_total(&msi), 77, "a single vector counts whole");
    }
}
