//! Per-device figures of the fill pool, and which NUMA domain each disk is on.
//!
//! The table is written by workers (a fill queued, refused or late) and fill
//! threads (a fill done) under one lock, and each change publishes a copy of it
//! ([`Devices::snapshot`]): the admin endpoint reads the copy and never takes a
//! lock a worker takes. Changes happen only on cold requests, and a copy of a
//! few devices costs less than the disk read that caused it.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;

use super::lock;
use super::pool::FillError;
use crate::sysfs::Host;
use crate::topology::{Plan, Topology};

/// One device's fill counters.
#[derive(Debug, Default, Clone)]
pub(crate) struct DeviceStats {
    pub queued: u64,
    pub fills: u64,
    pub fill_bytes: u64,
    pub errors: u64,
    pub timeouts: u64,
    pub overloads: u64,
    logged_error: bool,
    logged_timeout: bool,
}

/// The per-device table and its published copy.
#[derive(Default)]
pub(crate) struct Devices {
    table: Mutex<HashMap<u64, DeviceStats>>,
    published: ArcSwap<Vec<(u64, DeviceStats)>>,
}

impl Devices {
    /// The counters as last published, sorted by `st_dev`.
    pub(crate) fn snapshot(&self) -> Arc<Vec<(u64, DeviceStats)>> {
        self.published.load_full()
    }

    /// Takes a place in `dev`'s queue for a fill, unless `limit` fills are queued
    /// already (a refused `demand` fill counts as an overload).
    pub(crate) fn reserve(&self, dev: u64, limit: usize, demand: bool) -> Result<(), FillError> {
        self.update(|t| {
            let d = t.entry(dev).or_default();
            if d.queued as usize >= limit {
                if demand {
                    d.overloads += 1;
                }
                return Err(FillError::Overloaded);
            }
            d.queued += 1;
            Ok(())
        })
    }

    /// A fill of `len` bytes on `dev` is done, with `result`; the first error of a
    /// device is logged.
    pub(crate) fn finish(&self, dev: u64, len: u64, result: &Result<(), FillError>) {
        self.update(|t| {
            let d = t.entry(dev).or_default();
            d.queued = d.queued.saturating_sub(1);
            d.fills += 1;
            match result {
                Ok(()) => d.fill_bytes += len,
                Err(e) => {
                    d.errors += 1;
                    if !std::mem::replace(&mut d.logged_error, true) {
                        tracing::error!(
                            device = %dev_name(dev),
                            "{e}; the connections waiting on it are closed (logged once per device; see linerate_fill_errors_total)"
                        );
                    }
                }
            }
        })
    }

    /// A connection gave up on a fill of `dev` after `timeout`; the first such of a
    /// device is logged.
    pub(crate) fn count_timeout(&self, dev: u64, timeout: Duration) {
        self.update(|t| {
            let d = t.entry(dev).or_default();
            d.timeouts += 1;
            if !std::mem::replace(&mut d.logged_timeout, true) {
                tracing::error!(
                    device = %dev_name(dev),
                    ?timeout,
                    "a disk read did not finish within fill.timeout; its connections are closed (logged once per device; see linerate_fill_timeouts_total)"
                );
            }
        })
    }

    /// Changes the table and publishes the result, under the table's lock so that
    /// copies are published in the order of the changes.
    fn update<R>(&self, change: impl FnOnce(&mut HashMap<u64, DeviceStats>) -> R) -> R {
        let mut table = lock(&self.table);
        let r = change(&mut table);
        let mut copy: Vec<(u64, DeviceStats)> = table.iter().map(|(d, s)| (*d, s.clone())).collect();
        copy.sort_by_key(|(d, _)| *d);
        self.published.store(Arc::new(copy));
        r
    }
}

/// A block device's name for logs and metrics: `vda`, `nvme0n1p1`, or `MAJ:MIN`.
pub(crate) fn dev_name(dev: u64) -> String {
    let (ma, mi) = (libc::major(dev), libc::minor(dev));
    let uevent = std::fs::read_to_string(format!("/sys/dev/block/{ma}:{mi}/uevent")).unwrap_or_default();
    uevent.lines().find_map(|l| l.strip_prefix("DEVNAME=")).map_or_else(|| format!("{ma}:{mi}"), str::to_owned)
}

/// Every disk and partition whose node is known, mapped to a domain on that node.
pub(crate) fn disk_domains(topo: &Topology, plan: &Plan) -> HashMap<(u32, u32), usize> {
    let host = Host::new("/");
    let mut out = HashMap::new();
    let mut seen = HashSet::new();
    for disk in &topo.disks {
        let Some(node) = disk.node else { continue };
        let Some(domain) = plan.domains.iter().find(|d| d.node == node && !d.workers.is_empty()) else { continue };
        if !seen.insert(&disk.name) {
            continue;
        }
        let base = format!("sys/block/{}", disk.name);
        let mut dirs = vec![base.clone()];
        dirs.extend(host.list(&base).into_iter().filter(|p| p.starts_with(&disk.name)).map(|p| format!("{base}/{p}")));
        for dir in dirs {
            if let Some(dev) = host.read(&format!("{dir}/dev")).ok().and_then(|d| parse_dev(&d)) {
                out.insert(dev, domain.index);
            }
        }
    }
    out
}

fn parse_dev(s: &str) -> Option<(u32, u32)> {
    let (a, b) = s.trim().split_once(':')?;
    Some((a.parse().ok()?, b.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_change_is_published_for_readers_without_the_lock() {
        let d = Devices::default();
        assert!(d.snapshot().is_empty());
        d.reserve(7, 1, true).unwrap();
        assert_eq!(d.reserve(7, 1, true), Err(FillError::Overloaded), "one queued is the limit");
        let s = d.snapshot();
        assert_eq!((s[0].0, s[0].1.queued, s[0].1.overloads), (7, 1, 1));
        d.finish(7, 4096, &Ok(()));
        d.count_timeout(3, Duration::from_secs(1));
        let s = d.snapshot();
        assert_eq!(s.iter().map(|(dev, _)| *dev).collect::<Vec<_>>(), [3, 7], "sorted by device");
        assert_eq!((s[1].1.queued, s[1].1.fills, s[1].1.fill_bytes), (0, 1, 4096));
        assert_eq!(s[0].1.timeouts, 1);
    }

    #[test]
    fn parses_dev_numbers() {
        assert_eq!(parse_dev("259:3\n"), Some((259, 3)));
        assert_eq!(parse_dev("x"), None);
    }
}
