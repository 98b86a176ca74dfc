//! "Is this range in the page cache?", asked before a worker sends it.
//!
//! The answer decides whether a body range goes to `sendfile`/`preadv` at once or
//! waits for a fill (see [`super::pool`]). It must never block and must be cheap:
//! it runs once per response on the hot path.
//!
//! Two ways, chosen per call (measurements in docs/performance/cold-catalogue.md):
//! 1. `cachestat(2)` (Linux 6.5+): one syscall for the whole range, exact. Refused
//!    (`EPERM`, Linux 6.14+) on files the server neither owns nor may write, unless
//!    it has `CAP_FOWNER`.
//! 2. Otherwise a one-byte `preadv2(RWF_NOWAIT)` at every [`SAMPLE_STRIDE_BYTES`]
//!    of the range (and its last byte): never refused, never wrong about a page it
//!    reads, but it can miss a hole between two samples; such a hole costs a short
//!    blocking read inside `sendfile`, nothing worse.
//!
//! `mincore` is not used: on files the process does not own or may not write, the
//! kernel reports every page resident, which would silently defeat the check.
//! Once `cachestat` answers `ENOSYS` the process stops trying it; `EPERM` is per
//! file, so it is retried, and reported once.

use std::cell::RefCell;
use std::collections::HashMap;
use std::fs::File;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use linerate_sys::pagecache;

/// Distance between two sampled bytes when `cachestat` cannot be used. The
/// kernel reads ahead in 128 KiB steps by default and evicts in LRU order, so
/// holes smaller than this are rare.
pub(crate) const SAMPLE_STRIDE_BYTES: u64 = 128 * 1024;

static NO_CACHESTAT: AtomicBool = AtomicBool::new(false);
static REFUSED_LOGGED: AtomicBool = AtomicBool::new(false);

/// Whether all of `len` bytes of `file` at `offset` are in the page cache. The
/// range must lie within the file as it was planned; `len` 0 is resident.
pub(crate) fn is_resident(file: &File, offset: u64, len: u64) -> bool {
    if len == 0 {
        return true;
    }
    let fd = file.as_fd();
    if !NO_CACHESTAT.load(Ordering::Relaxed) {
        match pagecache::cached_pages(fd, offset, len) {
            Ok(n) => return n >= pagecache::pages_spanned(offset, len),
            Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => {
                tracing::info!(
                    "page-cache residency: no cachestat(2) (Linux < 6.5); sampling with preadv2(RWF_NOWAIT)"
                );
                NO_CACHESTAT.store(true, Ordering::Relaxed);
            }
            Err(e) => {
                if !REFUSED_LOGGED.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        "page-cache residency: cachestat(2) refused ({e}); the server needs to own the content \
                         files or have CAP_FOWNER for an exact check; sampling with preadv2(RWF_NOWAIT) instead"
                    );
                }
            }
        }
    }
    sampled(file, offset, len)
}

/// How long a window found resident is trusted without asking again.
///
/// The check is not free: `cachestat` walks the range's folios (measured 4 to
/// 23 µs per 2 MiB range here, depending on folio sizes) and the probes cost a
/// syscall each, against 200-450 µs of server CPU to send 2 MiB. A popular window
/// is asked for by many viewers a second; asking the kernel once a second per
/// worker keeps the check's cost near zero where it would matter most, and a
/// window that popular is the last the kernel evicts.
pub(crate) const TRUST_RESIDENT: Duration = Duration::from_secs(1);

/// Per open file and worker: when each window was last found resident, and
/// which windows this worker had read ahead.
#[derive(Default)]
pub(crate) struct Memo {
    checked: RefCell<HashMap<u64, Instant>>,
    ahead: RefCell<std::collections::HashSet<u64>>,
}

impl Memo {
    /// Whether every window overlapping `len` bytes at `offset` was found resident
    /// within [`TRUST_RESIDENT`] of `now`, and after `dropped_at` when the server
    /// dropped it since (a check from before a drop says nothing).
    pub(crate) fn covers(
        &self,
        offset: u64,
        len: u64,
        window_bytes: u64,
        now: Instant,
        dropped_at: Option<Instant>,
    ) -> bool {
        let checked = self.checked.borrow();
        !checked.is_empty()
            && windows(offset, len, window_bytes).all(|w| {
                checked
                    .get(&w)
                    .is_some_and(|&t| now.duration_since(t) < TRUST_RESIDENT && dropped_at.is_none_or(|d| t > d))
            })
    }

    /// Notes that `window` is being read ahead for a viewer of this file.
    pub(crate) fn note_ahead(&self, window: u64) {
        self.ahead.borrow_mut().insert(window);
    }

    /// Whether any window overlapping the range had been read ahead (and forgets
    /// them): a viewer is reading on, so the read-ahead should go on too.
    pub(crate) fn take_ahead(&self, offset: u64, len: u64, window_bytes: u64) -> bool {
        let mut ahead = self.ahead.borrow_mut();
        if ahead.is_empty() {
            return false;
        }
        let mut any = false;
        for w in windows(offset, len, window_bytes) {
            any |= ahead.remove(&w);
        }
        any
    }

    /// Forgets that the windows overlapping the range were found resident (their
    /// pages were dropped).
    pub(crate) fn forget(&self, offset: u64, len: u64, window_bytes: u64) {
        let mut checked = self.checked.borrow_mut();
        for w in windows(offset, len, window_bytes) {
            checked.remove(&w);
        }
    }

    /// Records that `len` bytes at `offset` were found resident at `now`.
    pub(crate) fn mark(&self, offset: u64, len: u64, window_bytes: u64, now: Instant) {
        let mut checked = self.checked.borrow_mut();
        for w in windows(offset, len, window_bytes) {
            checked.insert(w, now);
        }
    }
}

fn windows(offset: u64, len: u64, window_bytes: u64) -> std::ops::RangeInclusive<u64> {
    offset / window_bytes..=(offset + len.max(1) - 1) / window_bytes
}

fn sampled(file: &File, offset: u64, len: u64) -> bool {
    let end = offset + len;
    let mut at = offset;
    while at < end {
        match pagecache::probe_nowait(file.as_fd(), at) {
            Ok(true) => {}
            Ok(false) => return false,
            // A read error will show again when the range is sent or filled.
            Err(_) => return true,
        }
        at = (at / SAMPLE_STRIDE_BYTES + 1) * SAMPLE_STRIDE_BYTES;
    }
    matches!(pagecache::probe_nowait(file.as_fd(), end - 1), Ok(true) | Err(_))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn memo_remembers_read_ahead_once() {
        let m = Memo::default();
        assert!(!m.take_ahead(0, 100, 1000));
        m.note_ahead(2);
        assert!(!m.take_ahead(0, 1000, 1000));
        assert!(m.take_ahead(1500, 1000, 1000), "the range reaches window 2");
        assert!(!m.take_ahead(2000, 1000, 1000), "taken once");
    }

    #[test]
    fn memo_trusts_each_window_for_a_while() {
        let m = Memo::default();
        let t = Instant::now();
        let w = 1000;
        assert!(!m.covers(0, 10, w, t, None));
        m.mark(500, 1000, w, t); // windows 0 and 1
        assert!(m.covers(0, 2000, w, t + Duration::from_millis(500), None));
        assert!(!m.covers(0, 2001, w, t, None), "window 2 was never checked");
        assert!(!m.covers(1500, 10, w, t + TRUST_RESIDENT, None), "trust expires");
        m.mark(2000, 1, w, t + TRUST_RESIDENT);
        assert!(m.covers(2999, 1, w, t + TRUST_RESIDENT, None));
        let later = t + TRUST_RESIDENT + Duration::from_millis(1);
        assert!(!m.covers(2999, 1, w, later, Some(later)), "dropped (on any worker) after the check");
        assert!(m.covers(2999, 1, w, later, Some(t)), "dropped before the check");
        m.forget(2500, 10, w);
        assert!(!m.covers(2999, 1, w, t + TRUST_RESIDENT, None), "dropped windows are checked again");
    }

    #[test]
    fn written_file_is_resident_and_evicted_one_is_not() {
        let dir = tempfile::tempdir_in(std::env::current_dir().unwrap()).unwrap();
        let path = dir.path().join("f");
        let mut f = File::create(&path).unwrap();
        f.write_all(&vec![1u8; 1 << 20]).unwrap();
        f.sync_all().unwrap();
        let file = File::open(&path).unwrap();
        assert!(is_resident(&file, 0, 1 << 20));
        assert!(sampled(&file, 100, 900_000));
        pagecache::fadvise(file.as_fd(), 512 * 1024, 0, pagecache::Advice::DontNeed).unwrap();
        if pagecache::cached_pages(file.as_fd(), 0, 1 << 20).is_ok_and(|n| n == 128) {
            // Evicted the second half: the first is still resident, the whole is not.
            assert!(is_resident(&file, 0, 512 * 1024));
            assert!(!is_resident(&file, 0, 1 << 20));
            assert!(!is_resident(&file, 600_000, 10));
        }
    }
}
