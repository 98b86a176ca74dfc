//! The origin client: HTTP/1.1 requests from the pull-through cache to the
//! origins of the `[[origin]]` tables.
//!
//! **A request** is built by linerate, never copied from the viewer's
//! ([`OriginRequest`]): the method (GET, or HEAD), the URL's path followed by the
//! rest of the viewer's path (percent-encoded) and the query the cache keys on,
//! `Host` (the URL's host, with `:port` unless it is the scheme's default),
//! `User-Agent: linerate/<version>`, `Accept-Encoding: identity` (bytes are cached
//! as the origin stores them), `Range`, `If-None-Match`, `If-Modified-Since`, and
//! the viewer fields the table's `forward_headers` names. Nothing else, but for an
//! S3 table (`[origin.s3]`, see `s3`): the bucket in the path or the host name, the
//! key encoded as S3 encodes it, and the AWS Signature Version 4 fields.
//!
//! **Failover.** [`Origins::fetch`] tries a table's URLs in order. A connect
//! error, a connect or first-byte timeout, a connection broken before the head,
//! or a 5xx moves on to the next URL ([`OriginError::fails_over`]); any other
//! answer (a 404 too) is returned, but an S3 table's 401 or 403, which is
//! [`OriginError::Denied`]. When every URL failed, the last failure is
//! returned: a 5xx from the last URL is [`OriginError::Status`].
//!
//! **Peers and parents** (`parent`) come before the URLs: a request for a
//! stored object asks up to `peer_tries` of the table's peers, `only-if-cached`
//! (a 504 is a miss), then its parents in the key's order, then the URLs.
//!
//! **Timeouts**, each the table's: `connect_timeout` covers the TCP connect and
//! the TLS handshake; `first_byte_timeout` covers sending the request and
//! receiving the head (`hold_timeout` instead for a blocking LL-HLS request,
//! [`OriginRequest::hold`], whose timeout does not fail over); `idle_timeout`
//! is the longest wait for the next piece of a body ([`OriginResponse::chunk`]).
//! A head over [`HEAD_LIMIT_BYTES`] is refused.
//!
//! **Pool.** A connection whose body was read to its end goes back to its URL's
//! pool (at most the table's `max_idle_connections`, the newest reused first,
//! and only by a request on the origin thread that opened it);
//! an idle connection is closed after [`IDLE_CONNECTION_SECS`], or when the
//! origin closes it. A request that finds its pooled connection closed before
//! any answer (the origin closed it meanwhile) is sent again on another one, a
//! new one at the latest, without counting as a failure: GET and HEAD are safe
//! to send twice.
//!
//! **TLS** (rustls, aws-lc-rs): certificate verification is always on. The roots
//! are the system's (`rustls-native-certs`), or only the certificates in the
//! table's `ca_file` when it is set. SNI and `Host` name the origin URL's host,
//! never the viewer's.
//!
//! **The runtime.** Every origin request and every fill task runs on the origin
//! threads ([`Origins::spawn`]; see `runtime`); a worker never waits on the
//! network for an origin, it awaits a channel fed from there. Each URL's counters
//! ([`UrlStats`]) are atomics added to from those threads, read by
//! [`Origins::stats`] for /metrics and /status.

mod connect;
mod content_range;
mod error;
mod parent;
mod request;
mod response;
mod runtime;
mod s3;
mod stats;
mod stream;
#[cfg(test)]
mod tests;

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use anyhow::anyhow;

pub(crate) use self::{
    connect::HEAD_LIMIT_BYTES,
    error::{OriginError, Phase},
    request::{OriginRequest, PathEncoding},
    response::OriginResponse,
    stats::{ParentStats, PeerStats, UrlStats},
};

use connect::{chain, io_error_kind, Conn, Url};
use runtime::Runtime;

/// How often idle connections are checked for expiry: one closes between
/// [`IDLE_CONNECTION_SECS`] and that plus this after its last use.
const SWEEP_INTERVAL: Duration = Duration::from_secs(5);

/// An S3 table's refusals (wrong credentials) are logged at most once in this
/// long; every one is counted.
pub(crate) const DENIED_LOG_INTERVAL: Duration = Duration::from_secs(60);

/// The most of an S3 refusal's body read for its error code.
const DENIED_BODY_BYTES: usize = 8 * 1024;

/// The origin client of every `[[origin]]` table, and the threads it runs on.
pub(crate) struct Origins {
    tables: Vec<Table>,
    /// Table indexes, longest prefix first.
    by_prefix: Vec<usize>,
    runtime: Runtime,
    /// When the client started: the clock of [`Table::denied_logged`].
    started: Instant,
    node: Node,
    /// `1.1 <node name>`: this node's entry in the `Via` field.
    via: http::HeaderValue,
    /// Requests refused because their `Via` named this node.
    loops: AtomicU64,
    /// When a refused loop was last logged (as [`Table::denied_logged`]).
    loop_logged: AtomicU64,
}

/// Who this node is, for the `Via` field of its requests and to recognise
/// itself among its parents.
#[derive(Clone, Debug)]
pub(crate) struct Node {
    /// The received-by name of its `Via` entries.
    pub name: String,
    /// Its plain-HTTP listen addresses.
    pub listen: Vec<std::net::SocketAddr>,
}

struct Table {
    config: crate::config::Origin,
    urls: Vec<Arc<Url>>,
    /// The parent tier (`parents`), this node left out.
    parents: Vec<parent::Member>,
    /// The other edges of its group (`peers`), this node left out.
    peers: Vec<parent::Member>,
    /// The signer of an S3 table.
    s3: Option<s3::Signer>,
    /// When a refusal of this S3 table was last logged, in milliseconds since
    /// [`Origins::started`] plus one (0: never).
    denied_logged: AtomicU64,
}

impl Origins {
    /// Builds the clients of every `[[origin]]` table and starts the origin runtime:
    /// `threads` OS threads (at least one, named `linerate-origin{n}`), on which
    /// every origin request and every fill task runs; workers never wait on the
    /// network themselves (they await channels fed from here). TLS: certificate
    /// verification always on; roots = the system's (`rustls-native-certs`), or
    /// only the certificates in the table's `ca_file` when set; SNI and Host are
    /// the origin URL's host, never the viewer's. `credentials` are the S3
    /// tables' (by table index, as `Config::s3_credentials` read them). Errors
    /// name the table's key (`origin[1].ca_file: ...`).
    #[cfg(test)]
    pub(crate) fn start(
        tables: &[crate::config::Origin],
        credentials: &[Option<Arc<crate::config::S3Credentials>>],
        threads: usize,
    ) -> anyhow::Result<Arc<Origins>> {
        let node = Node { name: format!("test.{}", std::process::id()), listen: Vec::new() };
        Origins::start_as(tables, credentials, threads, node)
    }

    /// [`Origins::start`], as `node`.
    pub(crate) fn start_as(
        tables: &[crate::config::Origin],
        credentials: &[Option<Arc<crate::config::S3Credentials>>],
        threads: usize,
        node: Node,
    ) -> anyhow::Result<Arc<Origins>> {
        let via = http::HeaderValue::from_str(&format!("1.1 {}", node.name))
            .map_err(|e| anyhow!("cache.node_name: {:?} cannot be sent in a Via field: {e}", node.name))?;
        let mut system_roots = None;
        let mut built = Vec::with_capacity(tables.len());
        for (i, config) in tables.iter().enumerate() {
            let (roots, trust) = connect::roots(config, i, &mut system_roots)?
                .unwrap_or_else(|| (Arc::new(rustls::RootCertStore::empty()), "no root certificate".into()));
            let tls = connect::tls_config(roots)?;
            if config.urls.is_empty() {
                return Err(anyhow!("origin[{i}].urls: at least one origin URL is needed"));
            }
            let urls = config
                .urls
                .iter()
                .enumerate()
                .map(|(j, text)| {
                    Url::new(text, config, &tls, trust.clone())
                        .map(Arc::new)
                        .map_err(|e| anyhow!("origin[{i}].urls[{j}]: {e}"))
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            let s3 = match (&config.s3, credentials.get(i).cloned().flatten()) {
                (None, _) => None,
                (Some(s3), Some(c)) => Some(s3::Signer::new(s3, c)),
                (Some(_), None) => return Err(anyhow!("origin[{i}].s3: no credentials were read for it")),
            };
            let plain = crate::config::Origin { s3: None, ..config.clone() };
            let parents = members(i, config, "parents", (&plain, &tls, &trust), &node)?;
            let peers = members(i, config, "peers", (&plain, &tls, &trust), &node)?;
            built.push(Table { config: config.clone(), urls, parents, peers, s3, denied_logged: AtomicU64::new(0) });
        }
        let mut by_prefix: Vec<usize> = (0..built.len()).collect();
        by_prefix.sort_by_key(|&i| std::cmp::Reverse(built[i].config.prefix.len()));

        let runtime = Runtime::start(threads)?;
        let all: Vec<Arc<Url>> = built
            .iter()
            .flat_map(|t| t.urls.iter().chain(t.parents.iter().chain(&t.peers).map(|p| &p.url)).cloned())
            .collect();
        runtime.spawn(async move {
            let mut tick = tokio::time::interval(SWEEP_INTERVAL);
            loop {
                tick.tick().await;
                all.iter().for_each(|url| url.sweep());
            }
        });
        let has_parents = built.iter().any(|t| !t.parents.is_empty() || !t.peers.is_empty());
        let origins = Arc::new(Origins {
            tables: built,
            by_prefix,
            runtime,
            started: Instant::now(),
            node,
            via,
            loops: AtomicU64::new(0),
            loop_logged: AtomicU64::new(0),
        });
        if has_parents {
            // The probes hold only a weak reference: the client goes when its users do.
            let weak = Arc::downgrade(&origins);
            origins.runtime.spawn(async move {
                let mut tick = tokio::time::interval(parent::PROBE_INTERVAL);
                loop {
                    tick.tick().await;
                    let Some(o) = weak.upgrade() else { return };
                    let now = parent::millis_since(o.started);
                    for (i, t) in o.tables.iter().enumerate() {
                        for p in t.parents.iter().chain(&t.peers) {
                            p.probe(now, t.config.connect_timeout, t.config.parent_down_for, i).await;
                        }
                    }
                }
            });
        }
        Ok(origins)
    }

    /// Whether a request's `Via` field value names this node: it went round a
    /// loop of parents and came back.
    pub(crate) fn via_names_me(&self, via: &[u8]) -> bool {
        via_names(via, self.node.name.as_bytes())
    }

    /// Counts a request refused because its `Via` named this node, and logs it
    /// at most once per [`DENIED_LOG_INTERVAL`].
    pub(crate) fn refused_loop(&self, path: &[u8], via: &[u8]) {
        self.loops.fetch_add(1, Ordering::Relaxed);
        let now = parent::millis_since(self.started).saturating_add(1);
        let last = self.loop_logged.load(Ordering::Relaxed);
        let due = last == 0 || now.saturating_sub(last) >= DENIED_LOG_INTERVAL.as_millis() as u64;
        if due && self.loop_logged.compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed).is_ok() {
            tracing::error!(
                "request for {} refused with 508: its Via ({}) names this node ({}), so the parents form a loop; \
                 check the `parents` of the nodes named. Counted in linerate_cache_loops_total, logged at most once \
                 every {} s",
                String::from_utf8_lossy(path),
                String::from_utf8_lossy(via),
                self.node.name,
                DENIED_LOG_INTERVAL.as_secs(),
            );
        }
    }

    /// Requests refused because their `Via` named this node.
    pub(crate) fn loops(&self) -> u64 {
        self.loops.load(Ordering::Relaxed)
    }

    /// The S3 tables' credentials as a reload read them again (by table index;
    /// the tables themselves change only at a restart). Requests signed from
    /// now on use them.
    pub(crate) fn set_credentials(&self, credentials: &[Option<Arc<crate::config::S3Credentials>>]) {
        for (t, c) in self.tables.iter().zip(credentials) {
            if let (Some(signer), Some(c)) = (&t.s3, c) {
                signer.set_credentials(c.clone());
            }
        }
    }

    /// The table whose prefix is the longest prefix of `path` (a normalised
    /// absolute path such as `/vod/a/b.mp4`) and the rest of the path after that
    /// prefix (`a/b.mp4`).
    pub(crate) fn route<'p>(&self, path: &'p [u8]) -> Option<(usize, &'p [u8])> {
        self.by_prefix.iter().find_map(|&i| {
            let prefix = self.tables[i].config.prefix.as_bytes();
            path.strip_prefix(prefix).map(|rest| (i, rest))
        })
    }

    /// How many `[[origin]]` tables there are.
    pub(crate) fn table_count(&self) -> usize {
        self.tables.len()
    }

    pub(crate) fn table(&self, table: usize) -> &crate::config::Origin {
        &self.tables[table].config
    }

    /// Runs `fut` on the origin runtime.
    pub(crate) fn spawn<F: Future<Output = ()> + Send + 'static>(&self, fut: F) {
        self.runtime.spawn(fut);
    }

    /// Runs `fut` on the calling origin thread (elsewhere, as [`Origins::spawn`]):
    /// for work that goes on reading a response this thread's connection carries.
    pub(crate) fn spawn_here<F: Future<Output = ()> + Send + 'static>(&self, fut: F) {
        self.runtime.spawn_here(fut);
    }

    /// Sends `req` to table `table`'s URLs in order: on a connect error, a connect
    /// or first-byte timeout, a connection broken before the head, or a 5xx
    /// response, the next URL is tried; returns the first response that is none of
    /// those, or the last failure (a 5xx from the last URL is
    /// `OriginError::Status`). Before the URLs: the table's peers when
    /// `req.peers` (`only-if-cached`, [`Origins::fetch_peers`]), then its
    /// parents. Call it from a task on the origin runtime
    /// ([`Origins::spawn`]): the connections it opens run there.
    pub(crate) async fn fetch(&self, table: usize, req: &OriginRequest) -> Result<OriginResponse, OriginError> {
        let t = &self.tables[table];
        let mut last = None;
        let key = (!t.parents.is_empty() || !t.peers.is_empty()).then(|| tier_key(t, req));
        if req.peers && !t.peers.is_empty() {
            if let Some(response) = self.fetch_peers(table, t, key.as_deref().unwrap_or_default(), req).await {
                return Ok(response);
            }
        }
        if !t.parents.is_empty() {
            match self.fetch_parents(table, t, key.as_deref().unwrap_or_default(), req).await {
                Ok(response) => return Ok(response),
                Err(e @ OriginError::Loop) => return Err(e),
                Err(e @ OriginError::Timeout(Phase::FirstByte)) if req.hold => return Err(e),
                Err(_) => {}
            }
        }
        for (i, url) in t.urls.iter().enumerate() {
            let e = match self.counted_exchange(t, (i, url), req, true).await {
                Ok((response, status)) => {
                    if t.s3.is_some() && matches!(status, 401 | 403) {
                        self.denied(table, t, url, response).await
                    } else if status < 500 {
                        return Ok(response);
                    } else {
                        OriginError::Status(status)
                    }
                }
                Err(e) => e,
            };
            url.counters.count_error(&e);
            tracing::debug!(table, url = %url.text, error = %e, "origin request failed");
            if !e.fails_over() || (req.hold && matches!(e, OriginError::Timeout(Phase::FirstByte))) {
                return Err(e);
            }
            last = Some(e);
        }
        Err(last.unwrap_or_else(|| OriginError::Connect(format!("origin[{table}] has no URL"))))
    }

    /// `req` to the parents of table `t`, in the order of its key, skipping
    /// those marked down: the first answer other than a 5xx or a failure to
    /// have one. A parent's 508 (the parents form a loop) is
    /// [`OriginError::Loop`], which goes no further, as a blocking request's
    /// hold timeout does (and the parent is not marked down for it); any other
    /// failure sends the caller on to the origin.
    async fn fetch_parents(
        &self,
        table: usize,
        t: &Table,
        key: &[u8],
        req: &OriginRequest,
    ) -> Result<OriginResponse, OriginError> {
        let mut last = OriginError::Connect(format!("origin[{table}]: every parent is down"));
        for i in parent::order(key, &t.parents) {
            let p = &t.parents[i];
            if !p.is_up() {
                continue;
            }
            let url = &p.url;
            let e = match self.counted_exchange(t, (i, url), req, false).await {
                Ok((response, status)) => match status {
                    508 => OriginError::Loop,
                    500.. => OriginError::Status(status),
                    _ => return Ok(response),
                },
                Err(e) => e,
            };
            url.counters.count_error(&e);
            tracing::debug!(table, parent = %url.text, error = %e, "parent request failed");
            match &e {
                OriginError::Loop => return Err(e),
                // A blocking request held past `hold_timeout`: the segment has not
                // come, which is no fault of the parent, and the next would hold it
                // as long.
                OriginError::Timeout(Phase::FirstByte) if req.hold => return Err(e),
                OriginError::Connect(_) | OriginError::Reset(_) | OriginError::Timeout(_) => {
                    p.mark_down(parent::millis_since(self.started), t.config.parent_down_for, table, &e.to_string());
                }
                _ => {}
            }
            if !e.fails_over() {
                return Err(e);
            }
            last = e;
        }
        Err(last)
    }

    /// `req` to the peers of table `t`, `only-if-cached`: at most the table's
    /// `peer_tries` of those up, in the order of the object's `key`. The first
    /// answer that is the object's (200, 206, 304, 416) is returned; a 504 (the
    /// peer does not have it) or another 3xx or 4xx, counted in its misses, a
    /// 5xx or 1xx, or a failure (counted in its errors) moves on to the next
    /// peer, and after the last, `None`: the caller
    /// goes on to the parents and the origin. A failure at the transport marks
    /// the peer down, as a parent's does. A peer's answer is checked by the
    /// caller exactly as an origin's (length, `Content-Range`, version).
    async fn fetch_peers(&self, table: usize, t: &Table, key: &[u8], req: &OriginRequest) -> Option<OriginResponse> {
        let mut asked = 0;
        let req = OriginRequest { only_if_cached: true, ..req.clone() };
        for i in parent::order(key, &t.peers) {
            let p = &t.peers[i];
            if !p.is_up() {
                continue;
            }
            if asked == t.config.peer_tries {
                break;
            }
            asked += 1;
            let url = &p.url;
            let e = match self.counted_exchange(t, (i, url), &req, false).await {
                Ok((response, 200 | 206 | 304 | 416)) => return Some(response),
                // 504: it does not have it; a 4xx (a 404 it has stored, say)
                // or a 3xx is no answer for this node either: a miss too.
                Ok((response, status @ (504 | 300..=499))) => {
                    p.misses.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(table, peer = %url.text, status, "peer does not have it");
                    response.discard(DISCARD_BODY_BYTES).await;
                    continue;
                }
                Ok((response, status)) => {
                    response.discard(DISCARD_BODY_BYTES).await;
                    OriginError::Status(status)
                }
                Err(e) => e,
            };
            url.counters.count_error(&e);
            tracing::debug!(table, peer = %url.text, error = %e, "peer request failed");
            if let OriginError::Connect(_) | OriginError::Reset(_) | OriginError::Timeout(_) = &e {
                p.mark_down(parent::millis_since(self.started), t.config.parent_down_for, table, &e.to_string());
            }
        }
        None
    }

    /// [`Origins::exchange`] to URL `i` of its list, counted in the URL's
    /// counters (the request, and the head's status and first-byte time), its
    /// answer ready to be read; with the head's status.
    async fn counted_exchange(
        &self,
        t: &Table,
        (i, url): (usize, &Arc<Url>),
        req: &OriginRequest,
        origin: bool,
    ) -> Result<(OriginResponse, u16), OriginError> {
        url.counters.count_request();
        let (response, conn, first_byte) = self.exchange(t, url, req, origin).await?;
        let status = response.status().as_u16();
        url.counters.count_head(status, first_byte);
        let response =
            OriginResponse::new(response, req.head, conn, (i, url.clone()), first_byte, t.config.idle_timeout);
        Ok((response, status))
    }

    /// One request to one URL, up to its response head: on a pooled connection
    /// when there is one, else on a new one. `origin`: to one of the table's
    /// `urls` (signed for an S3 table), not to a parent.
    async fn exchange(
        &self,
        table: &Table,
        url: &Arc<Url>,
        req: &OriginRequest,
        origin: bool,
    ) -> Result<(http::Response<hyper::body::Incoming>, Conn, Duration), OriginError> {
        let config = &table.config;
        let signer = table.s3.as_ref().filter(|_| origin);
        loop {
            let (mut conn, pooled) = match url.take_idle() {
                Some(conn) => (conn, true),
                None => (url.connect(config.connect_timeout).await?, false),
            };
            // Unreachable in practice: the target is percent-encoded byte by byte.
            let encoding = if signer.is_some() { PathEncoding::S3 } else { PathEncoding::Http };
            let mut request = req
                .build(&url.base.path, &url.host, &config.forward_headers, encoding)
                .map_err(OriginError::BadResponse)?;
            if let Some(signer) = signer {
                signer.sign(&mut request, SystemTime::now()).map_err(OriginError::BadResponse)?;
            }
            // After the signature: a field S3 does not need, left out of it.
            request::add_via(&mut request, req.via.as_deref(), &self.via);
            let sent = Instant::now();
            let wait = if req.hold { config.hold_timeout } else { config.first_byte_timeout };
            let head = tokio::time::timeout(wait, async {
                conn.sender.ready().await?;
                conn.sender.send_request(request).await
            })
            .await;
            match head {
                Err(_) => return Err(OriginError::Timeout(Phase::FirstByte)),
                Ok(Ok(response)) => return Ok((response, conn, sent.elapsed())),
                Ok(Err(e)) if pooled && closed_before_answer(&e) => {
                    tracing::debug!(url = %url.text, error = %chain(&e), "pooled connection closed, opening another");
                }
                Ok(Err(e)) => return Err(head_error(&e)),
            }
        }
    }

    /// An S3 table's 401 or 403: the error, its code read from the body, and a
    /// log line naming the table, the endpoint, the bucket and the access key id
    /// (never the secret), at most once per [`DENIED_LOG_INTERVAL`] per table.
    async fn denied(&self, i: usize, table: &Table, url: &Url, mut response: OriginResponse) -> OriginError {
        let status = response.status;
        let mut body = Vec::new();
        while body.len() < DENIED_BODY_BYTES {
            match response.chunk().await {
                Ok(Some(piece)) => body.extend_from_slice(&piece),
                Ok(None) | Err(_) => break,
            }
        }
        let code = s3::error_code(&body).map(str::to_string);
        let e = OriginError::Denied(status, code);
        let now = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX).saturating_add(1);
        let last = table.denied_logged.load(Ordering::Relaxed);
        let due = last == 0 || now.saturating_sub(last) >= DENIED_LOG_INTERVAL.as_millis() as u64;
        if due && table.denied_logged.compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed).is_ok() {
            let (key, source) = table.s3.as_ref().map(|s| s.key_in_use()).unwrap_or_default();
            let bucket = table.s3.as_ref().map_or("", |s| s.bucket.as_str());
            let answer = match &e {
                OriginError::Denied(status, Some(code)) => format!("{status} {code}"),
                _ => status.to_string(),
            };
            tracing::error!(
                "origin[{i}] ({}): the S3 server at {} refused access to bucket `{bucket}` with access key id \
                 {key} (from {source}): {answer}; check the credentials, the clock, and the key's right to read \
                 the bucket. Viewers get 502; refusals are counted in \
                 linerate_origin_errors_total{{kind=\"denied\"}} and logged at most once every {} s",
                table.config.prefix,
                url.text,
                DENIED_LOG_INTERVAL.as_secs(),
            );
        }
        e
    }

    /// Per parent: counters and state for /metrics and /status.
    pub(crate) fn parent_stats(&self) -> Vec<ParentStats> {
        self.tables
            .iter()
            .enumerate()
            .flat_map(|(i, t)| {
                t.parents.iter().map(move |p| ParentStats {
                    stats: p.url.counters.snapshot(i, &p.url.text),
                    up: p.is_up(),
                    marked_down: p.marked_down.load(Ordering::Relaxed),
                })
            })
            .collect()
    }

    /// Per peer: counters and state for /metrics and /status.
    pub(crate) fn peer_stats(&self) -> Vec<PeerStats> {
        self.tables
            .iter()
            .enumerate()
            .flat_map(|(i, t)| {
                t.peers.iter().map(move |p| PeerStats {
                    stats: p.url.counters.snapshot(i, &p.url.text),
                    up: p.is_up(),
                    marked_down: p.marked_down.load(Ordering::Relaxed),
                    misses: p.misses.load(Ordering::Relaxed),
                })
            })
            .collect()
    }

    /// Per origin URL: counters for /metrics and /status.
    pub(crate) fn stats(&self) -> Vec<UrlStats> {
        self.tables
            .iter()
            .enumerate()
            .flat_map(|(i, t)| t.urls.iter().map(move |u| u.counters.snapshot(i, &u.text)))
            .collect()
    }
}

/// The most of an unwanted answer's body (a peer's 504 page) read so that its
/// connection can be used again; a longer one closes it.
const DISCARD_BODY_BYTES: u64 = 16 * 1024;

/// The key a request's object is hashed by among a table's parents and peers:
/// the path as served (the table's prefix, then the rest) and its query.
fn tier_key(t: &Table, req: &OriginRequest) -> Vec<u8> {
    let mut key = Vec::with_capacity(t.config.prefix.len() + req.path.len() + 16);
    key.extend_from_slice(t.config.prefix.as_bytes());
    key.extend_from_slice(&req.path);
    if let Some(q) = &req.query {
        key.push(b'?');
        key.extend_from_slice(q);
    }
    key
}

/// Table `i`'s parents or peers (`list`, its key's name): their URLs, each
/// asked for the viewer's path (they serve the same prefix), this node left out.
fn members(
    i: usize,
    config: &crate::config::Origin,
    list: &'static str,
    (plain, tls, trust): (&crate::config::Origin, &Arc<rustls::ClientConfig>, &Arc<str>),
    node: &Node,
) -> anyhow::Result<Vec<parent::Member>> {
    let (texts, role) = match list {
        "parents" => (&config.parents, "parent"),
        _ => (&config.peers, "peer"),
    };
    let mut out = Vec::with_capacity(texts.len());
    for (j, text) in texts.iter().enumerate() {
        let mut url = Url::new(text, plain, tls, trust.clone()).map_err(|e| anyhow!("origin[{i}].{list}[{j}]: {e}"))?;
        if parent::is_self(&url.base, &node.listen) {
            tracing::info!("origin[{i}].{list}[{j}]: {text} is this node, left out of its {list}");
            continue;
        }
        url.base.path = format!("{}{}", url.base.path, &config.prefix[1..]);
        out.push(parent::Member::new(Arc::new(url), role));
    }
    Ok(out)
}

/// Whether a `Via` field value has an entry received by `name`: entries are
/// `protocol received-by [comment]`, separated by commas.
fn via_names(via: &[u8], name: &[u8]) -> bool {
    via.split(|&b| b == b',').any(|entry| {
        let mut words = entry.split(|b| b.is_ascii_whitespace()).filter(|w| !w.is_empty());
        words.next().is_some() && words.next() == Some(name)
    })
}

/// Whether a request failed because its connection was closed, before any
/// response came: the race of a request sent on a keep-alive connection the
/// origin is closing.
fn closed_before_answer(e: &hyper::Error) -> bool {
    use std::io::ErrorKind::{BrokenPipe, ConnectionAborted, ConnectionReset};
    e.is_canceled()
        || e.is_closed()
        || e.is_incomplete_message()
        || matches!(io_error_kind(e), Some(ConnectionReset | ConnectionAborted | BrokenPipe))
}

/// What went wrong between sending a request and its head.
fn head_error(e: &hyper::Error) -> OriginError {
    if e.is_parse() || e.is_parse_status() {
        let mut text = format!("response head: {}", chain(e));
        // hyper's `is_parse_too_large` needs its server side; its message says it.
        if text.contains("too large") {
            text.push_str(&format!(" (over {} KiB)", HEAD_LIMIT_BYTES / 1024));
        }
        OriginError::BadResponse(text)
    } else {
        OriginError::Reset(chain(e))
    }
}
