//! The fill pool: disk reads that bring missing file ranges into the page cache,
//! on threads of their own, so that no worker ever waits for a disk.
//!
//! A worker that finds a body range not resident ([`super::residency`]) asks for
//! a fill of each missing *window* (`fill.window_bytes`, aligned in the file) and
//! parks that connection on the answer; its event loop goes on serving everyone
//! else. Then it sends the range exactly as if it had been resident all along.
//!
//! - **Where**: one set of `fill.threads` threads per NUMA domain, allowed on that
//!   domain's CPUs and preferring its memory, so the pages they read land on its
//!   node. Network-centric placement (the default) fills on the serving worker's
//!   domain; disk-centric (`numa.placement = "disk"`) on the domain of the node
//!   that holds the file's disk (sysfs, remappable with `numa.disk_nodes`).
//! - **Shared**: a window being filled is filled once, whoever asks: the second
//!   and later askers (a new episode starting for thousands of viewers at once)
//!   wait on the same read.
//! - **Bounded**: at most `fill.queue_per_disk` fills are queued per device; past
//!   that a demand fill fails at once (its connection closes and is counted) and
//!   read-ahead is skipped. Demand fills are taken before read-ahead.
//! - **Read-ahead**: while a range waits for one window, the next window of the
//!   same range is queued; after a range that needed a fill, `fill.readahead_windows`
//!   windows past its end are queued, so a viewer reading in order finds its next
//!   segment resident.
//! - **Deadline**: a connection waits at most `fill.timeout`. A fill that fails
//!   (`EIO`...) or is late ends only the connections waiting on it; both are
//!   counted per device and logged once per device, never per request. A fill
//!   thread stuck in the kernel stays stuck alone: workers never wait for it.
//!
//! A fill reads its window with `pread` into a per-thread scratch buffer (after a
//! `POSIX_FADV_WILLNEED` that submits the whole window at once): the copy costs
//! far less than the disk read, and unlike `readahead(2)` the call returns only
//! once the pages are really there.

use std::collections::{HashMap, HashSet, VecDeque};
use std::fs::File;
use std::os::fd::AsFd;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use linerate_sys::pagecache::{self, Advice};
use tokio::sync::oneshot;

use crate::config::{Fill as FillConfig, Placement};
use crate::sysfs::Host;
use crate::topology::{Plan, Topology};

/// Why a fill did not bring its window in.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FillError {
    #[error("disk read failed: {0}")]
    Io(String),
    #[error("disk read not done within fill.timeout")]
    Timeout,
    #[error("too many disk reads queued for this device")]
    Overloaded,
    #[error("fill pool stopped")]
    Stopped,
}

/// One window of one file: what concurrent requests share.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
struct WindowKey {
    dev: u64,
    ino: u64,
    window: u64,
}

struct Job {
    key: WindowKey,
    file: File,
    offset: u64,
    len: u64,
}

#[derive(Default)]
struct Queue {
    demand: VecDeque<Job>,
    ahead: VecDeque<Job>,
}

struct DomainQueue {
    jobs: Mutex<Queue>,
    ready: Condvar,
}

/// Per-device fill counters, written by fill threads and waiters, read by the
/// admin endpoint (not on the hot path: only cold requests touch them).
#[derive(Debug, Default, Clone)]
pub struct DeviceStats {
    pub queued: u64,
    pub fills: u64,
    pub fill_bytes: u64,
    pub errors: u64,
    pub timeouts: u64,
    pub overloads: u64,
    logged_error: bool,
    logged_timeout: bool,
}

type Waiters = Vec<oneshot::Sender<Result<(), FillError>>>;

/// The pool, shared by all workers.
pub struct FillPool {
    config: FillConfig,
    placement: Placement,
    queues: Vec<DomainQueue>,
    inflight: Mutex<HashMap<WindowKey, Waiters>>,
    devices: Mutex<HashMap<u64, DeviceStats>>,
    /// (major, minor) of each disk and partition with a known node -> its domain.
    disk_domains: HashMap<(u32, u32), usize>,
    /// Fills queued or running, all devices.
    pub depth: AtomicI64,
    pub read_ahead_fills: AtomicU64,
}

impl FillPool {
    /// Starts `config.threads` fill threads per domain of `plan`.
    pub fn start(
        config: &FillConfig,
        placement: Placement,
        topo: &Topology,
        plan: &Plan,
    ) -> std::io::Result<Arc<Self>> {
        let pool = Arc::new(FillPool {
            config: config.clone(),
            placement,
            queues: plan
                .domains
                .iter()
                .map(|_| DomainQueue { jobs: Mutex::default(), ready: Condvar::new() })
                .collect(),
            inflight: Mutex::default(),
            devices: Mutex::default(),
            disk_domains: disk_domains(topo, plan),
            depth: AtomicI64::new(0),
            read_ahead_fills: AtomicU64::new(0),
        });
        if placement == Placement::Disk && pool.disk_domains.is_empty() {
            tracing::warn!("numa.placement = \"disk\": no disk with a known NUMA node (see `linerate topo`); pages fill on the serving worker's domain");
        }
        for domain in &plan.domains {
            let cpus: Vec<usize> = domain.cpus.iter().map(|&c| c as usize).collect();
            for t in 0..config.threads {
                let pool = pool.clone();
                let (index, node, cpus) = (domain.index, domain.node, cpus.clone());
                std::thread::Builder::new()
                    .name(format!("linerate-fill{index}.{t}"))
                    .spawn(move || pool.run_thread(index, node, &cpus))?;
            }
        }
        tracing::info!(
            domains = plan.domains.len(),
            threads_per_domain = config.threads,
            window_bytes = config.window_bytes,
            placement = ?placement,
            "fill pool started"
        );
        Ok(pool)
    }

    pub fn window_bytes(&self) -> u64 {
        self.config.window_bytes
    }

    pub fn readahead_windows(&self) -> u64 {
        self.config.readahead_windows
    }

    /// A copy of the per-device counters, by `st_dev`.
    pub fn device_stats(&self) -> Vec<(u64, DeviceStats)> {
        let mut v: Vec<(u64, DeviceStats)> = lock(&self.devices).iter().map(|(d, s)| (*d, s.clone())).collect();
        v.sort_by_key(|(d, _)| *d);
        v
    }

    /// Fills the window of `file` (identified by `dev`/`ino`) that holds `offset`,
    /// clipped to `file_len`, and waits for it, at most `fill.timeout`.
    pub async fn fill(
        &self,
        domain: usize,
        file: &File,
        (dev, ino): (u64, u64),
        offset: u64,
        file_len: u64,
    ) -> Result<(), FillError> {
        let (tx, rx) = oneshot::channel();
        self.enqueue(domain, file, (dev, ino), offset, file_len, Some(tx))?;
        match tokio::time::timeout(self.config.timeout, rx).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(FillError::Stopped),
            Err(_) => {
                self.count_timeout(dev);
                Err(FillError::Timeout)
            }
        }
    }

    /// Whether a fill of any window overlapping `len` bytes at `offset` is queued
    /// or running. Its pages may already sit in the page cache, locked until the
    /// disk answers, and `cachestat` counts them as cached: a send must not trust
    /// them yet. Free (one atomic load) while no fill is under way.
    pub fn is_filling(&self, (dev, ino): (u64, u64), offset: u64, len: u64) -> bool {
        if self.depth.load(Ordering::Relaxed) <= 0 || len == 0 {
            return false;
        }
        let w = self.config.window_bytes;
        let inflight = lock(&self.inflight);
        (offset / w..=(offset + len - 1) / w).any(|window| inflight.contains_key(&WindowKey { dev, ino, window }))
    }

    /// Queues a read-ahead of the window holding `offset`, unless it is resident,
    /// past the end, or its disk's queue is half full. Returns whether the window
    /// is now being filled (queued by this call or already under way).
    pub fn read_ahead(&self, domain: usize, file: &File, id: (u64, u64), offset: u64, file_len: u64) -> bool {
        if offset >= file_len {
            return false;
        }
        let w = self.config.window_bytes;
        let start = offset / w * w;
        if super::residency::is_resident(file, start, (start + w).min(file_len) - start) {
            return false;
        }
        match self.enqueue(domain, file, id, offset, file_len, None) {
            Ok(true) => {
                self.read_ahead_fills.fetch_add(1, Ordering::Relaxed);
                true
            }
            Ok(false) => true,
            Err(_) => false,
        }
    }

    fn enqueue(
        &self,
        domain: usize,
        file: &File,
        (dev, ino): (u64, u64),
        offset: u64,
        file_len: u64,
        waiter: Option<oneshot::Sender<Result<(), FillError>>>,
    ) -> Result<bool, FillError> {
        let w = self.config.window_bytes;
        let key = WindowKey { dev, ino, window: offset / w };
        let start = key.window * w;
        let len = (start + w).min(file_len).saturating_sub(start);
        {
            let mut inflight = lock(&self.inflight);
            if let Some(waiters) = inflight.get_mut(&key) {
                waiters.extend(waiter);
                return Ok(false);
            }
            let demand = waiter.is_some();
            {
                let mut devices = lock(&self.devices);
                let d = devices.entry(dev).or_default();
                let limit = if demand { self.config.queue_per_disk } else { self.config.queue_per_disk / 2 };
                if d.queued as usize >= limit {
                    if demand {
                        d.overloads += 1;
                    }
                    return Err(FillError::Overloaded);
                }
                d.queued += 1;
            }
            let file = file.try_clone().map_err(|e| FillError::Io(e.to_string()))?;
            inflight.insert(key, waiter.into_iter().collect());
            let domain = self.domain_for(dev, domain);
            let q = &self.queues[domain];
            let mut jobs = lock(&q.jobs);
            let job = Job { key, file, offset: start, len };
            if demand {
                jobs.demand.push_back(job);
            } else {
                jobs.ahead.push_back(job);
            }
            self.depth.fetch_add(1, Ordering::Relaxed);
            q.ready.notify_one();
        }
        Ok(true)
    }

    fn domain_for(&self, dev: u64, worker_domain: usize) -> usize {
        let domain = match self.placement {
            Placement::Network => worker_domain,
            Placement::Disk => {
                self.disk_domains.get(&(libc::major(dev), libc::minor(dev))).copied().unwrap_or(worker_domain)
            }
        };
        domain.min(self.queues.len() - 1)
    }

    fn run_thread(&self, domain: usize, node: u32, cpus: &[usize]) {
        if let Err(e) = linerate_sys::pin_current_thread_to(cpus) {
            tracing::warn!(domain, "fill thread cannot be kept on its domain's CPUs: {e}");
        }
        if let Err(e) = linerate_sys::numa::prefer_node(node) {
            tracing::debug!(domain, node, "fill thread cannot prefer its node's memory: {e}");
        }
        let mut scratch = vec![0u8; 256 * 1024];
        let q = &self.queues[domain];
        loop {
            let job = {
                let mut jobs = lock(&q.jobs);
                loop {
                    if let Some(job) = jobs.demand.pop_front().or_else(|| jobs.ahead.pop_front()) {
                        break job;
                    }
                    jobs = q.ready.wait(jobs).unwrap_or_else(|p| p.into_inner());
                }
            };
            let result = read_window(&job, &mut scratch);
            self.depth.fetch_add(-1, Ordering::Relaxed);
            self.finish(job.key, job.len, result);
        }
    }

    fn finish(&self, key: WindowKey, len: u64, result: Result<(), FillError>) {
        {
            let mut devices = lock(&self.devices);
            let d = devices.entry(key.dev).or_default();
            d.queued = d.queued.saturating_sub(1);
            d.fills += 1;
            match &result {
                Ok(()) => d.fill_bytes += len,
                Err(e) => {
                    d.errors += 1;
                    if !std::mem::replace(&mut d.logged_error, true) {
                        tracing::error!(
                            device = %dev_name(key.dev),
                            "{e}; the connections waiting on it are closed (logged once per device; see linerate_fill_errors_total)"
                        );
                    }
                }
            }
        }
        let waiters = lock(&self.inflight).remove(&key).unwrap_or_default();
        for w in waiters {
            let _ = w.send(result.clone());
        }
    }

    fn count_timeout(&self, dev: u64) {
        let mut devices = lock(&self.devices);
        let d = devices.entry(dev).or_default();
        d.timeouts += 1;
        if !std::mem::replace(&mut d.logged_timeout, true) {
            tracing::error!(
                device = %dev_name(dev),
                timeout = ?self.config.timeout,
                "a disk read did not finish within fill.timeout; its connections are closed (logged once per device; see linerate_fill_timeouts_total)"
            );
        }
    }
}

/// Brings one window into the page cache and returns once it is there.
fn read_window(job: &Job, scratch: &mut [u8]) -> Result<(), FillError> {
    if job.len == 0 {
        return Ok(());
    }
    // Submit the whole window at once; the reads below then mostly wait for it.
    let _ = pagecache::fadvise(job.file.as_fd(), job.offset, job.len, Advice::WillNeed);
    let end = job.offset + job.len;
    let mut at = job.offset;
    while at < end {
        let n = ((end - at) as usize).min(scratch.len());
        match job.file.read_at(&mut scratch[..n], at) {
            Ok(0) => return Ok(()), // shorter than planned: the sender sees the truncation
            Ok(k) => at += k as u64,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(FillError::Io(e.to_string())),
        }
    }
    Ok(())
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A block device's name for logs and metrics: `vda`, `nvme0n1p1`, or `MAJ:MIN`.
pub fn dev_name(dev: u64) -> String {
    let (ma, mi) = (libc::major(dev), libc::minor(dev));
    let uevent = std::fs::read_to_string(format!("/sys/dev/block/{ma}:{mi}/uevent")).unwrap_or_default();
    uevent.lines().find_map(|l| l.strip_prefix("DEVNAME=")).map_or_else(|| format!("{ma}:{mi}"), str::to_owned)
}

/// Every disk and partition whose node is known, mapped to a domain on that node.
fn disk_domains(topo: &Topology, plan: &Plan) -> HashMap<(u32, u32), usize> {
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
    fn parses_dev_numbers() {
        assert_eq!(parse_dev("259:3\n"), Some((259, 3)));
        assert_eq!(parse_dev("x"), None);
    }
}
