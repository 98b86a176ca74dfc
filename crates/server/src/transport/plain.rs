//! Plain TCP: `send(MSG_MORE)` for heads, `sendfile(2)` for bodies.

use std::fs::File;
use std::io;

use tokio::io::Interest;
use tokio::net::TcpStream;

use super::socket::{Pace, SendLimits};
use super::{socket, SendError, Transport};

pub struct Plain {
    stream: TcpStream,
    pace: Pace,
    body_bytes: u64,
}

impl Plain {
    pub fn new(stream: TcpStream, limits: SendLimits) -> Plain {
        Plain { stream, pace: Pace::new(limits), body_bytes: 0 }
    }
}

impl Transport for Plain {
    const KIND: crate::counters::TransportKind = crate::counters::TransportKind::Plain;

    /// A read shorter than the room it had emptied the socket's receive queue, so
    /// the socket's readiness is cleared then and there, as nginx does after a short
    /// read: the next `read` waits for the event loop instead of first calling
    /// `recv` only to get `EAGAIN` (one syscall per keep-alive request).
    ///
    /// This is sound for a TCP socket under tokio's edge-triggered epoll: bytes that
    /// arrive after the read raise a new readiness event; an end of stream already
    /// seen stays visible (tokio never clears the closed states); and tokio clears
    /// only the readiness it observed before the closure ran, not an event that
    /// arrived meanwhile.
    async fn read(&mut self, buf: &mut Vec<u8>) -> io::Result<usize> {
        loop {
            self.stream.readable().await?;
            super::read_room(buf);
            let room = buf.capacity() - buf.len();
            let mut short = 0;
            let got = self.stream.try_io(Interest::READABLE, || {
                let n = self.stream.try_read_buf(buf)?;
                if n > 0 && n < room {
                    short = n;
                    // Reported as "would block" only so that tokio clears readiness.
                    return Err(io::ErrorKind::WouldBlock.into());
                }
                Ok(n)
            });
            match got {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock && short > 0 => return Ok(short),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                r => return r,
            }
        }
    }

    async fn write_all(&mut self, bytes: &[u8], more: bool) -> Result<(), SendError> {
        socket::send_all(&self.stream, bytes, more, &self.pace, self.body_bytes).await
    }

    async fn send_file(&mut self, file: &File, offset: u64, len: u64) -> Result<(), SendError> {
        socket::sendfile_all(&self.stream, file, offset, len, &self.pace, &mut self.body_bytes).await
    }

    fn begin_response(&mut self) {
        self.pace.begin(self.body_bytes);
    }

    fn body_bytes_sent(&self) -> u64 {
        self.body_bytes
    }

    async fn close(&mut self, linger: bool) {
        socket::close(&mut self.stream, linger).await
    }
}
