//! The writer thread: the one place the access-log file is written. It appends the
//! workers' batches in the order they were handed over, reopens the file when asked
//! (`SIGUSR1`, after a rotation), counts what it wrote and what it lost, and gives
//! each written batch's buffer back to the worker that filled it.
//!
//! A hand-over takes no lock. The queue is a bounded `std::sync::mpsc` channel that
//! workers only `try_send` to and the writer only `try_recv`s from: the writer
//! sleeps with `park_timeout`, not in the channel, so no sender ever has a waiting
//! receiver to wake through the channel's wait list (a mutex); a worker that queued
//! a batch `unpark`s the writer instead, a futex wake at most.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::Thread;
use std::time::Duration;

use super::worker_log::Batch;

/// Batches queued for the writer before new ones are dropped (with `BATCH_BYTES`,
/// about 8 MiB of records: several seconds of a very busy box).
const QUEUE_BATCHES: usize = 32;
/// How long the writer sleeps when no batch wakes it: the longest a reopen waits.
const IDLE_WAKE: Duration = Duration::from_millis(500);

/// The counters of the access log, shared by the writer and the workers.
#[derive(Debug, Default)]
pub(crate) struct LogCounters {
    /// Records written to the file.
    pub written: AtomicU64,
    /// Records lost: the writer's queue was full, or the write failed.
    pub dropped: AtomicU64,
    /// Times the file was reopened (`SIGUSR1`).
    pub reopened: AtomicU64,
}

/// The writer thread's side: the process has one.
pub(crate) struct AccessLog {
    /// The writer's queue (see the module doc: a hand-over takes no lock).
    tx: SyncSender<Batch>,
    /// The writer thread, to wake when a batch is queued or at `finish`.
    writer: OnceLock<Thread>,
    /// Set by [`AccessLog::finish`]: batches handed over from then on are dropped
    /// and counted.
    closed: AtomicBool,
    /// Hand-overs under way. The writer waits for none to be under way before its
    /// last drain, so a batch that was handed over before `closed` was set is
    /// written, and every other one is counted as dropped: none is lost uncounted.
    handing_over: AtomicUsize,
    reopen: AtomicBool,
    pub counters: LogCounters,
    /// Tells `finish` that the writer has written everything and stopped.
    done: Mutex<Receiver<()>>,
}

impl AccessLog {
    /// Opens (creating if needed, appending) `path` and starts the writer thread.
    /// Fails if the file cannot be opened, so a bad path stops start-up.
    pub(crate) fn start(path: &Path) -> std::io::Result<Arc<AccessLog>> {
        let file = open(path)?;
        let (tx, rx) = mpsc::sync_channel(QUEUE_BATCHES);
        let (done_tx, done_rx) = mpsc::channel();
        let log = Arc::new(AccessLog {
            tx,
            writer: OnceLock::new(),
            closed: AtomicBool::new(false),
            handing_over: AtomicUsize::new(0),
            reopen: AtomicBool::new(false),
            counters: LogCounters::default(),
            done: Mutex::new(done_rx),
        });
        let writer = Writer { path: path.to_path_buf(), file, rx, log: log.clone(), failing: false };
        let thread = std::thread::Builder::new().name("access-log".into()).spawn(move || {
            writer.run();
            let _ = done_tx.send(());
        })?;
        let _ = log.writer.set(thread.thread().clone());
        Ok(log)
    }

    /// Asks the writer to reopen the file (after a rotation): it does within half a
    /// second, before writing its next batch.
    pub(crate) fn reopen(&self) {
        self.reopen.store(true, Ordering::Release);
    }

    /// Queues a worker's batch for the writer, or, when the queue is full (the
    /// writer is behind) or closed, drops it, counts its records and gives its
    /// buffer back. Never waits.
    pub(super) fn hand_over(&self, batch: Batch) {
        // SeqCst on `handing_over` and `closed`, here and in `finish` and the
        // writer: either the writer sees this hand-over under way and waits for it,
        // or this hand-over sees `closed`.
        self.handing_over.fetch_add(1, Ordering::SeqCst);
        let refused = if self.closed.load(Ordering::SeqCst) {
            Some(batch)
        } else {
            match self.tx.try_send(batch) {
                Ok(()) => None,
                Err(TrySendError::Full(b) | TrySendError::Disconnected(b)) => Some(b),
            }
        };
        self.handing_over.fetch_sub(1, Ordering::SeqCst);
        match refused {
            None => self.wake_writer(),
            Some(batch) => {
                self.counters.dropped.fetch_add(batch.records, Ordering::Relaxed);
                batch.give_back();
            }
        }
    }

    fn wake_writer(&self) {
        if let Some(writer) = self.writer.get() {
            writer.unpark();
        }
    }

    /// Closes the queue and waits (up to `wait`) for the writer to write what is in
    /// it; call it after the workers have flushed.
    pub(crate) fn finish(&self, wait: Duration) {
        self.closed.store(true, Ordering::SeqCst);
        self.wake_writer();
        if lock(&self.done).recv_timeout(wait).is_err() {
            tracing::warn!("access log: the writer did not finish within {wait:?}; records still queued are lost");
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn open(path: &Path) -> std::io::Result<File> {
    OpenOptions::new().create(true).append(true).open(path)
}

struct Writer {
    path: PathBuf,
    file: File,
    rx: Receiver<Batch>,
    log: Arc<AccessLog>,
    /// The last write failed (logged once until one works again).
    failing: bool,
}

impl Writer {
    fn run(mut self) {
        loop {
            // Woken by a hand-over or by `finish` (a wake that came while it was
            // writing is kept: this returns at once), else after IDLE_WAKE.
            std::thread::park_timeout(IDLE_WAKE);
            let closing = self.log.closed.load(Ordering::SeqCst);
            if closing {
                while self.log.handing_over.load(Ordering::SeqCst) != 0 {
                    std::thread::yield_now();
                }
            }
            loop {
                let batch = self.rx.try_recv().ok();
                self.reopen_if_asked();
                let Some(batch) = batch else { break };
                self.write(batch);
            }
            if closing {
                return;
            }
        }
    }

    fn reopen_if_asked(&mut self) {
        if !self.log.reopen.swap(false, Ordering::AcqRel) {
            return;
        }
        match open(&self.path) {
            Ok(f) => {
                self.file = f;
                self.log.counters.reopened.fetch_add(1, Ordering::Relaxed);
                tracing::info!(path = %self.path.display(), "access log reopened");
            }
            Err(e) => {
                tracing::error!(path = %self.path.display(), "access log not reopened, still writing the old file: {e}")
            }
        }
    }

    fn write(&mut self, batch: Batch) {
        let counters = &self.log.counters;
        let written = self.file.write_all(&batch.bytes);
        let records = batch.records;
        batch.give_back();
        match written {
            Ok(()) => {
                counters.written.fetch_add(records, Ordering::Relaxed);
                if self.failing {
                    tracing::info!(path = %self.path.display(), "access log writable again");
                    self.failing = false;
                }
            }
            Err(e) => {
                counters.dropped.fetch_add(records, Ordering::Relaxed);
                if !self.failing {
                    tracing::error!(path = %self.path.display(), "access log write failed, dropping records until it works: {e}");
                    self.failing = true;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;
    use std::time::{Duration, Instant};

    use super::super::testing::record;
    use super::super::{Format, WorkerLog};
    use super::*;

    #[test]
    fn failed_writes_are_counted_as_dropped() {
        // /dev/full accepts the open and fails every write with ENOSPC: a full disk.
        let log = AccessLog::start(Path::new("/dev/full")).unwrap();
        let w = WorkerLog::new(log.clone());
        w.write(&record(b"/a", None), Format::Json, Instant::now());
        w.write(&record(b"/a", None), Format::Json, Instant::now());
        w.flush();
        log.finish(Duration::from_secs(5));
        assert_eq!(log.counters.dropped.load(Ordering::Relaxed), 2);
        assert_eq!(log.counters.written.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn writer_appends_batches_counts_drops_and_reopens() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("access.log");
        let log = AccessLog::start(&path).unwrap();
        let w = WorkerLog::new(log.clone());
        let now = Instant::now();
        for _ in 0..3 {
            assert!(w.wants_next(1));
            w.write(&record(b"/a", None), Format::Combined, now);
        }
        w.flush();
        // Rotation: rename, then reopen; the next records go to a new file.
        let rotated = dir.path().join("access.log.1");
        let deadline = Instant::now() + Duration::from_secs(5);
        while log.counters.written.load(Ordering::Relaxed) < 3 {
            assert!(Instant::now() < deadline, "records not written");
            std::thread::sleep(Duration::from_millis(10));
        }
        std::fs::rename(&path, &rotated).unwrap();
        log.reopen();
        while log.counters.reopened.load(Ordering::Relaxed) == 0 {
            assert!(Instant::now() < deadline, "not reopened");
            // The writer reopens before its next batch, or within half a second.
            std::thread::sleep(Duration::from_millis(10));
        }
        w.write(&record(b"/b", None), Format::Json, now);
        w.flush();
        log.finish(Duration::from_secs(5));
        assert_eq!(std::fs::read_to_string(&rotated).unwrap().lines().count(), 3);
        let new = std::fs::read_to_string(&path).unwrap();
        assert_eq!(new.lines().count(), 1);
        assert!(new.contains("\"path\":\"/b\""), "{new}");
        // After finish, records are dropped and counted, never blocking.
        w.write(&record(b"/c", None), Format::Json, now);
        w.flush();
        assert_eq!(log.counters.dropped.load(Ordering::Relaxed), 1);
        assert_eq!(log.counters.written.load(Ordering::Relaxed), 4);
    }

    /// Workers still handing batches over while `finish` runs (a worker that missed
    /// the drain deadline): each record is written or counted as dropped, none is
    /// lost uncounted, and no worker waits.
    #[test]
    fn hand_overs_racing_finish_are_written_or_counted() {
        const WORKERS: u64 = 4;
        const BATCHES: u64 = 300;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("access.log");
        let log = AccessLog::start(&path).unwrap();
        let workers: Vec<_> = (0..WORKERS)
            .map(|_| {
                let log = log.clone();
                std::thread::spawn(move || {
                    let w = WorkerLog::new(log);
                    for _ in 0..BATCHES {
                        w.write(&record(b"/a", None), Format::Combined, Instant::now());
                        w.flush();
                    }
                })
            })
            .collect();
        let deadline = Instant::now() + Duration::from_secs(5);
        while log.counters.written.load(Ordering::Relaxed) == 0 {
            assert!(Instant::now() < deadline, "nothing written");
            std::thread::yield_now();
        }
        log.finish(Duration::from_secs(5));
        for w in workers {
            w.join().unwrap();
        }
        let (written, dropped) =
            (log.counters.written.load(Ordering::Relaxed), log.counters.dropped.load(Ordering::Relaxed));
        assert_eq!(written + dropped, WORKERS * BATCHES);
        assert_eq!(std::fs::read_to_string(&path).unwrap().lines().count() as u64, written);
    }
}
