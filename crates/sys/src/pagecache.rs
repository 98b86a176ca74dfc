//! Asking the page cache what it holds, without waiting for a disk.
//!
//! A worker must never call `sendfile` or `preadv` on pages that are not in the
//! page cache: the call would block the whole worker for a disk read. These
//! wrappers answer "is this range resident?" without blocking:
//!
//! - [`cached_pages`]: `cachestat(2)` (Linux 6.5+), one call per range, exact. Since
//!   Linux 6.14 (and stable backports) it is refused with `EPERM` on a file the
//!   process neither owns, may write, nor has `CAP_FOWNER` over (the page-cache
//!   side-channel fix).
//! - [`probe_nowait`]: `preadv2(RWF_NOWAIT)` of one byte (Linux 4.14+), which
//!   returns `EAGAIN` instead of reading from disk. Never refused; callers sample a
//!   range with it when `cachestat` is missing or refused.
//!
//! `mincore` on a mapping is deliberately not offered: for a file the process does
//! not own or may not write, the kernel reports every page as resident
//! (`can_do_mincore`), so it can silently say "resident" when it is not.

use std::io;
use std::num::NonZeroU64;
use std::os::fd::{AsRawFd, BorrowedFd};

use rustix::io::{Errno, ReadWriteFlags};

use super::{cvt_long, file_offset};

pub const PAGE_BYTES: u64 = 4096;

/// `cachestat(2)`'s syscall number: the same on every architecture (Linux 6.5).
const SYS_CACHESTAT: libc::c_long = 451;

#[repr(C)]
struct CachestatRange {
    off: u64,
    len: u64,
}

#[repr(C)]
#[derive(Default)]
struct Cachestat {
    nr_cache: u64,
    nr_dirty: u64,
    nr_writeback: u64,
    nr_evicted: u64,
    nr_recently_evicted: u64,
}

/// How many of the pages covering `len` bytes of `file` at `offset` are in the
/// page cache (`cachestat`). `len` must be at least 1; the range should end at or
/// before the end of the file (pages past it are never cached).
///
/// Errors: `ENOSYS` before Linux 6.5, `EPERM` where the kernel restricts it (see
/// the module docs).
pub fn cached_pages(file: BorrowedFd<'_>, offset: u64, len: u64) -> io::Result<u64> {
    let range = CachestatRange { off: offset, len: len.max(1) };
    let mut out = Cachestat::default();
    // SAFETY: `range` and `out` are live locals, laid out as the kernel's UAPI
    // `struct cachestat_range` and `struct cachestat` (`repr(C)`, all u64 fields, no
    // padding), for the whole call; the kernel only reads the first and only writes
    // within the second, whose size it knows from the syscall's version. Flags must be
    // 0. The descriptor is borrowed, so it stays open. (Neither libc nor rustix wraps
    // cachestat.)
    let ret = unsafe {
        libc::syscall(
            SYS_CACHESTAT,
            file.as_raw_fd(),
            &range as *const CachestatRange,
            &mut out as *mut Cachestat,
            0 as libc::c_uint,
        )
    };
    cvt_long(ret)?;
    Ok(out.nr_cache)
}

/// The number of pages covering `len` bytes at `offset`.
pub fn pages_spanned(offset: u64, len: u64) -> u64 {
    if len == 0 {
        return 0;
    }
    (offset + len).div_ceil(PAGE_BYTES) - offset / PAGE_BYTES
}

/// Whether the page holding byte `offset` of `file` is in the page cache: reads
/// that one byte with `preadv2(RWF_NOWAIT)`. `Ok(false)` when the kernel would have
/// to wait for the disk. On a miss the kernel starts reading the page without
/// waiting for it (read-ahead in the caller's context), so a fast disk may make a
/// second probe succeed. A byte past the end of the file reads nothing and counts
/// as resident (there is nothing to wait for; the sender notices the truncation).
pub fn probe_nowait(file: BorrowedFd<'_>, offset: u64) -> io::Result<bool> {
    let offset = file_offset(offset)?;
    let mut byte = [0u8; 1];
    match rustix::io::preadv2(file, &mut [io::IoSliceMut::new(&mut byte)], offset, ReadWriteFlags::NOWAIT) {
        Ok(_) => Ok(true),
        Err(Errno::AGAIN) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Advice for [`fadvise`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Advice {
    /// Start reading the range into the page cache (asynchronously).
    WillNeed,
    /// Drop the range's clean pages from the page cache.
    DontNeed,
    /// Reads through this open file read exactly what they ask for: no kernel
    /// read-ahead, synchronous or asynchronous (the whole file; flag of the open
    /// file description, so shared by `dup`s of it).
    Random,
}

/// `posix_fadvise` on `len` bytes at `offset` (`len` 0: to the end of the file).
pub fn fadvise(file: BorrowedFd<'_>, offset: u64, len: u64, advice: Advice) -> io::Result<()> {
    let advice = match advice {
        Advice::WillNeed => rustix::fs::Advice::WillNeed,
        Advice::DontNeed => rustix::fs::Advice::DontNeed,
        Advice::Random => rustix::fs::Advice::Random,
    };
    let offset = file_offset(offset)?;
    if len > i64::MAX as u64 {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "length beyond off64_t"));
    }
    Ok(rustix::fs::fadvise(file, offset, NonZeroU64::new(len), advice)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsFd;

    #[test]
    fn pages_spanned_counts_partial_pages() {
        assert_eq!(pages_spanned(0, 0), 0);
        assert_eq!(pages_spanned(0, 1), 1);
        assert_eq!(pages_spanned(4095, 2), 2);
        assert_eq!(pages_spanned(4096, 4096), 1);
        assert_eq!(pages_spanned(100, 8192), 3);
    }

    #[test]
    fn a_file_just_written_is_resident_and_eviction_is_seen() {
        let dir = std::env::temp_dir().join(format!("linerate-pagecache-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("f");
        let mut f = std::fs::File::create(&path).unwrap();
        f.write_all(&vec![7u8; 64 * 1024]).unwrap();
        f.sync_all().unwrap();
        let file = std::fs::File::open(&path).unwrap();
        assert!(probe_nowait(file.as_fd(), 0).unwrap());
        assert!(probe_nowait(file.as_fd(), 1 << 30).unwrap(), "past the end counts as resident");
        match cached_pages(file.as_fd(), 0, 64 * 1024) {
            Ok(n) => assert_eq!(n, 16),
            Err(e) => assert!(matches!(e.raw_os_error(), Some(libc::ENOSYS | libc::EPERM)), "{e}"),
        }
        // Written back (sync_all), so DONTNEED can drop the pages. (No check of
        // probe_nowait here: on a miss it starts the read itself, and a fast disk
        // may answer before it looks again.)
        fadvise(file.as_fd(), 0, 0, Advice::DontNeed).unwrap();
        if let Ok(n) = cached_pages(file.as_fd(), 0, 64 * 1024) {
            assert_eq!(n, 0, "pages still cached after POSIX_FADV_DONTNEED");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
