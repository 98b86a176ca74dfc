//! Answering a request for a path: the signed-URL check, the lookup in the
//! worker's open-file cache, the response plan and head, and the body ranges
//! handed to the page-cache layer.

use std::rc::Rc;
use std::sync::Arc;

use linerate_http::conditional::Validators;
use linerate_http::path::{self, TargetError};
use linerate_http::plan::{plan_file, Body, FileInfo};
use linerate_http::{Method, Status};
use linerate_urlauth::Verdict;

use super::cached::{ObjectSource, Source};
use super::simple::{finish_head, start_head};
use super::{Conn, Cut, PATH_BYTES};
use crate::counters::ErrorKind;
use crate::server::cache::Key;
use crate::server::files::{Lookup, LookupError, OpenFile};
use crate::server::pagecache::{PageCache, RangeError};
use crate::transport::{SendError, Transport};

impl<T: Transport, P: PageCache> Conn<'_, T, P> {
    pub(super) async fn respond(&mut self, keep_alive: bool) -> Result<(), Cut> {
        match self.req.method {
            Method::Other => Ok(self.send_error(Status::MethodNotAllowed, keep_alive).await?),
            Method::Options => Ok(self.send_options(keep_alive).await?),
            Method::Get | Method::Head => self.send_target(keep_alive).await,
        }
    }

    async fn send_target(&mut self, keep_alive: bool) -> Result<(), Cut> {
        if self.path.capacity() == 0 {
            self.path.reserve(PATH_BYTES);
        }
        let target = match path::resolve(self.req.target(), &mut self.path) {
            Ok(t) => t,
            Err(TargetError::Escapes | TargetError::ForbiddenByte | TargetError::Malformed | TargetError::Asterisk) => {
                self.worker.counters.error(ErrorKind::BadRequest);
                return Ok(self.send_error(Status::BadRequest, keep_alive).await?);
            }
        };
        let dir_syntax = target.dir_syntax;
        // Signed URLs: after normalisation (a rule's prefix is compared with the path
        // that will be opened), before anything about the file is looked up.
        let signed = {
            let rules = self.worker.signed.borrow();
            match rules.find(&self.path) {
                None => None,
                Some(policy) => {
                    absolute_path(&self.path, dir_syntax, &mut self.scratch);
                    let cookie = self.req.cookie();
                    let now = self.worker.date.borrow_mut().now_secs();
                    Some(policy.check(&linerate_urlauth::Request {
                        path: &self.scratch,
                        query: target.query,
                        cookies: cookie.as_slice(),
                        client: self.peer.ip(),
                        now: u64::try_from(now).unwrap_or(0),
                    }))
                }
            }
        };
        if let Some(verdict) = signed {
            self.ex.signed = Some(verdict);
            self.worker.counters.signed[verdict.index()].add(1);
            let refusal = match verdict {
                Verdict::Allow => None,
                Verdict::Expired => Some(Status::Gone),
                Verdict::Deny(_) => Some(Status::Forbidden),
            };
            if let Some(status) = refusal {
                tracing::debug!(
                    worker = self.worker.index,
                    path = %String::from_utf8_lossy(&self.path),
                    signed = verdict.label(),
                    "signed URL refused"
                );
                return Ok(self.send_error(status, keep_alive).await?);
            }
        }
        // Under an [[origin]] prefix: the pull-through cache answers.
        if let Some(cache) = &self.worker.cache {
            absolute_path(&self.path, dir_syntax, &mut self.scratch);
            if let Some((table, rest)) = cache.origins.route(&self.scratch) {
                let args = &cache.origins.table(table).key_args;
                let mut key = Key::new(&self.scratch, rest, target.query, args);
                let fields = super::cached::raw_fields(
                    &self.buf[self.head_at.0 as usize..self.head_at.1 as usize],
                    &["Via", "Cache-Control", "Accept-Encoding"],
                );
                let gzip_ok =
                    fields.iter().any(|(n, v)| n == "Accept-Encoding" && crate::server::cache::gzip::accepts_gzip(v));
                let only_if_cached =
                    fields.iter().any(|(n, v)| n == "Cache-Control" && linerate_http::freshness::only_if_cached(v));
                key.via = fields.into_iter().find(|(n, _)| n == "Via").map(|(_, v)| v);
                // A peer's request: answered from the store or with 504, never
                // sent on (so it cannot go round a loop, whatever its Via).
                if only_if_cached {
                    let (key, cache) = (Arc::new(key), cache.clone());
                    return self.send_stored(&cache, table, key, keep_alive).await;
                }
                // A request this node sent already: the parents form a loop, and
                // forwarding it again would go round for ever.
                if key.via.as_deref().is_some_and(|v| cache.origins.via_names_me(v)) {
                    cache.origins.refused_loop(&self.scratch, key.via.as_deref().unwrap_or_default());
                    return Ok(self.send_error(Status::LoopDetected, keep_alive).await?);
                }
                let key = Arc::new(key);
                let cache = cache.clone();
                return self.send_cached(&cache, table, key, keep_alive, gzip_ok).await;
            }
        }
        let lookup = self.worker.files.borrow_mut().open(self.settings, &self.path);
        let file = match lookup {
            Ok(Lookup::File(_)) if dir_syntax => return Ok(self.send_error(Status::NotFound, keep_alive).await?),
            Ok(Lookup::File(f)) => f,
            Ok(Lookup::Directory) if !dir_syntax => return Ok(self.send_redirect_to_directory(keep_alive).await?),
            Ok(Lookup::Directory) => match self.find_index() {
                Ok(Some(f)) => f,
                Ok(None) => return Ok(self.send_error(Status::Forbidden, keep_alive).await?),
                Err(e) => return Ok(self.send_lookup_error(e, keep_alive).await?),
            },
            Err(e) => return Ok(self.send_lookup_error(e, keep_alive).await?),
        };
        self.send_file(&file, keep_alive).await
    }

    /// Tries the configured index files in the directory `self.path`; on success
    /// `self.path` names the index file.
    fn find_index(&mut self) -> Result<Option<Rc<OpenFile>>, LookupError> {
        let base = self.path.len();
        for name in &self.settings.config.index {
            self.path.truncate(base);
            if base > 0 {
                self.path.push(b'/');
            }
            self.path.extend_from_slice(name.as_bytes());
            match self.worker.files.borrow_mut().open(self.settings, &self.path) {
                Ok(Lookup::File(f)) => return Ok(Some(f)),
                Ok(Lookup::Directory) | Err(LookupError::NotFound) => continue,
                Err(e) => return Err(e),
            }
        }
        self.path.truncate(base);
        Ok(None)
    }

    async fn send_file(&mut self, file: &Rc<OpenFile>, keep_alive: bool) -> Result<(), Cut> {
        let info = FileInfo {
            len_bytes: file.stat.size_bytes,
            validators: Validators { etag: &file.etag, last_modified_secs: file.stat.mtime_secs() },
            content_type: self.settings.content_type(&self.path),
            now_secs: self.worker.date.borrow_mut().now_secs(),
        };
        self.send_planned(&info, &Source::File(file), keep_alive).await
    }

    /// Plans the response to a GET or HEAD for a representation described by
    /// `info` (preconditions, ranges), writes its head, and sends its body from
    /// `source`: whole, one range, or the parts of a multipart answer.
    pub(super) async fn send_planned(
        &mut self,
        info: &FileInfo<'_>,
        source: &Source<'_>,
        keep_alive: bool,
    ) -> Result<(), Cut> {
        let settings = self.settings;
        let max_ranges = settings.config.limits.max_ranges;
        let plan = plan_file(&self.req, info, max_ranges, self.worker.next_boundary_seed());
        // only-if-cached: every byte the body needs must be stored, else 504.
        if let Source::Object(o) = source {
            let stored = |first: u64, len: u64| o.cache.has_range(o.key, o.meta, first, len);
            let all_stored = !o.stored_only
                || self.req.method == Method::Head
                || match &plan.body {
                    Body::Empty => true,
                    Body::Range(r) => stored(r.first, r.len_bytes()),
                    Body::Multipart(mp) => mp.ranges.iter().all(|r| stored(r.first, r.len_bytes())),
                };
            if !all_stored {
                drop(plan);
                return Ok(self.send_not_stored(o.cache, keep_alive).await?);
            }
        }
        let mut h = start_head(&mut self.head, self.worker, settings, plan.status);
        plan.write_fields(&mut h, info, max_ranges > 0);
        if let Source::Object(o) = source {
            // A playlist: compressed for the viewers that accept gzip.
            if o.vary {
                h.field("Vary", b"Accept-Encoding");
            }
            if o.gzip.is_some() && plan.status == Status::Ok {
                h.field("Content-Encoding", b"gzip");
            }
        }
        if matches!(plan.status, Status::Ok | Status::PartialContent | Status::NotModified) {
            let object = match source {
                Source::Object(o) => Some(&**o.meta),
                Source::File(_) | Source::Memory(_) => None,
            };
            if !settings.config.cache_control.is_empty() {
                h.field("Cache-Control", settings.config.cache_control.as_bytes());
            } else if let Some(meta) = object {
                // The stored lifetime, for the caches downstream (a node asking
                // this one as its parent or peer); with Age, what is left of it.
                let mut n = itoa::Buffer::new();
                let lifetime = meta.fresh_until_ms.saturating_sub(meta.dated_at_ms).max(0) / 1000;
                let mut value = [0u8; 32];
                let text = n.format(lifetime).as_bytes();
                value[..9].copy_from_slice(b"s-maxage=");
                value[9..9 + text.len()].copy_from_slice(text);
                h.field("Cache-Control", &value[..9 + text.len()]);
            }
            if let Some(meta) = object {
                let now_ms = crate::server::cache::unix_now_ms();
                h.field_u64("Age", (now_ms.saturating_sub(meta.dated_at_ms).max(0) / 1000) as u64);
            }
        }
        h.rendered(&settings.cors_fields);
        if let (true, Some(cache)) = (settings.config.debug_headers, self.ex.cache) {
            h.field("X-Cache", cache.label().as_bytes());
        }
        finish_head(h, keep_alive, self.req.version);
        self.worker.counters.response(plan.status);
        self.worker.counters.head_bytes.add(self.head.len() as u64);
        self.ex.status = Some(plan.status);
        self.ex.head_bytes = self.head.len() as u64;
        tracing::trace!(
            worker = self.worker.index,
            status = plan.status.code(),
            path = %String::from_utf8_lossy(&self.path),
            query = self.req.target().contains(&b'?'),
            signed = self.ex.signed.map_or("-", Verdict::label)
        );

        if self.req.method == Method::Head {
            self.mark_first_byte();
            return Ok(self.io.write_all(&self.head, false).await?);
        }
        let sent = match &plan.body {
            Body::Empty => {
                self.mark_first_byte();
                Ok(self.io.write_all(&self.head, false).await?)
            }
            Body::Range(r) => {
                self.io.write_all(&self.head, true).await?;
                self.send_body(source, r.first, r.len_bytes(), true).await
            }
            Body::Multipart(mp) => {
                for (i, r) in mp.ranges.iter().enumerate() {
                    mp.write_part_head(i, info.content_type, info.len_bytes, &mut self.scratch);
                    if i == 0 {
                        // The response head and the first part header leave together.
                        self.head.extend_from_slice(&self.scratch);
                        self.io.write_all(&self.head, true).await?;
                    } else {
                        self.io.write_all(&self.scratch, true).await?;
                    }
                    self.count_memory_body(self.scratch.len());
                    self.send_body(source, r.first, r.len_bytes(), false).await?;
                }
                mp.write_closing(&mut self.scratch);
                self.io.write_all(&self.scratch, false).await?;
                self.count_memory_body(self.scratch.len());
                Ok(())
            }
        };
        if let (Ok(()), Body::Range(r), Source::File(file)) = (&sent, &plan.body, source) {
            if self.worker.page_chooser.choose() {
                self.sample_page_nodes(file, r.first, r.len_bytes());
            }
        }
        sent
    }

    /// Sends a body range from `source`: a local file, or a cached object.
    async fn send_body(&mut self, source: &Source<'_>, offset: u64, len: u64, read_on: bool) -> Result<(), Cut> {
        match source {
            Source::File(file) => Ok(self.send_range(file, offset, len, read_on).await?),
            Source::Memory(file) => {
                self.mark_first_byte();
                Ok(self.io.send_file(file, offset, len).await?)
            }
            Source::Object(ObjectSource { gzip: Some(g), .. }) => {
                self.mark_first_byte();
                Ok(self.io.send_file(&g.file, offset, len).await?)
            }
            Source::Object(o) => {
                let worker = self.worker;
                let pages = worker.pages.as_ref();
                let (io, progress) = (&mut self.io, &mut self.ex.progress);
                Ok(o.cache
                    .send_range(io, pages, &worker.slices, o.table, o.key, o.meta, offset, len, read_on, progress)
                    .await?)
            }
        }
    }

    /// Sends a body range: through the page-cache path when there is one (so a
    /// cold range is read by the fill pool, never by this worker), else straight to
    /// the transport.
    async fn send_range(
        &mut self,
        file: &Rc<OpenFile>,
        offset: u64,
        len: u64,
        read_on: bool,
    ) -> Result<(), RangeError> {
        let worker = self.worker;
        match &worker.pages {
            Some(pages) => pages.send_range(&mut self.io, file, offset, len, read_on, &mut self.ex.progress).await,
            None => {
                self.mark_first_byte();
                Ok(self.io.send_file(&file.file, offset, len).await?)
            }
        }
    }

    /// Where the pages just sent sat: counts the bytes from another node's pages,
    /// and the crossings (remote page, connection from another domain) per byte.
    fn sample_page_nodes(&self, file: &OpenFile, offset: u64, len: u64) {
        let c = &self.worker.counters;
        let Some(mine) = c.node else { return };
        let Ok(nodes) = linerate_sys::numa::page_cache_nodes(std::os::fd::AsFd::as_fd(&file.file), offset, len, 8)
        else {
            return;
        };
        let known: Vec<u32> = nodes.into_iter().flatten().collect();
        if known.is_empty() {
            return;
        }
        let remote = known.iter().filter(|&&n| n as usize != mine).count() as u64;
        let remote_bytes = len * remote / known.len() as u64;
        c.page_sampled_bytes.add(len);
        c.remote_page_bytes.add(remote_bytes);
        c.crossing_bytes.add(remote_bytes + if self.cross_domain { len } else { 0 });
    }

    async fn send_lookup_error(&mut self, e: LookupError, keep_alive: bool) -> Result<(), SendError> {
        let status = match e {
            LookupError::NotFound => Status::NotFound,
            LookupError::Forbidden => Status::Forbidden,
            LookupError::Unavailable => {
                tracing::warn!(worker = self.worker.index, "out of file descriptors opening a file: 503");
                Status::ServiceUnavailable
            }
            LookupError::Io(e) => {
                tracing::error!(worker = self.worker.index, path = %String::from_utf8_lossy(&self.path), "cannot open: {e}");
                Status::InternalServerError
            }
        };
        self.send_error(status, keep_alive).await
    }
}

/// The path a signed-URL policy checks: `/`, the normalised relative path, and a
/// trailing `/` when the target had directory syntax (nginx's `$uri`).
pub(super) fn absolute_path(relative: &[u8], dir_syntax: bool, buf: &mut Vec<u8>) {
    buf.clear();
    buf.push(b'/');
    buf.extend_from_slice(relative);
    if dir_syntax && !relative.is_empty() {
        buf.push(b'/');
    }
}
