//! The connection under the client: plain TCP or TLS (rustls), with reads that fill
//! a large caller-owned buffer in one system call.
//!
//! Sessions of a worker share that worker's buffers, so a buffer is never borrowed
//! across an `await`: a session waits for readability ([`Conn::readable`]), then
//! [`Conn::receive`] does one `recv` of up to the buffer's size and hands every
//! plaintext byte to a callback, all without yielding. For TLS the ciphertext of that
//! one read is fed to rustls record by record and the plaintext drained into a
//! second buffer as it is decrypted, so rustls's own buffers stay at one record and
//! the socket is still read in large pieces.

use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::sync::Arc;

use rustls::pki_types::ServerName;
use tokio::net::TcpStream;

/// What a [`Conn::receive`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Received {
    /// This many plaintext bytes were passed to the callback (may be 0 for TLS when
    /// only part of a record arrived).
    Data(usize),
    /// Nothing to read yet; wait with [`Conn::readable`].
    WouldBlock,
    /// The peer closed the connection.
    Closed,
}

/// How to secure connections to an origin.
#[derive(Clone)]
pub(crate) struct TlsTarget {
    pub config: Arc<rustls::ClientConfig>,
    pub server_name: ServerName<'static>,
}

/// One client connection.
pub(crate) enum Conn {
    Plain(TcpStream),
    Tls { tcp: TcpStream, tls: Box<rustls::ClientConnection> },
}

/// A failure to set up a connection.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ConnectError {
    #[error("connect: {0}")]
    Io(#[from] io::Error),
    #[error("TLS: {0}")]
    Tls(#[from] rustls::Error),
}

impl Conn {
    /// Connects and, for TLS, completes the handshake.
    pub(crate) async fn open(addr: SocketAddr, tls: Option<&TlsTarget>) -> Result<Conn, ConnectError> {
        let tcp = TcpStream::connect(addr).await?;
        tcp.set_nodelay(true)?;
        let Some(target) = tls else {
            return Ok(Conn::Plain(tcp));
        };
        let tls = Box::new(rustls::ClientConnection::new(target.config.clone(), target.server_name.clone())?);
        let mut conn = Conn::Tls { tcp, tls };
        conn.handshake().await?;
        Ok(conn)
    }

    async fn handshake(&mut self) -> Result<(), ConnectError> {
        let Conn::Tls { tcp, tls } = self else { return Ok(()) };
        while tls.is_handshaking() {
            flush_tls(tcp, tls).await?;
            if !tls.is_handshaking() {
                break;
            }
            if tls.wants_read() {
                tcp.readable().await?;
                match tls.read_tls(&mut SocketReader(tcp)) {
                    Ok(0) => return Err(io::Error::from(io::ErrorKind::UnexpectedEof).into()),
                    Ok(_) => {
                        tls.process_new_packets()?;
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }
        flush_tls(tcp, tls).await?;
        Ok(())
    }

    /// How the TLS handshake went: `Some(true)` resumed an earlier session,
    /// `Some(false)` was a full handshake, `None` for plain TCP.
    pub(crate) fn resumed(&self) -> Option<bool> {
        match self {
            Conn::Plain(_) => None,
            Conn::Tls { tls, .. } => Some(matches!(tls.handshake_kind(), Some(rustls::HandshakeKind::Resumed))),
        }
    }

    /// Sends all of `data` (a request).
    pub(crate) async fn send(&mut self, data: &[u8]) -> io::Result<()> {
        match self {
            Conn::Plain(tcp) => write_all(tcp, data).await,
            Conn::Tls { tcp, tls } => {
                tls.writer().write_all(data)?;
                flush_tls(tcp, tls).await
            }
        }
    }

    /// Waits until the socket has something to read.
    pub(crate) async fn readable(&self) -> io::Result<()> {
        match self {
            Conn::Plain(tcp) | Conn::Tls { tcp, .. } => tcp.readable().await,
        }
    }

    /// One read of up to `net.len()` bytes from the socket; the plaintext goes to
    /// `on_data` (for TLS through `plain`, which should be as large as `net`).
    /// `on_data` returning `false` stops the delivery (the response is broken).
    pub(crate) fn receive(
        &mut self,
        net: &mut [u8],
        plain: &mut [u8],
        on_data: &mut dyn FnMut(&[u8]) -> bool,
    ) -> io::Result<Received> {
        match self {
            Conn::Plain(tcp) => match tcp.try_read(net) {
                Ok(0) => Ok(Received::Closed),
                Ok(n) => {
                    on_data(&net[..n]);
                    Ok(Received::Data(n))
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(Received::WouldBlock),
                Err(e) => Err(e),
            },
            Conn::Tls { tcp, tls } => {
                let n = match tcp.try_read(net) {
                    Ok(0) => return Ok(Received::Closed),
                    Ok(n) => n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(Received::WouldBlock),
                    Err(e) => return Err(e),
                };
                let mut cipher = &net[..n];
                let mut delivered = 0;
                let mut closed = false;
                while !cipher.is_empty() {
                    tls.read_tls(&mut cipher)?;
                    tls.process_new_packets().map_err(io::Error::other)?;
                    loop {
                        match tls.reader().read(plain) {
                            Ok(0) => {
                                closed = true; // close_notify
                                break;
                            }
                            Ok(m) => {
                                delivered += m;
                                if !on_data(&plain[..m]) {
                                    return Ok(Received::Data(delivered));
                                }
                            }
                            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                            Err(e) => return Err(e),
                        }
                    }
                    if closed {
                        break;
                    }
                }
                // Answers rustls owes the peer (alerts, key updates) go out at once;
                // a full socket buffer here is left for the next send.
                while tls.wants_write() {
                    match tls.write_tls(&mut SocketWriter(tcp)) {
                        Ok(_) => {}
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                        Err(e) => return Err(e),
                    }
                }
                if closed && delivered == 0 {
                    return Ok(Received::Closed);
                }
                Ok(Received::Data(delivered))
            }
        }
    }
}

async fn write_all(tcp: &TcpStream, mut data: &[u8]) -> io::Result<()> {
    while !data.is_empty() {
        match tcp.try_write(data) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => data = &data[n..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => tcp.writable().await?,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

async fn flush_tls(tcp: &TcpStream, tls: &mut rustls::ClientConnection) -> io::Result<()> {
    while tls.wants_write() {
        match tls.write_tls(&mut SocketWriter(tcp)) {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => tcp.writable().await?,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// `io::Read` over a non-blocking tokio socket (`WouldBlock` when empty).
struct SocketReader<'a>(&'a TcpStream);

impl Read for SocketReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.try_read(buf)
    }
}

/// `io::Write` over a non-blocking tokio socket (`WouldBlock` when full).
struct SocketWriter<'a>(&'a TcpStream);

impl Write for SocketWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.try_write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
