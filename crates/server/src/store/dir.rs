//! One cache directory: its paths, journal, gauges and counters, and whether it
//! takes writes.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicI64, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use super::journal::{hex, Journal};
use super::{KeyHash, StoreError};
use crate::config::CacheDir;

pub(super) struct Dir {
    pub path: PathBuf,
    pub max_size_bytes: u64,
    pub min_free_bytes: u64,
    pub journal: Mutex<Journal>,
    /// Whether its journal was read at open. The sweep leaves a directory whose
    /// journal could not be read alone: every file there would look unknown.
    pub replayed: bool,
    /// What the index holds in it, changed under the shard locks.
    pub objects: AtomicI64,
    pub slices: AtomicI64,
    pub bytes: AtomicI64,
    /// Free bytes of its file system, as last measured (at open, then by the evictor).
    pub free_bytes: AtomicU64,
    /// Milliseconds past the store's epoch until which writes are refused (0: none
    /// failed yet).
    unwritable_until_ms: AtomicU64,
    /// The errno of the last failed write, for the errors answered meanwhile.
    last_errno: AtomicI32,
    logged: AtomicBool,
    pub evictions: AtomicU64,
    pub evicted_bytes: AtomicU64,
    pub damaged_slices: AtomicU64,
    logged_damage: AtomicBool,
    /// Writes that failed with an error that marks the directory unwritable.
    pub unwritable_errors: AtomicU64,
}

/// Whether a failed write says the directory takes no more writes for now (full,
/// read-only, refused, or a failing disk), rather than something about one file.
pub(super) fn unwritable_kind(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOSPC | libc::EROFS | libc::EACCES | libc::EPERM | libc::EDQUOT | libc::EIO))
}

impl Dir {
    pub(super) fn new(config: &CacheDir, journal: Journal, replayed: bool) -> Dir {
        Dir {
            path: config.path.clone(),
            max_size_bytes: config.max_size_bytes,
            min_free_bytes: config.min_free_bytes,
            journal: Mutex::new(journal),
            replayed,
            objects: AtomicI64::new(0),
            slices: AtomicI64::new(0),
            bytes: AtomicI64::new(0),
            free_bytes: AtomicU64::new(u64::MAX),
            unwritable_until_ms: AtomicU64::new(0),
            last_errno: AtomicI32::new(0),
            logged: AtomicBool::new(false),
            evictions: AtomicU64::new(0),
            evicted_bytes: AtomicU64::new(0),
            damaged_slices: AtomicU64::new(0),
            logged_damage: AtomicBool::new(false),
            unwritable_errors: AtomicU64::new(0),
        }
    }

    pub(super) fn tmp(&self) -> PathBuf {
        self.path.join("tmp")
    }

    pub(super) fn slices(&self) -> PathBuf {
        self.path.join("slices")
    }

    pub(super) fn journal_path(path: &Path) -> PathBuf {
        path.join("index.journal")
    }

    /// `slices/<k2>/<key>.<gen>.<index>`: 256 subdirectories keep each small.
    pub(super) fn slice_path(&self, key: &KeyHash, gen: u64, index: u64) -> PathBuf {
        let k = hex(key);
        let mut p = self.slices();
        p.push(&k[..2]);
        p.push(format!("{k}.{gen}.{index}"));
        p
    }

    /// Adds to what the index holds here.
    pub(super) fn account(&self, objects: i64, slices: i64, bytes: i64) {
        self.objects.fetch_add(objects, Ordering::Relaxed);
        self.slices.fetch_add(slices, Ordering::Relaxed);
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    pub(super) fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed).max(0) as u64
    }

    /// Records in the index that its journal must keep.
    pub(super) fn live_records(&self) -> u64 {
        (self.objects.load(Ordering::Relaxed) + self.slices.load(Ordering::Relaxed)).max(0) as u64
    }

    pub(super) fn writable(&self, now_ms: u64) -> bool {
        now_ms >= self.unwritable_until_ms.load(Ordering::Relaxed)
    }

    /// The error answered while the directory is marked unwritable.
    pub(super) fn refusal(&self) -> StoreError {
        let errno = self.last_errno.load(Ordering::Relaxed);
        StoreError::Unwritable { dir: self.path.clone(), source: io::Error::from_raw_os_error(errno) }
    }

    /// Counts a slice dropped because its file was missing or another; logged
    /// once per directory (a disk replaced or wiped would log every slice).
    pub(super) fn damaged(&self, path: &Path, why: &str) {
        let n = self.damaged_slices.fetch_add(1, Ordering::Relaxed) + 1;
        if !self.logged_damage.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                path = %path.display(),
                "cached slice dropped: its file is missing or not the one recorded ({why}); later ones are counted, not logged"
            );
        } else {
            tracing::debug!(path = %path.display(), "cached slice dropped ({why}), {n} in this directory");
        }
    }

    /// Turns a failed write into the store's error, marking the directory
    /// unwritable until `now_ms + retry` when the error says so.
    pub(super) fn failed(&self, e: io::Error, now_ms: u64, retry: Duration) -> StoreError {
        if !unwritable_kind(&e) {
            return StoreError::Io(e);
        }
        self.unwritable_errors.fetch_add(1, Ordering::Relaxed);
        self.last_errno.store(e.raw_os_error().unwrap_or(libc::EIO), Ordering::Relaxed);
        self.unwritable_until_ms.store(now_ms + retry.as_millis() as u64, Ordering::Relaxed);
        if !self.logged.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                dir = %self.path.display(),
                "cache directory not writable ({e}): fills for it pass through, tried again every {}",
                humantime::format_duration(retry)
            );
        } else {
            tracing::debug!(dir = %self.path.display(), "cache directory not writable again: {e}");
        }
        StoreError::Unwritable { dir: self.path.clone(), source: e }
    }
}
