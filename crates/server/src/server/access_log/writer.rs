//! The writer thread: the one place the access-log file is written. It appends the
//! workers' batches in the order they were handed over, reopens the file when asked
//! (`SIGUSR1`, after a rotation), counts what it wrote and what it lost, and gives
//! written batches' buffers back to be filled again.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::worker_log::{BATCH_BYTES, MAX_RECORD_GUESS};

/// Batches queued for the writer before new ones are dropped (with `BATCH_BYTES`,
/// about 8 MiB of records: several seconds of a very busy box).
const QUEUE_BATCHES: usize = 32;
/// Written batches' buffers kept for the workers to fill again, so that a batch
/// costs no allocation (a buffer of `BATCH_BYTES` is past malloc's mmap threshold).
const SPARE_BUFFERS: usize = 8;

/// The counters of the access log, shared by the writer and the workers.
#[derive(Debug, Default)]
pub struct LogCounters {
    /// Records written to the file.
    pub written: AtomicU64,
    /// Records lost: the writer's queue was full, or the write failed.
    pub dropped: AtomicU64,
    /// Times the file was reopened (`SIGUSR1`).
    pub reopened: AtomicU64,
}

/// A batch of formatted records.
struct Batch {
    bytes: Vec<u8>,
    records: u64,
}

/// The writer thread's side: the process has one.
pub struct AccessLog {
    /// None once [`AccessLog::finish`] has run.
    tx: Mutex<Option<SyncSender<Batch>>>,
    reopen: AtomicBool,
    pub counters: LogCounters,
    /// Tells `finish` that the writer has written everything and stopped.
    done: Mutex<Receiver<()>>,
    /// Emptied buffers of written batches, for the workers' next batches.
    spare: Mutex<Vec<Vec<u8>>>,
}

impl AccessLog {
    /// Opens (creating if needed, appending) `path` and starts the writer thread.
    /// Fails if the file cannot be opened, so a bad path stops start-up.
    pub fn start(path: &Path) -> std::io::Result<Arc<AccessLog>> {
        let file = open(path)?;
        let (tx, rx) = mpsc::sync_channel(QUEUE_BATCHES);
        let (done_tx, done_rx) = mpsc::channel();
        let log = Arc::new(AccessLog {
            tx: Mutex::new(Some(tx)),
            reopen: AtomicBool::new(false),
            counters: LogCounters::default(),
            done: Mutex::new(done_rx),
            spare: Mutex::new(Vec::new()),
        });
        let writer = Writer { path: path.to_path_buf(), file, rx, log: log.clone() };
        std::thread::Builder::new().name("access-log".into()).spawn(move || {
            writer.run();
            let _ = done_tx.send(());
        })?;
        Ok(log)
    }

    /// Asks the writer to reopen the file (after a rotation): it does within half a
    /// second, before writing its next batch.
    pub fn reopen(&self) {
        self.reopen.store(true, Ordering::Release);
    }

    /// An empty buffer for a worker's next batch: a written batch's, when there is one.
    pub(super) fn buffer(&self) -> Vec<u8> {
        lock(&self.spare).pop().unwrap_or_else(|| Vec::with_capacity(BATCH_BYTES + MAX_RECORD_GUESS))
    }

    /// Keeps a written batch's buffer for a next batch.
    fn recycle(&self, mut bytes: Vec<u8>) {
        bytes.clear();
        let mut spare = lock(&self.spare);
        if spare.len() < SPARE_BUFFERS {
            spare.push(bytes);
        }
    }

    pub(super) fn submit(&self, bytes: Vec<u8>, records: u64) {
        let unsent = match lock(&self.tx).as_ref() {
            Some(tx) => match tx.try_send(Batch { bytes, records }) {
                Ok(()) => return,
                Err(TrySendError::Full(b) | TrySendError::Disconnected(b)) => b.bytes,
            },
            None => bytes,
        };
        self.counters.dropped.fetch_add(records, Ordering::Relaxed);
        self.recycle(unsent);
    }

    /// Closes the queue and waits (up to `wait`) for the writer to write what is in
    /// it; call it after the workers have flushed.
    pub fn finish(&self, wait: Duration) {
        lock(&self.tx).take();
        if lock(&self.done).recv_timeout(wait).is_err() {
            tracing::warn!("access log: the writer did not finish within {wait:?}; records still queued are lost");
        }
    }

    /// How many written batches' buffers wait to be filled again.
    #[cfg(test)]
    pub(super) fn spare_buffers(&self) -> usize {
        lock(&self.spare).len()
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
}

impl Writer {
    fn run(mut self) {
        let mut failing = false;
        loop {
            let batch = match self.rx.recv_timeout(Duration::from_millis(500)) {
                Ok(b) => Some(b),
                Err(RecvTimeoutError::Timeout) => None,
                Err(RecvTimeoutError::Disconnected) => return,
            };
            if self.log.reopen.swap(false, Ordering::AcqRel) {
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
            let Some(batch) = batch else { continue };
            let counters = &self.log.counters;
            let written = self.file.write_all(&batch.bytes);
            self.log.recycle(batch.bytes);
            match written {
                Ok(()) => {
                    counters.written.fetch_add(batch.records, Ordering::Relaxed);
                    if failing {
                        tracing::info!(path = %self.path.display(), "access log writable again");
                        failing = false;
                    }
                }
                Err(e) => {
                    counters.dropped.fetch_add(batch.records, Ordering::Relaxed);
                    if !failing {
                        tracing::error!(path = %self.path.display(), "access log write failed, dropping records until it works: {e}");
                        failing = true;
                    }
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
}
