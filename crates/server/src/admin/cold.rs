//! The cold-catalogue view shared by `/metrics` and `/status`: how much of what
//! is served comes from the page cache, what the fill pool is doing per device,
//! how fast the disks read, and whether the kernel is short of memory.

use std::path::Path;

use serde::Serialize;

use super::AdminState;
use crate::procfs;

#[derive(Serialize, Debug, Default)]
pub(super) struct Cold {
    /// Body bytes that were in the page cache when they were about to be sent.
    pub resident_bytes: u64,
    /// Body bytes that needed a fill from disk first.
    pub filled_bytes: u64,
    /// `resident / (resident + filled)`, when anything was served.
    pub hit_ratio: Option<f64>,
    /// Fills queued or running now.
    pub fill_queue_depth: i64,
    /// Read-ahead fills queued since start.
    pub readahead_fills: u64,
    /// The page-cache admission policy (`fill.admission`), when on.
    pub admission: Option<Admission>,
    /// Connection waits for fills, and their quantiles since start (upper bucket
    /// bounds, in milliseconds).
    pub fill_waits: u64,
    pub fill_wait_p50_ms: Option<f64>,
    pub fill_wait_p99_ms: Option<f64>,
    pub devices: Vec<Device>,
    pub memory: Memory,
}

#[derive(Serialize, Debug, Default)]
pub(super) struct Admission {
    /// `fill.cache_bytes`, or the auto budget it stands for.
    pub cache_bytes: u64,
    /// The kept set as last ranked: files and their bytes.
    pub kept_files: u64,
    pub kept_bytes: u64,
    /// Bytes of ranges outside the kept set advised out of the page cache.
    pub dropped_bytes: u64,
}

#[derive(Serialize, Debug, Default)]
pub(super) struct Device {
    pub device: String,
    /// From the fill pool (devices it has read from).
    pub fills: u64,
    pub fill_bytes: u64,
    pub fill_errors: u64,
    pub fill_timeouts: u64,
    pub fill_overloads: u64,
    pub fill_queued: u64,
    /// From /proc/diskstats (whole disks), whoever read.
    pub read_bytes: u64,
}

#[derive(Serialize, Debug, Default)]
pub(super) struct Memory {
    /// `/proc/pressure/memory` totals (0 without PSI).
    pub pressure_some_us: u64,
    pub pressure_full_us: u64,
    /// Direct reclaim: stalls (`allocstall_*`), pages scanned and reclaimed.
    pub allocstall: u64,
    pub pgscan_direct: u64,
    pub pgsteal_direct: u64,
}

pub(super) fn snapshot(state: &AdminState) -> Cold {
    let resident_bytes = state.total(|w| w.cold.resident_bytes.get());
    let filled_bytes = state.total(|w| w.cold.filled_bytes.get());
    let mut waits = (0.0, 0u64, Vec::new());
    let mut bounds: &[f64] = &[];
    for w in &state.workers {
        bounds = w.cold.fill_wait_seconds.bounds();
        w.cold.fill_wait_seconds.accumulate(&mut waits);
    }
    let quantile = |q: f64| -> Option<f64> {
        let target = (waits.1 as f64 * q).ceil() as u64;
        let mut seen = 0;
        for (i, n) in waits.2.iter().enumerate() {
            seen += n;
            if waits.1 > 0 && seen >= target {
                return Some(bounds.get(i).map_or(f64::INFINITY, |b| b * 1000.0));
            }
        }
        None
    };
    let mut devices: Vec<Device> = Vec::new();
    if let Some(pool) = &state.fill {
        for &(dev, ref s) in pool.device_stats().iter() {
            devices.push(Device {
                device: crate::server::pagecache::devices::dev_name(dev),
                fills: s.fills,
                fill_bytes: s.fill_bytes,
                fill_errors: s.errors,
                fill_timeouts: s.timeouts,
                fill_overloads: s.overloads,
                fill_queued: s.queued,
                read_bytes: 0,
            });
        }
    }
    let proc_root = Path::new("/proc");
    for (name, bytes) in procfs::disk_reads(proc_root) {
        // A fill on a partition counts against its disk's reads only by name
        // prefix; show both rows rather than guess.
        match devices.iter_mut().find(|d| d.device == name) {
            Some(d) => d.read_bytes = bytes,
            None => devices.push(Device { device: name, read_bytes: bytes, ..Device::default() }),
        }
    }
    let vmstat = std::fs::read_to_string(proc_root.join("vmstat")).unwrap_or_default();
    let pressure = procfs::memory_pressure(proc_root);
    let direct = |key: &str| procfs::parse_vmstat(&vmstat, key).unwrap_or(0);
    Cold {
        resident_bytes,
        filled_bytes,
        hit_ratio: (resident_bytes + filled_bytes > 0)
            .then(|| resident_bytes as f64 / (resident_bytes + filled_bytes) as f64),
        fill_queue_depth: state.fill.as_ref().map_or(0, |p| p.depth.load(std::sync::atomic::Ordering::Relaxed)),
        readahead_fills: state
            .fill
            .as_ref()
            .map_or(0, |p| p.read_ahead_fills.load(std::sync::atomic::Ordering::Relaxed)),
        admission: state.fill.as_ref().and_then(|p| p.admission.as_ref()).map(|a| {
            let get = |v: &std::sync::atomic::AtomicU64| v.load(std::sync::atomic::Ordering::Relaxed);
            Admission {
                cache_bytes: a.budget_bytes(),
                kept_files: get(&a.kept_files),
                kept_bytes: get(&a.kept_bytes),
                dropped_bytes: get(&a.dropped_bytes),
            }
        }),
        fill_waits: waits.1,
        fill_wait_p50_ms: quantile(0.5),
        fill_wait_p99_ms: quantile(0.99),
        devices,
        memory: Memory {
            pressure_some_us: pressure.some_us,
            pressure_full_us: pressure.full_us,
            allocstall: procfs::parse_vmstat_stalls(&vmstat),
            pgscan_direct: direct("pgscan_direct"),
            pgsteal_direct: direct("pgsteal_direct"),
        },
    }
}
