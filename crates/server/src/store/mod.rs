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
//! only its live records (compaction) once it holds more than twice as many.
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
//! `open`), ties broken by least recent use ([`Store::note_use`]). Removing a
//! file a reader has open is safe on Linux: the reader keeps its descriptor.
//!
//! # Unwritable directories
//!
//! A write that fails with `ENOSPC`, `EROFS`, `EACCES`, `EPERM`, `EDQUOT` or `EIO`
//! marks its directory unwritable for 30 s: the store then
//! answers `StoreError::Unwritable` at once (the caller passes the bytes through
//! instead), and places new objects in the other directories.

// Wired into the cache in the next step.
#![cfg_attr(not(test), allow(dead_code))]

mod journal;

use aws_lc_rs::digest::{digest, SHA256};

/// The first 16 bytes of the SHA-256 of a cache key.
pub type KeyHash = [u8; 16];

/// The hash a cache key is stored under.
pub fn key_hash(key: &[u8]) -> KeyHash {
    let d = digest(&SHA256, key);
    let mut h = [0; 16];
    h.copy_from_slice(&d.as_ref()[..16]);
    h
}

/// What the store keeps of an object besides its bytes.
#[derive(Clone, Debug, PartialEq)]
pub struct ObjectMeta {
    /// The full cache key, for the caller to compare (two keys may share a hash).
    pub key: Vec<u8>,
    /// 200, or 404/410 for a cached negative answer (no slices).
    pub status: u16,
    /// Bytes of the object (0 for negative answers).
    pub size: u64,
    pub etag: Option<Vec<u8>>,
    pub last_modified: Option<Vec<u8>>,
    pub content_type: Option<Vec<u8>>,
    /// Unix seconds.
    pub stored_at: i64,
    pub fresh_until: i64,
    pub stale_while_revalidate_until: i64,
    pub stale_if_error_until: i64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_hash_is_the_head_of_sha256() {
        // SHA-256("abc") = ba7816bf 8f01cfea 414140de 5dae2223 b00361a3 ...
        assert_eq!(journal::hex(&key_hash(b"abc")), "ba7816bf8f01cfea414140de5dae2223");
    }
}
