//! One worker: a thread kept to its NUMA domain's CPUs (or to its own CPU, see
//! `numa.pin`), running its own single-threaded event loop.
//!
//! A worker owns its listening sockets (one per address, each a member of that
//! address's `SO_REUSEPORT` group), accepts connections from them, and serves every
//! connection it accepts until it closes: connections never move between workers.
//! Everything a connection touches on the hot path belongs to the worker: the
//! open-file cache, the Date cache, the counters. The only things shared with
//! other threads are the immutable [`Settings`], the counters' cache lines,
//! which only this worker writes, and the per-client table of
//! [`client_limits`], touched once at accept and once at close.
//!
//! Shutdown, step by step:
//! 1. the supervisor sends [`Control::Shutdown`];
//! 2. the worker stops its accept loops, which closes its listeners, so the kernel
//!    stops queueing connections for it;
//! 3. idle keep-alive connections close at once; a connection in the middle of a
//!    response finishes it (answering `Connection: close`) and closes;
//! 4. when no connection is left, or the drain timeout passes, the event loop ends
//!    and remaining connections are dropped.

pub(super) mod client_limits;

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Semaphore};

use crate::counters::tcp_info::{Chooser, Sampler};
use crate::counters::{ErrorKind, Refusal, WorkerCounters};
use crate::server::access_log::{AccessLog, WorkerLog};
use crate::server::cache::Cache;
use crate::server::conn;
use crate::server::files::FileCache;
use crate::server::pagecache::{ColdPath, FillPool};
use crate::server::settings::Settings;
use crate::tls::handshake::{self, HandshakeError};
use crate::tls::record::{cipher_parts, Protocol};
use crate::transport::ktls::Ktls;
use crate::transport::plain::Plain;
use crate::transport::usertls::{RecordBuffers, UserTls};
use crate::transport::SendLimits;
use client_limits::{ClientSlot, ClientTable};

/// Messages from the supervisor.
pub(super) enum Control {
    /// New settings for connections accepted from now on (and signed-URL rules for
    /// every request from now on); the worker answers on the channel once applied.
    Reload(Arc<Settings>, std::sync::mpsc::Sender<()>),
    Shutdown,
}

/// A worker's state, shared by its tasks (all on one thread): what its
/// connections see ([`conn::Context`], reached through `Deref`) and what only the
/// accept side uses.
pub(super) struct Worker {
    ctx: conn::Context,
    pub settings: RefCell<Arc<Settings>>,
    /// Record batch buffers for user-space TLS connections.
    pub record_buffers: Rc<RecordBuffers>,
    /// Picks the connections whose TCP_INFO is sampled.
    chooser: RefCell<Chooser>,
    /// Silo of each CPU, when there is more than one.
    cpu_domains: Option<Arc<Vec<Option<usize>>>>,
    /// Every worker's clients, for the per-client limits.
    clients: Arc<ClientTable>,
}

impl std::ops::Deref for Worker {
    type Target = conn::Context;

    fn deref(&self) -> &conn::Context {
        &self.ctx
    }
}

/// Everything a worker thread starts with.
pub(super) struct Launch {
    pub index: usize,
    /// The worker's own CPU: where its slot in the silo plan is.
    pub cpu: usize,
    /// The CPUs it may run on (`numa.pin`): its own, or all of its domain's.
    pub cpus: Vec<usize>,
    pub listeners: Vec<std::net::TcpListener>,
    pub tls_listeners: Vec<std::net::TcpListener>,
    pub settings: Arc<Settings>,
    pub counters: Arc<WorkerCounters>,
    pub control: mpsc::UnboundedReceiver<Control>,
    /// Silo of each CPU (index = CPU), for counting cross-domain connections.
    pub cpu_domains: Arc<Vec<Option<usize>>>,
    pub fill: Option<Arc<FillPool>>,
    /// The pull-through cache, when `[[origin]]` tables are configured.
    pub cache: Option<Arc<Cache>>,
    pub access_log: Option<Arc<AccessLog>>,
    /// The process-wide table behind the per-client limits.
    pub clients: Arc<ClientTable>,
    /// Called once the worker's listeners are registered with its event loop: from
    /// then on connections queued on them are accepted.
    pub started: Box<dyn FnOnce() + Send>,
}

/// Runs a worker until it is told to shut down and has drained. Returns an error
/// only if it could not start.
pub(super) fn run(launch: Launch) -> anyhow::Result<()> {
    if let Err(e) = linerate_sys::pin_current_thread_to(&launch.cpus) {
        tracing::warn!(worker = launch.index, cpus = ?launch.cpus, "cannot keep the worker to its CPUs: {e}; it will float");
    }
    let rt = tokio::runtime::Builder::new_current_thread().enable_io().enable_time().build()?;
    let local = tokio::task::LocalSet::new();
    local.block_on(&rt, serve(launch))
}

async fn serve(launch: Launch) -> anyhow::Result<()> {
    let Launch {
        index,
        cpu,
        cpus: _,
        listeners,
        tls_listeners,
        settings,
        counters,
        mut control,
        cpu_domains,
        fill,
        cache,
        access_log,
        clients,
        started,
    } = launch;
    counters.tid.store(linerate_sys::tcp::current_tid(), std::sync::atomic::Ordering::Relaxed);
    let multi_domain = cpu_domains.iter().flatten().any(|&d| d != counters.domain);
    let record_buffers = Rc::new(RecordBuffers::default());
    place_memory(&settings, &counters, &record_buffers);
    let debug_field = format!(
        "X-Linerate-Worker: {index} cpu={cpu} node={}\r\n",
        counters.node.map_or("-".into(), |n| n.to_string())
    )
    .into_bytes();
    let chooser = Chooser::new(settings.config.stats.tcp_info_sample, seed(index));
    let page_chooser = Chooser::new(settings.config.numa.page_sample, seed(index + 1000));
    let max_connections = settings.max_connections_per_worker;
    let drain = settings.config.timeouts.drain;
    let files = FileCache::new(settings.config.open_file_cache.entries, settings.config.open_file_cache.valid);
    let boundary_salt = ((index as u64) << 48) ^ u64::from(std::process::id());
    let pages = fill.map(|pool| ColdPath::new(pool, counters.clone()));
    let ctx = conn::Context::new(index, files, counters, pages, page_chooser, debug_field, boundary_salt)
        .with_log(access_log.map(WorkerLog::new))
        .with_cache(cache);
    *ctx.signed.borrow_mut() = settings.signed.clone();
    let worker = Rc::new(Worker {
        ctx,
        settings: RefCell::new(settings),
        record_buffers,
        chooser: RefCell::new(chooser),
        cpu_domains: multi_domain.then_some(cpu_domains),
        clients,
    });
    let slots = Arc::new(Semaphore::new(max_connections));
    let mut accepters = Vec::new();
    let kinds =
        listeners.into_iter().map(|l| (l, Scheme::Http)).chain(tls_listeners.into_iter().map(|l| (l, Scheme::Https)));
    for (listener, scheme) in kinds {
        let listener = TcpListener::from_std(listener)?;
        accepters.push(tokio::task::spawn_local(accept_loop(worker.clone(), listener, scheme, slots.clone())));
    }
    tracing::debug!(worker = index, cpu, max_connections, "worker started");
    if worker.log.is_some() {
        // Records wait at most about a second in the worker's buffer.
        let w = worker.clone();
        accepters.push(tokio::task::spawn_local(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(500));
            loop {
                tick.tick().await;
                if let Some(log) = &w.log {
                    log.flush_if_old(Instant::now());
                }
            }
        }));
    }
    started();

    while let Some(msg) = control.recv().await {
        match msg {
            Control::Reload(settings, applied) => {
                // Start a fresh cache. Connections still under the old settings
                // share it, but entries are keyed by settings, so a changed root
                // never crosses over. Responses in flight keep the files they hold.
                let c = &settings.config.open_file_cache;
                *worker.files.borrow_mut() = FileCache::new(c.entries, c.valid);
                *worker.chooser.borrow_mut() = Chooser::new(settings.config.stats.tcp_info_sample, seed(index));
                *worker.signed.borrow_mut() = settings.signed.clone();
                *worker.settings.borrow_mut() = settings;
                let _ = applied.send(());
            }
            Control::Shutdown => break,
        }
    }

    worker.begin_shutdown();
    for a in &accepters {
        a.abort();
    }
    let deadline = Instant::now() + drain;
    while slots.available_permits() < max_connections && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let left = max_connections - slots.available_permits();
    if left > 0 {
        tracing::warn!(worker = index, connections = left, "drain timeout: closing connections still open");
    }
    if let Some(log) = &worker.log {
        log.flush();
    }
    Ok(())
}

/// What a listener speaks.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Scheme {
    Http,
    Https,
}

async fn accept_loop(worker: Rc<Worker>, listener: TcpListener, scheme: Scheme, slots: Arc<Semaphore>) {
    let mut last_warning: Option<Instant> = None;
    loop {
        // Full: stop accepting (the kernel keeps queueing in the backlog) until a
        // connection ends, instead of accepting and dropping.
        let Ok(permit) = slots.clone().acquire_owned().await else { return };
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                worker.counters.error(ErrorKind::Accept);
                if is_resource_exhaustion(&e) {
                    // Out of descriptors or memory: the pending connection stays
                    // queued and accept would fail again at once. Back off instead of
                    // spinning; log at most every 10 s.
                    if last_warning.is_none_or(|t| t.elapsed() > Duration::from_secs(10)) {
                        tracing::warn!(worker = worker.index, "accept failed: {e}; pausing accepts for 100 ms");
                        last_warning = Some(Instant::now());
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                } else {
                    tracing::debug!(worker = worker.index, "accept failed: {e}");
                }
                continue;
            }
        };
        let settings = worker.settings.borrow().clone();
        let client = match worker.clients.admit(peer.ip(), &settings.config.client_limits, Instant::now()) {
            Ok(slot) => slot,
            Err(why) => {
                refuse(&worker, stream, peer, scheme, why);
                continue;
            }
        };
        worker.counters.connections_accepted.add(1);
        if let Err(e) = stream.set_nodelay(true) {
            tracing::debug!("TCP_NODELAY: {e}");
        }
        let info = conn::ConnInfo {
            peer,
            tls: None,
            cross_domain: count_cross_domain(&worker, &stream),
            sampler: if worker.chooser.borrow().choose() { Sampler::new(&stream) } else { None },
        };
        tokio::task::spawn_local(connection(worker.clone(), stream, scheme, settings, info, permit, client));
    }
}

/// One connection's task, from accept to close.
///
/// The task's own future stays small: what each phase awaits (plain HTTP; or a TLS
/// handshake, then HTTP over kernel or user-space TLS) is boxed separately, so a
/// connection holds the state of the phase it is in, not room for the largest of
/// all of them at once (inline, they made every task about 11.7 KiB).
async fn connection(
    worker: Rc<Worker>,
    stream: TcpStream,
    scheme: Scheme,
    settings: Arc<Settings>,
    info: conn::ConnInfo,
    permit: tokio::sync::OwnedSemaphorePermit,
    client: Option<ClientSlot>,
) {
    // Counted closed and the slots given back even if the task panics.
    let _open = OpenConnection { worker: worker.clone(), _permit: permit, _client: client };
    match scheme {
        Scheme::Http => {
            let transport = Plain::new(stream, SendLimits::new(&settings.config));
            Box::pin(conn::serve(transport, &worker, &settings, info)).await;
        }
        Scheme::Https => Box::pin(serve_tls(stream, &worker, &settings, info)).await,
    }
}

/// A connection over a per-client limit: closed before anything is read from it
/// or any handshake starts, counted, and logged at debug only (a warning sums
/// refusals up at most once a minute). A plain-HTTP client is first told why, with
/// a 429 written only if the socket takes it at once (it always does on a fresh
/// connection) so a refusal never waits.
fn refuse(worker: &Worker, stream: TcpStream, peer: std::net::SocketAddr, scheme: Scheme, why: Refusal) {
    worker.counters.client_limit_refusals[why as usize].add(1);
    tracing::debug!(worker = worker.index, %peer, limit = why.label(), "client over its limit: connection refused");
    worker.clients.note_refusal(why, Instant::now());
    if scheme == Scheme::Http {
        let _ = stream.try_write(TOO_MANY_REQUESTS);
    }
    // Dropping the stream closes it.
}

const TOO_MANY_REQUESTS: &[u8] =
    b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";

/// Handshake, then serve over kernel TLS when the kernel takes this session's
/// version and cipher, over the user-space record layer otherwise.
async fn serve_tls(stream: TcpStream, worker: &Worker, settings: &Settings, info: conn::ConnInfo) {
    let Some(tls) = settings.tls.as_ref() else { return };
    // Each phase's future is boxed on its own (see `connection`): the handshake's
    // state is allocated when the client's first bytes arrive, and freed before the
    // connection's is allocated.
    let deadline = tokio::time::Instant::now() + settings.config.timeouts.header;
    // Boxed: the timer is only needed until then, and inline it would make every
    // connection's task larger.
    if Box::pin(tokio::time::timeout_at(deadline, stream.readable())).await.is_err() {
        handshake_timed_out(worker);
        return;
    }
    let serving = match Box::pin(handshake(stream, worker, settings, tls, deadline)).await {
        Some((stream, established)) => after_handshake(stream, established, worker, settings, tls, info),
        None => return,
    };
    if let Some(serving) = serving {
        serving.await;
    }
}

/// HTTP over the established session: the connection's future, boxed. Not async,
/// so that the transport built here is not kept in the caller's future as well.
fn after_handshake<'a>(
    stream: TcpStream,
    mut established: crate::tls::handshake::Established,
    worker: &'a Worker,
    settings: &'a Settings,
    tls: &crate::tls::TlsSettings,
    mut info: conn::ConnInfo,
) -> Option<std::pin::Pin<Box<dyn std::future::Future<Output = ()> + 'a>>> {
    let counters = &worker.counters;
    counters.tls_handshakes.add(1);
    info.tls = Some(conn::TlsInfo {
        version: match established.protocol {
            Protocol::Tls12 => "TLSv1.2",
            Protocol::Tls13 => "TLSv1.3",
        },
        cipher: established.suite.suite().as_str().unwrap_or("unknown"),
        sni: established.sni.take(),
    });
    let version = match established.protocol {
        Protocol::Tls12 => linerate_sys::ktls::Version::Tls12,
        Protocol::Tls13 => linerate_sys::ktls::Version::Tls13,
    };
    let (cipher, _, _) = cipher_parts(&established.secrets.tx.1);
    let send_limits = SendLimits::new(&settings.config);
    if tls.kernel.supports(version, cipher) {
        let addrs = stream.local_addr().and_then(|l| Ok((l, stream.peer_addr()?)));
        match Ktls::new(stream, established, send_limits, tls.zerocopy_sendfile) {
            Ok(transport) => {
                counters.ktls_sessions.add(1);
                count_offload(worker, addrs);
                Some(Box::pin(conn::serve(transport, worker, settings, info)))
            }
            Err(e) => {
                counters.tls_handshake_failures.add(1);
                tracing::warn!(
                    worker = worker.index,
                    "cannot hand the TLS session to the kernel: {e}; connection closed"
                );
                None
            }
        }
    } else {
        counters.usertls_sessions.add(1);
        let transport = UserTls::new(stream, established, send_limits, worker.record_buffers.clone());
        Some(Box::pin(conn::serve(transport, worker, settings, info)))
    }
}

fn handshake_timed_out(worker: &Worker) {
    worker.counters.tls_handshake_failures.add(1);
    worker.counters.error(ErrorKind::Timeout);
}

/// The TLS handshake, done by `deadline`; a client speaking plain HTTP gets a 400
/// saying so. `None`: the connection is over (failure counted).
async fn handshake(
    mut stream: TcpStream,
    worker: &Worker,
    settings: &Settings,
    tls: &crate::tls::TlsSettings,
    deadline: tokio::time::Instant,
) -> Option<(TcpStream, crate::tls::handshake::Established)> {
    let counters = &worker.counters;
    let handshake = handshake::accept(&mut stream, tls.server_config.clone());
    match tokio::time::timeout_at(deadline, handshake).await {
        Ok(Ok(est)) => Some((stream, est)),
        Ok(Err(HandshakeError::PlainHttp)) => {
            counters.error(ErrorKind::BadRequest);
            let body = "400 Bad Request: plain HTTP was sent to an HTTPS port\n";
            let response = format!(
                "HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = tokio::time::timeout(settings.config.timeouts.send, stream.write_all(response.as_bytes())).await;
            crate::transport::close_tcp(&mut stream, true).await;
            None
        }
        Ok(Err(e)) => {
            counters.tls_handshake_failures.add(1);
            tracing::debug!(worker = worker.index, "TLS handshake failed: {e}");
            None
        }
        Err(_) => {
            handshake_timed_out(worker);
            None
        }
    }
}

/// A per-worker, per-process seed for the sampling choice.
fn seed(index: usize) -> u64 {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    (index as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ u64::from(nanos) ^ u64::from(std::process::id())
}

/// Counts the connection, and says so, if its SYN was taken by a CPU of another
/// silo than this worker's (`SO_INCOMING_CPU`). Skipped with a single silo.
fn count_cross_domain(worker: &Worker, stream: &TcpStream) -> bool {
    let Some(domains) = &worker.cpu_domains else { return false };
    let Ok(cpu) = linerate_sys::tcp::incoming_cpu(std::os::fd::AsFd::as_fd(stream)) else { return false };
    let cross = domains.get(cpu).copied().flatten().is_some_and(|d| d != worker.counters.domain);
    if cross {
        worker.counters.cross_domain_connections.add(1);
    }
    cross
}

/// Memory placement at worker start: with `numa.bind_memory`, the worker's
/// allocations prefer its node; either way its first record buffer is allocated
/// and written here, by the worker, which runs only on its domain's CPUs (first
/// touch puts it on the worker's node), and the node the kernel actually gave it
/// is recorded for /status.
fn place_memory(settings: &Settings, counters: &WorkerCounters, buffers: &RecordBuffers) {
    if let (true, Some(node)) = (settings.config.numa.bind_memory, counters.node) {
        if let Err(e) = linerate_sys::numa::prefer_node(node as u32) {
            tracing::warn!(worker = counters.index, node, "numa.bind_memory: {e}");
        }
    }
    let buffer = buffers.warm_one();
    if let Ok(node) = linerate_sys::numa::node_of(&buffer[0]) {
        counters.buffer_node.add(1 + i64::from(node));
    }
    buffers.give_back(buffer);
}

/// Asks the kernel whether this session's records are sealed by the NIC (TLS
/// offload, which Linux picks by itself when the NIC offers it) or in software.
/// It runs on the worker thread: one lookup of this socket, which the kernel answers
/// at once, and at worst `sockdiag::REPLY_TIMEOUT` (50 ms) waiting for a lost reply.
fn count_offload(worker: &Worker, addrs: std::io::Result<(std::net::SocketAddr, std::net::SocketAddr)>) {
    use linerate_sys::sockdiag::{self, TlsConf};
    let info = addrs.and_then(|(local, peer)| sockdiag::tls_info(local, peer));
    match info {
        Ok(Some(info)) if matches!(info.tx, Some(TlsConf::Hardware | TlsConf::HardwareRecord)) => {
            worker.counters.ktls_device_sessions.add(1)
        }
        Ok(Some(_)) => {}
        Ok(None) => tracing::debug!(worker = worker.index, "kTLS socket reports no TLS info"),
        Err(e) => tracing::debug!(worker = worker.index, "sock_diag: {e}"),
    }
}

struct OpenConnection {
    worker: Rc<Worker>,
    _permit: tokio::sync::OwnedSemaphorePermit,
    _client: Option<ClientSlot>,
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.worker.counters.connections_closed.add(1);
    }
}

fn is_resource_exhaustion(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::Transport;

    /// The signature of `connection`, returning the future `F`.
    type ConnectionFn<F> = fn(
        Rc<Worker>,
        TcpStream,
        Scheme,
        Arc<Settings>,
        conn::ConnInfo,
        tokio::sync::OwnedSemaphorePermit,
        Option<ClientSlot>,
    ) -> F;

    /// The size of the future `f` returns, without calling it.
    fn task_size<F>(_: ConnectionFn<F>) -> usize {
        std::mem::size_of::<F>()
    }

    fn serve_size<'a, T: Transport, F>(
        _: impl FnOnce(T, &'a conn::Context, &'a Settings, conn::ConnInfo) -> F,
    ) -> usize {
        std::mem::size_of::<F>()
    }

    fn handshake_size<'a, F>(
        _: impl FnOnce(TcpStream, &'a Worker, &'a Settings, &'a crate::tls::TlsSettings, tokio::time::Instant) -> F,
    ) -> usize {
        std::mem::size_of::<F>()
    }

    /// What every open connection carries is its task's future plus the boxed
    /// future of the phase it is in (see `connection`). These bounds keep them
    /// from growing back unnoticed (bench/conn-memory.py measures the whole).
    #[test]
    fn connection_futures_stay_small() {
        let task = task_size(connection);
        let plain = serve_size(conn::serve::<Plain, ColdPath>);
        let user_tls = serve_size(conn::serve::<UserTls, ColdPath>);
        let ktls = serve_size(conn::serve::<Ktls, ColdPath>);
        let handshake = handshake_size(handshake);
        println!(
            "task {task}, handshake {handshake}, plain {plain}, user-space TLS {user_tls}, kernel TLS {ktls} bytes"
        );
        assert!(task <= 320, "connection task: {task} bytes");
        assert!(handshake <= 3072, "handshake: {handshake} bytes");
        for (name, size, max) in
            [("plain", plain, 1536), ("user-space TLS", user_tls, 3072), ("kernel TLS", ktls, 1536)]
        {
            assert!(size <= max, "{name}: {size} bytes, more than {max}");
        }
    }
}
