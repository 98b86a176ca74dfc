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

/// Waits until the socket may take more bytes, or fails after `timeout`.
pub async fn wait_writable(stream: &TcpStream, timeout: Duration) -> Result<(), SendError> {
    match tokio::time::timeout(timeout, stream.writable()).await {
        Ok(r) => Ok(r?),
        Err(_) => Err(SendError::Timeout),
    }
}

/// Sends all of `bytes`; with `more`, the kernel holds them for the bytes that follow.
pub async fn send_all(stream: &TcpStream, mut bytes: &[u8], more: bool, timeout: Duration) -> Result<(), SendError> {
    while !bytes.is_empty() {
        let sock = stream.as_fd();
        match stream.try_io(Interest::WRITABLE, || linerate_sys::send(sock, bytes, more)) {
            Ok(n) => bytes = &bytes[n..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => wait_writable(stream, timeout).await?,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Sends `len` bytes of `file` from `offset` with `sendfile`, adding each sent
/// chunk to `sent`.
pub async fn sendfile_all(
    stream: &TcpStream,
    file: &File,
    mut offset: u64,
    mut len: u64,
    timeout: Duration,
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
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => wait_writable(stream, timeout).await?,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Shuts the sending side and, with `linger`, reads and drops what the client
/// still sends for a moment (see `Transport::close`).
pub async fn close(mut stream: TcpStream, linger: bool) {
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
