//! [`ColdPath`]: one worker's page-cache path, the real [`PageCache`].
//!
//! A range goes window by window, and the kernel is never handed more of the file
//! than was found resident just before: a slow viewer's send of a long range can
//! last seconds, and pages can leave the cache meanwhile (dropped by the
//! admission policy for another viewer, reclaimed by the kernel). Each window is
//! registered as being sent ([`super::senders`]), checked, filled if missing, then
//! sent; a window of a file outside the kept set is dropped once its last sender
//! is done.

use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

use super::admission::{self, Tally};
use super::senders::{PendingDrop, DROP_DELAY};
use super::{residency, FilePages, FillPool, PageCache, Progress, RangeError};
use crate::counters::WorkerCounters;
use crate::transport::Transport;

/// The fill pool as one worker uses it, with the worker's share of the admission
/// policy's demand counts.
pub(crate) struct ColdPath {
    pool: Arc<FillPool>,
    /// This worker's demand counts, merged into the shared estimate once a second.
    tally: Tally,
    counters: Arc<WorkerCounters>,
}

impl ColdPath {
    pub(crate) fn new(pool: Arc<FillPool>, counters: Arc<WorkerCounters>) -> ColdPath {
        ColdPath { pool, tally: Tally::default(), counters }
    }

    /// Whether `n` bytes at `at` can be handed to the kernel: found resident within
    /// the memo's trust (and after the window's last drop, `dropped_at`), or now.
    fn ready<F: FilePages>(&self, file: &F, at: u64, n: u64, dropped_at: Option<Instant>) -> bool {
        let (pool, memo, window) = (&self.pool, file.memo(), self.pool.window_bytes());
        let now = Instant::now();
        if memo.covers(at, n, window, now, dropped_at) {
            return true;
        }
        // A window being filled may sit in the page cache locked until the disk
        // answers, and `cachestat` counts it as cached: not yet.
        if pool.is_filling(file.id(), at, n) {
            return false;
        }
        let resident = residency::is_resident(file.file(), at, n);
        if resident {
            memo.mark(at, n, window, now);
        }
        resident
    }
}

impl PageCache for ColdPath {
    async fn send_range<T: Transport, F: FilePages + 'static>(
        &self,
        io: &mut T,
        file: &Rc<F>,
        offset: u64,
        len: u64,
        read_on: bool,
        progress: &mut Progress,
    ) -> Result<(), RangeError> {
        let (pool, counters) = (&self.pool, &self.counters);
        let (window, size, id) = (pool.window_bytes(), file.size_bytes(), file.id());
        let admitted = pool
            .admission
            .as_ref()
            .is_none_or(|a| a.note(&self.tally, id, size, admission::demand_bytes(offset, size), Instant::now()));
        let end = offset + len;
        let mut at = offset;
        // Whether the viewer reached a window read ahead for it, or waited for one:
        // either way it is reading on, and its next windows should be coming.
        let mut reading_on = false;
        while at < end {
            let upto = ((at / window + 1) * window).min(end);
            // Registered before the check, so that no drop comes between the
            // check and the send.
            let sender = pool.begin_send(id, at / window);
            reading_on |= file.memo().take_ahead(at, upto - at, window);
            if self.ready(&**file, at, upto - at, sender.as_ref().and_then(|s| s.dropped_at())) {
                counters.cold.resident_bytes.add(upto - at);
            } else {
                reading_on = true;
                if upto < end {
                    pool.read_ahead(counters.domain, file.file(), id, upto, size);
                }
                let started = Instant::now();
                let filled = pool.fill(counters.domain, file.file(), id, at, size).await;
                counters.cold.fill_wait_seconds.observe(started.elapsed().as_secs_f64());
                filled?;
                counters.cold.filled_bytes.add(upto - at);
                progress.filled = true;
            }
            progress.mark_first_byte();
            io.send_file(file.file(), at, upto - at).await?;
            if let Some(pending) = sender.and_then(|s| s.finish((at, upto), admitted, Instant::now())) {
                drop_later(pool.clone(), file.clone(), pending);
            }
            at = upto;
        }
        // Read ahead for a viewer going on: the windows after the one holding the
        // byte before `end` (a fill reads whole windows, so the rest of that one is
        // in), noted on the file so that reaching them continues the read-ahead.
        if read_on && reading_on {
            let next = end.div_ceil(window) * window;
            for k in 0..pool.readahead_windows() {
                let at = next + k * window;
                if pool.read_ahead(counters.domain, file.file(), id, at, size) {
                    file.memo().note_ahead(at / window);
                }
            }
        }
        Ok(())
    }
}

/// Drops a window that its last sender has just finished [`DROP_DELAY`] later,
/// unless someone began sending it meanwhile, and forgets that this worker found
/// it resident.
fn drop_later<F: FilePages + 'static>(pool: Arc<FillPool>, file: Rc<F>, pending: PendingDrop) {
    tokio::task::spawn_local(async move {
        tokio::time::sleep(DROP_DELAY).await;
        if pool.drop_idle(file.file(), pending, file.size_bytes()) > 0 {
            let w = pool.window_bytes();
            file.memo().forget(pending.window.index * w, w, w);
        }
    });
}
