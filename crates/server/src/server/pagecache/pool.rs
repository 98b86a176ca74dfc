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
//!   read-ahead is skipped. Demand fills are taken before read-ahead, and a
//!   read-ahead that a viewer comes to wait for is moved among them.
//! - **Read-ahead**: while a range waits for one window, the next window of the
//!   same range is queued; after a range that needed a fill, `fill.readahead_windows`
//!   windows past its end are queued, so a viewer reading in order finds its next
//!   segment resident.
//! - **Deadline**: a connection waits at most `fill.timeout`. A fill that fails
//!   (`EIO`...) or is late ends only the connections waiting on it; both are
//!   counted per device and logged once per device, never per request. A fill
//!   thread stuck in the kernel stays stuck alone: workers never wait for it.
//!
//! - **Admission**: with `fill.admission`, the page cache is kept for the files in
//!   most demand ([`Admission`]): the workers' counts of viewers starting each
//!   file ([`super::admission::demand_bytes`]), merged once a second into one decayed estimate, rank
//!   the files by demand per byte of file, and the best of them that fit in
//!   `fill.cache_bytes` are *kept*.
//!   Once a window of any other file has been sent, and nobody on any worker is
//!   sending it any more ([`super::senders`]), it is dropped from the page cache
//!   (`POSIX_FADV_DONTNEED`), unless a fill of it is under way, so one pass over a
//!   long-tail title does not evict the titles everyone watches.
//!
//! How a fill thread reads a window: [`super::read`].

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

use linerate_sys::pagecache::{self, Advice};
use tokio::sync::oneshot;

use super::admission::{cache_budget, Admission, FileId};
use super::devices::{disk_domains, DeviceStats, Devices};
use super::queue::{DomainQueue, Job};
use super::read::{read_window, whole_pages};
use super::senders::{PendingDrop, Sender, Senders};
use super::{lock, Window};
use crate::config::{Fill as FillConfig, Placement};
use crate::topology::{Plan, Topology};

/// Why a fill did not bring its window in.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum FillError {
    #[error("disk read failed: {0}")]
    Io(String),
    #[error("disk read not done within fill.timeout")]
    Timeout,
    #[error("too many disk reads queued for this device")]
    Overloaded,
    #[error("fill pool stopped")]
    Stopped,
}

type Waiters = Vec<oneshot::Sender<Result<(), FillError>>>;

/// The pool, shared by all workers.
pub(crate) struct FillPool {
    config: FillConfig,
    placement: Placement,
    queues: Vec<DomainQueue>,
    inflight: Mutex<HashMap<Window, Waiters>>,
    devices: Devices,
    /// (major, minor) of each disk and partition with a known node -> its domain.
    disk_domains: HashMap<(u32, u32), usize>,
    /// Fills queued or running, all devices.
    pub depth: AtomicI64,
    pub read_ahead_fills: AtomicU64,
    /// The page-cache admission policy, when `fill.admission`.
    pub admission: Option<Admission>,
    /// Who sends which window: a window is dropped only once nobody does.
    senders: Senders,
}

impl FillPool {
    /// Starts `config.threads` fill threads per domain of `plan`.
    pub(crate) fn start(
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
            devices: Devices::default(),
            disk_domains: disk_domains(topo, plan),
            depth: AtomicI64::new(0),
            read_ahead_fills: AtomicU64::new(0),
            admission: config.admission.then(|| Admission::new(cache_budget(config), config.admission_half_life)),
            senders: Senders::default(),
        });
        if let Some(a) = &pool.admission {
            tracing::info!(
                cache_bytes = a.budget_bytes(),
                half_life = ?config.admission_half_life,
                "page-cache admission: the most-demanded files that fit stay cached"
            );
        }
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

    pub(crate) fn window_bytes(&self) -> u64 {
        self.config.window_bytes
    }

    pub(crate) fn readahead_windows(&self) -> u64 {
        self.config.readahead_windows
    }

    /// The per-device counters as last published, by `st_dev`: read without
    /// taking any lock a worker or fill thread takes.
    pub(crate) fn device_stats(&self) -> Arc<Vec<(u64, DeviceStats)>> {
        self.devices.snapshot()
    }

    /// Fills the window of `file` (identified by `dev`/`ino`) that holds `offset`,
    /// clipped to `file_len`, and waits for it, at most `fill.timeout`.
    pub(crate) async fn fill(
        &self,
        domain: usize,
        file: &File,
        (dev, ino): FileId,
        offset: u64,
        file_len: u64,
    ) -> Result<(), FillError> {
        let (tx, rx) = oneshot::channel();
        self.enqueue(domain, file, (dev, ino), offset, file_len, Some(tx))?;
        match tokio::time::timeout(self.config.timeout, rx).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(FillError::Stopped),
            Err(_) => {
                self.devices.count_timeout(dev, self.config.timeout);
                Err(FillError::Timeout)
            }
        }
    }

    /// Whether a fill of any window overlapping `len` bytes at `offset` is queued
    /// or running. Its pages may already sit in the page cache, locked until the
    /// disk answers, and `cachestat` counts them as cached: a send must not trust
    /// them yet. Free (one atomic load) while no fill is under way.
    pub(crate) fn is_filling(&self, (dev, ino): FileId, offset: u64, len: u64) -> bool {
        if self.depth.load(Ordering::Relaxed) <= 0 || len == 0 {
            return false;
        }
        let w = self.config.window_bytes;
        let inflight = lock(&self.inflight);
        (offset / w..=(offset + len - 1) / w).any(|index| inflight.contains_key(&Window { dev, ino, index }))
    }

    /// Registers a connection about to check and send window `index` of file `id`
    /// ([`super::senders`]), when the pool drops pages (admission on): no drop
    /// evicts the window until it is done.
    pub(crate) fn begin_send(&self, id: FileId, index: u64) -> Option<Sender<'_>> {
        self.admission.as_ref()?;
        Some(self.senders.begin(Window { dev: id.0, ino: id.1, index }, Instant::now()))
    }

    /// Drops the bytes of a window outside the kept set sent since its last drop,
    /// if nobody has begun sending it since its last sender finished (`pending`):
    /// whole pages, and not while a fill is bringing the window in. Returns the
    /// bytes advised out.
    pub(crate) fn drop_idle(&self, file: &File, pending: PendingDrop, file_len: u64) -> u64 {
        let id = (pending.window.dev, pending.window.ino);
        let dropped = self.senders.drop_if_idle(pending, Instant::now(), |from, len| {
            if self.is_filling(id, from, len) {
                return 0;
            }
            match whole_pages(from, len, file_len) {
                Some((at, n)) if pagecache::fadvise(file.as_fd(), at, n, Advice::DontNeed).is_ok() => n,
                _ => 0,
            }
        });
        if let Some(a) = &self.admission {
            a.dropped_bytes.fetch_add(dropped, Ordering::Relaxed);
        }
        dropped
    }

    /// Queues a read-ahead of the window holding `offset`, unless it is resident,
    /// past the end, or its disk's queue is half full. Returns whether the window
    /// is now being filled (queued by this call or already under way).
    pub(crate) fn read_ahead(&self, domain: usize, file: &File, id: FileId, offset: u64, file_len: u64) -> bool {
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
        (dev, ino): FileId,
        offset: u64,
        file_len: u64,
        waiter: Option<oneshot::Sender<Result<(), FillError>>>,
    ) -> Result<bool, FillError> {
        let w = self.config.window_bytes;
        let key = Window::of((dev, ino), offset, w);
        let start = key.index * w;
        let len = (start + w).min(file_len).saturating_sub(start);
        {
            let mut inflight = lock(&self.inflight);
            if let Some(waiters) = inflight.get_mut(&key) {
                // The first viewer to wait for a read-ahead makes it a demand fill.
                if waiters.is_empty() && waiter.is_some() {
                    for q in &self.queues {
                        if lock(&q.jobs).promote(key) {
                            break;
                        }
                    }
                }
                waiters.extend(waiter);
                return Ok(false);
            }
            let demand = waiter.is_some();
            let limit = if demand { self.config.queue_per_disk } else { self.config.queue_per_disk / 2 };
            self.devices.reserve(dev, limit, demand)?;
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

    fn finish(&self, key: Window, len: u64, result: Result<(), FillError>) {
        self.devices.finish(key.dev, len, &result);
        let waiters = lock(&self.inflight).remove(&key).unwrap_or_default();
        for w in waiters {
            let _ = w.send(result.clone());
        }
    }
}
