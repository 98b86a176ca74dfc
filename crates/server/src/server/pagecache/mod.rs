//! The page-cache path: sending a body range of a file that may not be in memory,
//! without a worker ever waiting for the disk.
//!
//! `sendfile` and `preadv` on a page that is not resident block the calling thread
//! for the disk read, and a worker's thread carries thousands of viewers, so a
//! connection hands each body range to [`PageCache::send_range`], the one call this
//! layer offers it. The real implementation, [`ColdPath`] (`send`), goes window
//! by window (`fill.window_bytes`, aligned in the file):
//!
//! 1. **Register** as a sender of the window (`senders`), so that no drop of the
//!    page-cache admission policy evicts it between the check and the send.
//! 2. **Check** it ([`residency`]: a one-second memo per worker and open file, else
//!    `cachestat` or sampled `RWF_NOWAIT` probes).
//! 3. **Fill** it when missing ([`pool`]: fill threads per NUMA domain read it into
//!    the page cache; this connection parks on the answer, the worker serves
//!    everyone else, the next window is read ahead meanwhile).
//! 4. **Send** it through the connection's transport, exactly as if it had been
//!    resident all along.
//! 5. **Admit or drop** ([`admission`]): the page cache is kept for the files in
//!    most demand; a window of any other file is dropped once its last sender is
//!    done.
//!
//! Per-device figures of the fill threads ([`devices`]) are published as a
//! snapshot for the admin endpoint, which never takes a lock a worker takes.
//!
//! This layer knows files only through [`FilePages`] and connections only through
//! their `Transport`: it depends on neither the connection nor the open-file
//! cache above it, and the connection's tests drive it with an in-memory page
//! cache (`memory`) on tokio's paused clock.

pub(crate) mod admission;
pub(crate) mod devices;
#[cfg(test)]
pub(crate) mod memory;
pub(crate) mod pool;
mod queue;
mod read;
pub(crate) mod residency;
mod send;
mod senders;

use std::fs::File;
use std::rc::Rc;
use std::sync::Mutex;
use std::time::Instant;

pub(crate) use admission::FileId;
pub(crate) use pool::{FillError, FillPool};
pub(crate) use send::ColdPath;

use crate::transport::{SendError, Transport};

/// One window (`fill.window_bytes`, aligned) of one file: the unit that is
/// filled, shared by concurrent viewers, sent and dropped.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub(crate) struct Window {
    pub dev: u64,
    pub ino: u64,
    pub index: u64,
}

impl Window {
    /// The window of `file` that holds byte `offset`.
    pub(crate) fn of((dev, ino): FileId, offset: u64, window_bytes: u64) -> Window {
        Window { dev, ino, index: offset / window_bytes }
    }
}

/// A file as this layer sees it: an open descriptor, the identity and size the
/// response was planned with, and the worker's memo of its resident windows.
pub(crate) trait FilePages {
    fn file(&self) -> &File;
    /// `(st_dev, st_ino)`.
    fn id(&self) -> FileId;
    fn size_bytes(&self) -> u64;
    fn memo(&self) -> &residency::Memo;
}

/// What sending a range did, for the response's access-log record.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Progress {
    /// Read the clock when the first bytes go (the log format prints timings).
    pub timed: bool,
    /// When the first bytes of the response were handed to the kernel.
    pub first_byte: Option<Instant>,
    /// Some window of the response waited for a fill from disk.
    pub filled: bool,
    /// Some bytes of the response came from a fill from an origin: a slice was not
    /// stored (a cache miss), whatever the object's head was.
    pub from_origin: bool,
}

impl Progress {
    /// Bytes of the response are about to be handed to the kernel.
    pub(crate) fn mark_first_byte(&mut self) {
        if self.timed && self.first_byte.is_none() {
            self.first_byte = Some(Instant::now());
        }
    }
}

/// Why a range was not sent whole. Either way the head is out, so the only honest
/// answer is to close the connection.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RangeError {
    #[error(transparent)]
    Send(#[from] SendError),
    /// A disk read the range needed failed or did not finish within `fill.timeout`.
    #[error("{0}")]
    Fill(#[from] FillError),
}

/// The page cache as a connection sees it: one call per body range.
#[allow(async_fn_in_trait)] // workers are single-threaded; nothing here needs Send
pub(crate) trait PageCache {
    /// Sends `len` bytes of `file` at `offset` through `io`, never letting the
    /// worker wait for the disk. With `read_on` (a single range: a viewer reading
    /// in order), what follows the range is read ahead too; the parts of a
    /// multipart answer are seeks, and are not.
    async fn send_range<T: Transport, F: FilePages + 'static>(
        &self,
        io: &mut T,
        file: &Rc<F>,
        offset: u64,
        len: u64,
        read_on: bool,
        progress: &mut Progress,
    ) -> Result<(), RangeError>;
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
