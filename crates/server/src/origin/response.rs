//! An origin's response: its head as received, its body read piece by piece
//! under the idle timeout, and its `Content-Range` checked.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_LENGTH, CONTENT_RANGE};
use http_body_util::BodyExt;
use hyper::body::{Body, Incoming};

use super::connect::{chain, io_error_kind, Conn, Url};
use super::content_range::ContentRange;
use super::error::{OriginError, Phase};

/// A response head from an origin, and the means to read its body.
pub(crate) struct OriginResponse {
    pub status: u16,
    pub headers: http::HeaderMap,
    /// Which URL of the table answered (an index into its `urls`, or into its
    /// parents or peers for a parent's or a peer's answer).
    pub url: usize,
    /// From sending the request to the head received.
    pub first_byte: Duration,
    body: Incoming,
    /// The connection, until the body is done: then back to the pool, or closed.
    conn: Option<Conn>,
    origin_url: Arc<Url>,
    idle_timeout: Duration,
    /// The `Content-Length` of a body that follows the head (not of a HEAD's,
    /// a 204's or a 304's).
    content_length: Option<u64>,
    received: u64,
    state: State,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Reading,
    Done,
    Failed,
}

impl OriginResponse {
    pub(super) fn new(
        response: http::Response<Incoming>,
        head_request: bool,
        conn: Conn,
        url: (usize, Arc<Url>),
        first_byte: Duration,
        idle_timeout: Duration,
    ) -> OriginResponse {
        let (parts, body) = response.into_parts();
        let status = parts.status.as_u16();
        let bodiless = head_request || status < 200 || status == 204 || status == 304;
        let content_length = if bodiless { None } else { content_length(&parts.headers) };
        OriginResponse {
            status,
            headers: parts.headers,
            url: url.0,
            first_byte,
            body,
            conn: Some(conn),
            origin_url: url.1,
            idle_timeout,
            content_length,
            received: 0,
            state: State::Reading,
        }
    }

    /// The next piece of the body, `None` at its end. Fails when no byte comes for
    /// the table's `idle_timeout`, on a reset, or when the body is longer or
    /// shorter than its Content-Length; after a failure, every call fails. Every
    /// byte counts in the URL's `body_bytes`.
    ///
    /// A longer body is seen when its surplus comes before the connection goes
    /// idle (in practice: with the body's last bytes), as nginx sees it; the
    /// connection is then closed, never reused.
    pub(crate) async fn chunk(&mut self) -> Result<Option<Bytes>, OriginError> {
        match self.state {
            State::Reading => {}
            State::Done => return Ok(None),
            State::Failed => return Err(OriginError::BadResponse("the body already failed".into())),
        }
        loop {
            let frame = match tokio::time::timeout(self.idle_timeout, self.body.frame()).await {
                Err(_) => return Err(self.fail(OriginError::Timeout(Phase::Idle))),
                Ok(None) => return self.finish().await.map(|()| None),
                Ok(Some(Err(e))) => {
                    let e = self.body_error(&e);
                    return Err(self.fail(e));
                }
                Ok(Some(Ok(frame))) => frame,
            };
            // Trailers are not kept: nothing in a cached object needs them.
            if let Ok(data) = frame.into_data() {
                if data.is_empty() {
                    continue;
                }
                self.received += data.len() as u64;
                self.origin_url.counters.count_body(data.len());
                return Ok(Some(data));
            }
        }
    }

    /// Reads an unwanted answer's body to its end (a peer's 504 page) when its
    /// `Content-Length` is at most `max_bytes`, so its connection goes back to
    /// the pool; a longer or unframed one is dropped, closing it.
    pub(crate) async fn discard(mut self, max_bytes: u64) {
        if self.content_length.is_some_and(|n| n <= max_bytes) {
            while let Ok(Some(_)) = self.chunk().await {}
        }
    }

    /// `Content-Range: bytes first-last/total` of a 206 (or `bytes */total` of a
    /// 416), checked; `None` when absent; an error when malformed or inconsistent
    /// (with the status, or with a 206's `Content-Length`).
    pub(crate) fn content_range(&self) -> Result<Option<ContentRange>, OriginError> {
        let mut fields = self.headers.get_all(CONTENT_RANGE).iter();
        let Some(value) = fields.next() else { return Ok(None) };
        if fields.next().is_some() {
            return Err(OriginError::BadResponse("more than one Content-Range".into()));
        }
        let range = ContentRange::parse(value.as_bytes()).map_err(OriginError::BadResponse)?;
        range.check(self.status, content_length(&self.headers)).map_err(OriginError::BadResponse)?;
        Ok(Some(range))
    }

    /// Refuses the answer as not what was asked (its `Content-Range` missing,
    /// malformed, or another range than the one asked for): counted among its
    /// URL's `bad_response` errors, like a body that breaks its framing, and its
    /// connection closed with the body unread.
    pub(crate) fn refuse(&mut self, why: &str) {
        let _ = self.fail(OriginError::BadResponse(why.to_string()));
    }

    /// The end of the body: its length checked, the connection handed back.
    async fn finish(&mut self) -> Result<(), OriginError> {
        if let Some(expected) = self.content_length {
            // hyper frames the body by its Content-Length; this is a guard.
            if self.received != expected {
                let e = format!("a body of {} bytes, its Content-Length {expected}", self.received);
                return Err(self.fail(OriginError::BadResponse(e)));
            }
        }
        self.state = State::Done;
        let Some(mut conn) = self.conn.take() else { return Ok(()) };
        // hyper makes the connection ready for another request once it has read
        // the end of this message and found nothing after it. Bytes after it (a
        // body longer than its Content-Length) end the connection with an error
        // instead, which is all the surplus ever shows as.
        let ready = tokio::time::timeout(self.idle_timeout, conn.sender.ready()).await;
        match ready {
            Ok(Ok(())) => self.origin_url.put_idle(conn),
            Ok(Err(_)) => {
                let ended = tokio::time::timeout(self.idle_timeout, &mut conn.ended).await;
                if let Ok(Ok(Err(e))) = ended {
                    if io_error_kind(&e).is_none() && !e.is_incomplete_message() {
                        let e = match self.content_length {
                            Some(n) => format!("more than its Content-Length of {n} bytes: {e}"),
                            None => format!("bytes after the end of the body: {e}"),
                        };
                        return Err(self.fail(OriginError::BadResponse(e)));
                    }
                }
            }
            Err(_) => {}
        }
        Ok(())
    }

    fn body_error(&self, e: &hyper::Error) -> OriginError {
        use std::io::ErrorKind;
        match io_error_kind(e) {
            _ if e.is_incomplete_message() => self.cut_short(e),
            Some(ErrorKind::UnexpectedEof) => self.cut_short(e),
            // hyper's chunked decoder says a malformed chunk this way.
            Some(ErrorKind::InvalidData | ErrorKind::InvalidInput) => OriginError::BadResponse(chain(e)),
            _ if e.is_parse() => OriginError::BadResponse(chain(e)),
            _ => OriginError::Reset(chain(e)),
        }
    }

    fn cut_short(&self, e: &hyper::Error) -> OriginError {
        OriginError::BadResponse(match self.content_length {
            Some(n) => format!("the body ended after {} bytes, its Content-Length is {n}", self.received),
            None => format!("the body ended early: {}", chain(e)),
        })
    }

    /// Marks the body failed, counts `e`, and closes the connection.
    fn fail(&mut self, e: OriginError) -> OriginError {
        self.state = State::Failed;
        self.conn = None;
        self.origin_url.counters.count_error(&e);
        e
    }
}

impl Drop for OriginResponse {
    /// A connection whose body was read to its end but not to the `None` of
    /// [`OriginResponse::chunk`] (a HEAD's, a 304's) still goes back to the pool;
    /// one with body bytes unread is closed with it.
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            if self.state == State::Reading && self.body.is_end_stream() {
                self.origin_url.put_idle(conn);
            }
        }
    }
}

impl std::fmt::Debug for OriginResponse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OriginResponse")
            .field("status", &self.status)
            .field("url", &self.url)
            .field("first_byte", &self.first_byte)
            .field("headers", &self.headers)
            .finish_non_exhaustive()
    }
}

fn content_length(headers: &http::HeaderMap) -> Option<u64> {
    headers.get(CONTENT_LENGTH)?.to_str().ok()?.parse().ok()
}
