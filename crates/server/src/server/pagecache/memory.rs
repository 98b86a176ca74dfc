//! An in-memory page cache for unit tests: which windows are "resident" is a set,
//! and a fill of a missing window takes a set time on tokio's clock (paused in
//! tests, so a cold response runs in no real time) and can be made to fail. It
//! sends window by window through the transport like the real path, so a test of
//! the connection sees the same calls.

use std::cell::{Cell, RefCell};
use std::collections::HashSet;
use std::rc::Rc;
use std::time::Duration;

use super::{FileId, FilePages, FillError, PageCache, Progress, RangeError, Window};
use crate::transport::Transport;

pub(crate) struct MemoryPages {
    window_bytes: u64,
    resident: RefCell<HashSet<Window>>,
    /// How long a fill of one window takes.
    fill_time: Duration,
    /// How long a connection waits for a fill (`fill.timeout`).
    timeout: Duration,
    /// Fills fail with a disk error while set.
    pub failing: Cell<bool>,
    /// Fills done so far.
    pub fills: Cell<u64>,
}

impl MemoryPages {
    pub(crate) fn new(window_bytes: u64, fill_time: Duration, timeout: Duration) -> MemoryPages {
        MemoryPages {
            window_bytes,
            resident: RefCell::default(),
            fill_time,
            timeout,
            failing: Cell::new(false),
            fills: Cell::new(0),
        }
    }

    /// Marks every window overlapping `len` bytes at `offset` of file `id` resident.
    pub(crate) fn make_resident(&self, id: FileId, offset: u64, len: u64) {
        let w = self.window_bytes;
        for index in offset / w..=(offset + len.max(1) - 1) / w {
            self.resident.borrow_mut().insert(Window { dev: id.0, ino: id.1, index });
        }
    }
}

impl PageCache for MemoryPages {
    async fn send_range<T: Transport, F: FilePages + 'static>(
        &self,
        io: &mut T,
        file: &Rc<F>,
        offset: u64,
        len: u64,
        _read_on: bool,
        progress: &mut Progress,
    ) -> Result<(), RangeError> {
        let (w, end) = (self.window_bytes, offset + len);
        let mut at = offset;
        while at < end {
            let upto = ((at / w + 1) * w).min(end);
            let window = Window::of(file.id(), at, w);
            if !self.resident.borrow().contains(&window) {
                if self.fill_time > self.timeout {
                    tokio::time::sleep(self.timeout).await;
                    return Err(FillError::Timeout.into());
                }
                tokio::time::sleep(self.fill_time).await;
                if self.failing.get() {
                    return Err(FillError::Io("injected disk error".into()).into());
                }
                self.resident.borrow_mut().insert(window);
                self.fills.set(self.fills.get() + 1);
                progress.filled = true;
            }
            progress.mark_first_byte();
            io.send_file(file.file(), at, upto - at).await?;
            at = upto;
        }
        Ok(())
    }
}
