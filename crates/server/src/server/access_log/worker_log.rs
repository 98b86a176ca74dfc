//! A worker's side of the access log: which responses are logged (sampling), when
//! (the wall-clock time of a monotonic instant, with one clock read a second), and
//! the buffer records are formatted into, handed to the writer as one batch when it
//! is full or a second old. Nothing here waits for the writer.

use std::cell::{Cell, RefCell};
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use super::writer::AccessLog;
use super::{Format, Record};

/// A batch is handed to the writer once it holds this many bytes (a few thousand
/// records: each hand-over wakes the writer thread, so the writer's cost is mostly
/// per batch, not per record)...
const BATCH_BYTES: usize = 256 * 1024;
/// ...or once its oldest record has waited this long.
const BATCH_AGE: Duration = Duration::from_secs(1);
/// Room left in a fresh buffer past `BATCH_BYTES`, so the record that fills it
/// rarely makes it grow.
const MAX_RECORD_GUESS: usize = 4096;
/// Written batches' buffers a worker keeps to fill again, so that a batch costs no
/// allocation (a buffer of `BATCH_BYTES` is past malloc's mmap threshold). One is
/// enough while the writer keeps up: the worker fills one buffer while the writer
/// writes the other.
const SPARE_BUFFERS: usize = 1;
/// How often a worker reads the wall clock afresh to date its records (between
/// readings, a record's time is that reading moved by the monotonic clock).
const WALL_CLOCK_EVERY: Duration = Duration::from_secs(1);

/// A batch of formatted records, handed from a worker to the writer.
pub(super) struct Batch {
    pub(super) bytes: Vec<u8>,
    pub(super) records: u64,
    /// Where the buffer goes once written: its worker's spare buffers.
    back: SyncSender<Vec<u8>>,
}

impl Batch {
    /// Gives the emptied buffer back to the worker that filled it, unless that
    /// worker has a spare already (or is gone): then it is freed.
    pub(super) fn give_back(mut self) {
        self.bytes.clear();
        let _ = self.back.try_send(self.bytes);
    }
}

/// A worker's buffer of formatted records.
pub(crate) struct WorkerLog {
    log: Arc<AccessLog>,
    /// Emptied buffers of this worker's written batches, given back by the writer
    /// (a channel only this worker receives from: no lock is shared).
    spare: Receiver<Vec<u8>>,
    give_back: SyncSender<Vec<u8>>,
    seen: Cell<u64>,
    buf: RefCell<Vec<u8>>,
    records: Cell<u64>,
    oldest: Cell<Option<Instant>>,
    /// A reading of both clocks, taken together: records are dated from it.
    clocks: Cell<Option<(Instant, SystemTime)>>,
}

impl WorkerLog {
    pub(crate) fn new(log: Arc<AccessLog>) -> WorkerLog {
        let (give_back, spare) = mpsc::sync_channel(SPARE_BUFFERS);
        WorkerLog {
            log,
            spare,
            give_back,
            seen: Cell::new(0),
            buf: RefCell::new(Vec::new()),
            records: Cell::new(0),
            oldest: Cell::new(None),
            clocks: Cell::new(None),
        }
    }

    /// Whether this response is to be logged: one in `sample`, counted per worker.
    pub(crate) fn wants_next(&self, sample: u64) -> bool {
        let n = self.seen.get();
        self.seen.set(n.wrapping_add(1));
        n % sample.max(1) == 0
    }

    /// The wall-clock time of the monotonic instant `at` (`now` being the present):
    /// a reading of the wall clock at most `WALL_CLOCK_EVERY` old, moved by the
    /// monotonic clock. Saves a clock read per record; the two clocks run at the same
    /// rate (NTP slews both), so the time is the one `SystemTime::now()` would have
    /// given at `at`, to well under a millisecond, except in the second after the
    /// wall clock is stepped, when records keep the old time base until the next
    /// reading.
    pub(crate) fn wall_time(&self, at: Instant, now: Instant) -> SystemTime {
        let (base, wall) = match self.clocks.get() {
            Some((base, wall)) if now.saturating_duration_since(base) < WALL_CLOCK_EVERY => (base, wall),
            _ => {
                let fresh = (Instant::now(), SystemTime::now());
                self.clocks.set(Some(fresh));
                fresh
            }
        };
        let moved = match at.checked_duration_since(base) {
            Some(after) => wall.checked_add(after),
            None => wall.checked_sub(base.duration_since(at)),
        };
        moved.unwrap_or(wall)
    }

    pub(crate) fn write(&self, rec: &Record<'_>, format: Format, now: Instant) {
        {
            let mut buf = self.buf.borrow_mut();
            if buf.capacity() == 0 {
                // A written batch's buffer, when there is one.
                *buf = self.spare.try_recv().unwrap_or_else(|_| Vec::with_capacity(BATCH_BYTES + MAX_RECORD_GUESS));
            }
            match format {
                Format::Json => rec.write_json(&mut buf),
                Format::Combined => rec.write_combined(&mut buf),
            }
        }
        self.records.set(self.records.get() + 1);
        let oldest = *self.oldest.get().get_or_insert(now);
        self.oldest.set(Some(oldest));
        if self.buf.borrow().len() >= BATCH_BYTES || now.duration_since(oldest) >= BATCH_AGE {
            self.flush();
        }
    }

    /// Hands the buffered records to the writer (also called every second by the
    /// worker, and when it stops).
    pub(crate) fn flush(&self) {
        let records = self.records.replace(0);
        self.oldest.set(None);
        if records == 0 {
            return;
        }
        let full = std::mem::take(&mut *self.buf.borrow_mut());
        self.log.hand_over(Batch { bytes: full, records, back: self.give_back.clone() });
    }

    /// Flushes if the oldest record has waited a second.
    pub(crate) fn flush_if_old(&self, now: Instant) {
        if self.oldest.get().is_some_and(|t| now.duration_since(t) >= BATCH_AGE) {
            self.flush();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::sync::atomic::Ordering;

    use super::super::testing::record;
    use super::*;

    #[test]
    fn sampling_keeps_one_in_n() {
        let log = AccessLog::start(Path::new("/dev/null")).unwrap();
        let w = WorkerLog::new(log);
        assert_eq!((0..100).filter(|_| w.wants_next(10)).count(), 10);
        assert_eq!((0..100).filter(|_| w.wants_next(1)).count(), 100);
    }

    #[test]
    fn record_times_follow_the_wall_clock() {
        let log = AccessLog::start(Path::new("/dev/null")).unwrap();
        let w = WorkerLog::new(log);
        let since = |t: SystemTime| t.duration_since(SystemTime::UNIX_EPOCH).unwrap();
        for _ in 0..3 {
            let at = Instant::now();
            let wall = SystemTime::now();
            std::thread::sleep(Duration::from_millis(20));
            let (now, wall_now) = (Instant::now(), SystemTime::now());
            let got = since(w.wall_time(at, now));
            let want = since(wall);
            assert!(got.abs_diff(want) < Duration::from_millis(1), "{got:?} vs {want:?}");
            // The present, too, and an instant after the reading it is dated from.
            assert!(since(w.wall_time(now, now)).abs_diff(since(wall_now)) < Duration::from_millis(1));
            let later = Instant::now() + Duration::from_millis(5);
            let got_later = since(w.wall_time(later, now));
            assert!(got_later.abs_diff(since(wall_now) + Duration::from_millis(5)) < Duration::from_millis(1));
        }
        // Past WALL_CLOCK_EVERY the wall clock is read again.
        let old = w.clocks.get().unwrap().0;
        let now = old + WALL_CLOCK_EVERY + Duration::from_millis(1);
        w.wall_time(now, now);
        assert!(w.clocks.get().unwrap().0 > old);
    }

    #[test]
    fn written_batches_buffers_are_used_again() {
        let dir = tempfile::tempdir().unwrap();
        let log = AccessLog::start(&dir.path().join("access.log")).unwrap();
        let w = WorkerLog::new(log.clone());
        w.write(&record(b"/a", None), Format::Json, Instant::now());
        let first = w.buf.borrow().as_ptr();
        w.flush();
        let deadline = Instant::now() + Duration::from_secs(5);
        // Waits for the writer to give the buffer back, and leaves it with the worker.
        let given_back = loop {
            if let Ok(buf) = w.spare.try_recv() {
                break buf;
            }
            assert!(Instant::now() < deadline, "buffer not given back");
            std::thread::sleep(Duration::from_millis(5));
        };
        w.give_back.try_send(given_back).unwrap();
        w.write(&record(b"/b", None), Format::Json, Instant::now());
        assert_eq!(w.buf.borrow().as_ptr(), first);
        assert!(w.spare.try_recv().is_err());
        w.flush();
        log.finish(Duration::from_secs(5));
        assert_eq!(log.counters.written.load(Ordering::Relaxed), 2);
    }
}
