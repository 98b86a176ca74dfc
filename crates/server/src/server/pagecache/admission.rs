//! Popularity-aware page-cache admission: which files' pages stay cached.
//!
//! The kernel's LRU alone lets one pass over a long-tail title evict the titles
//! everyone watches. Instead every range that starts a file counts one pass over
//! it in its worker's [`Tally`] ([`demand_bytes`]); once a second the tallies are
//! merged into one estimate per file, decayed with `fill.admission_half_life`,
//! and the files are ranked by demand per byte of file ([`rank`]). The best that
//! fit in `fill.cache_bytes` are *kept*; the windows of any other file are dropped
//! once sent ([`super::senders`] says when that is safe).

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::lock;
use crate::config::Fill as FillConfig;

/// Share of the memory limit the kept files may fill. The rest is for what the
/// same memory cgroup is also charged: the server's own memory, the windows of
/// files outside the kept set between their fill and their drop (one being sent
/// and one read ahead per viewer, for [`super::senders::DROP_DELAY`] more), and the kernel's
/// reclaim, which starts before the limit is reached. A budget above what stays
/// cached would have the kept files evict each other, as the LRU does without a
/// policy; one below it leaves memory idle, a smaller loss.
pub(crate) const CACHE_HEADROOM: f64 = 0.9;

/// How often each worker adds its counts to the shared estimate, and how often
/// the kept set is ranked anew.
pub(crate) const MERGE_INTERVAL: Duration = Duration::from_secs(1);

/// A file's demand is forgotten once it decays below this many passes over it.
const FORGET_BELOW_PASSES: f64 = 1e-3;

/// `fill.cache_bytes`, or when 0 (auto) the server's memory limit (its memory
/// cgroup's, else the machine's) times [`CACHE_HEADROOM`].
pub(crate) fn cache_budget(config: &FillConfig) -> u64 {
    if config.cache_bytes > 0 {
        return config.cache_bytes;
    }
    let limit = crate::procfs::memory_limit_bytes(std::path::Path::new("/")).unwrap_or(1 << 30);
    (limit as f64 * CACHE_HEADROOM) as u64
}

/// `(dev, ino)`.
pub(crate) type FileId = (u64, u64);

/// The files whose pages stay cached, as last ranked.
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct Kept {
    files: HashSet<FileId>,
    /// Whether some file was left out: until then every file is admitted.
    full: bool,
    bytes: u64,
}

impl Kept {
    /// Whether the pages of file `id` may stay in the page cache.
    pub(crate) fn admits(&self, id: FileId) -> bool {
        !self.full || self.files.contains(&id)
    }
}

/// The demand a range asked of a file counts for: one pass over the file (its
/// size) for a range that starts it, nothing for the ranges that go on. Counting
/// starts (viewers arriving) rather than bytes sent keeps the estimate blind to how
/// fast each file is delivered: a client that downloads as fast as it can fetches a
/// cached file's bytes many times faster than an uncached one's, and bytes would
/// keep whichever files happened to be kept first.
pub(crate) fn demand_bytes(offset: u64, file_len: u64) -> u64 {
    if offset == 0 {
        file_len
    } else {
        0
    }
}

/// The fraction a demand keeps after `dt` with half-life `half_life`.
pub(crate) fn decay_factor(dt: Duration, half_life: Duration) -> f64 {
    (-(dt.as_secs_f64() / half_life.as_secs_f64()) * std::f64::consts::LN_2).exp()
}

/// Ranks files `(id, demanded bytes, size)` by demand per byte of file (how many
/// times over each is read: the hits a byte of cache buys), best first, ties by
/// id, and keeps each that still fits in `budget` bytes.
pub(crate) fn rank(mut files: Vec<(FileId, f64, u64)>, budget: u64) -> Kept {
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
pub(crate) struct Admission {
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
pub(crate) struct Tally {
    pending: RefCell<HashMap<FileId, (u64, u64)>>,
    merged_at: Cell<Option<Instant>>,
    kept: RefCell<Arc<Kept>>,
}

impl Admission {
    pub(crate) fn new(budget_bytes: u64, half_life: Duration) -> Admission {
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

    pub(crate) fn budget_bytes(&self) -> u64 {
        self.budget_bytes
    }

    /// Counts `bytes` of demand ([`demand_bytes`]) for file `id` (`size` bytes
    /// long) on this worker, and answers whether the file is in the kept set.
    pub(crate) fn note(&self, tally: &Tally, id: FileId, size: u64, bytes: u64, now: Instant) -> bool {
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

    /// Demand per byte of every file the estimate knows (the passes over it),
    /// decayed to `now`; read-only, under one lock of the table. The slice store
    /// ranks its evictions by it, so a slice popular in memory stays on disk too.
    pub(crate) fn densities(&self, now: Instant) -> HashMap<FileId, f64> {
        let t = lock(&self.table);
        let f = if now > t.at { decay_factor(now - t.at, self.half_life) } else { 1.0 };
        t.files.iter().map(|(id, d)| (*id, d.bytes * f / d.size.max(1) as f64)).collect()
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
}
