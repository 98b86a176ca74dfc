//! Kernel TLS: handing a TLS session's record protection to the kernel.
//!
//! After a user-space handshake, the socket gets the `tls` upper-layer protocol
//! (`TCP_ULP`) and then, per direction, the cipher, key, IV and record sequence
//! number (`SOL_TLS`/`TLS_TX`, `TLS_RX`). From then on `send`, `sendfile` and
//! `recvmsg` carry plaintext and the kernel builds and opens records.
//!
//! Kernel versions: TLS 1.2 AES-GCM TX 4.13, RX 4.17; TLS 1.3 5.1; AES-256-GCM 5.1;
//! ChaCha20-Poly1305 5.11; `TLS_TX_ZEROCOPY_RO` 5.19. Whether a given kernel has
//! them is found out by trying (see the server's start-up probe), never assumed.
//!
//! With a receive key installed, records that are not application data (alerts,
//! TLS 1.3 post-handshake messages) are returned by `recvmsg` one at a time with a
//! `TLS_GET_RECORD_TYPE` control message; a plain `read` would fail with `EIO` on
//! them, so [`recv_record`] is the only way this crate reads a kTLS socket.

use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, BorrowedFd};

use crate::{setsockopt_bytes, ByteOption};

pub(crate) const SOL_TLS: libc::c_int = 282;
pub(crate) const TLS_TX: libc::c_int = 1;
pub(crate) const TLS_RX: libc::c_int = 2;
pub(crate) const TLS_TX_ZEROCOPY_RO: libc::c_int = 3;
const TLS_SET_RECORD_TYPE: libc::c_int = 1;
const TLS_GET_RECORD_TYPE: libc::c_int = 2;
pub(crate) const TCP_ULP: libc::c_int = 31;

/// `TLS_1_2_VERSION` / `TLS_1_3_VERSION` of `linux/tls.h`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Version {
    Tls12,
    Tls13,
}

impl Version {
    fn code(self) -> u16 {
        match self {
            Version::Tls12 => 0x0303,
            Version::Tls13 => 0x0304,
        }
    }
}

/// The AEADs the kernel takes (and rustls negotiates).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Cipher {
    Aes128Gcm,
    Aes256Gcm,
    Chacha20Poly1305,
}

impl Cipher {
    fn code(self) -> u16 {
        match self {
            Cipher::Aes128Gcm => 51,
            Cipher::Aes256Gcm => 52,
            Cipher::Chacha20Poly1305 => 54,
        }
    }

    pub fn key_len(self) -> usize {
        match self {
            Cipher::Aes128Gcm => 16,
            Cipher::Aes256Gcm | Cipher::Chacha20Poly1305 => 32,
        }
    }
}

/// Which half of the connection a key protects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    Tx,
    Rx,
}

/// A `struct tls12_crypto_info_*` (the same layout serves TLS 1.3), built as the
/// bytes the kernel reads: version, cipher type, then for AES-GCM the 8-byte
/// explicit IV, the key, the 4-byte salt and the sequence number; for ChaCha20 the
/// 12-byte IV, the key and the sequence number. All fields are byte arrays after two
/// native-endian u16s, so the C struct has no padding.
pub struct CryptoInfo {
    bytes: [u8; 56],
    len: usize,
}

impl CryptoInfo {
    /// `iv` is the 12-byte per-connection IV as TLS defines it (for AES-GCM the first
    /// 4 bytes are the salt); `seq` is the next record's sequence number.
    pub fn new(version: Version, cipher: Cipher, key: &[u8], iv: &[u8; 12], seq: u64) -> io::Result<CryptoInfo> {
        if key.len() != cipher.key_len() {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "key length does not match the cipher"));
        }
        let mut bytes = [0u8; 56];
        let mut n = 0;
        let mut put = |src: &[u8]| {
            bytes[n..n + src.len()].copy_from_slice(src);
            n += src.len();
        };
        put(&version.code().to_ne_bytes());
        put(&cipher.code().to_ne_bytes());
        match cipher {
            Cipher::Aes128Gcm | Cipher::Aes256Gcm => {
                put(&iv[4..]);
                put(key);
                put(&iv[..4]);
            }
            Cipher::Chacha20Poly1305 => {
                put(iv);
                put(key);
            }
        }
        put(&seq.to_be_bytes());
        Ok(CryptoInfo { bytes, len: n })
    }
}

impl Drop for CryptoInfo {
    fn drop(&mut self) {
        // Key material: do not leave it on the stack longer than needed.
        self.bytes.fill(0);
    }
}

/// Attaches the `tls` upper-layer protocol to a connected TCP socket. `ENOENT`
/// means the kernel has no TLS support (`CONFIG_TLS` unset, or `tls.ko` cannot
/// be loaded). The socket keeps working as plain TCP until a key is installed.
pub fn attach_ulp(sock: BorrowedFd<'_>) -> io::Result<()> {
    setsockopt_bytes(sock, ByteOption::TcpUlp, b"tls")
}

/// Installs the key for one direction. After `Direction::Tx`, everything written
/// to the socket is sealed into records by the kernel.
pub fn install_key(sock: BorrowedFd<'_>, direction: Direction, info: &CryptoInfo) -> io::Result<()> {
    let option = match direction {
        Direction::Tx => ByteOption::TlsTx,
        Direction::Rx => ByteOption::TlsRx,
    };
    setsockopt_bytes(sock, option, &info.bytes[..info.len])
}

/// Lets `sendfile` on this kTLS socket encrypt straight from page-cache pages
/// without copying them first (`TLS_TX_ZEROCOPY_RO`, Linux 5.19+). Only safe for
/// files that do not change while being sent: a page modified after encryption
/// but before a retransmission makes the client see a record that fails
/// authentication.
pub fn enable_tx_zerocopy(sock: BorrowedFd<'_>) -> io::Result<()> {
    setsockopt_bytes(sock, ByteOption::TlsTxZerocopyRo, &1u32.to_ne_bytes())
}

/// The TLS record content type of application data.
pub const RECORD_APPLICATION_DATA: u8 = 23;

/// What one `recvmsg` on a kTLS socket returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Received {
    /// Application data: this many bytes at the start of the buffer. 0 is end of stream.
    Data(usize),
    /// One non-data record (alert = 21, handshake = 22) of this many bytes.
    Control { record_type: u8, len: usize },
}

/// Receives from a socket with a kTLS receive key: application data, or exactly one
/// control record, told apart by the record type the kernel attaches.
pub fn recv_record(sock: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<Received> {
    // Room for one cmsghdr carrying one byte, 8-byte aligned.
    let mut control = [0u64; 4];
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    // SAFETY: `msghdr` is a C struct of integers and raw pointers (plus padding
    // integers on musl), so all zeros is a valid value: null pointers, zero lengths.
    let mut msg: libc::msghdr = unsafe { MaybeUninit::zeroed().assume_init() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control) as _;
    // SAFETY: `msg` points at `iov` (describing `buf`, writable for its length) and at
    // `control` (writable for the `msg_controllen` = 32 bytes it announces), all of
    // which outlive the call; no address buffer is given (`msg_name` null). The kernel
    // writes within those lengths only. The descriptor is borrowed. (rustix's
    // `recvmsg` decodes only SCM_RIGHTS/SCM_CREDENTIALS control messages, not
    // TLS_GET_RECORD_TYPE.)
    let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut record_type = RECORD_APPLICATION_DATA;
    // SAFETY: after a successful recvmsg, `msg_controllen` is the number of bytes the
    // kernel wrote into `control` (at most its 32). CMSG_FIRSTHDR/NXTHDR return either
    // null or a header that lies wholly inside those bytes (`control` is 8-byte
    // aligned, as `cmsghdr` needs), so reading its fields is in bounds; CMSG_DATA of a
    // header whose `cmsg_len` covers at least one data byte points at a byte the
    // kernel wrote inside `control`.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == SOL_TLS
                && (*cmsg).cmsg_type == TLS_GET_RECORD_TYPE
                && (*cmsg).cmsg_len as usize >= libc::CMSG_LEN(1) as usize
            {
                record_type = *libc::CMSG_DATA(cmsg);
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    let n = n as usize;
    Ok(if record_type == RECORD_APPLICATION_DATA {
        Received::Data(n)
    } else {
        Received::Control { record_type, len: n }
    })
}

/// Sends `payload` as one record of the given content type (an alert such as
/// close_notify, or a TLS 1.3 KeyUpdate), through a kTLS transmit key.
pub fn send_record(sock: BorrowedFd<'_>, record_type: u8, payload: &[u8]) -> io::Result<usize> {
    let mut control = [0u64; 4];
    let mut iov = libc::iovec { iov_base: payload.as_ptr() as *mut libc::c_void, iov_len: payload.len() };
    // SAFETY: as in `recv_record`, all zeros is a valid `msghdr`.
    let mut msg: libc::msghdr = unsafe { MaybeUninit::zeroed().assume_init() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    // SAFETY: CMSG_SPACE only computes a size (24 bytes for one data byte on 64-bit
    // Linux); it touches no memory.
    msg.msg_controllen = unsafe { libc::CMSG_SPACE(1) } as _;
    // SAFETY: `msg_controllen` (CMSG_SPACE(1)) is at least one header, so
    // CMSG_FIRSTHDR returns the start of `control`, which is 8-byte aligned as
    // `cmsghdr` needs; the header and its one data byte lie inside the 32 bytes of
    // `control`, which are writable. For sendmsg, `msg` points at `iov` (describing
    // `payload`) and `control`, which outlive the call, and the kernel only reads
    // them (the iovec's `*mut` is the C type's, not a write). The descriptor is
    // borrowed. (rustix's `sendmsg` cannot build a SOL_TLS control message.)
    let n = unsafe {
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        (*cmsg).cmsg_level = SOL_TLS;
        (*cmsg).cmsg_type = TLS_SET_RECORD_TYPE;
        (*cmsg).cmsg_len = libc::CMSG_LEN(1) as _;
        *libc::CMSG_DATA(cmsg) = record_type;
        libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL)
    };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crypto_info_layout_matches_linux_tls_h() {
        let iv: [u8; 12] = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12];
        let key = [0xaa; 16];
        let info = CryptoInfo::new(Version::Tls13, Cipher::Aes128Gcm, &key, &iv, 0x0102).unwrap();
        // tls12_crypto_info_aes_gcm_128: 4 + 8 + 16 + 4 + 8 bytes.
        assert_eq!(info.len, 40);
        assert_eq!(&info.bytes[..2], &0x0304u16.to_ne_bytes());
        assert_eq!(&info.bytes[2..4], &51u16.to_ne_bytes());
        assert_eq!(&info.bytes[4..12], &iv[4..]);
        assert_eq!(&info.bytes[12..28], &key);
        assert_eq!(&info.bytes[28..32], &iv[..4]);
        assert_eq!(&info.bytes[32..40], &[0, 0, 0, 0, 0, 0, 1, 2]);
        let info = CryptoInfo::new(Version::Tls12, Cipher::Chacha20Poly1305, &[0; 32], &iv, 7).unwrap();
        // tls12_crypto_info_chacha20_poly1305: 4 + 12 + 32 + 0 + 8 bytes.
        assert_eq!(info.len, 56);
        assert_eq!(&info.bytes[4..16], &iv);
        assert_eq!(info.bytes[55], 7);
        assert_eq!(
            CryptoInfo::new(Version::Tls12, Cipher::Aes256Gcm, &key, &iv, 0).err().map(|e| e.kind()),
            Some(io::ErrorKind::InvalidInput)
        );
    }
}
