//! Reading a request: its head (with the header and keep-alive timeouts) and any
//! body, which is discarded exactly so that the next request starts where the
//! client's framing says.

use std::time::{Duration, Instant};

use linerate_http::body::{Discard, DiscardError};
use linerate_http::request::{self, BodyFraming, Parsed};
use linerate_http::{RequestError, Status};

use super::Conn;
use crate::counters::{ConnState, ErrorKind, StateTracker};
use crate::server::pagecache::PageCache;
use crate::transport::Transport;

/// How long a connection with no request yet may still send its first one after
/// shutdown began (the header timeout bounds it too).
const FIRST_REQUEST_GRACE: Duration = Duration::from_secs(2);

/// Why no head could be read.
pub(super) enum HeadEnd {
    /// The client closed, was idle past the keep-alive timeout, or shutdown began.
    Closed,
    /// A head started arriving but did not complete in time.
    Timeout,
    Bad(RequestError),
    Io,
}

impl<T: Transport, P: PageCache> Conn<'_, T, P> {
    pub(super) async fn read_head(&mut self, state: &mut StateTracker<'_>) -> Result<usize, HeadEnd> {
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
                    let waited = tokio::select! {
                        r = tokio::time::timeout(idle, self.io.read(&mut self.buf)) => Some(r),
                        _ = self.worker.shutdown_started() => None,
                    };
                    match waited {
                        Some(r) => r,
                        // At shutdown an idle keep-alive connection closes at once.
                        // One that has not sent its first request yet (accepted, or
                        // its TLS handshake finished, just as shutdown began) was
                        // opened to ask something now: it gets a moment to ask,
                        // instead of a close its client would not retry. Boxed: the
                        // timer inline would enlarge every connection.
                        None if self.served == 0 => {
                            Box::pin(tokio::time::timeout(FIRST_REQUEST_GRACE.min(idle), self.io.read(&mut self.buf)))
                                .await
                        }
                        None => return Err(HeadEnd::Closed),
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
    pub(super) fn release_buffers(&mut self) {
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
            self.head_at = (0, 0);
            // Body bytes consumed past the scanned head end leave nothing scanned.
            self.scanned = self.scanned.saturating_sub(self.pos);
            self.pos = 0;
        }
    }

    /// Reads and drops the request's body. `Err(Some(status))`: answer that and
    /// close; `Err(None)`: the connection failed, just close.
    pub(super) async fn discard_body(&mut self) -> Result<(), Option<Status>> {
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
}
