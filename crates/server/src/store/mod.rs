//! The slice store of the pull-through cache: objects fetched from origins, kept
//! on local disks as fixed-size slices, each a plain file a hit is `sendfile`d
//! from exactly as a local file is.
//!
//! # Layout on disk
//!
//! Each directory of `[cache]` holds:
//!
//! ```text
//! index.journal                      what the store knows (see below)
//! index.shards                       where each shard's records start in the
//!                                    journal's compacted part ([`shardmap`])
//! slices/<k2>/<key>.<gen>.<index>    one file per slice: key hash in hex (<k2>: its
//!                                    first two digits), the object's version, the
//!                                    slice's number (byte offset / slice_bytes)
//! tmp/<run>.<n>                      slices being written, and journals being rewritten
//! ```
//!
//! An object and all its slices live in one directory, chosen by its key hash
//! (`KeyHash`, the first 16 bytes of the SHA-256 of the cache key), or the next
//! writable one when that directory is not writable.
//!
//! # The journal
//!
//! `index.journal` ([`journal`]) records object metadata, committed slices and
//! drops, one line appended per change with one `write` (synced when
//! `[cache] fsync`). `open` replays the journals of every directory, so hits are
//! served at once, without walking the slice files. A journal is rewritten with
//! only its live records once it holds more than twice as many ([`compact`]),
//! and at a clean stop when much was appended since: shard by shard, with a
//! shard map. With a map, `open` reads only what was appended after the
//! compacted part; a shard's block is read and applied by the first lookup of
//! that shard, or by the sweep's thread, which applies every shard before it
//! sweeps (and the evictor, compaction and the gauges wait for all of them).
//!
//! # Crash safety
//!
//! A `kill -9` at any moment must never lead to a wrong byte served afterwards:
//!
//! 1. A slice is written to `tmp/` ([`Store::begin_slice`]); readers may `sendfile`
//!    from it while it is written, but nothing else knows it.
//! 2. Once complete, its length is checked, it is synced (when `fsync`), renamed
//!    into `slices/`, and only then put in the index and its record appended.
//!    A crash before the rename leaves a tmp file; between the rename and the
//!    record, a file the index does not know. A background sweep removes both
//!    after `open` returns (never before: `open` stays fast), and nothing else.
//! 3. A record whose file is missing, or whose size, inode or mtime differ from
//!    the record's, is caught by the one `stat` of each lookup
//!    ([`Store::slice`]), dropped from the index and reported absent. The store
//!    never truncates or rewrites a committed file; it only removes them.
//! 4. An object's version (`gen`) is in its slices' records and file names: a
//!    slice of a version the origin has since replaced is never taken for one
//!    of the new version, whichever records a crash lost.
//!
//! # Eviction
//!
//! Once a second a background thread looks at each directory: when its slices
//! take more than `max_size_bytes`, or its file system has less than
//! `min_free_bytes` free, slices go until it is 5% under that limit, the long
//! tail first: ranked by the page-cache admission's demand per byte of each
//! slice file (by `(dev, ino)`, through the [`Popularity`] callback given to
//! `open`), ties broken by least recent use ([`Store::note_use`]); the objects a
//! prefill manifest pinned ([`Store::set_pins`]) go last. Removing a
//! file a reader has open is safe on Linux: the reader keeps its descriptor.
//!
//! # Unwritable directories
//!
//! A write that fails with `ENOSPC`, `EROFS`, `EACCES`, `EPERM`, `EDQUOT` or `EIO`
//! marks its directory unwritable for [`UNWRITABLE_RETRY`]: the store then
//! answers `StoreError::Unwritable` at once (the caller passes the bytes through
//! instead), and places new objects in the other directories.

// Wired into the cache in the next step.

mod compact;
mod dir;
mod evict;
mod journal;
mod shardmap;
mod sweep;

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use aws_lc_rs::digest::{digest, SHA256};

use self::dir::{unwritable_kind, Dir};
use self::journal::{Journal, Record, Rewrite, SliceFile, Sorted};
use self::shardmap::ShardMap;
use crate::config::Cache as CacheConfig;

/// The first 16 bytes of the SHA-256 of a cache key.
pub(crate) type KeyHash = [u8; 16];

/// The hash a cache key is stored under.
pub(crate) fn key_hash(key: &[u8]) -> KeyHash {
    let d = digest(&SHA256, key);
    let mut h = [0; 16];
    h.copy_from_slice(&d.as_ref()[..16]);
    h
}

/// How long a directory that failed a write is left alone before it is tried again.
pub(crate) const UNWRITABLE_RETRY: Duration = Duration::from_secs(30);

/// Shards of the index: lookups of different keys rarely meet on one lock, and
/// after a start the first lookup of a key reads only its shard's block of the
/// journal (about 1/1024 of it).
const SHARDS: usize = 1024;

/// Demand per byte of each file the page cache knows, by `(dev, ino)`: the
/// admission's estimate, which ranks evictions.
pub(crate) type Popularity = Box<dyn Fn() -> HashMap<(u64, u64), f64> + Send + Sync>;

/// Pinned objects by key hash, each with its rank (0: the manifest's first entry).
pub(crate) type Pins = HashMap<KeyHash, u32>;

/// What the store keeps of an object besides its bytes.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct ObjectMeta {
    /// The full cache key, for the caller to compare (two keys may share a hash).
    pub key: Vec<u8>,
    /// 200, or 404/410 for a cached negative answer (no slices).
    pub status: u16,
    /// Bytes of the object (0 for negative answers).
    pub size: u64,
    pub etag: Option<Vec<u8>>,
    pub last_modified: Option<Vec<u8>>,
    pub content_type: Option<Vec<u8>>,
    /// Unix milliseconds at which the response was of age zero: when it was
    /// received less the age it arrived with (its `Age`, or the time since its
    /// `Date`; `linerate_http::freshness`). Its age at time `t` is
    /// `t - dated_at_ms`, what the `Age` field of a response from it says (in
    /// whole seconds); a made-up ETag and a missing Last-Modified come from it.
    /// (Journals written before ages were kept hold the time received: an age of
    /// zero on arrival.)
    pub dated_at_ms: i64,
    /// Unix milliseconds: fresh until then (the age-zero time plus the freshness
    /// lifetime), servable while revalidating until the second, and when the
    /// origin fails until the third. Milliseconds, so a live playlist's lifetime
    /// of 500 ms ends when it should.
    pub fresh_until_ms: i64,
    pub stale_while_revalidate_until_ms: i64,
    pub stale_if_error_until_ms: i64,
}

impl ObjectMeta {
    /// Whether `other` describes the same bytes: same key, answer, size and
    /// validators. Anything else is a new version, whose slices start afresh.
    pub(crate) fn same_version(&self, other: &ObjectMeta) -> bool {
        // A hit's lookup passes the very metadata the store handed out: no compare.
        std::ptr::eq(self, other)
            || self.key == other.key
                && self.status == other.status
                && self.size == other.size
                && self.etag == other.etag
                && self.last_modified == other.last_modified
    }
}

/// A committed slice, as its file was when looked up. The caller opening `path`
/// should compare the descriptor's `(dev, ino)` with these.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct SliceRef {
    pub path: PathBuf,
    pub len: u64,
    pub dev: u64,
    pub ino: u64,
    pub mtime_ns: i64,
    /// The position of its directory in `[cache] dirs`.
    pub dir: usize,
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum StoreError {
    /// The directory failed a write (full, read-only, refused, or a disk error),
    /// now or less than [`UNWRITABLE_RETRY`] ago: pass the bytes through.
    #[error("cache directory {dir:?} is not writable: {source}")]
    Unwritable { dir: PathBuf, source: io::Error },
    /// A slice is not as long as its place in the object says.
    #[error("a slice of {got} bytes where {expected} were expected")]
    Length { expected: u64, got: u64 },
    /// No such object: never stored, dropped, or replaced by a newer version.
    #[error("no such object in the store")]
    NoObject,
    /// The store was handed to a new process at a binary upgrade ([`Store::freeze`]):
    /// this one only reads it.
    #[error("the store belongs to the new process now")]
    Frozen,
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// What the store holds, for `/status` and `/metrics`.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub(crate) struct StoreStats {
    pub objects: u64,
    pub slices: u64,
    pub bytes: u64,
    pub dirs: Vec<DirStats>,
}

#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub(crate) struct DirStats {
    pub path: PathBuf,
    pub objects: u64,
    pub slices: u64,
    pub bytes: u64,
    /// Free bytes of its file system, as last measured (once a second).
    pub free_bytes: u64,
    pub writable: bool,
    pub evictions: u64,
    pub evicted_bytes: u64,
    /// Slices dropped at lookup because their file was missing or another.
    pub damaged_slices: u64,
    /// Writes that failed with an error that marks the directory unwritable.
    pub unwritable_errors: u64,
}

/// How often the evictor looks at each directory.
pub(crate) const EVICT_INTERVAL: Duration = Duration::from_secs(1);

/// Free bytes of the file system holding a path.
type FreeBytes = Box<dyn Fn(&Path) -> io::Result<u64> + Send + Sync>;

/// What tests change; `open` takes the defaults.
struct Options {
    /// How long a directory that failed a write is left alone.
    retry: Duration,
    /// How often the evictor runs; `None`: no evictor thread (tests run passes).
    evict_every: Option<Duration>,
    free_bytes: FreeBytes,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            retry: UNWRITABLE_RETRY,
            evict_every: Some(EVICT_INTERVAL),
            free_bytes: Box::new(linerate_sys::free_bytes),
        }
    }
}

/// The slice store (see the module doc).
pub(crate) struct Store {
    shared: Arc<Shared>,
    /// The sweep (and the evictor), joined when the store is dropped.
    threads: Vec<std::thread::JoinHandle<()>>,
}

/// What the store, its writers and its threads share.
struct Shared {
    /// Set by [`Store::freeze`]: nothing is written, deleted or compacted any more.
    frozen: AtomicBool,
    slice_bytes: u64,
    fsync: bool,
    dirs: Vec<Dir>,
    shards: Vec<Mutex<Shard>>,
    /// The next record's sequence number.
    seq: AtomicU64,
    /// The clock of unwritable marks.
    epoch: Instant,
    retry: Duration,
    /// Names this run's temporary files apart from those a crash left.
    run: String,
    tmp_files: AtomicU64,
    popularity: Popularity,
    /// Objects pre-positioned by a manifest ([`Store::set_pins`]): evicted only
    /// after every other slice, the manifest's last entries first.
    pins: Mutex<Arc<Pins>>,
    free_bytes: FreeBytes,
    /// A shard's block of a compacted journal could not be read: the sweep
    /// leaves the files alone (they would look unknown).
    load_failed: AtomicBool,
    /// Set when the store is dropped: the threads end.
    stop: Mutex<bool>,
    wake: Condvar,
    /// The sweep has run.
    swept: AtomicBool,
}

#[derive(Default)]
struct Shard {
    objects: HashMap<KeyHash, Entry>,
    /// Slices between `begin_slice` and the end of their commit or abort, by
    /// `(key, index)`: the sweep leaves their files alone.
    writing: HashMap<(KeyHash, u64), Writing>,
    /// After a start with shard maps, the records not applied yet: the first
    /// [`Shared::shard_at`] of this shard applies them, before anything else
    /// sees it.
    pending: Option<Pending>,
}

/// A shard's records left to apply: blocks of compacted journals, and the
/// records read at open (appended after those, or from journals without a map).
#[derive(Default)]
struct Pending {
    /// `(dir, journal, start, end)`.
    blocks: Vec<(usize, Arc<File>, u64, u64)>,
    records: ShardRecords,
}

/// A slice being written.
#[derive(Default)]
struct Writing {
    writers: u32,
    /// What `note_use` said of it before its commit, for its `Slice`.
    midway_until_ms: i64,
}

/// How long a slice a viewer stopped reading part-way through is kept from
/// eviction (unless someone reads it to its end first): a player asks for the
/// next part of a title within a segment's duration, and evicting the slice in
/// between would fetch all of it again for its rest. A viewer not back within
/// this is not waited for.
pub(crate) const READER_RETURNS_WITHIN_MS: i64 = 30_000;

/// An object in the index.
struct Entry {
    meta: Arc<ObjectMeta>,
    /// Its version: the sequence number of the record that began it.
    gen: u64,
    /// The sequence number of its newest metadata record.
    seq: u64,
    dir: usize,
    slices: HashMap<u64, Slice>,
}

#[derive(Clone, Copy, Debug)]
struct Slice {
    seq: u64,
    file: SliceFile,
    /// Last use (`note_use`), Unix milliseconds; its file's mtime until then.
    used_ms: i64,
    /// Until when (Unix milliseconds) a viewer who read part of it is expected
    /// back for the rest ([`READER_RETURNS_WITHIN_MS`]); 0: none.
    midway_until_ms: i64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn unix_ms() -> i64 {
    SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

fn mtime_ns(m: &std::fs::Metadata) -> i64 {
    m.mtime().saturating_mul(1_000_000_000).saturating_add(m.mtime_nsec())
}

/// Bytes of slice `index` of an object of `size` bytes: 0 past its end.
fn expected_len(size: u64, slice_bytes: u64, index: u64) -> u64 {
    match index.checked_mul(slice_bytes) {
        Some(start) if start < size => (size - start).min(slice_bytes),
        _ => 0,
    }
}

/// Renames a finished slice into place, making its subdirectory on first use.
fn rename_into(tmp: &Path, path: &Path) -> io::Result<()> {
    match std::fs::rename(tmp, path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound && tmp.exists() => {
            std::fs::create_dir_all(path.parent().unwrap_or(Path::new("/")))?;
            std::fs::rename(tmp, path)
        }
        r => r,
    }
}

impl Store {
    /// Opens (creates) every directory of `config`, replays the journals, and
    /// starts the evictor and the sweep. `popularity` gives demand per byte by
    /// file (dev, ino).
    pub(crate) fn open(config: &CacheConfig, popularity: Popularity) -> Result<Arc<Store>, StoreError> {
        Store::open_with(config, popularity, Options::default())
    }

    fn open_with(config: &CacheConfig, popularity: Popularity, options: Options) -> Result<Arc<Store>, StoreError> {
        if config.dirs.is_empty() {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "the slice store needs a directory").into());
        }
        let epoch = Instant::now();
        // Unique to this open, even of two in one process and millisecond.
        static OPENS: AtomicU64 = AtomicU64::new(0);
        let run = format!("{:x}-{:x}-{}", std::process::id(), unix_ms(), OPENS.fetch_add(1, Ordering::Relaxed));
        let mut dirs = Vec::with_capacity(config.dirs.len());
        let mut records = Vec::new();
        let mut sorted = Vec::new();
        let mut failures = Vec::new();
        for (i, c) in config.dirs.iter().enumerate() {
            let journal_path = Dir::journal_path(&c.path);
            let journal_tmp = c.path.join("tmp").join(format!("{run}.journal"));
            // Made at each open: an operator may have emptied the directory.
            let prepared = match std::fs::create_dir_all(c.path.join("tmp"))
                .and_then(|()| std::fs::create_dir_all(c.path.join("slices")))
            {
                Ok(()) => true,
                Err(e) if unwritable_kind(&e) => {
                    failures.push((i, e));
                    false
                }
                Err(e) => return Err(e.into()),
            };
            let replay = match journal::read(&journal_path, ShardMap::read(&shardmap::path(&c.path))) {
                Ok(r) => r,
                Err(e) if e.kind() == io::ErrorKind::InvalidData => return Err(e.into()),
                Err(e) => {
                    tracing::error!(dir = %c.path.display(), "cache journal unreadable, directory left empty: {e}");
                    failures.push((i, e));
                    dirs.push(Dir::new(c, Journal::new(journal_path, journal_tmp, 0, 0, false), false));
                    continue;
                }
            };
            let (lines, sorted_lines, torn) = match replay {
                Some(r) => {
                    if r.damaged > 0 {
                        tracing::warn!(dir = %c.path.display(), "{} damaged journal lines skipped", r.damaged);
                    }
                    records.extend(r.records.into_iter().map(|rec| (i, rec)));
                    let sorted_lines = r.sorted.as_ref().map_or(0, |p| p.map.lines);
                    sorted.extend(r.sorted.map(|p| (i, p)));
                    (r.lines, sorted_lines, r.torn_tail)
                }
                None if !prepared => (0, 0, false),
                None => {
                    // A new directory: an empty journal, renamed into place whole.
                    match Rewrite::create(journal_tmp.clone()).and_then(|w| w.finish(&journal_path)) {
                        Ok(_) => {}
                        Err(e) if unwritable_kind(&e) => failures.push((i, e)),
                        Err(e) => return Err(e.into()),
                    }
                    (0, 0, false)
                }
            };
            dirs.push(Dir::new(c, Journal::new(journal_path, journal_tmp, lines, sorted_lines, torn), true));
        }
        let mut shards: Vec<Shard> = (0..SHARDS).map(|_| Shard::default()).collect();
        let next_seq =
            if sorted.is_empty() { replay(&mut shards, &dirs, records) } else { defer(&mut shards, records, sorted) };
        let shared = Shared {
            slice_bytes: config.slice_bytes,
            fsync: config.fsync,
            dirs,
            shards: shards.into_iter().map(Mutex::new).collect(),
            seq: AtomicU64::new(next_seq),
            epoch,
            retry: options.retry,
            run,
            tmp_files: AtomicU64::new(0),
            popularity,
            pins: Mutex::default(),
            free_bytes: options.free_bytes,
            stop: Mutex::new(false),
            wake: Condvar::new(),
            swept: AtomicBool::new(false),
            frozen: AtomicBool::new(false),
            load_failed: AtomicBool::new(false),
        };
        for (i, e) in failures {
            let _ = shared.dirs[i].failed(e, shared.now_ms(), shared.retry);
        }
        for d in &shared.dirs {
            d.free_bytes.store((shared.free_bytes)(&d.path).unwrap_or(u64::MAX), Ordering::Relaxed);
        }
        let shared = Arc::new(shared);
        let sweeper = shared.clone();
        let mut threads = vec![std::thread::Builder::new().name("linerate-store-sweep".into()).spawn(move || {
            // Shards a lookup has not needed yet are read here, before the sweep
            // asks the index about every file. This thread and the ones it starts
            // run only when the workers leave a core idle: they must not delay the
            // first requests after a start, whose lookups read their own shards.
            if let Err(e) = linerate_sys::set_current_thread_idle() {
                tracing::info!(error = %e, "SCHED_IDLE refused: the store's load and sweep run at normal priority");
            }
            sweeper.load_all_on_threads();
            sweep::sweep(&sweeper);
            sweeper.swept.store(true, Ordering::Release);
        })?];
        if let Some(every) = options.evict_every {
            let evictor = shared.clone();
            let thread = std::thread::Builder::new().name("linerate-store-evict".into()).spawn(move || {
                while evictor.sleep(every) {
                    if evictor.frozen.load(Ordering::Acquire) {
                        continue;
                    }
                    for dir in 0..evictor.dirs.len() {
                        evict::pass(&evictor, dir);
                        // A failure marks the directory (and is logged there).
                        let _ = compact::compact(&evictor, dir, false);
                    }
                }
            });
            match thread {
                Ok(t) => threads.push(t),
                Err(e) => {
                    // Stop the sweep before giving up.
                    drop(Store { shared, threads });
                    return Err(e.into());
                }
            }
        }
        Ok(Arc::new(Store { shared, threads }))
    }

    /// Replaces the pinned objects: their slices are evicted only after every
    /// other slice, the highest rank (the manifest's bottom) first. Empty: none.
    pub(crate) fn set_pins(&self, pins: Pins) {
        *lock(&self.shared.pins) = Arc::new(pins);
    }

    pub(crate) fn slice_bytes(&self) -> u64 {
        self.shared.slice_bytes
    }

    /// Hands the store over to the process that took over the listening sockets at
    /// a binary upgrade: from now on this one only reads it (serving hits while it
    /// drains), and writes, deletes, evicts and compacts nothing. Two processes
    /// writing one journal would interleave records of two indexes, and one's
    /// compaction would drop the other's records; its fills go to memory instead.
    pub(crate) fn freeze(&self) {
        self.shared.frozen.store(true, Ordering::Release);
    }

    pub(crate) fn frozen(&self) -> bool {
        self.shared.frozen.load(Ordering::Acquire)
    }

    /// At a clean stop: rewrites each journal that had much appended since its
    /// last compaction, with its shard map, so that the next start serves hits
    /// at once instead of reading the whole journal first. Not after a hand-over
    /// (the store is the new process's).
    pub(crate) fn close(&self) {
        if self.frozen() {
            return;
        }
        let s = &*self.shared;
        for dir in 0..s.dirs.len() {
            let worth = {
                let j = lock(&s.dirs[dir].journal);
                compact::tail_worth_compacting(j.lines, j.sorted_lines)
            };
            if worth {
                // A failure marks the directory (and is logged there).
                let _ = compact::compact(s, dir, true);
            }
        }
    }

    /// The metadata stored under `key`; the caller compares its `key` field.
    pub(crate) fn object(&self, key: &KeyHash) -> Option<Arc<ObjectMeta>> {
        self.shared.shard(key).objects.get(key).map(|e| e.meta.clone())
    }

    /// Records new or refreshed metadata. When an object of that key exists with
    /// other validators (etag, last_modified), size, status or full key, all its
    /// slices are dropped first. A refresh is kept in the index even when its
    /// record cannot be written (`Unwritable`): the slices stay servable, and a
    /// restart brings back the previous metadata, older but consistent with them.
    /// A new version is not stored while no directory takes writes.
    pub(crate) fn put_object(&self, key: &KeyHash, meta: ObjectMeta) -> Result<(), StoreError> {
        if self.frozen() {
            return Err(StoreError::Frozen);
        }
        let s = &*self.shared;
        let now = s.now_ms();
        let mut stale = Vec::new();
        let mut records = Vec::with_capacity(2);
        let mut refused = None;
        {
            let mut shard = s.shard(key);
            match shard.objects.get_mut(key) {
                // A refresh stays where its slices are; one with none yet moves
                // off a directory that takes no writes.
                Some(e) if e.meta.same_version(&meta) && (!e.slices.is_empty() || s.dirs[e.dir].writable(now)) => {
                    e.seq = s.next_seq();
                    e.meta = Arc::new(meta);
                    records.push((e.dir, Record::Object { seq: e.seq, key: *key, gen: e.gen, meta: e.meta.clone() }));
                }
                _ => {
                    let dir = s.choose_dir(key, now);
                    let writable = s.dirs[dir].writable(now);
                    if let Some(old) = shard.objects.remove(key) {
                        stale = s.unindex(key, &old);
                        if old.dir != dir || !writable {
                            // Before the new version's record, in replay order.
                            records.push((old.dir, Record::DropObject { seq: s.next_seq(), key: *key }));
                        }
                    }
                    if writable {
                        let gen = s.next_seq();
                        let meta = Arc::new(meta);
                        s.dirs[dir].account(1, 0, 0);
                        let e = Entry { meta: meta.clone(), gen, seq: gen, dir, slices: HashMap::new() };
                        shard.objects.insert(*key, e);
                        records.push((dir, Record::Object { seq: gen, key: *key, gen, meta }));
                    } else {
                        // No directory takes writes: the object is not stored.
                        refused = Some(s.dirs[dir].refusal());
                    }
                }
            }
        }
        remove_files(&stale);
        let mut result = Ok(());
        for (dir, r) in &records {
            result = s.append(*dir, r);
        }
        refused.map_or(result, Err)
    }

    /// Drops an object's version `version` and its slices (the origin replaced
    /// it): a newer version stored meanwhile stays.
    pub(crate) fn drop_object(&self, key: &KeyHash, version: &ObjectMeta) {
        if self.frozen() {
            return;
        }
        let s = &*self.shared;
        // The number is taken under the lock, so that it orders this drop before
        // a put of the same key that follows it.
        let Some((old, seq)) = ({
            let mut shard = s.shard(key);
            if !shard.objects.get(key).is_some_and(|e| e.meta.same_version(version)) {
                return;
            }
            shard.objects.remove(key).map(|old| (old, s.next_seq()))
        }) else {
            return;
        };
        let stale = s.unindex(key, &old);
        remove_files(&stale);
        let _ = s.append(old.dir, &Record::DropObject { seq, key: *key });
    }

    /// Whether slice `index` of the version `version` is in the index, without
    /// the check of its file that [`Store::slice`] makes.
    pub(crate) fn indexed(&self, key: &KeyHash, version: &ObjectMeta, index: u64) -> bool {
        let shard = self.shared.shard(key);
        shard.objects.get(key).filter(|e| e.meta.same_version(version)).is_some_and(|e| e.slices.contains_key(&index))
    }

    /// A committed slice of the object's version `version`, checked against its
    /// file with one `stat`: a file that is missing or not the one recorded
    /// (size, inode, mtime) is dropped from the index and reported absent. A
    /// slice of another version (the origin replaced the object since `version`
    /// was read) is absent too: a response never mixes versions.
    pub(crate) fn slice(&self, key: &KeyHash, version: &ObjectMeta, index: u64) -> Option<SliceRef> {
        let s = &*self.shared;
        let (dir, gen, slice) = {
            let shard = s.shard(key);
            let e = shard.objects.get(key).filter(|e| e.meta.same_version(version))?;
            (e.dir, e.gen, *e.slices.get(&index)?)
        };
        let path = s.dirs[dir].slice_path(key, gen, index);
        let f = slice.file;
        let found = std::fs::metadata(&path);
        if let Ok(m) = &found {
            if m.len() == f.len && m.dev() == f.dev && m.ino() == f.ino && mtime_ns(m) == f.mtime_ns {
                return Some(SliceRef { path, len: f.len, dev: f.dev, ino: f.ino, mtime_ns: f.mtime_ns, dir });
            }
        }
        let why = match &found {
            Ok(_) => "size, inode or mtime differ".to_string(),
            Err(e) => e.to_string(),
        };
        if s.drop_slice(key, gen, index, Some(slice.seq), found.is_ok()).is_some() {
            s.dirs[dir].damaged(&path, &why);
        }
        None
    }

    /// Starts writing slice `index` (of `len` bytes) of an object whose metadata
    /// is stored: a new temporary file, opened read-write (readers may `sendfile`
    /// from it while it is written: hand out `writer.file()`). A fill of another
    /// version than the stored one (`version`) gets `NoObject`: its bytes are not
    /// the stored version's.
    pub(crate) fn begin_slice(
        &self,
        key: &KeyHash,
        version: &ObjectMeta,
        index: u64,
        len: u64,
    ) -> Result<SliceWriter, StoreError> {
        if self.frozen() {
            return Err(StoreError::Frozen);
        }
        let s = &self.shared;
        let now = s.now_ms();
        let (dir, gen) = {
            let mut shard = s.shard(key);
            let e = shard.objects.get(key).filter(|e| e.meta.same_version(version)).ok_or(StoreError::NoObject)?;
            let expected = if e.meta.status == 200 { expected_len(e.meta.size, s.slice_bytes, index) } else { 0 };
            if len != expected || len == 0 {
                return Err(StoreError::Length { expected, got: len });
            }
            let (dir, gen) = (e.dir, e.gen);
            if !s.dirs[dir].writable(now) {
                return Err(s.dirs[dir].refusal());
            }
            shard.writing.entry((*key, index)).or_default().writers += 1;
            (dir, gen)
        };
        let d = &s.dirs[dir];
        let tmp = d.tmp().join(format!("{}.{}", s.run, s.tmp_files.fetch_add(1, Ordering::Relaxed)));
        let create = || OpenOptions::new().read(true).write(true).create_new(true).open(&tmp);
        let file = match create() {
            // `tmp/` removed behind our back, or not made at open.
            Err(e) if e.kind() == io::ErrorKind::NotFound => std::fs::create_dir_all(d.tmp()).and_then(|()| create()),
            r => r,
        };
        match file {
            Ok(file) => {
                // The slice's blocks reserved at once: the fill's writes then cost the
                // writer less CPU (tail, bench/origin.sh: 4.6% less CPU per GB served at
                // the median). Only an optimisation: where it fails, the writes allocate.
                let _ = linerate_sys::preallocate(std::os::fd::AsFd::as_fd(&file), len);
                Ok(SliceWriter {
                    shared: s.clone(),
                    tmp,
                    file: Arc::new(file),
                    key: *key,
                    index,
                    len,
                    gen,
                    dir,
                    written: AtomicU64::new(0),
                    finished: false,
                })
            }
            Err(e) => {
                s.done_writing(key, index);
                Err(d.failed(e, now, s.retry))
            }
        }
    }

    /// Makes a fully written slice visible (its length must be `len`; else
    /// `StoreError::Length` and it is discarded). A slice of an object dropped or
    /// replaced meanwhile is discarded (`StoreError::NoObject`). Once the slice
    /// is visible, a failure to write its record only marks the directory: the
    /// slice is served until a restart, which sweeps it as unknown.
    pub(crate) fn commit_slice(&self, mut writer: SliceWriter) -> Result<SliceRef, StoreError> {
        if self.frozen() {
            self.abort_slice(writer);
            return Err(StoreError::Frozen);
        }
        let s = &*self.shared;
        let d = &s.dirs[writer.dir];
        let st = writer.file.metadata()?;
        if st.len() != writer.len {
            return Err(StoreError::Length { expected: writer.len, got: st.len() });
        }
        if s.fsync {
            writer.file.sync_data().map_err(|e| d.failed(e, s.now_ms(), s.retry))?;
        }
        let (key, index, gen) = (writer.key, writer.index, writer.gen);
        let path = d.slice_path(&key, gen, index);
        rename_into(&writer.tmp, &path).map_err(|e| d.failed(e, s.now_ms(), s.retry))?;
        // From here the file is at its place: `writer`'s drop must not remove it.
        writer.finished = true;
        if s.fsync {
            if let Err(e) = journal::sync_dir(path.parent().unwrap_or(&d.path)) {
                let _ = std::fs::remove_file(&path);
                s.done_writing(&key, index);
                return Err(d.failed(e, s.now_ms(), s.retry));
            }
        }
        let file = SliceFile { len: st.len(), dev: st.dev(), ino: st.ino(), mtime_ns: mtime_ns(&st) };
        let seq = {
            let mut shard = s.shard(&key);
            let midway_until_ms = shard.release(&key, index);
            let Some(e) = shard.objects.get_mut(&key).filter(|e| e.gen == gen) else {
                // Removed under the lock: no later commit of this version can
                // index a file at this path any more.
                let _ = std::fs::remove_file(&path);
                return Err(StoreError::NoObject);
            };
            let seq = s.next_seq();
            let old = e.slices.insert(index, Slice { seq, file, used_ms: unix_ms(), midway_until_ms });
            let old_len = old.map_or(0, |o| o.file.len as i64);
            d.account(0, old.is_none() as i64, file.len as i64 - old_len);
            seq
        };
        let _ = s.append(writer.dir, &Record::Slice { seq, key, gen, index, file });
        Ok(SliceRef { path, len: file.len, dev: file.dev, ino: file.ino, mtime_ns: file.mtime_ns, dir: writer.dir })
    }

    /// Gives up a slice being written: its temporary file goes (as when a
    /// writer is dropped).
    pub(crate) fn abort_slice(&self, writer: SliceWriter) {
        drop(writer);
    }

    /// Forgets a slice found damaged by a reader (and removes its file).
    pub(crate) fn forget_slice(&self, key: &KeyHash, index: u64) {
        if self.frozen() {
            return;
        }
        let s = &*self.shared;
        let Some(gen) = s.shard(key).objects.get(key).map(|e| e.gen) else { return };
        s.drop_slice(key, gen, index, None, true);
    }

    /// Notes that a viewer was sent part of slice `index` (from the store, or
    /// from its fill), up to its end or not (`reached_end`). Among slices of equal
    /// demand the least recently used are evicted first, and one a viewer stopped
    /// in the middle of is evicted last, for [`READER_RETURNS_WITHIN_MS`] or until
    /// someone reads it to its end.
    pub(crate) fn note_use(&self, key: &KeyHash, index: u64, reached_end: bool) {
        let now = unix_ms();
        let midway_until_ms = if reached_end { 0 } else { now + READER_RETURNS_WITHIN_MS };
        let mut shard = self.shared.shard(key);
        if let Some(slice) = shard.objects.get_mut(key).and_then(|e| e.slices.get_mut(&index)) {
            slice.used_ms = now;
            slice.midway_until_ms = midway_until_ms;
        } else if let Some(w) = shard.writing.get_mut(&(*key, index)) {
            w.midway_until_ms = midway_until_ms;
        }
    }

    /// What the store holds; right after a start, once every shard's records
    /// are applied (it applies those no lookup needed yet).
    pub(crate) fn stats(&self) -> StoreStats {
        let s = &*self.shared;
        s.load_all();
        let now = s.now_ms();
        let mut stats = StoreStats::default();
        for d in &s.dirs {
            let objects = d.objects.load(Ordering::Relaxed).max(0) as u64;
            let slices = d.slices.load(Ordering::Relaxed).max(0) as u64;
            stats.objects += objects;
            stats.slices += slices;
            stats.bytes += d.bytes();
            stats.dirs.push(DirStats {
                path: d.path.clone(),
                objects,
                slices,
                bytes: d.bytes(),
                free_bytes: d.free_bytes.load(Ordering::Relaxed),
                writable: d.writable(now),
                evictions: d.evictions.load(Ordering::Relaxed),
                evicted_bytes: d.evicted_bytes.load(Ordering::Relaxed),
                damaged_slices: d.damaged_slices.load(Ordering::Relaxed),
                unwritable_errors: d.unwritable_errors.load(Ordering::Relaxed),
            });
        }
        stats
    }
}

/// Applies the records of every journal; returns the next sequence number.
/// First the objects' (metadata and drops) in sequence order, which leaves each
/// key at its newest version; then the slices' in sequence order, each kept if
/// it belongs to that version. A version's number is never reused, so a slice
/// older than its object's newest metadata record (as compaction writes them)
/// still finds it, and one of an older version never does. A key's records all
/// go to its shard, so the shards are replayed apart, on several threads.
fn replay(shards: &mut [Shard], dirs: &[Dir], records: Vec<(usize, Record)>) -> u64 {
    let next_seq = records.iter().map(|(_, r)| r.seq()).max().map_or(1, |s| s + 1);
    let mut by_shard: Vec<ShardRecords> = (0..shards.len()).map(|_| ShardRecords::default()).collect();
    for (dir, r) in records {
        by_shard[shard_of(r.key())].push(dir, r);
    }
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).clamp(1, 8);
    let per_thread = shards.len().div_ceil(threads);
    // Each group in a slot its thread takes it from; a thread that cannot be
    // started leaves it to this one.
    let groups: Vec<_> = shards
        .chunks_mut(per_thread)
        .zip(by_shard.chunks_mut(per_thread))
        .map(|group| std::sync::Mutex::new(Some(group)))
        .collect();
    let run = |slot: &std::sync::Mutex<Option<(&mut [Shard], &mut [ShardRecords])>>| {
        if let Some((shards, records)) = lock(slot).take() {
            replay_shards(shards, records, dirs);
        }
    };
    std::thread::scope(|scope| {
        let handles: Vec<_> = groups[1..]
            .iter()
            .filter_map(|slot| {
                std::thread::Builder::new().name("linerate-replay".into()).spawn_scoped(scope, || run(slot)).ok()
            })
            .collect();
        for slot in &groups {
            run(slot);
        }
        for h in handles {
            h.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
        }
    });
    next_seq
}

/// Leaves the records to each shard's first use (a start with shard maps: see
/// [`shardmap`]); returns the next sequence number.
fn defer(shards: &mut [Shard], records: Vec<(usize, Record)>, sorted: Vec<(usize, Sorted)>) -> u64 {
    let in_maps = sorted.iter().map(|(_, p)| p.map.max_seq).max().unwrap_or(0);
    let next_seq = records.iter().map(|(_, r)| r.seq()).max().unwrap_or(0).max(in_maps) + 1;
    for (k, shard) in shards.iter_mut().enumerate() {
        let blocks = sorted.iter().map(|(dir, p)| (*dir, p.file.clone(), p.map.offsets[k], p.map.offsets[k + 1]));
        shard.pending = Some(Pending { blocks: blocks.collect(), records: ShardRecords::default() });
    }
    for (dir, r) in records {
        if let Some(p) = &mut shards[shard_of(r.key())].pending {
            p.records.push(dir, r);
        }
    }
    next_seq
}

/// One shard's records, split as `replay` applies them.
#[derive(Default)]
struct ShardRecords {
    objects: Vec<(usize, Record)>,
    slices: Vec<(usize, Record)>,
}

impl ShardRecords {
    fn push(&mut self, dir: usize, r: Record) {
        match r {
            Record::Object { .. } | Record::DropObject { .. } => self.objects.push((dir, r)),
            Record::Slice { .. } | Record::DropSlice { .. } => self.slices.push((dir, r)),
        }
    }
}

fn replay_shards(shards: &mut [Shard], records: &mut [ShardRecords], dirs: &[Dir]) {
    for (shard, records) in shards.iter_mut().zip(records) {
        let (mut objects, mut slices) = (std::mem::take(&mut records.objects), std::mem::take(&mut records.slices));
        objects.sort_by_key(|(_, r)| r.seq());
        slices.sort_by_key(|(_, r)| r.seq());
        replay_shard(shard, objects.into_iter().chain(slices));
        for e in shard.objects.values() {
            let bytes: u64 = e.slices.values().map(|s| s.file.len).sum();
            dirs[e.dir].account(1, e.slices.len() as i64, bytes as i64);
        }
    }
}

fn replay_shard(shard: &mut Shard, records: impl Iterator<Item = (usize, Record)>) {
    let objects = &mut shard.objects;
    for (dir, r) in records {
        match r {
            Record::Object { seq, key, gen, meta } => match objects.get_mut(&key) {
                Some(e) if e.gen == gen && e.dir == dir => {
                    e.meta = meta;
                    e.seq = seq;
                }
                // A new version (or a first record): the old one's slices
                // are left to the sweep.
                _ => {
                    objects.insert(key, Entry { meta, gen, seq, dir, slices: HashMap::new() });
                }
            },
            Record::Slice { seq, key, gen, index, file } => {
                if let Some(e) = objects.get_mut(&key).filter(|e| e.gen == gen && e.dir == dir) {
                    e.slices.insert(index, Slice { seq, file, used_ms: file.mtime_ns / 1_000_000, midway_until_ms: 0 });
                }
            }
            Record::DropSlice { key, gen, index, .. } => {
                if let Some(e) = objects.get_mut(&key).filter(|e| e.gen == gen) {
                    e.slices.remove(&index);
                }
            }
            Record::DropObject { key, .. } => {
                objects.remove(&key);
            }
        }
    }
}

fn shard_of(key: &KeyHash) -> usize {
    usize::from(u16::from_le_bytes([key[0], key[1]])) % SHARDS
}

fn remove_files(paths: &[PathBuf]) {
    for p in paths {
        let _ = std::fs::remove_file(p);
    }
}

impl Shard {
    /// Ends a `begin_slice`'s claim on `(key, index)`.
    /// One writer of slice `index` is done; returns what `note_use` said of the
    /// slice meanwhile (its `midway_until_ms`).
    fn release(&mut self, key: &KeyHash, index: u64) -> i64 {
        let Some(w) = self.writing.get_mut(&(*key, index)) else { return 0 };
        let midway = w.midway_until_ms;
        w.writers -= 1;
        if w.writers == 0 {
            self.writing.remove(&(*key, index));
        }
        midway
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        *lock(&self.shared.stop) = true;
        self.shared.wake.notify_all();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Shared {
    fn stopping(&self) -> bool {
        *lock(&self.stop)
    }

    /// Waits `d`, or until the store is dropped; says whether to go on.
    fn sleep(&self, d: Duration) -> bool {
        let stop = lock(&self.stop);
        let (stop, _) = self.wake.wait_timeout_while(stop, d, |stop| !*stop).unwrap_or_else(|p| p.into_inner());
        !*stop
    }

    fn shard(&self, key: &KeyHash) -> MutexGuard<'_, Shard> {
        self.shard_at(shard_of(key))
    }

    /// Shard `k`, its records applied (the only way to a shard: none is seen
    /// before its records are).
    fn shard_at(&self, k: usize) -> MutexGuard<'_, Shard> {
        let mut shard = lock(&self.shards[k]);
        if let Some(pending) = shard.pending.take() {
            self.load(k, &mut shard, pending);
        }
        shard
    }

    /// Applies shard `k`'s pending records: its blocks read and decoded, then
    /// all of them in sequence order, as a start without maps would.
    fn load(&self, k: usize, shard: &mut Shard, pending: Pending) {
        let mut records = pending.records;
        for (dir, file, start, end) in pending.blocks {
            let path = &self.dirs[dir].path;
            match journal::read_block(&file, start, end) {
                Ok(r) => {
                    // A record of another shard here is as damaged as a bad line.
                    let mut skipped = r.damaged;
                    for rec in r.records {
                        if shard_of(rec.key()) == k {
                            records.push(dir, rec);
                        } else {
                            skipped += 1;
                        }
                    }
                    if skipped > 0 {
                        tracing::warn!(dir = %path.display(), shard = k, "{skipped} damaged journal lines skipped");
                    }
                }
                Err(e) => {
                    tracing::error!(dir = %path.display(), shard = k, "cache journal unreadable, its objects left out: {e}");
                    self.load_failed.store(true, Ordering::Release);
                }
            }
        }
        replay_shards(std::slice::from_mut(shard), std::slice::from_mut(&mut records), &self.dirs);
    }

    /// Applies every shard's pending records.
    fn load_all(&self) {
        for k in 0..self.shards.len() {
            drop(self.shard_at(k));
        }
    }

    /// [`Shared::load_all`] on as many threads as there are cores (up to 8),
    /// each taking every n-th shard (a shard a lookup took meanwhile is skipped).
    fn load_all_on_threads(&self) {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).clamp(1, 8);
        let load = |first: usize| {
            for k in (first..self.shards.len()).step_by(threads) {
                drop(self.shard_at(k));
            }
        };
        std::thread::scope(|scope| {
            for t in 1..threads {
                // A thread that cannot be started leaves its shards to the pass below.
                let _ = std::thread::Builder::new().name("linerate-replay".into()).spawn_scoped(scope, move || load(t));
            }
            load(0);
        });
        self.load_all();
    }

    fn next_seq(&self) -> u64 {
        self.seq.fetch_add(1, Ordering::Relaxed)
    }

    /// Milliseconds since open, never 0 (the clock of unwritable marks).
    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64 + 1
    }

    /// The directory of a new object: the one its key hashes to, or the next
    /// that takes writes.
    fn choose_dir(&self, key: &KeyHash, now_ms: u64) -> usize {
        let n = self.dirs.len();
        let home = (u64::from_le_bytes(key[8..16].try_into().expect("8 bytes")) % n as u64) as usize;
        (0..n).map(|i| (home + i) % n).find(|&d| self.dirs[d].writable(now_ms)).unwrap_or(home)
    }

    /// Takes an object removed from the index off its directory's gauges, and
    /// lists its slice files.
    fn unindex(&self, key: &KeyHash, e: &Entry) -> Vec<PathBuf> {
        let d = &self.dirs[e.dir];
        let bytes: u64 = e.slices.values().map(|s| s.file.len).sum();
        d.account(-1, -(e.slices.len() as i64), -(bytes as i64));
        e.slices.keys().map(|&i| d.slice_path(key, e.gen, i)).collect()
    }

    /// Drops slice `index` of version `gen` from the index (only if its record is
    /// still `seq`, when given) and, when `remove`, its file, unless a writer is
    /// about to put a new file at that path. Returns the bytes dropped.
    fn drop_slice(&self, key: &KeyHash, gen: u64, index: u64, seq: Option<u64>, remove: bool) -> Option<u64> {
        let (dir, len, seq) = {
            let mut shard = self.shard(key);
            let writing = shard.writing.contains_key(&(*key, index));
            let e = shard.objects.get_mut(key).filter(|e| e.gen == gen)?;
            if seq.is_some_and(|seq| e.slices.get(&index).is_some_and(|s| s.seq != seq)) {
                return None;
            }
            let d = &self.dirs[e.dir];
            let old = e.slices.remove(&index);
            if let Some(old) = old {
                d.account(0, -1, -(old.file.len as i64));
            }
            // Under the lock: a commit to this path waits for it.
            if remove && !writing {
                let _ = std::fs::remove_file(d.slice_path(key, gen, index));
            }
            // Numbered under the lock: a commit of this slice that follows
            // orders after it.
            (e.dir, old.map(|o| o.file.len), self.next_seq())
        };
        let _ = self.append(dir, &Record::DropSlice { seq, key: *key, gen, index });
        len
    }

    /// Appends a record to directory `dir`'s journal, unless it is marked
    /// unwritable. A record not written is safe to lose (see [`journal`]).
    fn append(&self, dir: usize, record: &Record) -> Result<(), StoreError> {
        let d = &self.dirs[dir];
        if !d.writable(self.now_ms()) {
            return Err(d.refusal());
        }
        let mut line = Vec::with_capacity(192);
        record.encode(&mut line);
        let result = lock(&d.journal).append(&line, self.fsync);
        result.map_err(|e| d.failed(e, self.now_ms(), self.retry))
    }

    /// Ends a `begin_slice`'s claim on `(key, index)`.
    fn done_writing(&self, key: &KeyHash, index: u64) {
        self.shard(key).release(key, index);
    }
}

/// A slice being written (see [`Store::begin_slice`]). Dropped unfinished, it
/// removes its temporary file.
pub(crate) struct SliceWriter {
    shared: Arc<Shared>,
    tmp: PathBuf,
    file: Arc<File>,
    key: KeyHash,
    index: u64,
    len: u64,
    gen: u64,
    dir: usize,
    /// The end of the furthest write: what readers may send so far.
    written: AtomicU64,
    /// Renamed into place: nothing left to clean up.
    finished: bool,
}

impl SliceWriter {
    /// The temporary file, read-write: readers may `sendfile` its first
    /// [`SliceWriter::written`] bytes.
    pub(crate) fn file(&self) -> &Arc<File> {
        &self.file
    }

    /// Writes `bytes` at `offset` of the slice. Past the slice's length:
    /// `StoreError::Length`.
    pub(crate) fn write_at(&self, bytes: &[u8], offset: u64) -> Result<(), StoreError> {
        let end = offset.saturating_add(bytes.len() as u64);
        if end > self.len {
            return Err(StoreError::Length { expected: self.len, got: end });
        }
        let s = &self.shared;
        self.file.write_all_at(bytes, offset).map_err(|e| s.dirs[self.dir].failed(e, s.now_ms(), s.retry))?;
        self.written.fetch_max(end, Ordering::Release);
        Ok(())
    }

    /// The end of the furthest write so far (fills write in order, so the bytes
    /// before it are all there).
    #[cfg(test)]
    pub(crate) fn written(&self) -> u64 {
        self.written.load(Ordering::Acquire)
    }
}

impl Drop for SliceWriter {
    fn drop(&mut self) {
        if !self.finished {
            let _ = std::fs::remove_file(&self.tmp);
            self.shared.done_writing(&self.key, self.index);
        }
    }
}

#[cfg(test)]
mod tests;
