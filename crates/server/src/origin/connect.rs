//! Connections to one origin URL: TCP and TLS under the connect timeout, counted
//! while open, and the keep-alive pool they return to.

use std::collections::VecDeque;
use std::error::Error as StdError;
use std::io;
use std::pin::Pin;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _};
use bytes::Bytes;
use http::header::HeaderValue;
use http_body_util::Empty;
use hyper::client::conn::http1;
use hyper::rt::{Read, ReadBufCursor, Write};
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::RootCertStore;
use tokio::net::TcpStream;
use tokio::sync::oneshot;

use super::error::{OriginError, Phase};
use super::request::host_field;
use super::stats::Counters;
use super::stream::{HandshakeError, Stream};
use crate::config::{parse_base_url, BaseUrl, Origin};

/// Response heads (status line and fields) longer than this are refused: an
/// origin's head is a few hundred bytes, and a bounded one bounds the memory a
/// broken or hostile origin can take per connection.
pub(crate) const HEAD_LIMIT_BYTES: usize = 64 * 1024;

/// Idle keep-alive connections are closed after this long unused (hyper's own
/// pool default): long enough to carry a connection across the pauses of a
/// steady fill, short enough not to hold origin sockets nothing uses.
pub(super) const IDLE_CONNECTION_SECS: u64 = 90;

/// One origin URL: where it is, how to connect, its idle connections, its counters.
pub(super) struct Url {
    /// As configured, for logs and metrics.
    pub(super) text: String,
    pub(super) base: BaseUrl,
    /// The `Host` field of every request to it.
    pub(super) host: HeaderValue,
    /// The TLS configuration and name of an `https` URL (the name is its host:
    /// SNI, and what its certificate must be for).
    tls: Option<(Arc<rustls::ClientConfig>, ServerName<'static>)>,
    /// The roots a certificate must chain to, said in an untrusted-certificate error.
    trust: Arc<str>,
    /// Newest last.
    idle: Mutex<VecDeque<Conn>>,
    max_idle: usize,
    pub(super) counters: Counters,
}

/// A connection's request side; its other half runs as a task of its own.
pub(super) struct Conn {
    pub(super) sender: http1::SendRequest<Empty<Bytes>>,
    /// How the connection task ended (set once it has).
    pub(super) ended: oneshot::Receiver<Result<(), hyper::Error>>,
    /// When it was last put back idle.
    since: Instant,
    /// The origin thread its task runs on ([`super::runtime::current`]).
    home: Option<super::runtime::Thread>,
}

impl Url {
    pub(super) fn new(
        text: &str,
        table: &Origin,
        tls: &Arc<rustls::ClientConfig>,
        trust: Arc<str>,
    ) -> Result<Url, String> {
        let mut base = parse_base_url(text)?;
        if let Some(s3) = &table.s3 {
            base = super::s3::bucket_url(&base, s3);
        }
        let host = HeaderValue::from_str(&host_field(&base)).map_err(|e| format!("{text:?}: bad host: {e}"))?;
        let tls = if base.https {
            let name = ServerName::try_from(bare_host(&base.host).to_string())
                .map_err(|e| format!("{text:?}: {} is not a server name: {e}", base.host))?;
            Some((tls.clone(), name))
        } else {
            None
        };
        Ok(Url {
            text: text.to_string(),
            base,
            host,
            tls,
            trust,
            idle: Mutex::new(VecDeque::new()),
            max_idle: table.max_idle_connections,
            counters: Counters::default(),
        })
    }

    /// A new connection, its task spawned on the current (origin) runtime. The
    /// whole of it, TLS handshake included, is under `timeout` (as nginx's
    /// `proxy_connect_timeout` covers its SSL handshake).
    pub(super) async fn connect(self: &Arc<Self>, timeout: Duration) -> Result<Conn, OriginError> {
        let stream =
            tokio::time::timeout(timeout, self.open()).await.map_err(|_| OriginError::Timeout(Phase::Connect))??;
        let io = Counted::new(stream, self.clone());
        let (sender, connection) = http1::Builder::new()
            .max_header_size(HEAD_LIMIT_BYTES)
            .handshake(io)
            .await
            .map_err(|e| OriginError::Connect(format!("{}: {}", self.text, chain(&e))))?;
        let (done, ended) = oneshot::channel();
        tokio::spawn(async move {
            let _ = done.send(connection.await);
        });
        Ok(Conn { sender, ended, since: Instant::now(), home: super::runtime::current() })
    }

    /// TCP to the first address of the host that answers, then TLS for `https`.
    async fn open(&self) -> Result<Stream, OriginError> {
        let host = bare_host(&self.base.host);
        let fail = |what: String| OriginError::Connect(format!("{}: {what}", self.text));
        let addrs = tokio::net::lookup_host((host, self.base.port))
            .await
            .map_err(|e| fail(format!("cannot resolve {host}: {e}")))?;
        let mut last = None;
        let mut tcp = None;
        for addr in addrs {
            match TcpStream::connect(addr).await {
                Ok(s) => {
                    tcp = Some(s);
                    break;
                }
                Err(e) => last = Some(format!("{addr}: {e}")),
            }
        }
        let Some(tcp) = tcp else {
            return Err(fail(last.unwrap_or_else(|| format!("{host} has no address"))));
        };
        // Requests are small and sent whole: nothing to gain from Nagle.
        let _ = tcp.set_nodelay(true);
        let Some((config, name)) = &self.tls else { return Ok(Stream::Plain(TokioIo::new(tcp))) };
        match Stream::tls(tcp, config.clone(), name.clone()).await {
            Ok(tls) => Ok(tls),
            Err(HandshakeError::Tls(e @ rustls::Error::InvalidCertificate(_))) => Err(fail(format!(
                "TLS: the certificate of {host} is not trusted ({e}): it must be for {host} and chain to {}",
                self.trust
            ))),
            Err(HandshakeError::Tls(e)) => Err(fail(format!("TLS handshake: {e}"))),
            Err(HandshakeError::Io(e)) => Err(fail(format!("TLS handshake: {e}"))),
        }
    }

    /// The newest idle connection still open, not expired, and opened on the
    /// calling origin thread (closed and expired ones met on the way go).
    pub(super) fn take_idle(&self) -> Option<Conn> {
        let here = super::runtime::current();
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        let mut i = idle.len();
        while i > 0 {
            i -= 1;
            if !idle[i].usable() {
                idle.remove(i);
            } else if idle[i].home == here {
                return idle.remove(i);
            }
        }
        None
    }

    /// Keeps `conn` for the next request, within `max_idle_connections` (the
    /// oldest goes first: the newest is the least likely to be closed by the
    /// origin meanwhile).
    pub(super) fn put_idle(&self, mut conn: Conn) {
        if self.max_idle == 0 || conn.sender.is_closed() {
            return;
        }
        conn.since = Instant::now();
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        let evicted = if idle.len() >= self.max_idle { idle.pop_front() } else { None };
        idle.push_back(conn);
        drop(idle);
        drop(evicted);
    }

    /// Closes the idle connections that expired or that the origin closed.
    pub(super) fn sweep(&self) {
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        let (keep, expired): (VecDeque<Conn>, VecDeque<Conn>) =
            std::mem::take(&mut *idle).into_iter().partition(Conn::usable);
        *idle = keep;
        drop(idle);
        drop(expired);
    }

    #[cfg(test)]
    pub(super) fn idle_count(&self) -> usize {
        self.idle.lock().unwrap_or_else(PoisonError::into_inner).len()
    }

    /// Makes the idle connections look unused for `by` longer.
    #[cfg(test)]
    pub(super) fn age_idle(&self, by: Duration) {
        for conn in self.idle.lock().unwrap_or_else(PoisonError::into_inner).iter_mut() {
            conn.since -= by;
        }
    }
}

impl Conn {
    fn usable(&self) -> bool {
        !self.sender.is_closed() && self.since.elapsed() < Duration::from_secs(IDLE_CONNECTION_SECS)
    }
}

/// The certificate authorities a table's `https` URLs are verified against:
/// those of its `ca_file`, or the system's (loaded once, by `system`, only when
/// some table needs them). `None` when the table has neither a `ca_file` nor an
/// `https` URL. Errors name the table's key.
pub(super) fn roots(
    table: &Origin,
    index: usize,
    system: &mut Option<Arc<RootCertStore>>,
) -> anyhow::Result<Option<(Arc<RootCertStore>, Arc<str>)>> {
    if let Some(path) = &table.ca_file {
        let key = format!("origin[{index}].ca_file");
        let pem = std::fs::read(path).with_context(|| format!("{key}: {}: cannot read", path.display()))?;
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&pem)
            .collect::<Result<_, _>>()
            .map_err(|e| anyhow!("{key}: {}: not a PEM certificate list: {e}", path.display()))?;
        if certs.is_empty() {
            bail!("{key}: {}: contains no certificate", path.display());
        }
        let mut store = RootCertStore::empty();
        for (i, cert) in certs.into_iter().enumerate() {
            store
                .add(cert)
                .map_err(|e| anyhow!("{key}: {}: certificate {i} is not a usable CA: {e}", path.display()))?;
        }
        let trust = format!("the certificates in {} ({key})", path.display());
        return Ok(Some((Arc::new(store), trust.into())));
    }
    if !table.urls.iter().any(|u| u.starts_with("https://")) {
        return Ok(None);
    }
    if system.is_none() {
        let found = rustls_native_certs::load_native_certs();
        let mut store = RootCertStore::empty();
        let (added, _unusable) = store.add_parsable_certificates(found.certs);
        if added == 0 {
            let why: Vec<String> = found.errors.iter().map(|e| e.to_string()).collect();
            bail!(
                "origin[{index}]: no system root certificate could be loaded ({}); name the origin's CA in \
                 origin[{index}].ca_file",
                if why.is_empty() { "none found".to_string() } else { why.join("; ") }
            );
        }
        *system = Some(Arc::new(store));
    }
    let store = system.clone().unwrap_or_else(|| Arc::new(RootCertStore::empty()));
    Ok(Some((store, "the system's root certificates".into())))
}

/// A client configuration verifying against `roots` (always: there is no switch
/// to turn verification off).
pub(super) fn tls_config(roots: Arc<RootCertStore>) -> anyhow::Result<Arc<rustls::ClientConfig>> {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// A host as `lookup_host` and `ServerName` take it: an IPv6 address without
/// its brackets.
pub(super) fn bare_host(host: &str) -> &str {
    host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host)
}

/// An error and its sources, `: `-separated (a wrapper that says what it wraps
/// says it once).
pub(super) fn chain(e: &(dyn StdError + 'static)) -> String {
    let mut text = e.to_string();
    let mut last = text.clone();
    let mut source = e.source();
    while let Some(s) = source {
        let piece = s.to_string();
        if !last.ends_with(&piece) {
            text.push_str(": ");
            text.push_str(&piece);
        }
        last = piece;
        source = s.source();
    }
    text
}

/// The kind of the first `io::Error` behind `e`.
pub(super) fn io_error_kind(mut e: &(dyn StdError + 'static)) -> Option<io::ErrorKind> {
    loop {
        if let Some(io) = e.downcast_ref::<io::Error>() {
            return Some(io.kind());
        }
        e = e.source()?;
    }
}

/// A connection's socket, counted in `open_connections` from connect to close
/// (when hyper's connection task drops it).
struct Counted<T> {
    io: T,
    url: Arc<Url>,
}

impl<T> Counted<T> {
    fn new(io: T, url: Arc<Url>) -> Counted<T> {
        url.counters.open_connections.fetch_add(1, Relaxed);
        Counted { io, url }
    }
}

impl<T> Drop for Counted<T> {
    fn drop(&mut self) {
        self.url.counters.open_connections.fetch_sub(1, Relaxed);
    }
}

impl<T: Read + Unpin> Read for Counted<T> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: ReadBufCursor<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<T: Write + Unpin> Write for Counted<T> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }
}
