//! The admin endpoint: `/`, `/metrics`, `/status`, `/healthz`, `/load`.
//!
//! It runs on a thread of its own with its own small event loop, on its own address
//! (default 127.0.0.1:9090), so scraping never touches a worker: it reads the
//! workers' counters (single-writer atomics) and sums them. Connections are kept
//! alive (5 s idle) for clients that ask, until shutdown begins.
//!
//! - `/` (also `/dashboard`): a live page for people, drawn in the browser from
//!   `/status` (`dashboard`).
//! - `/metrics`: Prometheus/OpenMetrics text (prometheus-client).
//! - `/status`: JSON, totals and one object per worker.
//! - `/healthz`: 200 `ok` while serving, 503 `draining` during shutdown.
//! - `/prefill`: `POST` a manifest to pre-position titles, `GET` the job's
//!   progress (`prefill`, docs/PREFILL.md).
//! - `/load`: one line in HAProxy agent-check format: `up 73%` (a weight from the
//!   connections and Gb/s against the configured capacity) or `drain`. A client that
//!   connects and sends nothing for 200 ms (HAProxy's `agent-check` without
//!   `agent-send`) gets the same line on the bare TCP connection.

mod cache;
mod cold;
mod dashboard;
mod metrics;
mod prefill;
mod status;

use std::borrow::Cow;
use std::cell::Cell;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use linerate_http::request::{BodyFraming, Limits, Parsed};
use linerate_http::Request;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::counters::{TransportKind, WorkerCounters};

/// What the admin endpoint reports on, shared with the supervisor.
pub(crate) struct AdminState {
    pub workers: Vec<Arc<WorkerCounters>>,
    pub shutting_down: AtomicBool,
    pub started: Instant,
    /// `ktls-tx-rx` or `userspace`, when HTTPS is configured.
    pub tls_mode: Option<&'static str>,
    /// The connection steering in force (`domain-cbpf`, `cpu-cbpf` or `reuseport-hash`).
    pub steering: &'static str,
    /// Connections at which /load reports no spare capacity.
    pub capacity_connections: u64,
    /// Gb/s at which /load reports no spare capacity (0: not used).
    pub capacity_gbps: f64,
    /// The capacity model (`admin.capacity_model`) and which of its ceilings apply.
    pub capacity_model: Option<(crate::capacity::Inputs, crate::capacity::Path)>,
    /// The model's ceiling for the transport mix of the last second served, in Gb/s
    /// (`f64` bits; 0 until something is served).
    pub model_ceiling_gbps: AtomicU64,
    /// The fill pool, for its queue and per-device counters.
    pub fill: Option<Arc<crate::server::pagecache::FillPool>>,
    /// The pull-through cache, for its counters, its store and its origins.
    pub cache: Option<Arc<crate::server::cache::Cache>>,
    /// The prefill job (`/prefill`), with the cache.
    pub prefill: Option<Arc<crate::server::prefill::Prefiller>>,
    /// The access log, for its written and dropped record counts.
    pub access_log: Option<Arc<crate::server::access_log::AccessLog>>,
    /// The certificates in use (replaced at each reload), for their expiry.
    pub certificates: std::sync::Mutex<Vec<crate::tls::certs::CertExpiry>>,
    /// Reloads done and refused, and binary upgrades that failed (the new binary
    /// did not start), since this process started.
    pub reloads: std::sync::atomic::AtomicU64,
    pub reload_failures: std::sync::atomic::AtomicU64,
    pub upgrade_failures: std::sync::atomic::AtomicU64,
}

impl AdminState {
    pub(crate) fn total(&self, f: impl Fn(&WorkerCounters) -> u64) -> u64 {
        self.workers.iter().map(|w| f(w)).sum()
    }

    pub(crate) fn body_bytes(&self) -> u64 {
        self.total(|w| TransportKind::ALL.iter().map(|k| w.body_bytes_of(*k)).sum())
    }

    /// The capacity model's ceiling for the last second's transport mix, in Gb/s.
    pub(crate) fn model_ceiling(&self) -> Option<f64> {
        Some(f64::from_bits(self.model_ceiling_gbps.load(Ordering::Relaxed))).filter(|c| *c > 0.0)
    }

    /// Body bytes served so far per transport, for the capacity model's mix.
    fn served(&self) -> crate::capacity::Served {
        let sessions = self.total(|w| w.ktls_sessions.get());
        let device = self.total(|w| w.ktls_device_sessions.get());
        crate::capacity::Served {
            plain: self.total(|w| w.body_bytes_of(TransportKind::Plain)) as f64,
            ktls: self.total(|w| w.body_bytes_of(TransportKind::Ktls)) as f64,
            ktls_offload_share: if sessions == 0 { 0.0 } else { device as f64 / sessions as f64 },
            user_tls: self.total(|w| w.body_bytes_of(TransportKind::UserTls)) as f64,
        }
    }

    /// The agent-check line for the current load.
    pub(crate) fn load_line(&self, gbps: f64) -> String {
        if self.shutting_down.load(Ordering::Relaxed) {
            return "drain".to_string();
        }
        let conns = self.total(WorkerCounters::connections_open) as f64;
        let mut used = conns / self.capacity_connections.max(1) as f64;
        if self.capacity_gbps > 0.0 {
            used = used.max(gbps / self.capacity_gbps);
        } else if let Some(ceiling) = self.model_ceiling() {
            used = used.max(gbps / ceiling);
        }
        let weight = ((1.0 - used) * 100.0).round().clamp(1.0, 100.0) as u32;
        // `ready` lifts HAProxy's administrative drain, which a `drain` reply set: a
        // node restarted after a drain rejoins at the next check by itself.
        format!("up ready {weight}%")
    }
}

/// How long a connection may stay silent before it is taken for an agent check.
const AGENT_WAIT: Duration = Duration::from_millis(200);
/// How long a request head may take, and a kept-alive connection may stay idle.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// Stops the admin endpoint from accepting (requests already read are answered).
pub(crate) struct Stop(Arc<tokio::sync::Notify>);

impl Stop {
    /// Closes this process's copy of the admin socket: after an upgrade the new
    /// process, which holds the same socket, answers alone.
    pub(crate) fn stop(&self) {
        self.0.notify_one();
    }
}

/// Starts the admin thread on an already bound listener.
pub(crate) fn start(listener: std::net::TcpListener, state: Arc<AdminState>) -> std::io::Result<Stop> {
    let stop = Arc::new(tokio::sync::Notify::new());
    let stopped = stop.clone();
    std::thread::Builder::new().name("linerate-admin".into()).spawn(move || {
        let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
            Ok(rt) => rt,
            Err(e) => {
                tracing::error!("admin endpoint cannot start: {e}");
                return;
            }
        };
        let local = tokio::task::LocalSet::new();
        local.block_on(&rt, serve(listener, state, stopped));
    })?;
    Ok(Stop(stop))
}

async fn serve(listener: std::net::TcpListener, state: Arc<AdminState>, stop: Arc<tokio::sync::Notify>) {
    let listener = match TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => return tracing::error!("admin endpoint cannot start: {e}"),
    };
    let registry = Rc::new(metrics::registry(state.clone()));
    // Body throughput over the last second, for /load and /status.
    let gbps = Rc::new(Cell::new(0.0));
    {
        let (state, gbps) = (state.clone(), gbps.clone());
        tokio::task::spawn_local(async move {
            let mut last = (Instant::now(), state.body_bytes());
            let mut last_served = state.served();
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tick.tick().await;
                let now = (Instant::now(), state.body_bytes());
                let secs = now.0.duration_since(last.0).as_secs_f64();
                if secs > 0.0 {
                    gbps.set((now.1 - last.1) as f64 * 8.0 / secs / 1e9);
                }
                last = now;
                if let Some((inputs, path)) = &state.capacity_model {
                    let served = state.served();
                    let delta = crate::capacity::Served {
                        plain: served.plain - last_served.plain,
                        ktls: served.ktls - last_served.ktls,
                        ktls_offload_share: served.ktls_offload_share,
                        user_tls: served.user_tls - last_served.user_tls,
                    };
                    // Nothing served: the mix is unknown, the last ceiling stands.
                    if let Some(bps) = crate::capacity::served_mix_ceiling(inputs, *path, &delta) {
                        state.model_ceiling_gbps.store((bps / 1e9).to_bits(), Ordering::Relaxed);
                    }
                    last_served = served;
                }
            }
        });
    }
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = stop.notified() => break,
        };
        let (stream, peer) = match accepted {
            Ok(x) => x,
            Err(e) => {
                tracing::debug!("admin accept: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let (state, registry, gbps) = (state.clone(), registry.clone(), gbps.clone());
        tokio::task::spawn_local(async move {
            if let Err(e) = handle(stream, &state, &registry, &gbps).await {
                tracing::debug!(%peer, "admin request: {e}");
            }
        });
    }
    drop(listener);
    // Requests in flight finish; the process exits after its drain.
    std::future::pending::<()>().await
}

async fn handle(
    mut stream: TcpStream,
    state: &AdminState,
    registry: &prometheus_client::registry::Registry,
    gbps: &Cell<f64>,
) -> std::io::Result<()> {
    let mut probe = [0u8; 1];
    if tokio::time::timeout(AGENT_WAIT, stream.peek(&mut probe)).await.is_err() {
        // Nothing sent: an agent check.
        stream.write_all(format!("{}\n", state.load_line(gbps.get())).as_bytes()).await?;
        return stream.shutdown().await;
    }
    let mut buf = Vec::with_capacity(1024);
    let mut req = Request::default();
    let limits = Limits { max_head_bytes: 8192, max_uri_bytes: 1024, max_headers: 50 };
    // Keep-alive, so that a browser polling /status reuses its connection rather than
    // opening one a second: a browser may open a connection ahead of need and leave it
    // silent, which the check above would answer with the agent line.
    loop {
        let parsed = tokio::time::timeout(REQUEST_TIMEOUT, async {
            loop {
                if !buf.is_empty() {
                    match req.parse(&buf, &limits) {
                        Ok(Parsed::Complete(n)) => return Ok(Some(Some(n))),
                        Ok(Parsed::Partial) => {}
                        Err(_) => return Ok(Some(None)),
                    }
                }
                if stream.read_buf(&mut buf).await? == 0 {
                    return Ok(None);
                }
            }
        })
        .await;
        let head = match parsed {
            Ok(Ok(Some(head))) => head,
            Ok(Ok(None)) | Err(_) => return Ok(()),
            Ok(Err(e)) => return Err(e),
        };
        let post_prefill = head.is_some() && req.method_name() == b"POST" && {
            let target = req.target();
            target.split(|&b| b == b'?').next() == Some(&b"/prefill"[..])
        };
        let reply = match head {
            None => Reply::text("400 Bad Request", "bad request\n"),
            Some(n) if post_prefill => {
                match prefill::read_body(&mut stream, &mut buf, n, req.body, req.expect_continue).await? {
                    Ok(body) => prefill::post(state, &body),
                    Err(reply) => reply,
                }
            }
            Some(_) => {
                let target = req.target();
                let path = target.split(|&b| b == b'?').next().unwrap_or_default();
                route(path, state, registry, gbps.get())
            }
        };
        // A request with a body (which nothing here reads) ends the connection, and
        // so does every answer once shutdown has begun: the next request goes to a
        // new connection, which after a binary upgrade the new process answers.
        let keep_alive = head.is_some()
            && req.keep_alive
            && req.body == BodyFraming::None
            && !state.shutting_down.load(Ordering::Relaxed);
        let head_only = head.is_some() && req.method == linerate_http::Method::Head;
        let response = format!(
            "HTTP/1.1 {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nCache-Control: no-store\r\n{}Connection: {}\r\n\r\n{}",
            reply.status,
            reply.content_type,
            reply.body.len(),
            reply.headers,
            if keep_alive { "keep-alive" } else { "close" },
            if head_only { "" } else { &reply.body }
        );
        stream.write_all(response.as_bytes()).await?;
        match head {
            Some(n) if keep_alive => drop(buf.drain(..n)),
            _ => return stream.shutdown().await,
        }
    }
}

/// One answer of the admin endpoint.
struct Reply {
    status: &'static str,
    content_type: &'static str,
    body: Cow<'static, str>,
    /// More header lines, each ending in CRLF.
    headers: &'static str,
}

impl Reply {
    fn new(status: &'static str, content_type: &'static str, body: impl Into<Cow<'static, str>>) -> Reply {
        Reply { status, content_type, body: body.into(), headers: "" }
    }

    fn text(status: &'static str, body: impl Into<Cow<'static, str>>) -> Reply {
        Reply::new(status, "text/plain; charset=utf-8", body)
    }
}

fn route(path: &[u8], state: &AdminState, registry: &prometheus_client::registry::Registry, gbps: f64) -> Reply {
    match path {
        b"/" | b"/dashboard" => {
            Reply { headers: dashboard::headers(), ..Reply::new("200 OK", "text/html; charset=utf-8", dashboard::PAGE) }
        }
        b"/metrics" => {
            let mut out = String::new();
            match prometheus_client::encoding::text::encode(&mut out, registry) {
                Ok(()) => Reply::new("200 OK", "application/openmetrics-text; version=1.0.0; charset=utf-8", out),
                Err(_) => Reply::text("500 Internal Server Error", "cannot encode metrics\n"),
            }
        }
        b"/status" => Reply::new("200 OK", "application/json", status::json(state, gbps)),
        b"/healthz" if state.shutting_down.load(Ordering::Relaxed) => {
            Reply::text("503 Service Unavailable", "draining\n")
        }
        b"/healthz" => Reply::text("200 OK", "ok\n"),
        b"/load" => Reply::text("200 OK", format!("{}\n", state.load_line(gbps))),
        b"/prefill" => prefill::get(state),
        _ => Reply::text("404 Not Found", "not found: try /, /metrics, /status, /healthz, /load or /prefill\n"),
    }
}

/// Binds the admin listener (before the workers start, like the others).
pub(crate) fn bind(addr: SocketAddr) -> anyhow::Result<std::net::TcpListener> {
    use anyhow::Context;
    let l = std::net::TcpListener::bind(addr).with_context(|| format!("cannot listen on {addr} (admin)"))?;
    l.set_nonblocking(true)?;
    Ok(l)
}

/// CPU seconds a worker thread has used, from /proc/self/task/TID/stat.
pub(crate) fn thread_cpu_seconds(tid: u32) -> Option<f64> {
    if tid == 0 {
        return None;
    }
    let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    Some(ticks as f64 / linerate_sys::clock::ticks_per_second().ok()? as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(capacity: u64, gbps_cap: f64) -> AdminState {
        AdminState {
            workers: vec![Arc::new(WorkerCounters::new(0, Some(0), Some(0), 0))],
            shutting_down: AtomicBool::new(false),
            started: Instant::now(),
            tls_mode: None,
            steering: "reuseport-hash",
            capacity_connections: capacity,
            capacity_gbps: gbps_cap,
            capacity_model: None,
            model_ceiling_gbps: Default::default(),
            fill: None,
            cache: None,
            prefill: None,
            access_log: None,
            certificates: Default::default(),
            reloads: Default::default(),
            reload_failures: Default::default(),
            upgrade_failures: Default::default(),
        }
    }

    #[test]
    fn load_line_uses_the_model_ceiling_unless_capacity_gbps_is_set() {
        let s = state(1000, 0.0);
        assert_eq!(s.load_line(5.0), "up ready 100%", "no model, no capacity_gbps");
        s.model_ceiling_gbps.store(20.0f64.to_bits(), Ordering::Relaxed);
        assert_eq!(s.model_ceiling(), Some(20.0));
        assert_eq!(s.load_line(5.0), "up ready 75%");
        let s = state(1000, 10.0);
        s.model_ceiling_gbps.store(20.0f64.to_bits(), Ordering::Relaxed);
        assert_eq!(s.load_line(5.0), "up ready 50%", "capacity_gbps wins");
    }

    #[test]
    fn load_line_weights() {
        let s = state(100, 0.0);
        assert_eq!(s.load_line(0.0), "up ready 100%");
        s.workers[0].connections_accepted.add(25);
        assert_eq!(s.load_line(50.0), "up ready 75%", "Gb/s ignored without a capacity");
        let s2 = state(100, 10.0);
        s2.workers[0].connections_accepted.add(10);
        assert_eq!(s2.load_line(5.0), "up ready 50%", "the busier of the two decides");
        s2.workers[0].connections_accepted.add(500);
        assert_eq!(s2.load_line(0.0), "up ready 1%", "never 0, which HAProxy reads as drain");
        s2.shutting_down.store(true, Ordering::Relaxed);
        assert_eq!(s2.load_line(0.0), "drain");
    }

    #[test]
    fn routes() {
        let s = Arc::new(state(100, 0.0));
        let registry = metrics::registry(s.clone());
        for path in [&b"/"[..], b"/dashboard"] {
            let r = route(path, &s, &registry, 0.0);
            assert_eq!((r.status, r.content_type), ("200 OK", "text/html; charset=utf-8"));
            assert!(r.body.starts_with("<!doctype html>") && r.body.contains("fetch('status'"));
            assert!(r.headers.starts_with("Content-Security-Policy: default-src 'none';"), "{}", r.headers);
            assert!(r.headers.ends_with("\r\n"));
        }
        let r = route(b"/status", &s, &registry, 0.0);
        assert_eq!((r.status, r.headers), ("200 OK", ""));
        let v: serde_json::Value = serde_json::from_str(&r.body).unwrap();
        assert_eq!(v["totals"]["tls_handshake_failures"], 0);
        assert_eq!(route(b"/index.html", &s, &registry, 0.0).status, "404 Not Found");
        // No cache, no prefill: both methods say why.
        let r = route(b"/prefill", &s, &registry, 0.0);
        assert!(r.status == "404 Not Found" && r.body.contains("[[origin]]"), "{}", r.body);
        let r = prefill::post(&s, b"/vod/a.mp4\n");
        assert!(r.status == "404 Not Found" && r.body.contains("[[origin]]"), "{}", r.body);
        assert!(v.get("prefill").is_none(), "no prefill object without a cache");
    }
}
