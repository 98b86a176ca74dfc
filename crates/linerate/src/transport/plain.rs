//! Plain TCP: `send(MSG_MORE)` for heads, `sendfile(2)` for bodies.

use std::fs::File;
use std::io;
use std::os::fd::AsFd;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt, Interest};
use tokio::net::TcpStream;

use super::{SendError, Transport};

/// How long a lingering close keeps reading, and how much it reads at most.
const LINGER: Duration = Duration::from_secs(2);
const LINGER_MAX_BYTES: usize = 256 * 1024;

pub struct Plain {
    stream: TcpStream,
    send_timeout: Duration,
    body_bytes: u64,
}

impl Plain {
    pub fn new(stream: TcpStream, send_timeout: Duration) -> Plain {
        Plain { stream, send_timeout, body_bytes: 0 }
    }

    async fn wait_writable(&self) -> Result<(), SendError> {
        match tokio::time::timeout(self.send_timeout, self.stream.writable()).await {
            Ok(r) => Ok(r?),
            Err(_) => Err(SendError::Timeout),
        }
    }
}

impl Transport for Plain {
    async fn read(&mut self, buf: &mut Vec<u8>) -> io::Result<usize> {
        self.stream.read_buf(buf).await
    }

    async fn write_all(&mut self, mut bytes: &[u8], more: bool) -> Result<(), SendError> {
        while !bytes.is_empty() {
            let sock = self.stream.as_fd();
            match self.stream.try_io(Interest::WRITABLE, || linerate_sys::send(sock, bytes, more)) {
                Ok(n) => bytes = &bytes[n..],
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => self.wait_writable().await?,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    async fn send_file(&mut self, file: &File, mut offset: u64, mut len: u64) -> Result<(), SendError> {
        while len > 0 {
            let sock = self.stream.as_fd();
            let chunk = len.min(linerate_sys::SENDFILE_MAX_BYTES as u64) as usize;
            match self.stream.try_io(Interest::WRITABLE, || linerate_sys::sendfile(sock, file.as_fd(), offset, chunk)) {
                // Linux: sendfile returns 0 when the offset is at or past the end of
                // the file, i.e. it shrank after the response was planned.
                Ok(0) => return Err(SendError::Truncated),
                Ok(n) => {
                    offset += n as u64;
                    len -= n as u64;
                    self.body_bytes += n as u64;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => self.wait_writable().await?,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    fn body_bytes_sent(&self) -> u64 {
        self.body_bytes
    }

    async fn close(mut self, linger: bool) {
        let _ = self.stream.shutdown().await;
        if !linger {
            return;
        }
        let mut sink = [0u8; 16 * 1024];
        let mut total = 0;
        let _ = tokio::time::timeout(LINGER, async {
            while total < LINGER_MAX_BYTES {
                match self.stream.read(&mut sink).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => total += n,
                }
            }
        })
        .await;
    }
}
