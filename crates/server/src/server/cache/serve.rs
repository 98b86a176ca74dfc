//! Sending a range of a cached object, on the viewer's worker: slice by slice,
//! each from the store through the page-cache path (exactly as a local file), or
//! from its fill as the bytes arrive.

use std::cell::RefCell;
use std::fs::File;
use std::num::NonZeroUsize;
use std::rc::Rc;
use std::sync::Arc;

use tokio::sync::watch;

use super::fill::slice_bounds;
use super::{Cache, Failure, FillState, Key};
use crate::server::pagecache::residency::Memo;
use crate::server::pagecache::{FileId, FilePages, PageCache, Progress, RangeError};
use crate::store::{KeyHash, ObjectMeta, SliceRef};
use crate::transport::{SendError, Transport};

/// Why a cached range was not sent whole (its head is out: the connection closes).
#[derive(Debug, thiserror::Error)]
pub(crate) enum ServeError {
    #[error(transparent)]
    Range(#[from] RangeError),
    /// The slice's fill failed: the origin failed, or answered wrong.
    #[error("{0}")]
    Origin(Failure),
}

impl From<SendError> for ServeError {
    fn from(e: SendError) -> ServeError {
        ServeError::Range(RangeError::Send(e))
    }
}

/// A stored slice, open: a file like any other to the page-cache path.
pub(crate) struct SliceFile {
    file: File,
    id: FileId,
    len: u64,
    memo: Memo,
}

impl FilePages for SliceFile {
    fn file(&self) -> &File {
        &self.file
    }

    fn id(&self) -> FileId {
        self.id
    }

    fn size_bytes(&self) -> u64 {
        self.len
    }

    fn memo(&self) -> &Memo {
        &self.memo
    }
}

/// A worker's open stored slices, so that a hit costs no `open`.
pub(crate) struct SliceFiles {
    open: RefCell<lru::LruCache<(KeyHash, u64), Rc<SliceFile>>>,
}

impl SliceFiles {
    pub(crate) fn new(entries: usize) -> SliceFiles {
        SliceFiles { open: RefCell::new(lru::LruCache::new(NonZeroUsize::new(entries.max(1)).expect("not 0"))) }
    }

    /// The slice `sref` names, open: a kept descriptor of that very file (same
    /// inode), or a new one checked against what the store recorded. `None` when the
    /// file is not what the store recorded (changed behind the server's back).
    fn open(&self, key: &KeyHash, index: u64, sref: &SliceRef) -> Option<Rc<SliceFile>> {
        let mut open = self.open.borrow_mut();
        if let Some(f) = open.get(&(*key, index)) {
            if f.id == (sref.dev, sref.ino) && f.len == sref.len {
                return Some(f.clone());
            }
        }
        let file = File::open(&sref.path).ok()?;
        let st = linerate_sys::fstat(std::os::fd::AsFd::as_fd(&file)).ok()?;
        if (st.dev, st.ino, st.size_bytes) != (sref.dev, sref.ino, sref.len) || st.mtime_ns != i128::from(sref.mtime_ns)
        {
            return None;
        }
        let f = Rc::new(SliceFile { file, id: (st.dev, st.ino), len: sref.len, memo: Memo::default() });
        open.put((*key, index), f.clone());
        Some(f)
    }
}

impl Cache {
    /// Sends bytes `offset..offset + len` of the object `meta` describes, slice by
    /// slice. With `read_on` (a single range: a viewer reading in order) the
    /// page-cache path reads ahead within stored slices.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn send_range<T: Transport, P: PageCache>(
        self: &Arc<Cache>,
        io: &mut T,
        pages: Option<&P>,
        files: &SliceFiles,
        table: usize,
        key: &Arc<Key>,
        meta: &Arc<ObjectMeta>,
        offset: u64,
        len: u64,
        read_on: bool,
        progress: &mut Progress,
    ) -> Result<(), ServeError> {
        let s = self.slice_bytes;
        let end = offset + len;
        let mut at = offset;
        // The slices this response started ahead of itself: joining one of
        // them later is not a collapsed miss.
        let mut own = Vec::new();
        while at < end {
            let index = at / s;
            let (first, last) = slice_bounds(index, s, meta.size);
            let upto = end.min(last + 1);
            // The next slices coming meanwhile: the next one when the range goes
            // on past this one, and `read_ahead_slices` of them for a viewer
            // reading in order.
            if upto < end || read_on {
                own.extend(self.read_ahead(table, key, meta, index, upto < end));
            }
            match self.stored(files, key, meta, index) {
                Some(slice) => {
                    match pages {
                        Some(p) => p.send_range(io, &slice, at - first, upto - at, read_on, progress).await?,
                        None => {
                            progress.mark_first_byte();
                            io.send_file(&slice.file, at - first, upto - at).await?;
                        }
                    }
                    self.store.note_use(&key.hash, index, upto == last + 1);
                    self.stats.hit_bytes.add(upto - at);
                }
                None => {
                    let (rx, joined) = self.slice_fill(table, key, meta, index, None, None);
                    if joined && !own.contains(&index) {
                        self.collapsed(table);
                    }
                    follow(io, rx, at - first, Some(upto - first), progress).await?;
                    self.store.note_use(&key.hash, index, upto == last + 1);
                    self.stats.miss_bytes.add(upto - at);
                }
            }
            at = upto;
        }
        Ok(())
    }

    /// Slice `index` of `key` in the version `meta` from the store, open, if it
    /// is there and intact (a damaged one is forgotten, so it is fetched again).
    fn stored(&self, files: &SliceFiles, key: &Key, meta: &ObjectMeta, index: u64) -> Option<Rc<SliceFile>> {
        let sref = self.store.slice(&key.hash, meta, index)?;
        let f = files.open(&key.hash, index, &sref);
        if f.is_none() {
            tracing::warn!(path = %sref.path.display(), "a cache file differs from what was stored; fetched again");
            self.store.forget_slice(&key.hash, index);
        }
        f
    }
}

/// Sends bytes `from..to` of what a fill writes (to its end when `to` is `None`),
/// each as soon as the fill has written it.
pub(crate) async fn follow<T: Transport>(
    io: &mut T,
    mut rx: watch::Receiver<FillState>,
    from: u64,
    to: Option<u64>,
    progress: &mut Progress,
) -> Result<(), ServeError> {
    let mut sent = from;
    loop {
        let state = rx.borrow_and_update().clone();
        if let Some(file) = &state.file {
            let upto = to.map_or(state.written, |t| t.min(state.written));
            if upto > sent {
                progress.from_origin = true;
                progress.mark_first_byte();
                io.send_file(file, sent, upto - sent).await?;
                sent = upto;
            }
        }
        match (&state.end, to) {
            (_, Some(t)) if sent >= t => return Ok(()),
            (Some(Ok(())), None) if sent >= state.written => return Ok(()),
            (Some(Ok(())), Some(_)) if sent >= state.written => {
                return Err(ServeError::Origin(Failure::BadResponse("the fill ended early".into())))
            }
            (Some(Err(f)), _) if sent >= state.written || state.file.is_none() => {
                return Err(ServeError::Origin(f.clone()))
            }
            _ => {}
        }
        if sent < state.written {
            continue;
        }
        if rx.changed().await.is_err() {
            // The fill is gone without a word: its task ended (a panic, or shutdown).
            return Err(ServeError::Origin(Failure::BadResponse("the fill stopped".into())));
        }
    }
}
