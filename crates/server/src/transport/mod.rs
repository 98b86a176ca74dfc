//! The send path: one interface, interchangeable transports.
//!
//! The HTTP layer (`server::conn`) is generic over [`Transport`] and never asks which
//! one it has. A transport is chosen once per connection, when it is accepted (and,
//! for TLS, once the handshake tells whether the kernel took the keys):
//!
//! - [`plain::Plain`]: request bytes are read from the socket; response heads are
//!   sent with `send(MSG_MORE)` so they share a segment with the first body bytes;
//!   bodies go out with `sendfile(2)` straight from the page cache.
//! - [`ktls::Ktls`]: the same send path on a socket that holds the TLS keys; the
//!   kernel seals records. Reads use `recvmsg` to see alerts.
//! - [`usertls::UserTls`]: the fallback when the kernel has no TLS: file data is read
//!   with one `preadv` into the payload slots of a batch of records, sealed in place
//!   and written with one `write` (one copy of each body byte).
//!
//! Every transport waits for writability itself, bounded by the send timeout (no
//! progress for that long ends the connection) and by the minimum average send
//! rate of the response in flight ([`SendLimits`]), so a client that stops reading,
//! or reads a byte now and then, cannot pin a connection for long.

use std::fs::File;
use std::io;

pub(crate) mod ktls;
pub(crate) mod plain;
mod socket;
pub(crate) mod usertls;

pub(crate) use socket::close as close_tcp;
pub(crate) use socket::SendLimits;

/// A read buffer's first allocation: room for a typical request head.
const FIRST_READ_BYTES: usize = 2048;
/// How much a read buffer grows by when a head needs more.
const READ_CHUNK_BYTES: usize = 4096;

/// Makes room in `buf` for a read, once bytes have arrived: a first allocation of
/// 2 KiB, then 4 KiB more whenever less than half of that is left.
pub(crate) fn read_room(buf: &mut Vec<u8>) {
    if buf.capacity() == 0 {
        buf.reserve_exact(FIRST_READ_BYTES);
    } else if buf.capacity() - buf.len() < READ_CHUNK_BYTES / 2 {
        buf.reserve(READ_CHUNK_BYTES);
    }
}

/// Why sending a response stopped.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SendError {
    #[error("{0}")]
    Io(#[from] io::Error),
    #[error("client accepted no data for the send timeout")]
    Timeout,
    /// The response has been sent slower on average than `client_limits.min_send_rate`
    /// for longer than `client_limits.min_send_rate_after`.
    #[error("client reads slower than the minimum send rate")]
    TooSlow,
    /// The file ended before the planned range did (it was truncated while being
    /// served). The response cannot be completed honestly: close the connection.
    #[error("file truncated during transfer")]
    Truncated,
}

#[allow(async_fn_in_trait)] // workers are single-threaded; nothing here needs Send
pub(crate) trait Transport {
    /// Which send path this is, for the body-byte counters.
    const KIND: crate::counters::TransportKind;

    /// Waits for bytes, then appends whatever has arrived to `buf`; `Ok(0)` at end of
    /// stream. Room in `buf` is made only once bytes are there (see [`read_room`]),
    /// so a connection waiting for its next request may hold no buffer at all.
    async fn read(&mut self, buf: &mut Vec<u8>) -> io::Result<usize>;

    /// Sends all of `bytes`. `more` says that body bytes follow at once, so the
    /// transport may hold a small head back to share a segment with them.
    async fn write_all(&mut self, bytes: &[u8], more: bool) -> Result<(), SendError>;

    /// Sends `len` bytes of `file` starting at `offset`.
    async fn send_file(&mut self, file: &File, offset: u64, len: u64) -> Result<(), SendError>;

    /// A response starts: the minimum send rate is measured from here. Called once
    /// per response, before its head is sent.
    fn begin_response(&mut self) {}

    /// Body bytes sent on this connection so far (by `send_file`), including
    /// those of a response that failed halfway: what the client may have received.
    fn body_bytes_sent(&self) -> u64;

    /// Whether the connection should close after the current response (for TLS:
    /// the current key is near its confidentiality limit and cannot be renewed).
    fn wants_close(&self) -> bool {
        false
    }

    /// Closes the connection. With `linger`, the sending side is shut first and
    /// whatever the client still sends is read and dropped for a short while, so
    /// that unread request bytes do not turn the close into a reset that could
    /// destroy the response before the client has read it.
    /// It borrows rather than consumes the transport, so that the connection's
    /// future does not keep a second copy of it for the close (the socket is closed
    /// when the transport is dropped, right after).
    async fn close(&mut self, linger: bool);
}
