//! Answers of unknown length: an origin that answers a cacheable request with a
//! 200 and no `Content-Length` (chunked, or ended by closing the connection) is
//! sending something still being made, such as a live segment the encoder is
//! writing. It is streamed, once, to every viewer who asks while it arrives.
//!
//! The body is written into a file in memory as it arrives, and its progress
//! published on a watch channel ([`FillState`], as a slice fill does). Viewers
//! follow it (HTTP/1.1 viewers as `Transfer-Encoding: chunked`, one chunk per
//! piece received; HTTP/1.0 viewers to the connection's close); one who joins late
//! gets what is there, then follows. A body that ends cleanly (the last chunk,
//! or the close of a body without framing) is then stored as an ordinary object
//! of the size it turned out to have, cut into slices, and every later request
//! is a hit with a `Content-Length`. A body that ends any other way (a reset, a
//! broken chunk, a stalled origin past `idle_timeout`) cuts the responses that
//! follow it: a chunked one without its last chunk, so its viewer sees the
//! error, and nothing is stored.
//!
//! Until it is stored, the stream is what the key names: `Cache::open` hands it
//! to every viewer, so one origin request serves them all. A request with a
//! `Range`, or one arriving once the body is complete, waits for the end and is
//! answered like any stored object (ranges, conditionals, `Content-Length`) from
//! the file in memory.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use tokio::sync::watch;

use super::fill::memory_file;
use super::meta::{field, object_meta};
use super::serve::ServeError;
use super::{lock, Cache, Failure, FillState, Key, Opened};
use crate::origin::OriginResponse;
use crate::store::ObjectMeta;
use crate::transport::Transport;

/// The most of an answer of unknown length held in memory: an origin that sends
/// more (an endless body) has its viewers' responses cut there, and nothing is
/// stored. Live segments are megabytes.
pub(crate) const LIVE_MAX_BYTES: u64 = 1 << 30;

/// An answer of unknown length under way, shared by its viewers.
#[derive(Debug)]
pub(crate) struct Live {
    /// The full cache key (two keys may share a hash).
    pub key: Vec<u8>,
    pub etag: Option<Vec<u8>>,
    pub last_modified: Option<Vec<u8>>,
    pub content_type: Option<Vec<u8>>,
    /// Unix seconds of the origin's answer (a made-up ETag comes from it, as for
    /// a stored object).
    pub stored_at: i64,
    /// The body so far; its `file` is always set.
    pub body: watch::Receiver<FillState>,
}

impl Live {
    /// Waits for the body's end: its length, or why it failed.
    pub(crate) async fn complete(&self) -> Result<u64, Failure> {
        let mut rx = self.body.clone();
        loop {
            {
                let s = rx.borrow_and_update();
                if let Some(end) = &s.end {
                    return end.clone().map(|()| s.written);
                }
            }
            if rx.changed().await.is_err() {
                return Err(Failure::BadResponse("the origin request was lost".into()));
            }
        }
    }

    /// The file the body is written into.
    pub(crate) fn file(&self) -> Arc<File> {
        self.body.borrow().file.clone().expect("a live body has its file from the start")
    }

    /// Whether the body has ended, well or not.
    pub(crate) fn ended(&self) -> bool {
        self.body.borrow().end.is_some()
    }
}

impl Cache {
    /// The answer of unknown length of `key` under way, if any.
    pub(super) fn live_of(&self, key: &Key) -> Option<Arc<Live>> {
        // Raised before the head request that starts a stream leaves `opening`,
        // so a viewer that found no head request under way sees it.
        if self.live_count.load(Ordering::Acquire) == 0 {
            return None;
        }
        lock(&self.live).get(&key.hash).filter(|l| l.key == key.text).cloned()
    }

    /// Starts streaming `response` (a 200 without a length, of a cacheable answer
    /// received at `now_ms`) to every viewer of `key`, and storing it once whole.
    pub(super) fn start_live(
        self: &Arc<Cache>,
        table: usize,
        key: &Arc<Key>,
        response: OriginResponse,
        now_ms: i64,
    ) -> Opened {
        let file = Arc::new(memory_file());
        let (tx, rx) = watch::channel(FillState { file: Some(file.clone()), written: 0, end: None });
        let h = &response.headers;
        let live = Arc::new(Live {
            key: key.text.clone(),
            etag: field(h, http::header::ETAG).map(<[u8]>::to_vec),
            last_modified: field(h, http::header::LAST_MODIFIED).map(<[u8]>::to_vec),
            content_type: field(h, http::header::CONTENT_TYPE).map(<[u8]>::to_vec),
            stored_at: now_ms.div_euclid(1000),
            body: rx,
        });
        // Before the head request leaves `opening`: a viewer arriving meanwhile
        // finds one or the other, never neither.
        if lock(&self.live).insert(key.hash, live.clone()).is_none() {
            self.live_count.fetch_add(1, Ordering::AcqRel);
        }
        self.stats.fills.add(1);
        let (cache, key, ours) = (self.clone(), key.clone(), live.clone());
        // On the thread whose connection carries the response.
        self.origins.spawn_here(async move {
            let mut response = response;
            let result = cache.pump(&mut response, &file, &tx).await;
            let written = tx.borrow().written;
            // The viewers first: storing copies the body, and they need not wait.
            tx.send_modify(|s| s.end = Some(result.clone()));
            match result {
                Ok(()) => {
                    let meta = object_meta(&key.text, 200, written, &response.headers, now_ms, cache.origins.table(table));
                    cache.store_live(&key, meta, &file);
                }
                Err(f) => {
                    cache.stats.fill_failures.add(1);
                    tracing::debug!(key = %String::from_utf8_lossy(&key.text), "live answer cut after {written} bytes: {f}");
                }
            }
            // Only now: until the slices are in, a viewer is served from memory
            // rather than sent to the origin for a slice not yet stored.
            let mut live = lock(&cache.live);
            if live.get(&key.hash).is_some_and(|l| Arc::ptr_eq(l, &ours)) {
                live.remove(&key.hash);
                cache.live_count.fetch_sub(1, Ordering::AcqRel);
            }
        });
        Opened::Live(live)
    }

    /// Writes the body into `file` as it arrives, publishing each piece.
    async fn pump(
        &self,
        response: &mut OriginResponse,
        file: &File,
        tx: &watch::Sender<FillState>,
    ) -> Result<(), Failure> {
        let mut written = 0u64;
        while let Some(chunk) = response.chunk().await.map_err(Failure::origin)? {
            if written + chunk.len() as u64 > LIVE_MAX_BYTES {
                tracing::warn!("an origin answer without a length passed {LIVE_MAX_BYTES} bytes: cut, not stored");
                return Err(Failure::BadResponse(format!("no length and more than {LIVE_MAX_BYTES} bytes")));
            }
            file.write_all_at(&chunk, written).map_err(|e| Failure::BadResponse(format!("memory: {e}")))?;
            written += chunk.len() as u64;
            self.stats.origin_bytes.add(chunk.len() as u64);
            tx.send_modify(|s| s.written = written);
        }
        Ok(())
    }

    /// Stores a whole body of `meta.size` bytes from `file` as an object and its
    /// slices. A store that refuses (full, read-only) leaves the object out:
    /// the next request asks the origin again.
    fn store_live(&self, key: &Key, meta: ObjectMeta, file: &File) {
        let size = meta.size;
        if let Err(e) = self.store.put_object(&key.hash, meta.clone()) {
            self.note_store_error(&e);
            return;
        }
        let s = self.slice_bytes;
        let mut buf = vec![0u8; (256 * 1024).min(s as usize)];
        for index in 0..size.div_ceil(s) {
            let (first, last) = super::slice_bounds(index, s, size);
            let len = last + 1 - first;
            let w = match self.store.begin_slice(&key.hash, &meta, index, len) {
                Ok(w) => w,
                Err(e) => {
                    self.note_store_error(&e);
                    self.store.drop_object(&key.hash, &meta);
                    return;
                }
            };
            let mut at = 0u64;
            let copied = loop {
                if at == len {
                    break Ok(());
                }
                let n = ((len - at) as usize).min(buf.len());
                if let Err(e) = file.read_exact_at(&mut buf[..n], first + at) {
                    break Err(crate::store::StoreError::from(e));
                }
                if let Err(e) = w.write_at(&buf[..n], at) {
                    break Err(e);
                }
                at += n as u64;
            };
            let committed = copied.and_then(|()| self.store.commit_slice(w).map(|_| ()));
            match committed {
                Ok(()) => self.stats.stored_slices.add(1),
                Err(e) => {
                    // A slice missing is fetched with a Range request when asked
                    // for; an object none of whose slices could be kept is dropped.
                    self.note_store_error(&e);
                    self.store.drop_object(&key.hash, &meta);
                    return;
                }
            }
        }
    }
}

/// Sends a live body to one viewer as it arrives, from its start: each piece as
/// a chunk of its own when `chunked` (then the last chunk once the body ended
/// well), or raw (the response ends with the connection). A body that failed
/// ends the response there, without its last chunk. Returns the bytes of chunk
/// framing sent.
pub(crate) async fn follow_live<T: Transport>(
    io: &mut T,
    live: &Live,
    chunked: bool,
    progress: &mut crate::server::pagecache::Progress,
) -> Result<u64, ServeError> {
    let mut rx = live.body.clone();
    let (mut sent, mut framing) = (0u64, 0u64);
    let mut size_line = String::with_capacity(20);
    loop {
        let state = rx.borrow_and_update().clone();
        if let (Some(file), true) = (&state.file, state.written > sent) {
            let n = state.written - sent;
            progress.from_origin = true;
            progress.mark_first_byte();
            if chunked {
                size_line.clear();
                {
                    use std::fmt::Write;
                    let _ = write!(size_line, "{n:x}\r\n");
                }
                io.write_all(size_line.as_bytes(), true).await?;
            }
            io.send_file(file, sent, n).await?;
            if chunked {
                // At once, not with the next chunk's size: a client may wait for
                // a chunk's CRLF before it hands the chunk on.
                io.write_all(b"\r\n", false).await?;
                framing += size_line.len() as u64 + 2;
            }
            sent = state.written;
        }
        match &state.end {
            Some(Ok(())) if sent >= state.written => {
                if chunked {
                    io.write_all(b"0\r\n\r\n", false).await?;
                    framing += 5;
                }
                return Ok(framing);
            }
            Some(Err(f)) if sent >= state.written => return Err(ServeError::Origin(f.clone())),
            _ => {}
        }
        if sent < state.written {
            continue;
        }
        if rx.changed().await.is_err() {
            return Err(ServeError::Origin(Failure::BadResponse("the live answer stopped".into())));
        }
    }
}
