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

//!
//! The files of this module: [`context`] (what a connection sees of its worker),
//! `read` (heads and request bodies), `answer` (dispatch, the signed-URL check,
//! the lookup, file responses and their heads), `simple` (responses from memory:
//! error pages, redirects, `OPTIONS`), `exchange` (the access-log record of each
//! response). Body ranges go to the page-cache layer ([`super::pagecache`]) in
//! one call each.

mod answer;
mod cached;
mod context;
mod exchange;
mod read;
mod simple;
#[cfg(test)]
mod tests;

use std::net::SocketAddr;

use linerate_http::{Request, Status};

pub(super) use context::{ConnInfo, Context, TlsInfo};
use exchange::Exchange;
use read::HeadEnd;

use super::cache::{Failure, ServeError};
use super::pagecache::{FillError, PageCache, RangeError};

/// First allocation of a response head and of a request's path (they are freed
/// between requests): room for a typical one at once, not grown by doubling.
const HEAD_BYTES: usize = 512;
const PATH_BYTES: usize = 128;
use super::settings::Settings;
use crate::counters::tcp_info::{Sampler, TcpFigures};
use crate::counters::{ConnState, ErrorKind, StateTracker};
use crate::transport::{SendError, Transport};

/// Why a response ended before its body was whole (its head is out, so the only
/// honest answer is to close), or why the connection closes after it.
#[derive(Debug)]
enum Cut {
    Send(SendError),
    /// A disk read the body needed failed or was late.
    Disk(FillError),
    /// The origin failed while its bytes were being relayed.
    Origin(Failure),
    /// Complete, but ends with the connection (a body whose end is the close).
    Close,
}

impl From<SendError> for Cut {
    fn from(e: SendError) -> Cut {
        Cut::Send(e)
    }
}

impl From<RangeError> for Cut {
    fn from(e: RangeError) -> Cut {
        match e {
            RangeError::Send(e) => Cut::Send(e),
            RangeError::Fill(e) => Cut::Disk(e),
        }
    }
}

impl From<ServeError> for Cut {
    fn from(e: ServeError) -> Cut {
        match e {
            ServeError::Range(e) => e.into(),
            ServeError::Origin(f) => Cut::Origin(f),
        }
    }
}

/// Serves one connection until it closes.
pub(super) async fn serve<T: Transport, P: PageCache>(io: T, worker: &Context<P>, settings: &Settings, info: ConnInfo) {
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
        head_at: (0, 0),
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

struct Conn<'a, T, P> {
    io: T,
    worker: &'a Context<P>,
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
    /// Where the current request's head lies in `buf` (empty once moved).
    head_at: (u32, u32),
}

impl<T: Transport, P: PageCache> Conn<'_, T, P> {
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
            self.head_at = (self.pos as u32, (self.pos + head_len) as u32);
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
                        Cut::Close => return Ending::Quiet,
                        Cut::Send(SendError::Timeout) => ErrorKind::Timeout,
                        Cut::Send(SendError::TooSlow) => ErrorKind::SlowClient,
                        Cut::Send(SendError::Truncated) => ErrorKind::Truncated,
                        Cut::Send(SendError::Io(_)) => ErrorKind::Reset,
                        Cut::Disk(e) => {
                            tracing::debug!(worker = self.worker.index, path = %String::from_utf8_lossy(&self.path), "{e}");
                            ErrorKind::Disk
                        }
                        Cut::Origin(f) => {
                            tracing::debug!(worker = self.worker.index, path = %String::from_utf8_lossy(&self.path), "origin: {f}");
                            ErrorKind::Origin
                        }
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
}
