//! Asking the kernel about one TCP socket through `NETLINK_SOCK_DIAG`.
//!
//! Used to find out where a kernel TLS session's records are sealed: in software
//! (`tls_sw`) or by the NIC (`tls_device`), which Linux chooses by itself when the
//! egress NIC offers TLS offload. The socket's upper-layer-protocol info carries it
//! (`INET_DIAG_ULP_INFO` → `INET_ULP_INFO_TLS` → `TLS_INFO_TXCONF`, Linux 5.2+).
//!
//! The request names one socket by its 4-tuple (no dump), so the answer is one
//! message; the reply is parsed with bounds checks on every attribute. The kernel
//! answers such a request at once, from the caller's own system call; should the
//! reply never come (netlink drops messages when memory is short), the receive gives
//! up after [`REPLY_TIMEOUT`] instead of blocking the calling thread.

use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::Duration;

use rustix::net::netlink::{self, SocketAddrNetlink};
use rustix::net::{AddressFamily, RecvFlags, SendFlags, SocketFlags, SocketType};

const SOCK_DIAG_BY_FAMILY: u16 = 20;
const NLM_F_REQUEST: u16 = 1;
const NLMSG_ERROR: u16 = 2;
const INET_DIAG_INFO: u8 = 2;
const INET_DIAG_ULP_INFO: u16 = 22;
const INET_ULP_INFO_NAME: u16 = 1;
const INET_ULP_INFO_TLS: u16 = 2;
const TLS_INFO_TXCONF: u16 = 3;
const TLS_INFO_RXCONF: u16 = 4;
const NLA_TYPE_MASK: u16 = 0x3fff;
/// `sizeof(struct inet_diag_msg)`.
const INET_DIAG_MSG_LEN: usize = 72;

/// The longest [`tls_info`] waits for the kernel's reply (`SO_RCVTIMEO`).
pub const REPLY_TIMEOUT: Duration = Duration::from_millis(50);

/// Where one direction of a kernel TLS session is handled (`TLS_CONF_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TlsConf {
    /// Keys installed but no record processing (`TLS_CONF_BASE`).
    Base,
    /// Software kTLS: the kernel seals/opens records on the CPU.
    Software,
    /// NIC offload: the NIC seals/opens records.
    Hardware,
    /// NIC offload of the full record.
    HardwareRecord,
    Unknown(u16),
}

impl TlsConf {
    fn from_code(c: u16) -> TlsConf {
        match c {
            1 => TlsConf::Base,
            2 => TlsConf::Software,
            3 => TlsConf::Hardware,
            4 => TlsConf::HardwareRecord,
            other => TlsConf::Unknown(other),
        }
    }
}

/// The TLS configuration of a socket's two directions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TlsInfo {
    pub tx: Option<TlsConf>,
    pub rx: Option<TlsConf>,
}

/// Looks up the TCP socket with this local and peer address. Returns `None` when
/// the socket has no `tls` upper-layer protocol; `ENOENT` when there is no such socket.
pub fn tls_info(local: SocketAddr, peer: SocketAddr) -> io::Result<Option<TlsInfo>> {
    let req = request(local, peer)?;
    let sock = diag_socket()?;
    // Port id 0 addresses the kernel.
    rustix::net::sendto(&sock, &req, SendFlags::empty(), &SocketAddrNetlink::new(0, 0))?;
    let mut buf = [0u8; 8192];
    let n = recv_reply(sock.as_fd(), &mut buf)?;
    parse_reply(&buf[..n])
}

/// A `NETLINK_SOCK_DIAG` socket whose receives give up after [`REPLY_TIMEOUT`].
fn diag_socket() -> io::Result<OwnedFd> {
    let sock = rustix::net::socket_with(
        AddressFamily::NETLINK,
        SocketType::RAW,
        SocketFlags::CLOEXEC,
        Some(netlink::SOCK_DIAG),
    )?;
    rustix::net::sockopt::set_socket_timeout(&sock, rustix::net::sockopt::Timeout::Recv, Some(REPLY_TIMEOUT))?;
    Ok(sock)
}

/// One reply; `ErrorKind::TimedOut` when none came within the socket's timeout.
fn recv_reply(sock: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<usize> {
    match rustix::net::recv(sock, buf, RecvFlags::empty()) {
        Ok((n, _)) => Ok(n),
        Err(rustix::io::Errno::AGAIN) => {
            Err(io::Error::new(io::ErrorKind::TimedOut, "no sock_diag reply within the receive timeout"))
        }
        Err(e) => Err(e.into()),
    }
}

fn request(local: SocketAddr, peer: SocketAddr) -> io::Result<Vec<u8>> {
    let family = match (local, peer) {
        (SocketAddr::V4(_), SocketAddr::V4(_)) => libc::AF_INET,
        (SocketAddr::V6(_), SocketAddr::V6(_)) => libc::AF_INET6,
        _ => return Err(io::Error::new(io::ErrorKind::InvalidInput, "mixed address families")),
    };
    let mut m = Vec::with_capacity(72);
    let len: u32 = 16 + 56;
    m.extend_from_slice(&len.to_ne_bytes());
    m.extend_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
    m.extend_from_slice(&NLM_F_REQUEST.to_ne_bytes());
    m.extend_from_slice(&1u32.to_ne_bytes()); // sequence
    m.extend_from_slice(&0u32.to_ne_bytes()); // port id: the kernel
                                              // struct inet_diag_req_v2
    m.push(family as u8);
    m.push(libc::IPPROTO_TCP as u8);
    m.push(1 << (INET_DIAG_INFO - 1));
    m.push(0);
    m.extend_from_slice(&u32::MAX.to_ne_bytes()); // all states
                                                  // struct inet_diag_sockid: ports and addresses in network order
    m.extend_from_slice(&local.port().to_be_bytes());
    m.extend_from_slice(&peer.port().to_be_bytes());
    for addr in [local, peer] {
        let mut a = [0u8; 16];
        match addr {
            SocketAddr::V4(v4) => a[..4].copy_from_slice(&v4.ip().octets()),
            SocketAddr::V6(v6) => a.copy_from_slice(&v6.ip().octets()),
        }
        m.extend_from_slice(&a);
    }
    m.extend_from_slice(&0u32.to_ne_bytes()); // interface: any
    m.extend_from_slice(&u32::MAX.to_ne_bytes()); // cookie: INET_DIAG_NOCOOKIE
    m.extend_from_slice(&u32::MAX.to_ne_bytes());
    debug_assert_eq!(m.len(), len as usize);
    Ok(m)
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn malformed() -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, "malformed sock_diag reply")
}

/// Iterates the netlink attributes (`struct nlattr`) in `b`: (type, payload).
fn attrs(mut b: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        let len = u16_at(b, 0)? as usize;
        let ty = u16_at(b, 2)? & NLA_TYPE_MASK;
        if len < 4 || len > b.len() {
            return None;
        }
        let payload = &b[4..len];
        b = &b[(len + 3) & !3..];
        Some((ty, payload))
    })
}

fn parse_reply(reply: &[u8]) -> io::Result<Option<TlsInfo>> {
    let len = u32_at(reply, 0).ok_or_else(malformed)? as usize;
    let ty = u16_at(reply, 4).ok_or_else(malformed)?;
    let msg = reply.get(16..len.min(reply.len())).ok_or_else(malformed)?;
    if ty == NLMSG_ERROR {
        let errno = u32_at(msg, 0).ok_or_else(malformed)? as i32;
        return Err(io::Error::from_raw_os_error(-errno));
    }
    if ty != SOCK_DIAG_BY_FAMILY {
        return Err(malformed());
    }
    let rest = msg.get(INET_DIAG_MSG_LEN..).ok_or_else(malformed)?;
    let Some((_, ulp)) = attrs(rest).find(|(t, _)| *t == INET_DIAG_ULP_INFO) else { return Ok(None) };
    if !attrs(ulp).any(|(t, p)| t == INET_ULP_INFO_NAME && p.starts_with(b"tls")) {
        return Ok(None);
    }
    let mut info = TlsInfo { tx: None, rx: None };
    if let Some((_, tls)) = attrs(ulp).find(|(t, _)| *t == INET_ULP_INFO_TLS) {
        for (t, p) in attrs(tls) {
            match t {
                TLS_INFO_TXCONF => info.tx = u16_at(p, 0).map(TlsConf::from_code),
                TLS_INFO_RXCONF => info.rx = u16_at(p, 0).map(TlsConf::from_code),
                _ => {}
            }
        }
    }
    Ok(Some(info))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_tcp_socket_has_no_tls_info() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (_server, _) = listener.accept().unwrap();
        let info = tls_info(client.local_addr().unwrap(), client.peer_addr().unwrap()).unwrap();
        assert_eq!(info, None);
        // A socket that does not exist.
        let gone: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let e = tls_info(gone, gone).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOENT), "{e}");
    }

    #[test]
    fn a_reply_that_never_comes_times_out() {
        // Nothing was asked, so the kernel has nothing to say: the receive must give
        // up after REPLY_TIMEOUT rather than block its thread.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let sock = diag_socket().unwrap();
            let started = std::time::Instant::now();
            let got = recv_reply(sock.as_fd(), &mut [0u8; 256]);
            let _ = tx.send((got.map_err(|e| e.kind()), started.elapsed()));
        });
        let (got, waited) = rx.recv_timeout(Duration::from_secs(5)).expect("recv blocked with no reply");
        assert_eq!(got, Err(io::ErrorKind::TimedOut));
        assert!(waited >= REPLY_TIMEOUT / 2, "gave up after {waited:?}");
    }

    #[test]
    fn parses_a_tls_reply() {
        // A reply as the kernel builds it: header, inet_diag_msg, ULP info nest.
        let mut tls = Vec::new();
        for (ty, val) in [(TLS_INFO_TXCONF, 2u16), (TLS_INFO_RXCONF, 3u16)] {
            tls.extend_from_slice(&6u16.to_ne_bytes());
            tls.extend_from_slice(&ty.to_ne_bytes());
            tls.extend_from_slice(&val.to_ne_bytes());
            tls.extend_from_slice(&[0, 0]);
        }
        let mut ulp = Vec::new();
        ulp.extend_from_slice(&8u16.to_ne_bytes());
        ulp.extend_from_slice(&INET_ULP_INFO_NAME.to_ne_bytes());
        ulp.extend_from_slice(b"tls\0");
        ulp.extend_from_slice(&((4 + tls.len()) as u16).to_ne_bytes());
        ulp.extend_from_slice(&(INET_ULP_INFO_TLS | 0x8000).to_ne_bytes());
        ulp.extend_from_slice(&tls);
        let mut msg = vec![0u8; 16 + INET_DIAG_MSG_LEN];
        msg.extend_from_slice(&((4 + ulp.len()) as u16).to_ne_bytes());
        msg.extend_from_slice(&INET_DIAG_ULP_INFO.to_ne_bytes());
        msg.extend_from_slice(&ulp);
        let total = msg.len() as u32;
        msg[..4].copy_from_slice(&total.to_ne_bytes());
        msg[4..6].copy_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
        let info = parse_reply(&msg).unwrap().unwrap();
        assert_eq!(info, TlsInfo { tx: Some(TlsConf::Software), rx: Some(TlsConf::Hardware) });
        // Truncated replies are errors, not panics.
        for cut in 0..msg.len() {
            let _ = parse_reply(&msg[..cut]);
        }
    }
}
