//! The server handshake, driven over a socket with rustls's unbuffered API.
//!
//! Records are read whole and one at a time (header, then exactly its length), so
//! when rustls reports the handshake complete no byte after the client's last
//! handshake record has left the socket: the kernel (kTLS) or the user-space record
//! layer takes over at an exact record boundary, and any request the client sent
//! right after its Finished is still waiting in the socket.

use std::io;
use std::sync::Arc;

use rustls::kernel::KernelConnection;
use rustls::server::{ServerConnectionData, UnbufferedServerConnection};
use rustls::unbuffered::{ConnectionState, EncodeError, UnbufferedStatus};
use rustls::{ExtractedSecrets, ProtocolVersion, ServerConfig, SupportedCipherSuite};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::record::{Protocol, HEADER_LEN, MAX_PAYLOAD};

/// A completed handshake, ready to hand to a transport.
pub struct Established {
    pub secrets: ExtractedSecrets,
    pub kernel: KernelConnection<ServerConnectionData>,
    pub protocol: Protocol,
    pub suite: SupportedCipherSuite,
    /// The server name the client asked for (SNI), when it sent one and the
    /// certificate was chosen by it (a full handshake).
    pub sni: Option<Box<str>>,
}

#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    #[error("{0}")]
    Io(#[from] io::Error),
    #[error("TLS: {0}")]
    Tls(#[from] rustls::Error),
    #[error("client closed during the handshake")]
    Closed,
    /// The client spoke plain HTTP to the TLS port.
    #[error("plain HTTP on the HTTPS port")]
    PlainHttp,
}

impl Established {
    /// Records that may be sealed under one key before confidentiality degrades
    /// (2^24 for AES-GCM, per rustls's suite tables).
    pub fn record_limit(&self) -> u64 {
        match self.suite {
            SupportedCipherSuite::Tls13(s) => s.common.confidentiality_limit,
            SupportedCipherSuite::Tls12(s) => s.common.confidentiality_limit,
            #[allow(unreachable_patterns)] // the enum may grow
            _ => 1 << 24,
        }
    }
}

/// Runs the server side of the handshake on `stream`.
///
/// Memory is taken only while there is work: nothing before the client's first
/// byte arrives, and no record buffer while waiting for the client's next flight
/// (a server under a flood of new sessions holds thousands of handshakes at once).
pub async fn accept(stream: &mut TcpStream, config: Arc<ServerConfig>) -> Result<Established, HandshakeError> {
    stream.readable().await?;
    let mut conn = UnbufferedServerConnection::new(config)?;
    let mut incoming: Vec<u8> = Vec::new();
    let mut outgoing: Vec<u8> = Vec::new();
    let mut out_len = 0;
    let mut sni = None;
    loop {
        let UnbufferedStatus { discard, state } = conn.process_tls_records(&mut incoming);
        // Taken at once, with no await in between: see `certs::take_seen_sni`.
        if let Some(name) = super::certs::take_seen_sni() {
            sni = Some(name);
        }
        let state = match state {
            Ok(s) => s,
            Err(e) => {
                send_pending_alert(stream, &mut conn).await;
                return Err(e.into());
            }
        };
        let mut done = false;
        let mut need_record = false;
        match state {
            ConnectionState::EncodeTlsData(mut data) => loop {
                match data.encode(&mut outgoing[out_len..]) {
                    Ok(n) => {
                        out_len += n;
                        break;
                    }
                    Err(EncodeError::InsufficientSize(s)) => outgoing.resize(out_len + s.required_size, 0),
                    Err(EncodeError::AlreadyEncoded) => break,
                }
            },
            ConnectionState::TransmitTlsData(data) => {
                stream.write_all(&outgoing[..out_len]).await?;
                out_len = 0;
                outgoing = Vec::new();
                data.done();
            }
            ConnectionState::BlockedHandshake => need_record = true,
            ConnectionState::WriteTraffic(_) => {
                // The flight ends with a TransmitTlsData, so nothing should be left;
                // were rustls ever to end it without one, the session tickets would be
                // lost (no resumption) and the sequence numbers handed to the record
                // layer would count records the client never saw.
                if out_len > 0 {
                    stream.write_all(&outgoing[..out_len]).await?;
                    out_len = 0;
                }
                done = true;
            }
            ConnectionState::PeerClosed | ConnectionState::Closed => return Err(HandshakeError::Closed),
            _ => {
                return Err(HandshakeError::Io(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "unexpected data during the handshake",
                )))
            }
        }
        incoming.drain(..discard);
        if incoming.is_empty() {
            incoming = Vec::new();
        }
        if done {
            break;
        }
        if need_record {
            // Whatever rustls did not discard (a handshake message split across
            // records) stays in front; the next record is appended to it.
            read_record(stream, &mut incoming).await?;
        }
    }
    let protocol = match conn.protocol_version() {
        Some(ProtocolVersion::TLSv1_2) => Protocol::Tls12,
        _ => Protocol::Tls13,
    };
    let suite = conn.negotiated_cipher_suite().expect("negotiated once the handshake is done");
    let (secrets, kernel) = conn.dangerous_into_kernel_connection()?;
    Ok(Established { secrets, kernel, protocol, suite, sni })
}

/// Appends exactly one record to `incoming`.
async fn read_record(stream: &mut TcpStream, incoming: &mut Vec<u8>) -> Result<(), HandshakeError> {
    let start = incoming.len();
    incoming.resize(start + HEADER_LEN, 0);
    read_exact(stream, &mut incoming[start..]).await?;
    let header = &incoming[start..];
    if !(20..=23).contains(&header[0]) {
        // Every TLS record starts with a content type of 20..=23; an upper-case
        // letter is the first byte of an HTTP method.
        return Err(if header[0].is_ascii_uppercase() {
            HandshakeError::PlainHttp
        } else {
            HandshakeError::Io(io::Error::new(io::ErrorKind::InvalidData, "not a TLS record"))
        });
    }
    let len = u16::from_be_bytes([header[3], header[4]]) as usize;
    if len > MAX_PAYLOAD + 2048 {
        return Err(HandshakeError::Io(io::Error::new(io::ErrorKind::InvalidData, "oversized TLS record")));
    }
    incoming.resize(start + HEADER_LEN + len, 0);
    read_exact(stream, &mut incoming[start + HEADER_LEN..]).await
}

async fn read_exact(stream: &mut TcpStream, buf: &mut [u8]) -> Result<(), HandshakeError> {
    match stream.read_exact(buf).await {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Err(HandshakeError::Closed),
        Err(e) => Err(e.into()),
    }
}

/// After a failed handshake rustls may have an alert for the peer; send it if the
/// socket takes it at once (best effort: the connection is closing anyway).
async fn send_pending_alert(stream: &mut TcpStream, conn: &mut UnbufferedServerConnection) {
    let mut out = Vec::new();
    // Each call hands out one queued chunk; the alert may follow other messages.
    for _ in 0..8 {
        let UnbufferedStatus { state, .. } = conn.process_tls_records(&mut []);
        let Ok(ConnectionState::EncodeTlsData(mut data)) = state else { break };
        let start = out.len();
        out.resize(start + 256, 0);
        let n = match data.encode(&mut out[start..]) {
            Err(EncodeError::InsufficientSize(s)) => {
                out.resize(start + s.required_size, 0);
                data.encode(&mut out[start..])
            }
            other => other,
        };
        match n {
            Ok(n) => out.truncate(start + n),
            Err(_) => {
                out.truncate(start);
                break;
            }
        }
    }
    if !out.is_empty() {
        let _ = stream.try_write(&out);
    }
}
