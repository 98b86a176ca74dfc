//! The byte stream under an origin connection: plain TCP, or TLS driven by hand
//! over it (rustls's buffered connection, as the load generator drives its own).
//!
//! The TLS side is hyper's `Read`/`Write` over a non-blocking socket: reads hand
//! out plaintext rustls has decrypted, and only read the socket when there is
//! none; writes give plaintext to rustls and push out what it sealed as far as
//! the socket takes it, waiting for writability only when rustls's buffer is full
//! or on a flush. (hyper-rustls does the same through tokio-rustls, reachable only
//! through tower's `Service` trait, which this crate does not depend on.)

use std::io::{self, BufRead, Write as _};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use hyper::rt::{Read, ReadBufCursor, Write};
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;

pub(super) enum Stream {
    Plain(TokioIo<TcpStream>),
    Tls(Box<TlsStream>),
}

pub(super) struct TlsStream {
    tcp: TcpStream,
    tls: rustls::ClientConnection,
    /// `close_notify` was queued (by a shutdown).
    closing: bool,
}

/// A failed TLS handshake: the peer's certificate or protocol, or the socket.
pub(super) enum HandshakeError {
    Tls(rustls::Error),
    Io(io::Error),
}

impl TlsStream {
    /// Runs the handshake on `tcp`, with `name` as SNI and as the name the
    /// certificate must carry.
    pub(super) async fn handshake(
        tcp: TcpStream,
        config: Arc<rustls::ClientConfig>,
        name: ServerName<'static>,
    ) -> Result<TlsStream, HandshakeError> {
        let tls = rustls::ClientConnection::new(config, name).map_err(HandshakeError::Tls)?;
        let mut s = TlsStream { tcp, tls, closing: false };
        while s.tls.is_handshaking() {
            std::future::poll_fn(|cx| s.poll_send_all(cx)).await.map_err(HandshakeError::Io)?;
            if !s.tls.is_handshaking() {
                break;
            }
            s.tcp.readable().await.map_err(HandshakeError::Io)?;
            match s.tls.read_tls(&mut SocketReader(&s.tcp)) {
                Ok(0) => return Err(HandshakeError::Io(io::ErrorKind::UnexpectedEof.into())),
                Ok(_) => {
                    if let Err(e) = s.tls.process_new_packets() {
                        // The alert saying why, if the socket takes it.
                        let _ = s.tls.write_tls(&mut SocketWriter(&s.tcp));
                        return Err(HandshakeError::Tls(e));
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(HandshakeError::Io(e)),
            }
        }
        std::future::poll_fn(|cx| s.poll_send_all(cx)).await.map_err(HandshakeError::Io)?;
        Ok(s)
    }

    /// Writes out everything rustls has sealed, waiting for writability.
    fn poll_send_all(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.tls.wants_write() {
            match self.tls.write_tls(&mut SocketWriter(&self.tcp)) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => ready!(self.tcp.poll_write_ready(cx))?,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
        Poll::Ready(Ok(()))
    }

    /// Writes out what the socket takes now; the rest waits for the next write
    /// or flush.
    fn send_some(&mut self) -> io::Result<()> {
        while self.tls.wants_write() {
            match self.tls.write_tls(&mut SocketWriter(&self.tcp)) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    fn poll_read_plain(&mut self, cx: &mut Context<'_>, mut buf: ReadBufCursor<'_>) -> Poll<io::Result<()>> {
        loop {
            match self.tls.reader().fill_buf() {
                // Plaintext, or the end after the peer's close_notify (nothing put).
                Ok(plain) => {
                    let n = plain.len().min(buf.remaining());
                    buf.put_slice(&plain[..n]);
                    self.tls.reader().consume(n);
                    return Poll::Ready(Ok(()));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                // A TCP end without close_notify: a truncation hyper must see as
                // one when the message was not complete.
                Err(e) => return Poll::Ready(Err(e)),
            }
            ready!(self.tcp.poll_read_ready(cx))?;
            match self.tls.read_tls(&mut SocketReader(&self.tcp)) {
                // rustls recorded the end; the reader reports it above.
                Ok(0) => {}
                Ok(_) => {
                    if let Err(e) = self.tls.process_new_packets() {
                        let _ = self.send_some();
                        return Poll::Ready(Err(io::Error::new(io::ErrorKind::InvalidData, e)));
                    }
                    // Answers rustls owes the peer (alerts, key updates).
                    self.send_some()?;
                }
                // Readiness was cleared: the next poll_read_ready waits.
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }

    fn poll_write_plain(&mut self, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        loop {
            let n = self.tls.writer().write(buf)?;
            self.send_some()?;
            if n > 0 || buf.is_empty() {
                return Poll::Ready(Ok(n));
            }
            // rustls's buffer is full: wait until the socket takes some of it.
            ready!(self.tcp.poll_write_ready(cx))?;
            match self.tls.write_tls(&mut SocketWriter(&self.tcp)) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }

    fn poll_shutdown(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if !self.closing {
            self.tls.send_close_notify();
            self.closing = true;
        }
        ready!(self.poll_send_all(cx))?;
        tokio::io::AsyncWrite::poll_shutdown(Pin::new(&mut self.tcp), cx)
    }
}

impl Read for Stream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: ReadBufCursor<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => s.poll_read_plain(cx, buf),
        }
    }
}

impl Write for Stream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => s.poll_write_plain(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => s.poll_send_all(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => s.poll_shutdown(cx),
        }
    }
}

/// `io::Read` over a non-blocking tokio socket (`WouldBlock` when empty).
struct SocketReader<'a>(&'a TcpStream);

impl io::Read for SocketReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.try_read(buf)
    }
}

/// `io::Write` over a non-blocking tokio socket (`WouldBlock` when full).
struct SocketWriter<'a>(&'a TcpStream);

impl io::Write for SocketWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.try_write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
