//! `[fill]`: the cold path (residency checks, the fill pool, read-ahead) and the
//! page-cache admission policy (see "The cold path" in ARCHITECTURE.md).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{bad, range, Bad};

/// The cold path (`[fill]`): before a body range is sent, the worker asks the
/// page cache whether it is resident; if not, the connection waits while a fill
/// thread reads it from disk, and the worker serves everyone else meanwhile.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Fill {
    /// Check residency and fill off the worker. Off: bodies are sent as they are,
    /// and a cold page blocks the worker for the disk read.
    pub enabled: bool,
    /// Fill threads per NUMA domain: how many disk reads run at once there.
    pub threads: usize,
    /// The unit of a fill, aligned in the file: requests for the same window share
    /// one disk read.
    pub window_bytes: u64,
    /// How long a connection waits for a fill before it is closed.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    /// Fills queued per disk at most; past it a demand fill fails (the connection
    /// closes) and read-ahead is skipped.
    pub queue_per_disk: usize,
    /// Windows read ahead past the end of a range that needed a fill, so a viewer
    /// reading a title in order finds its next segment resident.
    pub readahead_windows: u64,
    /// Popularity-aware page-cache admission (`server::pagecache::admission::Admission`): only the
    /// most-demanded files that fit in `cache_bytes` stay cached; a range of any
    /// other file is dropped from the page cache once it is sent.
    pub admission: bool,
    /// The page cache the kept files may fill; 0 = auto: the memory limit of the
    /// server's own memory cgroup (or the machine's memory when none is set) times
    /// `server::pagecache::admission::CACHE_HEADROOM`.
    pub cache_bytes: u64,
    /// Half-life of the demand estimate that ranks the files.
    #[serde(with = "humantime_serde")]
    pub admission_half_life: Duration,
}

impl Default for Fill {
    fn default() -> Self {
        Fill {
            enabled: true,
            threads: 4,
            window_bytes: 2 * 1024 * 1024,
            timeout: Duration::from_secs(10),
            queue_per_disk: 256,
            readahead_windows: 1,
            admission: true,
            cache_bytes: 0,
            admission_half_life: Duration::from_secs(60),
        }
    }
}

impl Fill {
    pub(super) fn validate(&self) -> Result<(), Bad> {
        range("fill.threads", self.threads, 1, 256)?;
        range("fill.window_bytes", self.window_bytes, 64 * 1024, 64 * 1024 * 1024)?;
        if self.window_bytes % linerate_sys::pagecache::PAGE_BYTES != 0 {
            return bad("fill.window_bytes", "must be a multiple of 4096 (the page size)");
        }
        if self.timeout < Duration::from_millis(100) || self.timeout > Duration::from_secs(3600) {
            return bad("fill.timeout", "must be between 100ms and 1h");
        }
        range("fill.queue_per_disk", self.queue_per_disk, 1, 1 << 20)?;
        range("fill.readahead_windows", self.readahead_windows, 0, 64)?;
        if self.cache_bytes != 0 && self.cache_bytes < self.window_bytes {
            return bad("fill.cache_bytes", "must be 0 (auto) or at least fill.window_bytes");
        }
        if self.admission_half_life < Duration::from_secs(1) || self.admission_half_life > Duration::from_secs(86400) {
            return bad("fill.admission_half_life", "must be between 1s and 24h");
        }
        Ok(())
    }
}
