//! Answering a request under an `[[origin]]` prefix from the pull-through cache:
//! the object's head from the cache (a hit, or the origin's answer collapsed with
//! every other viewer's), then exactly the response a local file would get (the
//! same plan, preconditions and ranges), its body sent slice by slice; or, for an
//! object that may not be stored, the origin's own answer passed through.

use std::sync::Arc;
use std::time::Instant;

use http::header::HeaderName;
use linerate_http::conditional::Validators;
use linerate_http::plan::FileInfo;
use linerate_http::{date, Method, Status, Version};

use super::simple::{finish_head, start_head};
use super::{Conn, Cut};
use crate::server::cache::gzip::{self, Gzipped};
use crate::server::cache::{live, serve, Cache, CacheStatus, Key, Live, Opened};
use crate::server::files::OpenFile;
use crate::server::pagecache::PageCache;
use crate::store::ObjectMeta;
use crate::transport::Transport;

/// Where a response's body comes from.
pub(super) enum Source<'a> {
    File(&'a std::rc::Rc<OpenFile>),
    Object(ObjectSource<'a>),
    /// A file in memory: a live answer, complete but not (yet) stored.
    Memory(&'a std::fs::File),
}

/// A cached object, for sending ranges of it.
pub(super) struct ObjectSource<'a> {
    pub cache: &'a Arc<Cache>,
    pub table: usize,
    pub key: &'a Arc<Key>,
    pub meta: &'a Arc<ObjectMeta>,
    /// For `only-if-cached`: every byte of the body must be stored (else 504).
    pub stored_only: bool,
    /// The compressed representation sent instead of the stored bytes.
    pub gzip: Option<&'a Gzipped>,
    /// A playlist: the answer depends on `Accept-Encoding`.
    pub vary: bool,
}

/// Who an object's response is for.
#[derive(Clone, Copy)]
enum Asker {
    /// A viewer; `gzip_ok`: its `Accept-Encoding` accepts gzip.
    Viewer { gzip_ok: bool },
    /// An `only-if-cached` request (a peer's): every byte of the body must be
    /// stored (else 504), sent as stored.
    StoredOnly,
}

impl<T: Transport, P: PageCache> Conn<'_, T, P> {
    pub(super) async fn send_cached(
        &mut self,
        cache: &Arc<Cache>,
        table: usize,
        key: Arc<Key>,
        keep_alive: bool,
        gzip_ok: bool,
    ) -> Result<(), Cut> {
        let started = Instant::now();
        let opened = cache.open(table, &key, first_wanted(self.req.range())).await;
        match opened {
            Opened::Object { meta, status } => {
                // X-Cache says MISS when the first slice a body needs is not
                // indexed (only asked when the field is sent: the log and the
                // counters go by what the body took, below).
                let guess = match status {
                    CacheStatus::Hit
                        if self.settings.config.debug_headers
                            && self.req.method == Method::Get
                            && !cache.has_slice(&key, &meta, first_wanted(self.req.range())) =>
                    {
                        CacheStatus::Miss
                    }
                    s => s,
                };
                self.note_cache(guess, started);
                let sent = match Status::from_code(meta.status) {
                    Some(Status::Ok) => {
                        self.send_object(cache, table, &key, &meta, keep_alive, Asker::Viewer { gzip_ok }).await
                    }
                    Some(s) => Ok(self.send_error(s, keep_alive).await?),
                    None => Ok(self.send_error(Status::BadGateway, keep_alive).await?),
                };
                // What the log and the counters say: a miss when bytes came from the
                // origin, else what the head was.
                match (status, self.ex.progress.from_origin) {
                    (CacheStatus::Hit, true) => {
                        self.ex.cache = Some(CacheStatus::Miss);
                        // To the response's first bytes: the origin's, when the
                        // first slice sent was the one missing.
                        let first = self.ex.progress.first_byte.unwrap_or_else(Instant::now);
                        self.ex.origin_us = Some(micros(first.saturating_duration_since(started)));
                    }
                    (CacheStatus::Hit, false) => self.note_cache(CacheStatus::Hit, started),
                    _ => {}
                }
                cache.count(self.ex.cache.unwrap_or(status));
                sent
            }
            Opened::Live(live) => {
                self.note_cache(CacheStatus::Miss, started);
                cache.count(CacheStatus::Miss);
                self.send_live(&live, keep_alive).await
            }
            Opened::Pass(_) => {
                self.note_cache(CacheStatus::Pass, started);
                self.send_passed(cache, table, &key, keep_alive).await
            }
            Opened::Status(code) => {
                self.note_cache(CacheStatus::Miss, started);
                let status = Status::from_code(code).filter(|s| (400..500).contains(&s.code()));
                Ok(self.send_error(status.unwrap_or(Status::BadGateway), keep_alive).await?)
            }
            Opened::Failed(f) => {
                self.note_cache(CacheStatus::Miss, started);
                tracing::debug!(worker = self.worker.index, path = %String::from_utf8_lossy(&self.path), "origin: {f}");
                let status = match f.status() {
                    504 => Status::GatewayTimeout,
                    508 => Status::LoopDetected,
                    _ => Status::BadGateway,
                };
                Ok(self.send_error(status, keep_alive).await?)
            }
        }
    }

    /// A request with `Cache-Control: only-if-cached` (a peer's): answered from
    /// the store when the object is stored and fresh, has the origin's `ETag`
    /// and `Last-Modified`, and every byte the response needs is stored, else
    /// 504 at once; never a request onwards
    /// (RFC 9111 section 5.2.1.7). A 504 is counted
    /// (`linerate_cache_only_if_cached_misses_total`) and logged as a MISS.
    pub(super) async fn send_stored(
        &mut self,
        cache: &Arc<Cache>,
        table: usize,
        key: Arc<Key>,
        keep_alive: bool,
    ) -> Result<(), Cut> {
        let started = Instant::now();
        // An object the origin gave no ETag or no Last-Modified is not handed
        // to peers: the validators made up here differ from node to node, so a
        // slice the requester later has from elsewhere would look like another
        // version.
        let Some(meta) =
            cache.stored_fresh(&key).filter(|m| m.status != 200 || (m.etag.is_some() && m.last_modified.is_some()))
        else {
            return Ok(self.send_not_stored(cache, keep_alive).await?);
        };
        self.note_cache(CacheStatus::Hit, started);
        let sent = match Status::from_code(meta.status) {
            Some(Status::Ok) => self.send_object(cache, table, &key, &meta, keep_alive, Asker::StoredOnly).await,
            Some(s) => Ok(self.send_error(s, keep_alive).await?),
            None => Ok(self.send_error(Status::BadGateway, keep_alive).await?),
        };
        if self.ex.status != Some(Status::GatewayTimeout) {
            if meta.status != 200 {
                cache.stats.negative_hits.add(1);
            }
            cache.count(CacheStatus::Hit);
        }
        sent
    }

    /// The 504 of an `only-if-cached` request whose answer is not all stored.
    pub(super) async fn send_not_stored(
        &mut self,
        cache: &Arc<Cache>,
        keep_alive: bool,
    ) -> Result<(), crate::transport::SendError> {
        cache.stats.only_if_cached_misses.add(1);
        self.ex.cache = Some(CacheStatus::Miss);
        self.ex.origin_us = None;
        self.send_error(Status::GatewayTimeout, keep_alive).await
    }

    /// The cache status and, unless it was a hit, the time the origin took.
    fn note_cache(&mut self, status: CacheStatus, started: Instant) {
        self.ex.cache = Some(status);
        self.ex.origin_us = (status != CacheStatus::Hit).then(|| micros(started.elapsed()));
    }

    async fn send_object(
        &mut self,
        cache: &Arc<Cache>,
        table: usize,
        key: &Arc<Key>,
        meta: &Arc<ObjectMeta>,
        keep_alive: bool,
        asker: Asker,
    ) -> Result<(), Cut> {
        let (stored_only, gzip_ok) = match asker {
            Asker::Viewer { gzip_ok } => (false, gzip_ok),
            Asker::StoredOnly => (true, false),
        };
        // A response's validators are the origin's; an origin without an ETag gets
        // one made of the object's size and when it was stored (it changes when the
        // object is fetched again).
        let made_etag;
        let etag = match &meta.etag {
            Some(e) => e.as_slice(),
            None => {
                made_etag = format!("\"{:x}-{:x}\"", meta.size, meta.dated_at_ms.div_euclid(1000)).into_bytes();
                &made_etag
            }
        };
        let last_modified_secs =
            meta.last_modified.as_deref().and_then(date::parse_secs).unwrap_or(meta.dated_at_ms.div_euclid(1000));
        let content_type = meta
            .content_type
            .as_deref()
            .and_then(|t| std::str::from_utf8(t).ok())
            .unwrap_or_else(|| self.settings.content_type(&self.path));
        // A small playlist, whole, to a viewer accepting gzip: compressed (in
        // memory, off this worker); a range is answered from the stored bytes.
        let vary = gzip::is_playlist(content_type.as_bytes());
        let wanted = gzip_ok
            && !stored_only
            && self.req.range().is_none()
            && gzip::compressible(content_type.as_bytes(), meta.size);
        let gzipped = if wanted { cache.gzipped(key, meta).await } else { None };
        let gzip_etag;
        let (etag, len_bytes) = match &gzipped {
            Some(g) => {
                gzip_etag = gzip::gzip_etag(etag);
                (gzip_etag.as_slice(), g.len)
            }
            None => (etag, meta.size),
        };
        let info = FileInfo {
            len_bytes,
            validators: Validators { etag, last_modified_secs },
            content_type,
            now_secs: self.worker.date.borrow_mut().now_secs(),
        };
        let gzip = gzipped.as_deref();
        let source = Source::Object(ObjectSource { cache, table, key, meta, stored_only, gzip, vary });
        self.send_planned(&info, &source, keep_alive).await
    }

    /// An answer of unknown length (docs/CACHE.md, "Live"): while it arrives, a
    /// GET without `Range` follows it (chunked to HTTP/1.1 viewers, ended by the
    /// close for HTTP/1.0 ones) and a HEAD gets the head alone; a request with a
    /// `Range`, or one made once the body is whole, waits for its end and is
    /// answered as any object is (ranges, conditionals, `Content-Length`).
    async fn send_live(&mut self, live: &Live, keep_alive: bool) -> Result<(), Cut> {
        if self.req.range().is_some() || live.ended() {
            let size = match live.complete().await {
                Ok(size) => size,
                Err(f) => {
                    tracing::debug!(worker = self.worker.index, path = %String::from_utf8_lossy(&self.path), "origin: {f}");
                    return Ok(self
                        .send_error(Status::from_code(f.status()).unwrap_or(Status::BadGateway), keep_alive)
                        .await?);
                }
            };
            let made_etag;
            let etag = match &live.etag {
                Some(e) => e.as_slice(),
                None => {
                    made_etag = format!("\"{:x}-{:x}\"", size, live.stored_at).into_bytes();
                    &made_etag
                }
            };
            let content_type = live
                .content_type
                .as_deref()
                .and_then(|t| std::str::from_utf8(t).ok())
                .unwrap_or_else(|| self.settings.content_type(&self.path));
            let info = FileInfo {
                len_bytes: size,
                validators: Validators {
                    etag,
                    last_modified_secs: live
                        .last_modified
                        .as_deref()
                        .and_then(date::parse_secs)
                        .unwrap_or(live.stored_at),
                },
                content_type,
                now_secs: self.worker.date.borrow_mut().now_secs(),
            };
            let file = live.file();
            return self.send_planned(&info, &Source::Memory(&file), keep_alive).await;
        }
        let head = self.req.method == Method::Head;
        let chunked = self.req.version != Version::Http10;
        let keep_alive = keep_alive && chunked;
        let mut h = start_head(&mut self.head, self.worker, self.settings, Status::Ok);
        let content_type =
            live.content_type.as_deref().unwrap_or_else(|| self.settings.content_type(&self.path).as_bytes());
        h.field("Content-Type", content_type);
        for (name, v) in [("ETag", &live.etag), ("Last-Modified", &live.last_modified)] {
            if let Some(v) = v {
                h.field(name, v);
            }
        }
        if chunked {
            h.field("Transfer-Encoding", b"chunked");
        }
        if !self.settings.config.cache_control.is_empty() {
            h.field("Cache-Control", self.settings.config.cache_control.as_bytes());
        }
        h.rendered(&self.settings.cors_fields);
        if self.settings.config.debug_headers {
            h.field("X-Cache", CacheStatus::Miss.label().as_bytes());
        }
        finish_head(h, keep_alive, self.req.version);
        self.worker.counters.response(Status::Ok);
        self.worker.counters.head_bytes.add(self.head.len() as u64);
        self.ex.status = Some(Status::Ok);
        self.ex.head_bytes = self.head.len() as u64;
        self.mark_first_byte();
        self.io.write_all(&self.head, !head).await?;
        if !head {
            let framing = live::follow_live(&mut self.io, live, chunked, &mut self.ex.progress).await?;
            self.count_memory_body(framing as usize);
        }
        if !keep_alive {
            return Err(Cut::Close);
        }
        Ok(())
    }

    /// An object that may not be stored: the origin is asked for this viewer alone
    /// and its answer relayed (status, the fields in `pass::RELAYED`, the body as it
    /// arrives). Without a length from the origin, the body ends with the connection.
    async fn send_passed(
        &mut self,
        cache: &Arc<Cache>,
        table: usize,
        key: &Arc<Key>,
        keep_alive: bool,
    ) -> Result<(), Cut> {
        let head = self.req.method == Method::Head;
        let range = single_range(self.req.range());
        let forwarded = self.forwarded(&cache.origins.table(table).forward_headers);
        let passed = match cache.pass(table, key, head, range, forwarded).await {
            Ok(p) => p,
            Err(f) => {
                let status = match f.status() {
                    504 => Status::GatewayTimeout,
                    508 => Status::LoopDetected,
                    _ => Status::BadGateway,
                };
                return Ok(self.send_error(status, keep_alive).await?);
            }
        };
        let status = match Status::from_code(passed.status) {
            Some(s) if s.code() < 300 || (400..500).contains(&s.code()) || s == Status::NotModified => s,
            _ => Status::BadGateway,
        };
        let keep_alive = keep_alive && (passed.len.is_some() || head || status.is_bodiless());
        let mut h = start_head(&mut self.head, self.worker, self.settings, status);
        for (name, value) in &passed.fields {
            h.field(name.as_str(), value.as_bytes());
        }
        if let Some(len) = passed.len {
            h.field_u64("Content-Length", len);
        }
        h.rendered(&self.settings.cors_fields);
        finish_head(h, keep_alive, self.req.version);
        self.worker.counters.response(status);
        self.worker.counters.head_bytes.add(self.head.len() as u64);
        self.ex.status = Some(status);
        self.ex.head_bytes = self.head.len() as u64;
        let bodiless = head || status.is_bodiless() || passed.len == Some(0);
        self.mark_first_byte();
        self.io.write_all(&self.head, !bodiless).await?;
        if !bodiless {
            serve::follow(&mut self.io, passed.body, 0, passed.len, &mut self.ex.progress).await?;
        }
        if !keep_alive {
            return Err(Cut::Close);
        }
        Ok(())
    }

    /// The viewer's fields named in `names`, as the request carried them.
    fn forwarded(&self, names: &[String]) -> Vec<(String, Vec<u8>)> {
        if names.is_empty() {
            return Vec::new();
        }
        raw_fields(&self.buf[self.head_at.0 as usize..self.head_at.1 as usize], names)
    }
}

/// The fields named in `names` of a raw request head (names compared without
/// case; a repeated field is joined with ", ").
pub(super) fn raw_fields<S: AsRef<str>>(head: &[u8], names: &[S]) -> Vec<(String, Vec<u8>)> {
    let mut out: Vec<(String, Vec<u8>)> = Vec::new();
    for line in head.split(|&b| b == b'\n').skip(1) {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let Some(colon) = line.iter().position(|&b| b == b':') else { continue };
        let (name, value) = (&line[..colon], line[colon + 1..].trim_ascii());
        let Some(n) = names.iter().map(AsRef::as_ref).find(|n| n.as_bytes().eq_ignore_ascii_case(name)) else {
            continue;
        };
        if HeaderName::from_bytes(name).is_err() {
            continue;
        }
        match out.iter_mut().find(|(have, _)| have.as_str() == n) {
            Some((_, v)) => {
                v.extend_from_slice(b", ");
                v.extend_from_slice(value);
            }
            None => out.push((n.to_string(), value.to_vec())),
        }
    }
    out
}

/// The first byte a Range field asks for (`bytes=N-...`), else 0: on a miss, the
/// slice holding it is fetched with the object's head.
fn micros(d: std::time::Duration) -> u32 {
    u32::try_from(d.as_micros()).unwrap_or(u32::MAX)
}

fn first_wanted(range: Option<&[u8]>) -> u64 {
    let Some(spec) = range.and_then(|r| r.trim_ascii().strip_prefix(b"bytes=")) else { return 0 };
    let first = spec.split(|&b| b == b',' || b == b'-').next().unwrap_or_default().trim_ascii();
    std::str::from_utf8(first).ok().and_then(|s| s.parse().ok()).unwrap_or(0)
}

/// A Range field of one closed range (`bytes=A-B`), passed to the origin as it is;
/// any other form asks for the whole body.
fn single_range(range: Option<&[u8]>) -> Option<(u64, u64)> {
    let spec = range?.trim_ascii().strip_prefix(b"bytes=")?;
    let s = std::str::from_utf8(spec).ok()?;
    let (a, b) = s.split_once('-')?;
    let (a, b): (u64, u64) = (a.trim().parse().ok()?, b.trim().parse().ok()?);
    (a <= b && !s.contains(',')).then_some((a, b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_wanted_byte_is_read_from_the_range_field() {
        assert_eq!(first_wanted(Some(b"bytes=1048576-")), 1048576);
        assert_eq!(first_wanted(Some(b"bytes=500-999,0-9")), 500);
        assert_eq!(first_wanted(Some(b"bytes=-500")), 0, "a suffix: its place is not known yet");
        assert_eq!(first_wanted(None), 0);
        assert_eq!(single_range(Some(b"bytes=0-99")), Some((0, 99)));
        assert_eq!(single_range(Some(b"bytes=0-99,200-299")), None);
        assert_eq!(single_range(Some(b"bytes=-5")), None);
    }

    #[test]
    fn forwarded_fields_are_read_from_the_raw_head() {
        let head = b"GET /a HTTP/1.1\r\nHost: x\r\nX-Request-Id: 1\r\nx-request-id: 2\r\nCookie: c\r\n\r\n";
        let got = raw_fields(head, &["X-Request-Id".to_string()]);
        assert_eq!(got, vec![("X-Request-Id".to_string(), b"1, 2".to_vec())]);
        assert!(raw_fields(head, &["Accept".to_string()]).is_empty());
    }
}
