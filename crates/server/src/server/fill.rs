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
//!   file ([`demand_bytes`]), merged once a second into one decayed estimate, rank
//!   the files by demand per byte of file, and the best of them that fit in
//!   `fill.cache_bytes` are *kept*.
//!   Once a window of any other file has been sent, and nobody on any worker is
//!   sending it any more ([`super::senders`]), it is dropped from the page cache
//!   (`POSIX_FADV_DONTNEED`), unless a fill of it is under way, so one pass over a
//!   long-tail title does not evict the titles everyone watches.
//!
//! A fill reads its window with `pread` into a per-thread scratch buffer (after a
//! `POSIX_FADV_WILLNEED` that submits the whole window at once): the copy costs
//! far less than the disk read, and unlike `readahead(2)` the call returns only
//! once the pages are really there.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet, VecDeque};
use std::fs::File;
use std::os::fd::AsFd;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use linerate_sys::pagecache::{self, Advice};
use tokio::sync::oneshot;

use super::senders::{PendingDrop, Sender, Senders, Window};
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

impl Queue {
    /// Moves the read-ahead of `key`, if it is still waiting, to the back of the
    /// demand queue: a viewer now waits for it. Left among the read-aheads, it would
    /// be taken only once no demand fill is queued, which on a saturated disk can be
    /// never (until the viewer's `fill.timeout`). Returns whether it was moved.
    fn promote(&mut self, key: WindowKey) -> bool {
        match self.ahead.iter().position(|job| job.key == key) {
            Some(i) => {
                let job = self.ahead.remove(i).expect("position is in range");
                self.demand.push_back(job);
                true
            }
            None => false,
        }
    }
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
    /// The page-cache admission policy, when `fill.admission`.
    pub admission: Option<Admission>,
    /// Who sends which window: a window is dropped only once nobody does.
    senders: Senders,
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
            admission: config.admission.then(|| Admission::new(cache_budget(config), config.admission_half_life)),
            senders: Senders::default(),
        });
        if let Some(a) = &pool.admission {
            tracing::info!(
                cache_bytes = a.budget_bytes,
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

    /// Registers a connection about to check and send window `index` of file `id`
    /// ([`super::senders`]), when the pool drops pages (admission on): no drop
    /// evicts the window until it is done.
    pub fn begin_send(&self, id: FileId, index: u64) -> Option<Sender<'_>> {
        self.admission.as_ref()?;
        Some(self.senders.begin(Window { dev: id.0, ino: id.1, index }, Instant::now()))
    }

    /// Drops the bytes of a window outside the kept set sent since its last drop,
    /// if nobody has begun sending it since its last sender finished (`pending`):
    /// whole pages, and not while a fill is bringing the window in. Returns the
    /// bytes advised out.
    pub fn drop_idle(&self, file: &File, pending: PendingDrop, file_len: u64) -> u64 {
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

/// How many times a fill reads its window again when, once read, it is not all in
/// the page cache: its first pages can be reclaimed while its last are still being
/// read (memory pressure, a proactive pageout), and the worker sending it would
/// then read them back from the disk itself.
const REREADS: usize = 2;

/// Brings one window into the page cache and returns once it is there.
fn read_window(job: &Job, scratch: &mut [u8]) -> Result<(), FillError> {
    if job.len == 0 {
        return Ok(());
    }
    // Submit the whole window at once; the reads below then mostly wait for it.
    let _ = pagecache::fadvise(job.file.as_fd(), job.offset, job.len, Advice::WillNeed);
    for _ in 0..=REREADS {
        // Shorter than planned: the sender sees the truncation.
        if !read_through(job, scratch)? || super::residency::is_resident(&job.file, job.offset, job.len) {
            break;
        }
    }
    Ok(())
}

/// Reads the window with `pread` into `scratch` (pages already cached are only
/// copied). False when the file ended before the window did.
fn read_through(job: &Job, scratch: &mut [u8]) -> Result<bool, FillError> {
    let end = job.offset + job.len;
    let mut at = job.offset;
    while at < end {
        let n = ((end - at) as usize).min(scratch.len());
        match job.file.read_at(&mut scratch[..n], at) {
            Ok(0) => return Ok(false),
            Ok(k) => at += k as u64,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(FillError::Io(e.to_string())),
        }
    }
    Ok(true)
}

/// The whole pages within `len` bytes at `offset` (the last, partial page of the
/// file counts as whole): `(offset, len)` for `POSIX_FADV_DONTNEED`, None when
/// there is none (a length of 0 would mean "to the end of the file").
pub fn whole_pages(offset: u64, len: u64, file_len: u64) -> Option<(u64, u64)> {
    let page = pagecache::PAGE_BYTES;
    let start = offset.div_ceil(page) * page;
    let end = offset + len;
    let end = if end >= file_len { file_len.div_ceil(page) * page } else { end / page * page };
    (end > start).then(|| (start, end - start))
}

/// Share of the memory limit the kept files may fill. The rest is for what the
/// same memory cgroup is also charged: the server's own memory, the windows of
/// files outside the kept set between their fill and their drop (one being sent
/// and one read ahead per viewer, for [`super::senders::DROP_DELAY`] more), and the kernel's
/// reclaim, which starts before the limit is reached. A budget above what stays
/// cached would have the kept files evict each other, as the LRU does without a
/// policy; one below it leaves memory idle, a smaller loss.
pub const CACHE_HEADROOM: f64 = 0.9;

/// How often each worker adds its counts to the shared estimate, and how often
/// the kept set is ranked anew.
pub const MERGE_INTERVAL: Duration = Duration::from_secs(1);

/// A file's demand is forgotten once it decays below this many passes over it.
const FORGET_BELOW_PASSES: f64 = 1e-3;

/// `fill.cache_bytes`, or when 0 (auto) the server's memory limit (its memory
/// cgroup's, else the machine's) times [`CACHE_HEADROOM`].
pub fn cache_budget(config: &FillConfig) -> u64 {
    if config.cache_bytes > 0 {
        return config.cache_bytes;
    }
    let limit = crate::procfs::memory_limit_bytes(std::path::Path::new("/")).unwrap_or(1 << 30);
    (limit as f64 * CACHE_HEADROOM) as u64
}

/// `(dev, ino)`.
pub type FileId = (u64, u64);

/// The files whose pages stay cached, as last ranked.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Kept {
    files: HashSet<FileId>,
    /// Whether some file was left out: until then every file is admitted.
    full: bool,
    bytes: u64,
}

impl Kept {
    /// Whether the pages of file `id` may stay in the page cache.
    pub fn admits(&self, id: FileId) -> bool {
        !self.full || self.files.contains(&id)
    }
}

/// The demand a range asked of a file counts for: one pass over the file (its
/// size) for a range that starts it, nothing for the ranges that go on. Counting
/// starts (viewers arriving) rather than bytes sent keeps the estimate blind to how
/// fast each file is delivered: a client that downloads as fast as it can fetches a
/// cached file's bytes many times faster than an uncached one's, and bytes would
/// keep whichever files happened to be kept first.
pub fn demand_bytes(offset: u64, file_len: u64) -> u64 {
    if offset == 0 {
        file_len
    } else {
        0
    }
}

/// The fraction a demand keeps after `dt` with half-life `half_life`.
pub fn decay_factor(dt: Duration, half_life: Duration) -> f64 {
    (-(dt.as_secs_f64() / half_life.as_secs_f64()) * std::f64::consts::LN_2).exp()
}

/// Ranks files `(id, demanded bytes, size)` by demand per byte of file (how many
/// times over each is read: the hits a byte of cache buys), best first, ties by
/// id, and keeps each that still fits in `budget` bytes.
pub fn rank(mut files: Vec<(FileId, f64, u64)>, budget: u64) -> Kept {
    let density = |&(_, bytes, size): &(FileId, f64, u64)| bytes / size.max(1) as f64;
    files.sort_by(|a, b| density(b).total_cmp(&density(a)).then(a.0.cmp(&b.0)));
    let mut kept = Kept::default();
    for (id, _, size) in files {
        if kept.bytes + size <= budget {
            kept.bytes += size;
            kept.files.insert(id);
        } else {
            kept.full = true;
        }
    }
    kept
}

struct Demand {
    /// Requested bytes, decayed to [`Table::at`].
    bytes: f64,
    size: u64,
}

struct Table {
    at: Instant,
    files: HashMap<FileId, Demand>,
    ranked_at: Option<Instant>,
}

/// Popularity-aware page-cache admission, shared by all workers: one decayed
/// demand estimate per file, and the kept set it ranks (see the module doc).
pub struct Admission {
    budget_bytes: u64,
    half_life: Duration,
    table: Mutex<Table>,
    kept: Mutex<Arc<Kept>>,
    /// Bytes of ranges outside the kept set advised out of the page cache.
    pub dropped_bytes: AtomicU64,
    /// The kept set's files and their bytes, as last ranked.
    pub kept_files: AtomicU64,
    pub kept_bytes: AtomicU64,
}

/// One worker's requested bytes since its last merge (with each file's size), and
/// its copy of the kept set: the hot path touches no lock but once a second.
#[derive(Default)]
pub struct Tally {
    pending: RefCell<HashMap<FileId, (u64, u64)>>,
    merged_at: Cell<Option<Instant>>,
    kept: RefCell<Arc<Kept>>,
}

impl Admission {
    pub fn new(budget_bytes: u64, half_life: Duration) -> Admission {
        Admission {
            budget_bytes,
            half_life,
            table: Mutex::new(Table { at: Instant::now(), files: HashMap::new(), ranked_at: None }),
            kept: Mutex::default(),
            dropped_bytes: AtomicU64::new(0),
            kept_files: AtomicU64::new(0),
            kept_bytes: AtomicU64::new(0),
        }
    }

    pub fn budget_bytes(&self) -> u64 {
        self.budget_bytes
    }

    /// Counts `bytes` of demand ([`demand_bytes`]) for file `id` (`size` bytes
    /// long) on this worker, and answers whether the file is in the kept set.
    pub fn note(&self, tally: &Tally, id: FileId, size: u64, bytes: u64, now: Instant) -> bool {
        {
            let mut pending = tally.pending.borrow_mut();
            let e = pending.entry(id).or_insert((0, size));
            *e = (e.0 + bytes, size);
        }
        if tally.merged_at.get().is_none_or(|t| now.saturating_duration_since(t) >= MERGE_INTERVAL) {
            self.merge(&mut tally.pending.borrow_mut(), now);
            tally.merged_at.set(Some(now));
            *tally.kept.borrow_mut() = lock(&self.kept).clone();
        }
        tally.kept.borrow().admits(id)
    }

    /// Adds a worker's counts to the shared estimate, and ranks the kept set anew
    /// when it was last ranked [`MERGE_INTERVAL`] ago.
    fn merge(&self, pending: &mut HashMap<FileId, (u64, u64)>, now: Instant) {
        let mut t = lock(&self.table);
        if now > t.at {
            let f = decay_factor(now - t.at, self.half_life);
            t.files.retain(|_, d| {
                d.bytes *= f;
                d.bytes >= d.size as f64 * FORGET_BELOW_PASSES
            });
            t.at = now;
        }
        for (id, (bytes, size)) in pending.drain() {
            let d = t.files.entry(id).or_insert(Demand { bytes: 0.0, size });
            d.bytes += bytes as f64;
            d.size = size;
        }
        if t.ranked_at.is_some_and(|r| now.saturating_duration_since(r) < MERGE_INTERVAL) {
            return;
        }
        t.ranked_at = Some(now);
        let kept = rank(t.files.iter().map(|(id, d)| (*id, d.bytes, d.size)).collect(), self.budget_bytes);
        drop(t);
        self.kept_files.store(kept.files.len() as u64, Ordering::Relaxed);
        self.kept_bytes.store(kept.bytes, Ordering::Relaxed);
        *lock(&self.kept) = Arc::new(kept);
    }
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
    fn ranks_by_demand_per_byte_within_the_budget() {
        let mib = 1 << 20;
        // b is asked for as many bytes as a but is twice its size: half as dense.
        let files =
            vec![((0, 2), 64.0 * mib as f64, 64 * mib), ((0, 1), 64.0 * mib as f64, 32 * mib), ((0, 3), 1.0, 16 * mib)];
        let kept = rank(files.clone(), 100 * mib);
        assert!(kept.full, "112 MiB do not fit in 100");
        assert!(kept.admits((0, 1)) && kept.admits((0, 2)) && !kept.admits((0, 3)));
        assert_eq!(kept.bytes, 96 * mib);
        // A smaller budget skips b and still takes c, which fits.
        let kept = rank(files.clone(), 50 * mib);
        assert!(kept.admits((0, 1)) && !kept.admits((0, 2)) && kept.admits((0, 3)));
        assert_eq!(kept.bytes, 48 * mib);
        // Until the demand outgrows the budget, every file is admitted, even unseen ones.
        let kept = rank(files, 200 * mib);
        assert!(!kept.full && kept.admits((9, 9)));
        assert!(Kept::default().admits((1, 1)));
    }

    #[test]
    fn a_read_ahead_someone_waits_for_moves_to_the_demand_queue() {
        let file = || File::open("/proc/self/stat").unwrap();
        let key = |window| WindowKey { dev: 1, ino: 2, window };
        let job = |window| Job { key: key(window), file: file(), offset: 0, len: 1 };
        let mut q = Queue::default();
        q.demand.push_back(job(0));
        q.ahead.extend([job(1), job(2), job(3)]);
        assert!(q.promote(key(2)));
        let windows = |d: &VecDeque<Job>| d.iter().map(|j| j.key.window).collect::<Vec<_>>();
        assert_eq!(windows(&q.demand), [0, 2]);
        assert_eq!(windows(&q.ahead), [1, 3]);
        // Already taken by a fill thread, or never queued here: nothing to move.
        assert!(!q.promote(key(2)));
        assert!(!q.promote(key(9)));
    }

    #[test]
    fn a_start_counts_one_pass_and_the_rest_nothing() {
        assert_eq!(demand_bytes(0, 64 << 20), 64 << 20);
        assert_eq!(demand_bytes(2 << 20, 64 << 20), 0);
        assert_eq!(demand_bytes(0, 0), 0);
    }

    #[test]
    fn demand_halves_every_half_life() {
        let h = Duration::from_secs(60);
        assert!((decay_factor(Duration::ZERO, h) - 1.0).abs() < 1e-12);
        assert!((decay_factor(h, h) - 0.5).abs() < 1e-12);
        assert!((decay_factor(h * 3, h) - 0.125).abs() < 1e-12);
    }

    #[test]
    fn workers_counts_merge_into_one_ranking() {
        let mib = 1 << 20;
        let a = Admission::new(2 * mib, Duration::from_secs(60));
        let (w1, w2) = (Tally::default(), Tally::default());
        let t0 = Instant::now();
        // Worker 1 sees file 1 a lot; its first call merges and ranks at once.
        assert!(a.note(&w1, (0, 1), mib, 4 * mib, t0), "nothing is full yet");
        // Worker 2 asks for files 2 and 3 once each, and for file 1 too.
        assert!(a.note(&w2, (0, 2), mib, mib, t0));
        assert!(a.note(&w2, (0, 3), mib, mib / 2, t0), "its copy of the kept set is not yet full");
        // A second later both merge: files 1 (5 passes) and 2 (1 pass) fit, not 3.
        a.note(&w2, (0, 1), mib, mib, t0 + MERGE_INTERVAL);
        let t1 = t0 + MERGE_INTERVAL * 2;
        assert!(a.note(&w1, (0, 1), mib, 0, t1));
        assert!(!a.note(&w1, (0, 3), mib, 0, t1));
        assert!(a.note(&w1, (0, 2), mib, 0, t1));
        assert_eq!(a.kept_files.load(Ordering::Relaxed), 2);
        assert_eq!(a.kept_bytes.load(Ordering::Relaxed), 2 * mib);
        // File 3 becomes popular; five half-lives on, file 2 has fallen out.
        let t2 = t1 + Duration::from_secs(300);
        a.note(&w2, (0, 3), mib, 3 * mib, t2);
        let t3 = t2 + MERGE_INTERVAL;
        assert!(a.note(&w2, (0, 3), mib, 0, t3));
        assert!(!a.note(&w2, (0, 2), mib, 0, t3));
        assert!(a.note(&w2, (0, 1), mib, 0, t3), "5 passes decayed 5 half-lives still beat file 2");
    }

    #[test]
    fn drops_whole_pages_only() {
        let p = pagecache::PAGE_BYTES;
        assert_eq!(whole_pages(0, 10 * p, 100 * p), Some((0, 10 * p)));
        assert_eq!(whole_pages(1, 10 * p, 100 * p), Some((p, 9 * p)), "partial pages at both ends stay");
        assert_eq!(whole_pages(10, 100, 100 * p), None);
        assert_eq!(whole_pages(p, 2 * p + 7, 3 * p + 7), Some((p, 3 * p)), "the file's last page counts as whole");
        assert_eq!(whole_pages(0, 0, p), None);
    }

    #[test]
    fn parses_dev_numbers() {
        assert_eq!(parse_dev("259:3\n"), Some((259, 3)));
        assert_eq!(parse_dev("x"), None);
    }
}
