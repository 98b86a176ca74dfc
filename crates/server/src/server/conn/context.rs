//! What a connection sees of the worker that owns it, and what the accept path
//! learned about it.

use std::cell::{Cell, RefCell};
use std::net::SocketAddr;
use std::sync::Arc;

use linerate_http::date::DateCache;
use linerate_urlauth::Rules;
use tokio::sync::Notify;

use crate::counters::tcp_info::{Chooser, Sampler};
use crate::counters::WorkerCounters;
use crate::server::access_log::WorkerLog;
use crate::server::cache::{Cache, SliceFiles};
use crate::server::files::FileCache;
use crate::server::pagecache::ColdPath;

/// Stored slices a worker keeps open.
const SLICE_FILES: usize = 4096;

/// What a connection needs from the worker that owns it, and nothing more: the
/// worker's open-file cache, Date cache, counters, page-cache path and shutdown
/// signal. A connection never sees the accept loop or other connections, so this
/// module can be tested with an in-memory transport, an in-memory page cache
/// (`P`) and a context of its own.
pub(crate) struct Context<P = ColdPath> {
    pub index: usize,
    pub files: RefCell<FileCache>,
    pub date: RefCell<DateCache>,
    pub counters: Arc<WorkerCounters>,
    /// The page-cache path, when `fill.enabled`: body ranges go through it, so
    /// that cold ones are read by the fill pool, never by the worker.
    pub pages: Option<P>,
    /// The pull-through cache, when `[[origin]]` tables are configured.
    pub cache: Option<Arc<Cache>>,
    /// This worker's open stored slices.
    pub slices: SliceFiles,
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

impl<P> Context<P> {
    pub(crate) fn new(
        index: usize,
        files: FileCache,
        counters: Arc<WorkerCounters>,
        pages: Option<P>,
        page_chooser: Chooser,
        debug_field: Vec<u8>,
        boundary_salt: u64,
    ) -> Context<P> {
        Context {
            index,
            files: RefCell::new(files),
            date: RefCell::new(DateCache::default()),
            counters,
            pages,
            cache: None,
            slices: SliceFiles::new(SLICE_FILES),
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

    /// Gives the connections the pull-through cache.
    pub(crate) fn with_cache(mut self, cache: Option<Arc<Cache>>) -> Context<P> {
        self.cache = cache;
        self
    }

    /// Gives the connections an access log to write to.
    pub(crate) fn with_log(mut self, log: Option<WorkerLog>) -> Context<P> {
        self.log = log;
        self
    }

    pub(crate) fn is_shutting_down(&self) -> bool {
        self.shutting_down.get()
    }

    /// Starts shutdown: idle connections close, busy ones finish their response.
    pub(crate) fn begin_shutdown(&self) {
        self.shutting_down.set(true);
        self.shutdown.notify_waiters();
    }

    /// Resolves when shutdown begins (at once if it already has).
    pub(crate) async fn shutdown_started(&self) {
        let notified = self.shutdown.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if !self.shutting_down.get() {
            notified.await;
        }
    }

    /// A number that differs for every multipart response of this process.
    pub(crate) fn next_boundary_seed(&self) -> u64 {
        let n = self.boundary_seq.get().wrapping_add(1);
        self.boundary_seq.set(n);
        n ^ self.boundary_salt
    }
}

/// What the accept path learned about a connection.
pub(crate) struct ConnInfo {
    pub peer: SocketAddr,
    /// Set for the connections chosen for TCP_INFO sampling.
    pub sampler: Option<Sampler>,
    /// The SYN arrived in another silo than this worker's.
    pub cross_domain: bool,
    /// The TLS session, for HTTPS connections.
    pub tls: Option<TlsInfo>,
}

/// What the access log says about a TLS session.
pub(crate) struct TlsInfo {
    pub version: &'static str,
    pub cipher: &'static str,
    pub sni: Option<Box<str>>,
}
