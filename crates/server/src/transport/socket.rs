//! Sending on a TCP socket, shared by the transports that let the kernel write
//! the bytes (plain TCP and kernel TLS): heads with `send(MSG_MORE)`, bodies with
//! `sendfile`, both waiting for writability within the send timeout.

use std::fs::File;
use std::io;
use std::os::fd::AsFd;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt, Interest};
use tokio::net::TcpStream;

use super::SendError;

/// How long a lingering close keeps reading, and how much it reads at most.
const LINGER: Duration = Duration::from_secs(2);
const LINGER_MAX_BYTES: usize = 256 * 1024;

/// What bounds a connection's waits for writability: the send timeout (no progress
/// at all for that long) and the lowest average rate of a response (once it has
/// taken longer than `min_rate_after`). From the settings the connection started with.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SendLimits {
    pub timeout: Duration,
    /// Bytes per second; 0 = no minimum.
    pub min_rate: u64,
    pub min_rate_after: Duration,
}

impl SendLimits {
    pub(crate) fn new(config: &crate::config::Config) -> SendLimits {
        SendLimits {
            timeout: config.timeouts.send,
            min_rate: config.client_limits.min_send_rate,
            min_rate_after: config.client_limits.min_send_rate_after,
        }
    }
}

/// The send limits and the progress of the response in flight: when it started and
/// how many body bytes the connection had sent by then. The rate is checked only
/// when the socket is full, so a client keeping up never pays for it: the wait for
/// writability ends at the moment the response's average would fall under the
/// minimum, `start + max(min_rate_after, sent / min_rate)`, since nothing is sent
/// while waiting.
#[derive(Debug)]
pub(super) struct Pace {
    limits: SendLimits,
    started: tokio::time::Instant,
    base: u64,
}

impl Pace {
    pub(super) fn new(limits: SendLimits) -> Pace {
        Pace { limits, started: tokio::time::Instant::now(), base: 0 }
    }

    /// A response starts; `sent` is the connection's body-byte count so far.
    pub(super) fn begin(&mut self, sent: u64) {
        if self.limits.min_rate > 0 {
            self.started = tokio::time::Instant::now();
            self.base = sent;
        }
    }

    /// When the response's average rate falls under the minimum if no more than
    /// `sent` bytes (the connection's count) have gone by then; None without a minimum.
    fn slow_at(&self, sent: u64) -> Option<tokio::time::Instant> {
        let rate = self.limits.min_rate;
        if rate == 0 {
            return None;
        }
        let bytes = sent.saturating_sub(self.base);
        let nanos = u128::from(bytes % rate) * 1_000_000_000 / u128::from(rate);
        let earned = Duration::from_secs(bytes / rate) + Duration::from_nanos(nanos as u64);
        self.started.checked_add(earned.max(self.limits.min_rate_after))
    }
}

/// Waits until the socket may take more bytes. Fails after the send timeout, or
/// when the response in flight (`sent`: the connection's body bytes so far) falls
/// under the minimum average rate, whichever comes first.
pub(super) async fn wait_writable(stream: &TcpStream, pace: &Pace, sent: u64) -> Result<(), SendError> {
    let now = tokio::time::Instant::now();
    let timeout_at = now + pace.limits.timeout;
    let (deadline, error) = match pace.slow_at(sent) {
        Some(slow) if slow < timeout_at => (slow, SendError::TooSlow),
        _ => (timeout_at, SendError::Timeout),
    };
    let result = if deadline <= now {
        Err(error)
    } else {
        match tokio::time::timeout_at(deadline, stream.writable()).await {
            Ok(r) => Ok(r?),
            Err(_) => Err(error),
        }
    };
    if let Err(SendError::TooSlow) = result {
        // The queue would otherwise still be delivered at the client's pace after
        // the close: drop it with the connection.
        if let Err(e) = linerate_sys::tcp::set_abortive_close(stream.as_fd()) {
            tracing::debug!("SO_LINGER: {e}");
        }
    }
    result
}

/// Reads what has arrived into `buf`'s spare capacity (room must have been made).
/// `Err(WouldBlock)` when nothing was there; `Ok(0)` at end of stream.
///
/// A read shorter than the room it had emptied the socket's receive queue, so the
/// socket's readiness is cleared then and there, as nginx does after a short read:
/// the next wait goes to the event loop at once instead of first calling `recv` only
/// to get `EAGAIN` (one syscall per keep-alive request). This is sound for a TCP
/// socket under tokio's edge-triggered epoll: bytes that arrive after the read raise
/// a new readiness event; an end of stream already seen stays visible (tokio never
/// clears the closed states); and tokio clears only the readiness it observed before
/// the closure ran, not an event that arrived meanwhile.
pub(super) fn read_available(stream: &TcpStream, buf: &mut Vec<u8>) -> io::Result<usize> {
    let room = buf.capacity() - buf.len();
    let mut short = 0;
    let got = stream.try_io(Interest::READABLE, || {
        let n = stream.try_read_buf(buf)?;
        if n > 0 && n < room {
            short = n;
            // Reported as "would block" only so that tokio clears the readiness.
            return Err(io::ErrorKind::WouldBlock.into());
        }
        Ok(n)
    });
    match got {
        Err(e) if e.kind() == io::ErrorKind::WouldBlock && short > 0 => Ok(short),
        r => r,
    }
}

/// Sends all of `bytes`; with `more`, the kernel holds them for the bytes that
/// follow. `sent` is the connection's body-byte count, for the rate check.
pub(super) async fn send_all(
    stream: &TcpStream,
    mut bytes: &[u8],
    more: bool,
    pace: &Pace,
    sent: u64,
) -> Result<(), SendError> {
    while !bytes.is_empty() {
        let sock = stream.as_fd();
        match stream.try_io(Interest::WRITABLE, || linerate_sys::send(sock, bytes, more)) {
            Ok(n) => bytes = &bytes[n..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => wait_writable(stream, pace, sent).await?,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Sends `len` bytes of `file` from `offset` with `sendfile`, adding each sent
/// chunk to `sent`.
pub(super) async fn sendfile_all(
    stream: &TcpStream,
    file: &File,
    mut offset: u64,
    mut len: u64,
    pace: &Pace,
    sent: &mut u64,
) -> Result<(), SendError> {
    while len > 0 {
        let sock = stream.as_fd();
        let chunk = len.min(linerate_sys::SENDFILE_MAX_BYTES as u64) as usize;
        match stream.try_io(Interest::WRITABLE, || linerate_sys::sendfile(sock, file.as_fd(), offset, chunk)) {
            // Linux: sendfile returns 0 when the offset is at or past the end of the
            // file, i.e. it shrank after the response was planned.
            Ok(0) => return Err(SendError::Truncated),
            Ok(n) => {
                offset += n as u64;
                len -= n as u64;
                *sent += n as u64;
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => wait_writable(stream, pace, *sent).await?,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Shuts the sending side and, with `linger`, reads and drops what the client
/// still sends for a moment (see `Transport::close`).
pub(crate) async fn close(stream: &mut TcpStream, linger: bool) {
    let _ = stream.shutdown().await;
    if !linger {
        return;
    }
    // On the heap: an array here would sit inside every connection's task, lingering
    // or not, and make each of them 16 KiB larger.
    let mut sink = vec![0u8; 16 * 1024];
    let mut total = 0;
    let _ = tokio::time::timeout(LINGER, async {
        while total < LINGER_MAX_BYTES {
            match stream.read(&mut sink).await {
                Ok(0) | Err(_) => break,
                Ok(n) => total += n,
            }
        }
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pace(min_rate: u64, after_secs: u64) -> Pace {
        Pace::new(SendLimits {
            timeout: Duration::from_secs(60),
            min_rate,
            min_rate_after: Duration::from_secs(after_secs),
        })
    }

    #[test]
    fn slow_at_is_when_the_average_falls_under_the_minimum() {
        let mut p = pace(1000, 10);
        p.begin(5000);
        let start = p.started;
        // Nothing sent yet: the grace period.
        assert_eq!(p.slow_at(5000), Some(start + Duration::from_secs(10)));
        // 20 kB sent at 1 kB/s lasts 20 s.
        assert_eq!(p.slow_at(25_000), Some(start + Duration::from_secs(20)));
        assert_eq!(p.slow_at(25_500), Some(start + Duration::from_millis(20_500)));
        // No overflow with absurd counts.
        assert!(pace(1, 1).slow_at(u64::MAX).is_none_or(|t| t > start));
        assert_eq!(pace(0, 10).slow_at(1), None, "no minimum");
    }

    #[tokio::test(start_paused = true)]
    async fn a_response_starts_the_clock_again() {
        let mut p = pace(1000, 10);
        tokio::time::sleep(Duration::from_secs(100)).await;
        p.begin(0);
        assert_eq!(p.slow_at(0), Some(tokio::time::Instant::now() + Duration::from_secs(10)));
    }
}
