//! `[open_file_cache]`: the files each worker keeps open (`server::files`).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{range, Bad};

/// Most open files a worker's cache may keep: it allocates room for all of them.
pub const MAX_OPEN_FILE_CACHE_ENTRIES: usize = 1 << 20;

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct OpenFileCache {
    /// Open files kept per worker (0 disables the cache).
    pub entries: usize,
    /// How long a cached file is trusted without checking its path again.
    #[serde(with = "humantime_serde")]
    pub valid: Duration,
}

impl Default for OpenFileCache {
    fn default() -> Self {
        OpenFileCache { entries: 1024, valid: Duration::ZERO }
    }
}

impl OpenFileCache {
    pub(super) fn validate(&self) -> Result<(), Bad> {
        range("open_file_cache.entries", self.entries, 0, MAX_OPEN_FILE_CACHE_ENTRIES)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Config, DEFAULT_LISTEN};

    /// Each worker's open-file cache allocates room for `entries` files at start:
    /// an unbounded value made that allocation fail (or `entries × workers` overflow).
    #[test]
    fn open_file_cache_entries_is_bounded() {
        let dir = std::env::temp_dir();
        let c = |entries: usize| Config {
            root: Some(dir.clone()),
            listen: vec![DEFAULT_LISTEN.parse().unwrap()],
            open_file_cache: OpenFileCache { entries, ..OpenFileCache::default() },
            ..Config::default()
        };
        assert!(c(MAX_OPEN_FILE_CACHE_ENTRIES).validate().is_ok());
        assert_eq!(c(MAX_OPEN_FILE_CACHE_ENTRIES + 1).validate().unwrap_err().0, "open_file_cache.entries");
        assert_eq!(c(usize::MAX).validate().unwrap_err().0, "open_file_cache.entries");
    }
}
