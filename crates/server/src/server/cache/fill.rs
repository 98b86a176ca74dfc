//! Slice fills: one origin request per slice however many viewers want it, its
//! body written into a file that every waiting viewer reads as it grows.
//!
//! A fill runs on the origin runtime. It publishes its progress on a watch channel
//! ([`FillState`]): the file to read (the store's temporary file of the slice, or a
//! file in memory when the store cannot take it) and how many bytes of it are
//! written. Viewers, on their workers, wait for the count to pass what they have
//! sent and `sendfile` the new bytes: every viewer receives bytes as they arrive
//! from the origin, and one who joins late first gets what is already written. The
//! bytes just written are in the page cache, so these sends never wait for a disk.
//!
//! A fill is finished even when every viewer has left: it is one slice at most,
//! and the next viewer of the title most likely wants it. When the origin fails
//! mid-slice, the body is too short or too long, or the object turns out replaced
//! (its validators or size changed), the fill ends with a [`Failure`]: the waiting
//! responses are cut (they can only close: their heads are out), and the slice is
//! not kept. A replaced object is dropped from the store, so the next request
//! starts on the new version; no response ever mixes two.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::sync::watch;

use super::meta::same_version;
use super::{Cache, Key, Pace, LOG_ONCE_STORE};
use crate::origin::{OriginError, OriginRequest, OriginResponse};
use crate::store::{ObjectMeta, SliceWriter, StoreError};

/// A fill's progress, as viewers see it.
#[derive(Clone, Debug, Default)]
pub(crate) struct FillState {
    /// What to read the slice from, once the fill has a place to write it.
    pub file: Option<Arc<File>>,
    /// Bytes of the slice written so far, from its start.
    pub written: u64,
    /// Set once the fill ended.
    pub end: Option<Result<(), Failure>>,
}

/// Why a fill did not bring its slice (or the object's head) in.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Failure {
    /// The origin could not be reached, answered 5xx, timed out or reset.
    #[error("origin {kind}: {detail}")]
    Origin { kind: &'static str, detail: String, timeout: bool },
    /// The origin's answer does not fit what was asked (a wrong Content-Range, a
    /// body longer or shorter than the slice, a status that makes no sense here).
    #[error("bad answer from the origin: {0}")]
    BadResponse(String),
    /// The object changed at the origin (other validators or size): dropped.
    #[error("the origin replaced the object")]
    Replaced,
}

impl Failure {
    pub(crate) fn origin(e: OriginError) -> Failure {
        let timeout = matches!(e, OriginError::Timeout(_));
        Failure::Origin { kind: e.kind(), detail: e.to_string(), timeout }
    }

    /// The status a viewer gets when this happens before its head is out.
    pub(crate) fn status(&self) -> u16 {
        match self {
            Failure::Origin { timeout: true, .. } => 504,
            Failure::Origin { kind: "loop", .. } => 508,
            _ => 502,
        }
    }
}

/// Where a fill writes: the store, or memory when the store cannot take the slice.
enum Sink {
    Store(SliceWriter),
    Memory(Arc<File>),
}

impl Sink {
    fn file(&self) -> Arc<File> {
        match self {
            Sink::Store(w) => w.file().clone(),
            Sink::Memory(f) => f.clone(),
        }
    }
}

/// How long bytes a fill has written may wait before its viewers are told, and
/// how many: a fill tells its viewers of its first bytes at once, then of what
/// came within a hold together. Each telling wakes every waiting viewer, on
/// every worker, for a `sendfile` each; an origin answer comes in chunks of tens
/// of KB, often several within a millisecond, and a wake per chunk was a
/// measurable share of a miss's CPU (docs/performance/origin.md, "Telling viewers
/// less often").
const HOLD: std::time::Duration = std::time::Duration::from_millis(1);
const HOLD_BYTES: u64 = 256 * 1024;

/// What a fill's viewers have been told of its bytes.
#[derive(Default)]
struct Publish {
    told: u64,
    /// When the bytes not told yet must be.
    deadline: Option<tokio::time::Instant>,
}

impl Publish {
    /// `written` bytes are in the file: tells the viewers now, or by the hold.
    fn wrote(&mut self, tx: &watch::Sender<FillState>, written: u64) {
        if self.told == 0 || written - self.told >= HOLD_BYTES {
            self.now(tx, written);
        } else if self.deadline.is_none() {
            self.deadline = Some(tokio::time::Instant::now() + HOLD);
        }
    }

    fn now(&mut self, tx: &watch::Sender<FillState>, written: u64) {
        self.deadline = None;
        if written != self.told {
            self.told = written;
            tx.send_modify(|s| s.written = written);
        }
    }
}

/// The first and last byte of slice `index` of an object of `size` bytes.
pub(super) fn slice_bounds(index: u64, slice_bytes: u64, size: u64) -> (u64, u64) {
    let first = index * slice_bytes;
    (first, (first + slice_bytes).min(size).saturating_sub(1))
}

impl Cache {
    /// The fill of slice `index` of `key` in the version `meta` describes: the one
    /// under way, or a new one (with `response` as its origin answer when the
    /// caller already has it). Returns its progress and whether it was joined
    /// rather than started. With `pace` (a background fill: the prefill's), the
    /// origin body is read under that cap until a viewer joins; without, the
    /// caller is a viewer, and a paced fill it joins goes on at full speed.
    pub(crate) fn slice_fill(
        self: &Arc<Cache>,
        table: usize,
        key: &Arc<Key>,
        meta: &Arc<ObjectMeta>,
        index: u64,
        response: Option<OriginResponse>,
        pace: Option<Arc<Pace>>,
    ) -> (watch::Receiver<FillState>, bool) {
        self.slice_fill_publishing(table, key, meta, index, response, pace, None)
    }

    /// [`Cache::slice_fill`] of a version that `publish` puts in the store. The
    /// fill is registered first, then `publish` runs (outside the fills' lock: it
    /// writes the journal), then the fill starts: a viewer who finds the new
    /// version in the store also finds the fill of this slice, and joins it.
    /// (Published first and registered after, a viewer in between found neither
    /// the slice nor its fill and asked the origin for the slice a second time.)
    #[allow(clippy::too_many_arguments)]
    pub(super) fn slice_fill_publishing(
        self: &Arc<Cache>,
        table: usize,
        key: &Arc<Key>,
        meta: &Arc<ObjectMeta>,
        index: u64,
        response: Option<OriginResponse>,
        pace: Option<Arc<Pace>>,
        publish: Option<&dyn Fn()>,
    ) -> (watch::Receiver<FillState>, bool) {
        let mut fills = super::lock(&self.fills);
        let (tx, rx) = watch::channel(FillState::default());
        let viewer = Arc::new(AtomicBool::new(pace.is_none()));
        match fills.get(&(key.hash, index)) {
            Some((version, rx, waits)) if version.same_version(meta) => {
                if pace.is_none() {
                    waits.store(true, Ordering::Relaxed);
                }
                let joined = rx.clone();
                drop(fills);
                if let Some(publish) = publish {
                    publish();
                }
                return (joined, true);
            }
            // A fill of the stored version under way, and this viewer reads an
            // older one (the origin replaced it while the viewer read): this fill
            // runs alone, for this viewer, and will find its version gone. (Not
            // when this version is being published: it is the stored one then.)
            Some((version, _, _))
                if publish.is_none() && self.store.object(&key.hash).is_some_and(|m| m.same_version(version)) => {}
            // None, or a fill of a version the origin has replaced since it
            // began: its bytes are not this version's. It runs on (its slice is
            // not kept), and this fill takes its place for this version's viewers.
            Some(_) | None => {
                fills.insert((key.hash, index), (meta.clone(), rx.clone(), viewer.clone()));
            }
        }
        drop(fills);
        if let Some(publish) = publish {
            publish();
        }
        self.stats.fills.add(1);
        let own = rx.clone();
        let (cache, key, meta) = (self.clone(), key.clone(), meta.clone());
        // A fill that takes over an open's response stays on the open's thread,
        // where that response's connection runs.
        let here = response.is_some();
        let fill = async move {
            let pace = pace.map(|p| (p, viewer));
            let result = cache.run_fill(table, &key, &meta, index, response, &tx, pace).await;
            if let Err(f) = &result {
                cache.stats.fill_failures.add(1);
                tracing::debug!(key = %String::from_utf8_lossy(&key.text), index, "slice fill failed: {f}");
                if *f == Failure::Replaced {
                    cache.store.drop_object(&key.hash, &meta);
                    cache.stats.replaced.add(1);
                }
            }
            tx.send_modify(|s| s.end = Some(result));
            let mut fills = super::lock(&cache.fills);
            // Unless a fill of a newer version has taken its place.
            if fills.get(&(key.hash, index)).is_some_and(|(_, rx, _)| rx.same_channel(&own)) {
                fills.remove(&(key.hash, index));
            }
        };
        if here {
            self.origins.spawn_here(fill);
        } else {
            self.origins.spawn(fill);
        }
        (rx, false)
    }

    /// Starts the fills of the slices after slice `index` of the object `meta`
    /// describes that are neither stored nor being filled: the next one when
    /// `next` (a range going on past this slice), and `read_ahead_slices` of
    /// them. Returns the slices it started.
    pub(super) fn read_ahead(
        self: &Arc<Cache>,
        table: usize,
        key: &Arc<Key>,
        meta: &Arc<ObjectMeta>,
        index: u64,
        next: bool,
    ) -> Vec<u64> {
        let configured = u64::from(self.origins.table(table).read_ahead_slices);
        let n = configured.max(u64::from(next));
        let slices = meta.size.div_ceil(self.slice_bytes);
        let mut started = Vec::new();
        for i in index + 1..(index + 1 + n).min(slices) {
            if self.store.indexed(&key.hash, meta, i) || self.filling(&key.hash, i) {
                continue;
            }
            let (_, joined) = self.slice_fill(table, key, meta, i, None, None);
            if !joined {
                if !(next && i == index + 1) {
                    self.stats.read_ahead.add(1);
                }
                started.push(i);
            }
        }
        started
    }

    #[allow(clippy::too_many_arguments)]
    async fn run_fill(
        &self,
        table: usize,
        key: &Key,
        meta: &ObjectMeta,
        index: u64,
        response: Option<OriginResponse>,
        tx: &watch::Sender<FillState>,
        pace: Option<(Arc<Pace>, Arc<AtomicBool>)>,
    ) -> Result<(), Failure> {
        let (first, last) = slice_bounds(index, self.slice_bytes, meta.size);
        let len = last + 1 - first;
        let mut response = match response {
            Some(r) => r,
            None => {
                let req = OriginRequest {
                    path: key.origin_path.clone(),
                    query: key.origin_query.clone(),
                    via: key.via.clone(),
                    range: Some((first, last)),
                    peers: true,
                    ..OriginRequest::default()
                };
                self.tables[table].origin_request(key.kind);
                let mut r = self.origins.fetch(table, &req).await.map_err(Failure::origin)?;
                check_slice_answer(meta, &mut r, first, last)?;
                r
            }
        };
        let mut sink = self.sink(key, meta, index, len);
        tx.send_modify(|s| s.file = Some(sink.file()));
        let mut written = 0u64;
        let mut publish = Publish::default();
        loop {
            let next = response.chunk();
            tokio::pin!(next);
            // Bytes written but not told yet are told when the next chunk takes
            // longer than the hold to come; the chunk's read goes on meanwhile
            // (never dropped half-way).
            let chunk = loop {
                match publish.deadline {
                    Some(at) => tokio::select! {
                        biased;
                        c = &mut next => break c,
                        () = tokio::time::sleep_until(at) => publish.now(tx, written),
                    },
                    None => break next.await,
                }
            };
            // A failure tells what was written first: a viewer whose range ends
            // within it is not cut.
            let chunk = match chunk {
                Ok(c) => c,
                Err(e) => {
                    publish.now(tx, written);
                    return Err(Failure::origin(e));
                }
            };
            let Some(chunk) = chunk else { break };
            if written + chunk.len() as u64 > len {
                publish.now(tx, written);
                self.abort(sink);
                return Err(Failure::BadResponse(format!("body longer than the {len} bytes asked for")));
            }
            if let Err(e) = write(&sink, &chunk, written) {
                // The store failed mid-slice (disk full...): carry on in memory.
                sink = self.to_memory(sink, written, &e)?;
                tx.send_modify(|s| s.file = Some(sink.file()));
                write(&sink, &chunk, written).map_err(|e| Failure::BadResponse(format!("memory: {e}")))?;
            }
            written += chunk.len() as u64;
            self.stats.origin_bytes.add(chunk.len() as u64);
            publish.wrote(tx, written);
            match &pace {
                Some((p, viewer)) if viewer.load(Ordering::Relaxed) => p.count(chunk.len() as u64),
                Some((p, _)) => {
                    publish.now(tx, written);
                    p.take(chunk.len() as u64).await
                }
                None => {}
            }
        }
        publish.now(tx, written);
        if written != len {
            self.abort(sink);
            return Err(Failure::BadResponse(format!("body of {written} bytes, {len} asked for")));
        }
        match sink {
            Sink::Store(w) => match self.store.commit_slice(w) {
                Ok(_) => self.stats.stored_slices.add(1),
                Err(e) => tracing::debug!("slice not kept: {e}"),
            },
            Sink::Memory(_) => self.stats.unstored_slices.add(1),
        }
        Ok(())
    }

    /// A place for the slice: the store's, or a file in memory when the store
    /// cannot take it (logged once, counted).
    fn sink(&self, key: &Key, meta: &ObjectMeta, index: u64, len: u64) -> Sink {
        match self.store.begin_slice(&key.hash, meta, index, len) {
            Ok(w) => Sink::Store(w),
            Err(e) => {
                self.note_store_error(&e);
                Sink::Memory(Arc::new(memory_file()))
            }
        }
    }

    /// Counts a failure of the store, and logs the first one the store has not
    /// logged itself: a directory that refuses writes (full, read-only...) logs
    /// that once, per directory, when it is marked.
    pub(super) fn note_store_error(&self, e: &StoreError) {
        if matches!(e, StoreError::NoObject | StoreError::Frozen) {
            return;
        }
        self.stats.store_errors.add(1);
        if !matches!(e, StoreError::Unwritable { .. })
            && !LOG_ONCE_STORE.swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            tracing::error!("cache store: {e}; responses are passed through from the origin, not kept (logged once; see linerate_cache_store_errors_total)");
        }
    }

    /// Moves a fill from the store to memory after the store failed (`why`), with
    /// the `written` bytes it had.
    fn to_memory(&self, sink: Sink, written: u64, why: &StoreError) -> Result<Sink, Failure> {
        self.note_store_error(why);
        let Sink::Store(w) = sink else {
            return Err(Failure::BadResponse(format!("memory: {why}")));
        };
        let memory = memory_file();
        let mut buf = vec![0u8; 256 * 1024];
        let mut at = 0;
        while at < written {
            let n = ((written - at) as usize).min(buf.len());
            w.file().read_exact_at(&mut buf[..n], at).map_err(|e| Failure::BadResponse(format!("reread: {e}")))?;
            memory.write_all_at(&buf[..n], at).map_err(|e| Failure::BadResponse(format!("memory: {e}")))?;
            at += n as u64;
        }
        self.store.abort_slice(w);
        Ok(Sink::Memory(Arc::new(memory)))
    }

    fn abort(&self, sink: Sink) {
        if let Sink::Store(w) = sink {
            self.store.abort_slice(w);
        }
    }
}

fn write(sink: &Sink, bytes: &[u8], at: u64) -> Result<(), StoreError> {
    match sink {
        Sink::Store(w) => w.write_at(bytes, at),
        Sink::Memory(f) => Ok(f.write_all_at(bytes, at)?),
    }
}

/// A file in memory for bytes that are sent but not kept.
pub(super) fn memory_file() -> File {
    linerate_sys::memfd("linerate-slice").unwrap_or_else(|e| {
        // memfd_create exists since Linux 3.17; without it, an unlinked file in /tmp.
        tracing::warn!("memfd_create failed ({e}); passing through a temporary file");
        tempfile::tempfile().expect("a temporary file for a passed-through response")
    })
}

/// Refuses an origin's answer that does not fit what was asked (`why`): the
/// failure of the request, also counted among its URL's errors (`bad_response`).
pub(super) fn refuse(r: &mut OriginResponse, why: String) -> Failure {
    r.refuse(&why);
    Failure::BadResponse(why)
}

/// Checks an origin's answer to the request for bytes `first..=last` of the object
/// `meta` describes: a 206 of exactly that range of an object of the same size and
/// version, or a 200 of the whole object when it is that range.
pub(super) fn check_slice_answer(
    meta: &ObjectMeta,
    r: &mut OriginResponse,
    first: u64,
    last: u64,
) -> Result<(), Failure> {
    match r.status {
        206 => {
            let cr = match r.content_range() {
                Ok(Some(cr)) => cr,
                Ok(None) => return Err(refuse(r, "206 without Content-Range".into())),
                Err(e) => return Err(refuse(r, e.to_string())),
            };
            if cr.total.is_some_and(|t| t != meta.size) {
                return Err(Failure::Replaced);
            }
            if cr.first != Some((first, last)) {
                let why = format!("asked for bytes {first}-{last}, got {:?} of {:?}", cr.first, cr.total);
                return Err(refuse(r, why));
            }
        }
        200 if first == 0 && last + 1 == meta.size => {}
        200 => return Err(Failure::BadResponse("the origin ignored Range".into())),
        404 | 410 | 412 => return Err(Failure::Replaced),
        s => return Err(Failure::BadResponse(format!("status {s} to a slice request"))),
    }
    if !same_version(meta, &r.headers) {
        return Err(Failure::Replaced);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_are_aligned_and_the_last_is_short() {
        assert_eq!(slice_bounds(0, 100, 250), (0, 99));
        assert_eq!(slice_bounds(2, 100, 250), (200, 249));
        assert_eq!(slice_bounds(1, 100, 200), (100, 199));
    }

    /// A fill tells its viewers of its first bytes at once, of later ones after a
    /// hold or once a hold's worth of bytes is there, and only of new bytes.
    #[test]
    fn viewers_are_told_of_the_first_bytes_at_once_then_after_a_hold() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        rt.block_on(async {
            let (tx, mut rx) = watch::channel(FillState::default());
            let told = || rx.borrow().written;
            let mut p = Publish::default();
            p.wrote(&tx, 1000);
            assert_eq!((told(), p.deadline), (1000, None));
            let before = tokio::time::Instant::now();
            p.wrote(&tx, 2000);
            p.wrote(&tx, 3000);
            assert_eq!(told(), 1000);
            let due = p.deadline.expect("a deadline for the held bytes");
            assert!(due >= before + HOLD && due <= tokio::time::Instant::now() + HOLD);
            p.wrote(&tx, 1000 + HOLD_BYTES);
            assert_eq!((told(), p.deadline), (1000 + HOLD_BYTES, None));
            p.wrote(&tx, 2000 + HOLD_BYTES);
            p.now(&tx, 2000 + HOLD_BYTES);
            assert_eq!((told(), p.deadline), (2000 + HOLD_BYTES, None));
            rx.borrow_and_update();
            p.now(&tx, 2000 + HOLD_BYTES);
            assert!(!rx.has_changed().unwrap(), "nothing new, nothing told");
        });
    }

    #[test]
    fn failures_map_to_gateway_statuses() {
        let t = Failure::Origin { kind: "timeout", detail: String::new(), timeout: true };
        assert_eq!(t.status(), 504);
        assert_eq!(Failure::Replaced.status(), 502);
        assert_eq!(Failure::origin(OriginError::Loop).status(), 508);
        assert_eq!(Failure::origin(OriginError::Status(503)).status(), 502);
    }
}
