//! The byte stream under an origin connection: plain TCP, or TLS over it
//! (tokio-rustls), both as hyper's `Read`/`Write` through hyper-util's `TokioIo`.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use hyper::rt::{Read, ReadBufCursor, Write};
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

pub(super) enum Stream {
    Plain(TokioIo<TcpStream>),
    Tls(Box<TokioIo<TlsStream<TcpStream>>>),
}

/// A failed TLS handshake: the peer's certificate or protocol, or the socket.
pub(super) enum HandshakeError {
    Tls(rustls::Error),
    Io(io::Error),
}

impl Stream {
    /// Runs a TLS handshake on `tcp`, with `name` as SNI and as the name the
    /// certificate must carry.
    pub(super) async fn tls(
        tcp: TcpStream,
        config: Arc<rustls::ClientConfig>,
        name: ServerName<'static>,
    ) -> Result<Stream, HandshakeError> {
        match TlsConnector::from(config).connect(name, tcp).await {
            Ok(tls) => Ok(Stream::Tls(Box::new(TokioIo::new(tls)))),
            // tokio-rustls hands a rustls error over inside an io::Error.
            Err(e) => match e.get_ref().and_then(|inner| inner.downcast_ref::<rustls::Error>()) {
                Some(tls) => Err(HandshakeError::Tls(tls.clone())),
                None => Err(HandshakeError::Io(e)),
            },
        }
    }
}

impl Read for Stream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: ReadBufCursor<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(&mut **s).poll_read(cx, buf),
        }
    }
}

impl Write for Stream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(&mut **s).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(&mut **s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(&mut **s).poll_shutdown(cx),
        }
    }
}
