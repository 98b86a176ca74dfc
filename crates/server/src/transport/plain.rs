//! Plain TCP: `send(MSG_MORE)` for heads, `sendfile(2)` for bodies.

use std::fs::File;
use std::io;

use tokio::net::TcpStream;

use super::socket::{Pace, SendLimits};
use super::{socket, SendError, Transport};

pub(crate) struct Plain {
    stream: TcpStream,
    pace: Pace,
    body_bytes: u64,
}

impl Plain {
    pub(crate) fn new(stream: TcpStream, limits: SendLimits) -> Plain {
        Plain { stream, pace: Pace::new(limits), body_bytes: 0 }
    }
}

impl Transport for Plain {
    const KIND: crate::counters::TransportKind = crate::counters::TransportKind::Plain;

    async fn read(&mut self, buf: &mut Vec<u8>) -> io::Result<usize> {
        loop {
            self.stream.readable().await?;
            super::read_room(buf);
            match socket::read_available(&self.stream, buf) {
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
