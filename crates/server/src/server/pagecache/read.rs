//! Reading one window into the page cache, on a fill thread.
//!
//! A fill reads its window with `pread` into a per-thread scratch buffer (after a
//! `POSIX_FADV_WILLNEED` that submits the whole window at once): the copy costs
//! far less than the disk read, and unlike `readahead(2)` the call returns only
//! once the pages are really there.

use std::os::fd::AsFd;
use std::os::unix::fs::FileExt;

use linerate_sys::pagecache::{self, Advice};

use super::pool::FillError;
use super::queue::Job;

/// How many times a fill reads its window again when, once read, it is not all in
/// the page cache: its first pages can be reclaimed while its last are still being
/// read (memory pressure, a proactive pageout), and the worker sending it would
/// then read them back from the disk itself.
const REREADS: usize = 2;

/// Brings one window into the page cache and returns once it is there.
pub(super) fn read_window(job: &Job, scratch: &mut [u8]) -> Result<(), FillError> {
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
pub(super) fn whole_pages(offset: u64, len: u64, file_len: u64) -> Option<(u64, u64)> {
    let page = pagecache::PAGE_BYTES;
    let start = offset.div_ceil(page) * page;
    let end = offset + len;
    let end = if end >= file_len { file_len.div_ceil(page) * page } else { end / page * page };
    (end > start).then(|| (start, end - start))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drops_whole_pages_only() {
        let p = pagecache::PAGE_BYTES;
        assert_eq!(whole_pages(0, 10 * p, 100 * p), Some((0, 10 * p)));
        assert_eq!(whole_pages(1, 10 * p, 100 * p), Some((p, 9 * p)), "partial pages at both ends stay");
        assert_eq!(whole_pages(10, 100, 100 * p), None);
        assert_eq!(whole_pages(p, 2 * p + 7, 3 * p + 7), Some((p, 3 * p)), "the file's last page counts as whole");
        assert_eq!(whole_pages(0, 0, p), None);
    }
}
