//! One connection's life: read a head, discard any body, answer, repeat.
//!
//! ```text
//!  accept ──► read head ──► discard body ──► respond ──► keep-alive? ──yes──┐
//!               ▲  │ 400/408/413/414/431/505 + close    │ no: close        │
//!               │  ▼                                     ▼                  │
//!               └───────────────── next request (pipelined bytes first) ◄───┘
//! ```
//!
//! The code is generic over [`Transport`]: it writes heads and asks for file
//! ranges to be sent, and never knows whether they leave by `sendfile`, kernel TLS
//! or user-space TLS. Requests are answered strictly in order; bytes of a pipelined
//! next request stay in the buffer and are parsed once the current response is out.
//!
//! Timeouts: the first head must arrive within `timeouts.header` of the accept and
//! a later one within `timeouts.keepalive` of the previous response; once a head's
//! first byte is in, the rest (and any body) must follow within `timeouts.header`
//! of it, however slowly it trickles. Sending is bounded by `timeouts.send` in the
//! transport.

use std::cell::{Cell, RefCell};
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

use linerate_http::date::DateCache;
use tokio::sync::Notify;

use linerate_http::body::{Discard, DiscardError};
use linerate_http::conditional::Validators;
use linerate_http::path::{self, TargetError};
use linerate_http::plan::{plan_file, Body, FileInfo};
use linerate_http::request::{self, BodyFraming, Parsed};
use linerate_http::response::HeadWriter;
use linerate_http::{Method, Request, RequestError, Status, Version};
use linerate_urlauth::{Rules, Verdict};

use super::access_log::{Record, WorkerLog};
use super::files::{FileCache, Lookup, LookupError, OpenFile};
use super::fill::{self, FillPool};
use super::residency;
use super::senders::{PendingDrop, DROP_DELAY};
use super::settings::Settings;
use crate::counters::tcp_info::{Chooser, Sampler, TcpFigures};
use crate::counters::{ConnState, ErrorKind, StateTracker, WorkerCounters};
use crate::transport::{SendError, Transport};

/// First allocation of a response head and of a request's path (they are freed
/// between requests): room for a typical one at once, not grown by doubling.
const HEAD_BYTES: usize = 512;
const PATH_BYTES: usize = 128;

/// What a connection needs from the worker that owns it, and nothing more: the
/// worker's open-file cache, Date cache, counters, fill pool and shutdown signal.
/// A connection never sees the accept loop or other connections, so this module
/// can be tested with an in-memory transport and a context of its own.
pub struct Context {
    pub index: usize,
    pub files: RefCell<FileCache>,
    pub date: RefCell<DateCache>,
    pub counters: Arc<WorkerCounters>,
    /// The fill pool, when `fill.enabled`: cold ranges are read there.
    pub fill: Option<Arc<FillPool>>,
    /// This worker's demand counts for the fill pool's page-cache admission.
    pub admission: fill::Tally,
    /// Picks the responses whose page-cache nodes are sampled.
    pub page_chooser: Chooser,
    /// `X-Linerate-Worker: ...` (debug_headers), pre-rendered.
    pub debug_field: Vec<u8>,
    /// The newest signed-URL rules, replaced at each reload. Every request checks
    /// against these rather than its connection's settings, so a key added or removed
    /// by a reload counts for connections accepted before it too: keys rotate with no
    /// window in which a long keep-alive connection still lacks the new one.
    pub signed: RefCell<Arc<Rules>>,
    shutting_down: Cell<bool>,
    shutdown: Notify,
    /// Counter and per-process salt for multipart boundaries.
    boundary_seq: Cell<u64>,
    boundary_salt: u64,
    /// The worker's access-log buffer, when `access_log.path` is set.
    pub log: Option<WorkerLog>,
}

impl Context {
    pub fn new(
        index: usize,
        files: FileCache,
        counters: Arc<WorkerCounters>,
        fill: Option<Arc<FillPool>>,
        page_chooser: Chooser,
        debug_field: Vec<u8>,
        boundary_salt: u64,
    ) -> Context {
        Context {
            index,
            files: RefCell::new(files),
            date: RefCell::new(DateCache::default()),
            counters,
            fill,
            admission: fill::Tally::default(),
            page_chooser,
            debug_field,
            signed: RefCell::new(Arc::new(Rules::new())),
            shutting_down: Cell::new(false),
            shutdown: Notify::new(),
            boundary_seq: Cell::new(0),
            boundary_salt,
            log: None,
        }
    }

    /// Gives the connections an access log to write to.
    pub fn with_log(mut self, log: Option<WorkerLog>) -> Context {
        self.log = log;
        self
    }

    pub fn is_shutting_down(&self) -> bool {
        self.shutting_down.get()
    }

    /// Starts shutdown: idle connections close, busy ones finish their response.
    pub fn begin_shutdown(&self) {
        self.shutting_down.set(true);
        self.shutdown.notify_waiters();
    }

    /// Resolves when shutdown begins (at once if it already has).
    pub async fn shutdown_started(&self) {
        let notified = self.shutdown.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if !self.shutting_down.get() {
            notified.await;
        }
    }

    /// A number that differs for every multipart response of this process.
    pub fn next_boundary_seed(&self) -> u64 {
        let n = self.boundary_seq.get().wrapping_add(1);
        self.boundary_seq.set(n);
        n ^ self.boundary_salt
    }
}

/// What the accept path learned about a connection.
pub struct ConnInfo {
    pub peer: SocketAddr,
    /// Set for the connections chosen for TCP_INFO sampling.
    pub sampler: Option<Sampler>,
    /// The SYN arrived in another silo than this worker's.
    pub cross_domain: bool,
    /// The TLS session, for HTTPS connections.
    pub tls: Option<TlsInfo>,
}

/// What the access log says about a TLS session.
pub struct TlsInfo {
    pub version: &'static str,
    pub cipher: &'static str,
    pub sni: Option<Box<str>>,
}

/// The response in progress, for its access-log record. Tracked only when the
/// worker has an access log and this response is in the sample.
#[derive(Default)]
struct Exchange {
    /// When the request head was complete (the record's wall-clock time is worked
    /// out from it: one clock read, not two).
    started: Option<Instant>,
    /// The format prints duration and time to first byte: read the clock for them.
    timed: bool,
    status: Option<Status>,
    head_bytes: u64,
    /// Body bytes sent from memory: multipart part heads, error pages.
    memory_body_bytes: u64,
    /// `body_bytes_sent()` of the transport when the response started.
    file_bytes_before: u64,
    /// When the first bytes of the response were handed to the kernel.
    first_byte: Option<Instant>,
    /// A body range waited for a disk fill.
    filled: bool,
    /// The signed-URL verdict, when the path is under a signed prefix.
    signed: Option<Verdict>,
}

/// Serves one connection until it closes.
pub async fn serve<T: Transport>(io: T, worker: &Context, settings: &Settings, info: ConnInfo) {
    let ConnInfo { sampler, cross_domain, peer, tls } = info;
    let mut state = StateTracker::new(&worker.counters, ConnState::Reading);
    let mut conn = Conn {
        io,
        worker,
        settings,
        buf: Vec::new(),
        pos: 0,
        scanned: 0,
        req: Request::default(),
        head: Vec::new(),
        scratch: Vec::new(),
        path: Vec::new(),
        served: 0,
        body_bytes_counted: 0,
        cross_domain,
        peer,
        tls,
        ex: Exchange::default(),
        tcp: None,
    };
    let ending = conn.run(&mut state, sampler.as_ref()).await;
    conn.count_body_bytes();
    if let Some(s) = &sampler {
        s.sample(&worker.counters.tcp);
    }
    let linger = matches!(ending, Ending::Linger) || conn.pos < conn.buf.len();
    conn.io.close(linger).await;
}

enum Ending {
    /// Close now: the client is gone, or asked to close and sent nothing more.
    Quiet,
    /// Close after an error response or with requests possibly still in flight:
    /// shut the sending side, drain what the client sends for a moment, then close.
    Linger,
}

/// Why no head could be read.
enum HeadEnd {
    /// The client closed, was idle past the keep-alive timeout, or shutdown began.
    Closed,
    /// A head started arriving but did not complete in time.
    Timeout,
    Bad(RequestError),
    Io,
}

struct Conn<'a, T> {
    io: T,
    worker: &'a Context,
    settings: &'a Settings,
    /// Received bytes; `buf[pos..]` are not consumed yet. Like the other buffers
    /// below, it is freed while the connection waits for a request with nothing
    /// received (see `release_buffers`): idle viewers hold no buffers.
    buf: Vec<u8>,
    pos: usize,
    /// `buf[..scanned]` has been searched for the end of the head.
    scanned: usize,
    req: Request,
    /// The response head being built.
    head: Vec<u8>,
    /// Multipart part headers.
    scratch: Vec<u8>,
    /// The decoded path of the current request, relative to the root.
    path: Vec<u8>,
    served: u64,
    body_bytes_counted: u64,
    cross_domain: bool,
    peer: SocketAddr,
    tls: Option<TlsInfo>,
    ex: Exchange,
    /// The last TCP_INFO sample of a sampled connection.
    tcp: Option<TcpFigures>,
}

impl<T: Transport> Conn<'_, T> {
    /// What is awaited here stays in the connection's future for its whole life, so
    /// responses, error answers and the rare `100 Continue` are boxed while they run:
    /// an idle connection's future then holds little more than its state.
    async fn run(&mut self, state: &mut StateTracker<'_>, sampler: Option<&Sampler>) -> Ending {
        loop {
            if self.pos == self.buf.len() {
                self.release_buffers();
            }
            self.req.clear();
            let head_len = match self.read_head(state).await {
                Ok(n) => n,
                // Idle when shutdown began: a request may be on its way, and closing
                // with it unread would reset the connection; linger so the client
                // sees an orderly close and retries elsewhere.
                Err(HeadEnd::Closed) if self.worker.is_shutting_down() => return Ending::Linger,
                Err(HeadEnd::Closed) => return Ending::Quiet,
                Err(HeadEnd::Io) => {
                    self.worker.counters.error(ErrorKind::Reset);
                    return Ending::Quiet;
                }
                Err(HeadEnd::Timeout) => {
                    self.worker.counters.error(ErrorKind::Timeout);
                    self.begin_exchange();
                    let _ = Box::pin(self.send_error(Status::RequestTimeout, false)).await;
                    self.log_exchange();
                    return Ending::Linger;
                }
                Err(HeadEnd::Bad(e)) => {
                    tracing::debug!(worker = self.worker.index, "{e}");
                    self.worker.counters.error(ErrorKind::BadRequest);
                    self.begin_exchange();
                    let _ = Box::pin(self.send_error(e.status(), false)).await;
                    self.log_exchange();
                    return Ending::Linger;
                }
            };
            self.begin_exchange();
            self.pos += head_len;
            self.scanned = self.pos;
            if let Err(status) = self.discard_body().await {
                if let Some(status) = status {
                    self.worker.counters.error(ErrorKind::BadRequest);
                    let _ = Box::pin(self.send_error(status, false)).await;
                    self.log_exchange();
                }
                return Ending::Linger;
            }
            self.served += 1;
            let max = self.settings.config.limits.max_requests_per_connection;
            let keep_alive = self.req.keep_alive
                && !self.worker.is_shutting_down()
                && (max == 0 || self.served < max)
                && !self.io.wants_close();
            state.set(ConnState::Sending);
            // The response's future is boxed for the response's time only: inline,
            // the send path's state would sit in every idle connection's future too.
            let result = match sampler {
                None => Box::pin(self.respond(keep_alive)).await,
                Some(s) => {
                    let worker = self.worker;
                    let interval = self.settings.config.stats.tcp_info_interval;
                    let result = {
                        let mut respond = Box::pin(self.respond(keep_alive));
                        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
                        loop {
                            tokio::select! {
                                r = &mut respond => break r,
                                _ = tick.tick() => { s.sample(&worker.counters.tcp); }
                            }
                        }
                    };
                    self.tcp = s.sample(&worker.counters.tcp).or(self.tcp);
                    result
                }
            };
            self.count_body_bytes();
            self.log_exchange();
            match result {
                Ok(()) => {}
                Err(e) => {
                    let kind = match e {
                        SendError::Timeout => ErrorKind::Timeout,
                        SendError::TooSlow => ErrorKind::SlowClient,
                        SendError::Truncated => ErrorKind::Truncated,
                        SendError::Fill(_) => ErrorKind::Disk,
                        SendError::Io(_) => ErrorKind::Reset,
                    };
                    if kind == ErrorKind::Truncated {
                        tracing::warn!(path = %String::from_utf8_lossy(&self.path), "file shrank while being sent; connection closed");
                    }
                    self.worker.counters.error(kind);
                    return Ending::Quiet;
                }
            }
            if !keep_alive {
                // The client wanted to keep going but we close: it may have sent more.
                return if self.req.keep_alive { Ending::Linger } else { Ending::Quiet };
            }
        }
    }

    /// Counts response bytes after the head that left from memory (multipart part
    /// headers, error pages): with the file bytes the transport counts, the body
    /// total is exactly what clients received after the heads.
    fn count_memory_body(&mut self, n: usize) {
        self.worker.counters.body_bytes[T::KIND as usize].add(n as u64);
        self.ex.memory_body_bytes += n as u64;
    }

    /// Starts tracking a response for the access log.
    fn begin_exchange(&mut self) {
        self.io.begin_response();
        let Some(log) = self.worker.log.as_ref() else { return };
        let config = &self.settings.config.access_log;
        self.ex = if log.wants_next(config.sample) {
            Exchange {
                started: Some(Instant::now()),
                timed: config.format.has_timings(),
                file_bytes_before: self.io.body_bytes_sent(),
                ..Exchange::default()
            }
        } else {
            Exchange::default()
        };
    }

    /// Bytes of the response are about to be handed to the kernel.
    fn mark_first_byte(&mut self) {
        if self.ex.timed && self.ex.first_byte.is_none() {
            self.ex.first_byte = Some(Instant::now());
        }
    }

    /// Writes the access-log record of the response just sent (or cut short), if
    /// there was one and it is in the sample.
    fn log_exchange(&mut self) {
        let Some(log) = self.worker.log.as_ref() else { return };
        let ex = std::mem::take(&mut self.ex);
        let (Some(started), Some(status)) = (ex.started, ex.status) else { return };
        let config = &self.settings.config.access_log;
        // A format without timings is dated from the start alone: no clock read here.
        let now = if ex.timed { Instant::now() } else { started };
        let body_bytes = self.io.body_bytes_sent() - ex.file_bytes_before + ex.memory_body_bytes;
        let method = self.req.method_name();
        let tls = self.tls.as_ref();
        let record = Record {
            time: log.wall_time(started, now),
            client: self.peer,
            method: if method.is_empty() { b"-" } else { method },
            target: self.req.target(),
            version: match self.req.version {
                Version::Http10 => "HTTP/1.0",
                Version::Http11 => "HTTP/1.1",
            },
            status: status.code(),
            range: self.req.range(),
            body_bytes,
            bytes: body_bytes + ex.head_bytes,
            duration: now - started,
            ttfb: ex.first_byte.map(|t| t - started),
            transport: T::KIND.label(),
            tls_version: tls.map(|t| t.version),
            cipher: tls.map(|t| t.cipher),
            sni: tls.and_then(|t| t.sni.as_deref()),
            worker: self.worker.index,
            cross_domain: self.cross_domain,
            filled: ex.filled,
            signed: ex.signed.map(Verdict::label),
            user_agent: self.req.user_agent(),
            referer: self.req.referer(),
            tcp: self.tcp,
        };
        log.write(&record, config.format, now);
    }

    fn count_body_bytes(&mut self) {
        let sent = self.io.body_bytes_sent();
        self.worker.counters.body_bytes[T::KIND as usize].add(sent - self.body_bytes_counted);
        self.body_bytes_counted = sent;
    }

    async fn read_head(&mut self, state: &mut StateTracker<'_>) -> Result<usize, HeadEnd> {
        let timeouts = &self.settings.config.timeouts;
        let limits = &self.settings.request_limits;
        let idle = if self.served == 0 { timeouts.header } else { timeouts.keepalive };
        state.set(if self.served == 0 || self.pos < self.buf.len() { ConnState::Reading } else { ConnState::Idle });
        let mut head_deadline: Option<Instant> = None;
        let mut line_seen = false;
        loop {
            let pending = &self.buf[self.pos..];
            if !pending.is_empty() {
                let new_from = self.scanned.saturating_sub(self.pos);
                line_seen = line_seen || pending[new_from.min(pending.len())..].contains(&b'\n');
                let worth_parsing = request::may_be_complete(pending, new_from)
                    || pending.len() >= limits.max_head_bytes
                    || (!line_seen && pending.len() > limits.max_uri_bytes);
                if worth_parsing {
                    match self.req.parse(pending, limits) {
                        Ok(Parsed::Complete(n)) => return Ok(n),
                        Ok(Parsed::Partial) => {}
                        Err(e) => return Err(HeadEnd::Bad(e)),
                    }
                }
                self.scanned = self.buf.len();
                if head_deadline.is_none() {
                    head_deadline = Some(Instant::now() + timeouts.header);
                    state.set(ConnState::Reading);
                }
            }
            self.make_room();
            let result = match head_deadline {
                None => {
                    tokio::select! {
                        r = tokio::time::timeout(idle, self.io.read(&mut self.buf)) => r,
                        _ = self.worker.shutdown_started() => return Err(HeadEnd::Closed),
                    }
                }
                Some(deadline) => tokio::time::timeout_at(deadline.into(), self.io.read(&mut self.buf)).await,
            };
            match result {
                Err(_) if head_deadline.is_some() => return Err(HeadEnd::Timeout),
                Err(_) => return Err(HeadEnd::Closed),
                Ok(Ok(0)) => return Err(HeadEnd::Closed),
                Ok(Ok(_)) => {}
                Ok(Err(_)) => return Err(HeadEnd::Io),
            }
        }
    }

    /// Between requests, with nothing received: frees the read buffer and the
    /// response buffers. Most viewers of an edge spend most of their time here
    /// (a player fetches a segment every few seconds), so they hold none of them;
    /// the next request allocates each once again (at its usual size, not by
    /// doubling), a few hundred nanoseconds against the response it asks for. The
    /// request's small arena of field values is kept.
    fn release_buffers(&mut self) {
        self.buf = Vec::new();
        self.pos = 0;
        self.scanned = 0;
        self.head = Vec::new();
        self.scratch = Vec::new();
        self.path = Vec::new();
    }

    /// Moves unconsumed bytes to the front before a read (the transport makes the
    /// room, once bytes have arrived).
    fn make_room(&mut self) {
        if self.pos > 0 {
            self.buf.drain(..self.pos);
            // Body bytes consumed past the scanned head end leave nothing scanned.
            self.scanned = self.scanned.saturating_sub(self.pos);
            self.pos = 0;
        }
    }

    /// Reads and drops the request's body. `Err(Some(status))`: answer that and
    /// close; `Err(None)`: the connection failed, just close.
    async fn discard_body(&mut self) -> Result<(), Option<Status>> {
        if self.req.body == BodyFraming::None {
            return Ok(());
        }
        let mut body = Discard::new(self.req.body, self.settings.config.limits.max_request_body_bytes)
            .map_err(|_| Some(Status::ContentTooLarge))?;
        // The client waits for a go-ahead before sending its body (RFC 9110 section
        // 10.1.1); a body over the limit got its 413 above, without one.
        if self.req.expect_continue && self.pos == self.buf.len() {
            const CONTINUE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";
            Box::pin(self.io.write_all(CONTINUE, false)).await.map_err(|_| None)?;
            self.worker.counters.head_bytes.add(CONTINUE.len() as u64);
        }
        let deadline = Instant::now() + self.settings.config.timeouts.header;
        loop {
            match body.feed(&self.buf[self.pos..]) {
                Ok(n) => self.pos += n,
                Err(DiscardError::TooLarge) => return Err(Some(Status::ContentTooLarge)),
                Err(DiscardError::Malformed) => return Err(Some(Status::BadRequest)),
            }
            if body.is_done() {
                self.scanned = self.pos;
                return Ok(());
            }
            self.make_room();
            match tokio::time::timeout_at(deadline.into(), self.io.read(&mut self.buf)).await {
                Ok(Ok(n)) if n > 0 => {}
                Err(_) => {
                    self.worker.counters.error(ErrorKind::Timeout);
                    return Err(Some(Status::RequestTimeout));
                }
                Ok(_) => return Err(None),
            }
        }
    }

    async fn respond(&mut self, keep_alive: bool) -> Result<(), SendError> {
        match self.req.method {
            Method::Other => self.send_error(Status::MethodNotAllowed, keep_alive).await,
            Method::Options => self.send_options(keep_alive).await,
            Method::Get | Method::Head => self.send_target(keep_alive).await,
        }
    }

    async fn send_target(&mut self, keep_alive: bool) -> Result<(), SendError> {
        if self.path.capacity() == 0 {
            self.path.reserve(PATH_BYTES);
        }
        let target = match path::resolve(self.req.target(), &mut self.path) {
            Ok(t) => t,
            Err(TargetError::Escapes | TargetError::ForbiddenByte | TargetError::Malformed | TargetError::Asterisk) => {
                self.worker.counters.error(ErrorKind::BadRequest);
                return self.send_error(Status::BadRequest, keep_alive).await;
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
                return self.send_error(status, keep_alive).await;
            }
        }
        let lookup = self.worker.files.borrow_mut().open(self.settings, &self.path);
        let file = match lookup {
            Ok(Lookup::File(_)) if dir_syntax => return self.send_error(Status::NotFound, keep_alive).await,
            Ok(Lookup::File(f)) => f,
            Ok(Lookup::Directory) if !dir_syntax => return self.send_redirect_to_directory(keep_alive).await,
            Ok(Lookup::Directory) => match self.find_index() {
                Ok(Some(f)) => f,
                Ok(None) => return self.send_error(Status::Forbidden, keep_alive).await,
                Err(e) => return self.send_lookup_error(e, keep_alive).await,
            },
            Err(e) => return self.send_lookup_error(e, keep_alive).await,
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

    async fn send_file(&mut self, file: &Rc<OpenFile>, keep_alive: bool) -> Result<(), SendError> {
        let settings = self.settings;
        let content_type = settings.content_type(&self.path);
        let info = FileInfo {
            len_bytes: file.stat.size_bytes,
            validators: Validators { etag: &file.etag, last_modified_secs: file.stat.mtime_secs() },
            content_type,
            now_secs: self.worker.date.borrow_mut().now_secs(),
        };
        let max_ranges = settings.config.limits.max_ranges;
        let plan = plan_file(&self.req, &info, max_ranges, self.worker.next_boundary_seed());
        let mut h = start_head(&mut self.head, self.worker, settings, plan.status);
        plan.write_fields(&mut h, &info, max_ranges > 0);
        if !settings.config.cache_control.is_empty()
            && matches!(plan.status, Status::Ok | Status::PartialContent | Status::NotModified)
        {
            h.field("Cache-Control", settings.config.cache_control.as_bytes());
        }
        h.rendered(&settings.cors_fields);
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
            return self.io.write_all(&self.head, false).await;
        }
        let sent = match &plan.body {
            Body::Empty => {
                self.mark_first_byte();
                self.io.write_all(&self.head, false).await
            }
            Body::Range(r) => {
                self.io.write_all(&self.head, true).await?;
                self.send_range(file, r.first, r.len_bytes(), true).await
            }
            Body::Multipart(mp) => {
                for (i, r) in mp.ranges.iter().enumerate() {
                    mp.write_part_head(i, content_type, info.len_bytes, &mut self.scratch);
                    if i == 0 {
                        // The response head and the first part header leave together.
                        self.head.extend_from_slice(&self.scratch);
                        self.io.write_all(&self.head, true).await?;
                    } else {
                        self.io.write_all(&self.scratch, true).await?;
                    }
                    self.count_memory_body(self.scratch.len());
                    self.send_range(file, r.first, r.len_bytes(), false).await?;
                }
                mp.write_closing(&mut self.scratch);
                self.io.write_all(&self.scratch, false).await?;
                self.count_memory_body(self.scratch.len());
                Ok(())
            }
        };
        if let (Ok(()), Body::Range(r)) = (&sent, &plan.body) {
            if self.worker.page_chooser.choose() {
                self.sample_page_nodes(file, r.first, r.len_bytes());
            }
        }
        sent
    }

    /// Sends `len` bytes of `file` at `offset`, never letting the worker wait for
    /// the disk. The range goes window by window (`fill.window_bytes`, aligned),
    /// and the kernel is never handed more of the file than was found resident
    /// just before: each window is checked (a residency memo, else the page
    /// cache), then sent if resident; a missing one, however it became missing
    /// (never read, dropped by the admission policy, reclaimed by the kernel),
    /// parks this connection on a fill while the next one is read ahead (see
    /// `server::fill`). With `read_on` (a single range: a viewer reading in
    /// order), the windows after it are read ahead too; the parts of a multipart
    /// answer are seeks, and are not. A window of a file outside the admission
    /// policy's kept set is dropped from the page cache once nobody on any worker
    /// is sending it (`server::senders`).
    async fn send_range(&mut self, file: &Rc<OpenFile>, offset: u64, len: u64, read_on: bool) -> Result<(), SendError> {
        let counters = &self.worker.counters;
        let Some(pool) = self.worker.fill.as_ref() else {
            self.mark_first_byte();
            return self.io.send_file(&file.file, offset, len).await;
        };
        let (window, size, id) = (pool.window_bytes(), file.stat.size_bytes, (file.stat.dev, file.stat.ino));
        let admitted = pool
            .admission
            .as_ref()
            .is_none_or(|a| a.note(&self.worker.admission, id, size, fill::demand_bytes(offset, size), Instant::now()));
        let ready = |at: u64, n: u64, dropped_at: Option<Instant>| {
            let now = Instant::now();
            if file.resident.covers(at, n, window, now, dropped_at) {
                return true;
            }
            if pool.is_filling(id, at, n) {
                return false;
            }
            let resident = residency::is_resident(&file.file, at, n);
            if resident {
                file.resident.mark(at, n, window, now);
            }
            resident
        };
        let end = offset + len;
        let mut at = offset;
        // Whether the viewer reached a window read ahead for it, or waited for one:
        // either way it is reading on, and its next windows should be coming.
        let mut reading_on = false;
        while at < end {
            let upto = ((at / window + 1) * window).min(end);
            // Registered before the check, so that no drop comes between the
            // check and the send.
            let sender = pool.begin_send(id, at / window);
            reading_on |= file.resident.take_ahead(at, upto - at, window);
            if ready(at, upto - at, sender.as_ref().and_then(|s| s.dropped_at())) {
                counters.cold.resident_bytes.add(upto - at);
            } else {
                reading_on = true;
                if upto < end {
                    pool.read_ahead(counters.domain, &file.file, id, upto, size);
                }
                let started = Instant::now();
                let filled = pool.fill(counters.domain, &file.file, id, at, size).await;
                counters.cold.fill_wait_seconds.observe(started.elapsed().as_secs_f64());
                if let Err(e) = filled {
                    tracing::debug!(worker = self.worker.index, path = %String::from_utf8_lossy(&self.path), "{e}");
                    return Err(SendError::Fill(e));
                }
                counters.cold.filled_bytes.add(upto - at);
                self.ex.filled = true;
            }
            self.mark_first_byte();
            self.io.send_file(&file.file, at, upto - at).await?;
            if let Some(pending) = sender.and_then(|s| s.finish((at, upto), admitted, Instant::now())) {
                drop_later(pool.clone(), file.clone(), pending);
            }
            at = upto;
        }
        // Read ahead for a viewer going on: the windows after the one holding the
        // byte before `end` (a fill reads whole windows, so the rest of that one is
        // in), noted on the file so that reaching them continues the read-ahead.
        if read_on && reading_on {
            let next = end.div_ceil(window) * window;
            for k in 0..pool.readahead_windows() {
                let at = next + k * window;
                if pool.read_ahead(counters.domain, &file.file, id, at, size) {
                    file.resident.note_ahead(at / window);
                }
            }
        }
        Ok(())
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

    /// 301 to the same path with a slash, so relative links in an index page work.
    async fn send_redirect_to_directory(&mut self, keep_alive: bool) -> Result<(), SendError> {
        // Built from the normalised path, never from the raw target: `//host/..`
        // must not turn into a protocol-relative `Location`.
        let mut location = Vec::with_capacity(self.req.target().len() + 2);
        let query = path::resolve(self.req.target(), &mut self.scratch).ok().and_then(|t| t.query);
        path::directory_location(&self.path, query, &mut location);
        let body = simple_body(Status::MovedPermanently);
        let mut h = start_head(&mut self.head, self.worker, self.settings, Status::MovedPermanently);
        h.field("Location", &location)
            .field("Content-Type", b"text/plain; charset=utf-8")
            .field_u64("Content-Length", body.len() as u64);
        finish_head(h, keep_alive, self.req.version);
        self.send_small(Status::MovedPermanently, body.as_bytes()).await
    }

    async fn send_options(&mut self, keep_alive: bool) -> Result<(), SendError> {
        let settings = self.settings;
        let preflight =
            !settings.cors_fields.is_empty() && self.req.origin().is_some() && self.req.cors_request_method().is_some();
        let mut h = start_head(&mut self.head, self.worker, settings, Status::NoContent);
        h.field("Allow", b"GET, HEAD, OPTIONS");
        if preflight {
            h.rendered(&settings.cors_fields)
                .field("Access-Control-Allow-Methods", b"GET, HEAD, OPTIONS")
                .field(
                    "Access-Control-Allow-Headers",
                    b"Range, If-Range, If-Match, If-None-Match, If-Modified-Since, If-Unmodified-Since",
                )
                .field("Access-Control-Max-Age", b"86400");
        }
        finish_head(h, keep_alive, self.req.version);
        self.send_small(Status::NoContent, b"").await
    }

    /// An error (or other short) response with a one-line text body.
    async fn send_error(&mut self, status: Status, keep_alive: bool) -> Result<(), SendError> {
        let body = simple_body(status);
        let mut h = start_head(&mut self.head, self.worker, self.settings, status);
        match status {
            Status::MethodNotAllowed => {
                h.field("Allow", b"GET, HEAD, OPTIONS");
            }
            Status::ServiceUnavailable => {
                h.field("Retry-After", b"1");
            }
            _ => {}
        }
        h.field("Content-Type", b"text/plain; charset=utf-8").field_u64("Content-Length", body.len() as u64);
        finish_head(h, keep_alive, self.req.version);
        self.send_small(status, body.as_bytes()).await
    }

    async fn send_small(&mut self, status: Status, body: &[u8]) -> Result<(), SendError> {
        self.worker.counters.response(status);
        self.worker.counters.head_bytes.add(self.head.len() as u64);
        self.ex.status = Some(status);
        self.ex.head_bytes = self.head.len() as u64;
        let body = if self.req.method == Method::Head { &[][..] } else { body };
        self.head.extend_from_slice(body);
        self.mark_first_byte();
        self.io.write_all(&self.head, false).await?;
        self.count_memory_body(body.len());
        Ok(())
    }
}

/// The path a signed-URL policy checks: `/`, the normalised relative path, and a
/// trailing `/` when the target had directory syntax (nginx's `$uri`).
fn absolute_path(relative: &[u8], dir_syntax: bool, buf: &mut Vec<u8>) {
    buf.clear();
    buf.push(b'/');
    buf.extend_from_slice(relative);
    if dir_syntax && !relative.is_empty() {
        buf.push(b'/');
    }
}

fn simple_body(status: Status) -> String {
    format!("{} {}\n", status.code(), status.reason())
}

/// Status line, Date and the fields every response carries.
fn start_head<'b>(head: &'b mut Vec<u8>, worker: &Context, settings: &Settings, status: Status) -> HeadWriter<'b> {
    if head.capacity() == 0 {
        head.reserve(HEAD_BYTES);
    }
    let mut h = HeadWriter::new(head, status);
    h.field("Date", worker.date.borrow_mut().now());
    h.rendered(&settings.common_fields);
    if settings.config.debug_headers {
        h.rendered(&worker.debug_field);
    }
    h
}

/// The Connection field, then the empty line. HTTP/1.1 keeps alive by default, so
/// only a close is announced; an HTTP/1.0 client is told when it may keep going.
fn finish_head(mut h: HeadWriter<'_>, keep_alive: bool, version: Version) {
    if !keep_alive {
        h.field("Connection", b"close");
    } else if version == Version::Http10 {
        h.field("Connection", b"keep-alive");
    }
    h.finish();
}

/// Drops a window that its last sender has just finished [`DROP_DELAY`] later,
/// unless someone began sending it meanwhile, and forgets that this worker found
/// it resident.
fn drop_later(pool: Arc<FillPool>, file: Rc<OpenFile>, pending: PendingDrop) {
    tokio::task::spawn_local(async move {
        tokio::time::sleep(DROP_DELAY).await;
        if pool.drop_idle(&file.file, pending, file.stat.size_bytes) > 0 {
            let w = pool.window_bytes();
            file.resident.forget(pending.window.index * w, w, w);
        }
    });
}

#[cfg(test)]
#[path = "conn_tests.rs"]
mod tests;
