//! Kernel TLS: after the handshake the keys live in the socket, and the send path
//! is the plain one (`send(MSG_MORE)` for heads, `sendfile` for bodies); the kernel
//! builds the records. Reading goes through `recvmsg`, which reports the record
//! type of control records (alerts, post-handshake messages).

use std::fs::File;
use std::io;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};

use linerate_sys::ktls::{self, CryptoInfo, Direction, Received, Version};
use tokio::io::Interest;
use tokio::net::TcpStream;

use super::socket::{Pace, SendLimits};
use super::{socket, SendError, Transport};
use crate::tls::handshake::Established;
use crate::tls::record::{self, Protocol};
use crate::tls::{control, Control};

static ZEROCOPY_FAILURE_LOGGED: AtomicBool = AtomicBool::new(false);

pub(crate) struct Ktls {
    stream: TcpStream,
    pace: Pace,
    body_bytes: u64,
    /// An upper bound on the records the kernel has sealed with the current key.
    records: u64,
    record_limit: u64,
}

/// Records a write of `len` bytes can produce at most.
fn records_for(len: u64) -> u64 {
    len.div_ceil(record::MAX_PAYLOAD as u64) + 1
}

impl Ktls {
    /// Hands the session's keys to the kernel. An error here leaves the socket
    /// unusable (rustls has given the session away), so the caller closes it.
    pub(crate) fn new(stream: TcpStream, est: Established, limits: SendLimits, zerocopy: bool) -> io::Result<Ktls> {
        let sock = stream.as_fd();
        ktls::attach_ulp(sock)?;
        let version = match est.protocol {
            Protocol::Tls12 => Version::Tls12,
            Protocol::Tls13 => Version::Tls13,
        };
        for (direction, (seq, secrets)) in [(Direction::Tx, &est.secrets.tx), (Direction::Rx, &est.secrets.rx)] {
            let (cipher, key, iv) = record::cipher_parts(secrets);
            ktls::install_key(sock, direction, &CryptoInfo::new(version, cipher, key, iv, *seq)?)?;
        }
        if zerocopy {
            if let Err(e) = ktls::enable_tx_zerocopy(sock) {
                if !ZEROCOPY_FAILURE_LOGGED.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        "tls.zerocopy_sendfile: the kernel refused TLS_TX_ZEROCOPY_RO ({e}); sending with copies"
                    );
                }
            }
        }
        Ok(Ktls { stream, pace: Pace::new(limits), body_bytes: 0, records: 0, record_limit: est.record_limit() })
    }
}

impl Transport for Ktls {
    const KIND: crate::counters::TransportKind = crate::counters::TransportKind::Ktls;

    async fn read(&mut self, buf: &mut Vec<u8>) -> io::Result<usize> {
        loop {
            // Room is made once a record is there: an idle connection holds no buffer.
            self.stream.readable().await?;
            let start = buf.len();
            let room = (buf.capacity() - start).max(1024);
            buf.resize(start + room, 0);
            let sock = self.stream.as_fd();
            let got = self.stream.try_io(Interest::READABLE, || ktls::recv_record(sock, &mut buf[start..]));
            let control = match got {
                Ok(Received::Data(n)) => {
                    buf.truncate(start + n);
                    return Ok(n);
                }
                Ok(Received::Control { record_type, len }) => control::classify(record_type, &buf[start..start + len]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    buf.truncate(start);
                    continue;
                }
                Err(e) => {
                    buf.truncate(start);
                    // EBADMSG: a record failed authentication in the kernel.
                    if e.raw_os_error() == Some(libc::EBADMSG) {
                        let _ = ktls::send_record(self.stream.as_fd(), record::CONTENT_ALERT, &control::BAD_RECORD_MAC);
                    }
                    return Err(e);
                }
            };
            buf.truncate(start);
            let control = match control {
                Ok(c) => c,
                Err(v) => {
                    if let Some(alert) = v.alert {
                        let _ = ktls::send_record(self.stream.as_fd(), record::CONTENT_ALERT, &alert);
                    }
                    return Err(v.error);
                }
            };
            match control {
                Control::CloseNotify => return Ok(0),
                Control::Ignore => {}
                // Rekeying a kernel TLS socket depends on the kernel version; rather
                // than guess, end the connection (the client reconnects).
                Control::KeyUpdate { .. } => {
                    return Err(io::Error::new(io::ErrorKind::Unsupported, "TLS key update on a kernel TLS connection"))
                }
            }
        }
    }

    async fn write_all(&mut self, bytes: &[u8], more: bool) -> Result<(), SendError> {
        self.records += records_for(bytes.len() as u64);
        socket::send_all(&self.stream, bytes, more, &self.pace, self.body_bytes).await
    }

    async fn send_file(&mut self, file: &File, offset: u64, len: u64) -> Result<(), SendError> {
        self.records += records_for(len);
        if self.records >= self.record_limit {
            return Err(SendError::Io(io::Error::other("TLS record limit for this key reached")));
        }
        socket::sendfile_all(&self.stream, file, offset, len, &self.pace, &mut self.body_bytes).await
    }

    fn begin_response(&mut self) {
        self.pace.begin(self.body_bytes);
    }

    fn body_bytes_sent(&self) -> u64 {
        self.body_bytes
    }

    fn wants_close(&self) -> bool {
        // Leave room for one more large response under the current key.
        self.records >= self.record_limit - self.record_limit / 8
    }

    async fn close(&mut self, linger: bool) {
        // close_notify, if the socket takes it at once.
        let _ = ktls::send_record(self.stream.as_fd(), record::CONTENT_ALERT, &control::CLOSE_NOTIFY);
        socket::close(&mut self.stream, linger).await
    }
}
