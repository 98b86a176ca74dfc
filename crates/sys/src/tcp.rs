//! TCP socket options and statistics the server reads or sets itself.
//!
//! Options rustix has typed wrappers for go through it (`TCP_CONGESTION`,
//! `SO_INCOMING_CPU`, `SO_SNDBUF`); the rest (`TCP_INFO`, `TCP_NOTSENT_LOWAT`,
//! `SO_MAX_PACING_RATE`) through the crate's byte-buffer `getsockopt`/`setsockopt`.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

use rustix::net::sockopt;

use crate::{cvt, getsockopt_bytes, setsockopt_bytes, ByteOption};

/// The parts of `struct tcp_info` (linux/tcp.h) the server samples.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TcpInfo {
    /// Unrecovered retransmission timeouts.
    pub retransmits: u8,
    pub rtt_usecs: u32,
    pub rtt_var_usecs: u32,
    pub snd_cwnd_segments: u32,
    pub total_retrans: u32,
    pub pacing_rate_bytes: u64,
    /// 0 on kernels before 4.9.
    pub delivery_rate_bytes: u64,
    /// 0 on kernels before 4.19.
    pub bytes_sent: u64,
    /// 0 on kernels before 4.19.
    pub bytes_retrans: u64,
}

/// Reads `TCP_INFO`. Fields the running kernel does not report are 0.
pub fn tcp_info(sock: BorrowedFd<'_>) -> io::Result<TcpInfo> {
    let mut raw = [0u8; 256];
    let len = getsockopt_bytes(sock, ByteOption::TcpInfo, &mut raw)?;
    let raw = &raw[..len];
    // Offsets of struct tcp_info, stable since each field was added.
    let u32_at = |o: usize| raw.get(o..o + 4).map_or(0, |b| u32::from_ne_bytes(b.try_into().expect("4 bytes")));
    let u64_at = |o: usize| raw.get(o..o + 8).map_or(0, |b| u64::from_ne_bytes(b.try_into().expect("8 bytes")));
    Ok(TcpInfo {
        retransmits: raw.get(2).copied().unwrap_or(0),
        rtt_usecs: u32_at(68),
        rtt_var_usecs: u32_at(72),
        snd_cwnd_segments: u32_at(80),
        total_retrans: u32_at(100),
        pacing_rate_bytes: u64_at(104),
        delivery_rate_bytes: u64_at(160),
        bytes_sent: u64_at(200),
        bytes_retrans: u64_at(208),
    })
}

/// The CPU whose softirq received the connection's packets (`SO_INCOMING_CPU`,
/// Linux 3.19+): for a just-accepted socket, the CPU that took its SYN.
pub fn incoming_cpu(sock: BorrowedFd<'_>) -> io::Result<usize> {
    // The kernel stores -1 until a packet has been received; rustix reads the int
    // as a u32.
    let cpu = sockopt::socket_incoming_cpu(sock)? as i32;
    if cpu < 0 {
        return Err(io::Error::new(io::ErrorKind::NotFound, "no incoming CPU recorded"));
    }
    Ok(cpu as usize)
}

/// Sets the congestion control algorithm (`TCP_CONGESTION`), e.g. `bbr`. Sockets
/// accepted from a listener inherit it.
pub fn set_congestion_control(sock: BorrowedFd<'_>, name: &str) -> io::Result<()> {
    Ok(sockopt::set_tcp_congestion(sock, name)?)
}

/// The congestion control algorithm in use.
pub fn congestion_control(sock: BorrowedFd<'_>) -> io::Result<String> {
    Ok(sockopt::tcp_congestion(sock)?)
}

/// Caps the pacing rate (`SO_MAX_PACING_RATE`, bytes per second; honoured by the fq
/// qdisc and by TCP's internal pacing).
pub fn set_max_pacing_rate(sock: BorrowedFd<'_>, bytes_per_sec: u64) -> io::Result<()> {
    // The option takes a u64 since Linux 4.20, a u32 before; a u32 value works on both
    // when it fits.
    match u32::try_from(bytes_per_sec) {
        Ok(v) => setsockopt_bytes(sock, ByteOption::MaxPacingRate, &v.to_ne_bytes()),
        Err(_) => setsockopt_bytes(sock, ByteOption::MaxPacingRate, &bytes_per_sec.to_ne_bytes()),
    }
}

/// Makes the socket's close abortive (`SO_LINGER` on with a zero timeout): closing
/// it drops whatever is still queued and sends a reset, instead of delivering the
/// queued bytes first. For a client that is cut for reading too slowly, whose queue
/// would otherwise keep the memory, and the connection, for as long as it takes.
pub fn set_abortive_close(sock: BorrowedFd<'_>) -> io::Result<()> {
    Ok(sockopt::set_socket_linger(sock, Some(std::time::Duration::ZERO))?)
}

/// Limits unsent data queued in the socket (`TCP_NOTSENT_LOWAT`): the socket reports
/// writable only when less than this is waiting, so a slow client holds less memory.
pub fn set_notsent_lowat(sock: BorrowedFd<'_>, bytes: u32) -> io::Result<()> {
    setsockopt_bytes(sock, ByteOption::TcpNotsentLowat, &bytes.to_ne_bytes())
}

/// Reads an integer socket option, for tests that check what a socket inherited.
pub fn notsent_lowat(sock: BorrowedFd<'_>) -> io::Result<u32> {
    let mut v = [0u8; 4];
    getsockopt_bytes(sock, ByteOption::TcpNotsentLowat, &mut v)?;
    Ok(u32::from_ne_bytes(v))
}

/// Whether the kernel calls the socket writable now (`poll` for `POLLOUT`, not
/// waiting): its own test, a third of the send buffer free and unsent bytes under
/// `TCP_NOTSENT_LOWAT`. Unlike [`send_room`] it sees the low-water mark, and the
/// send buffer as the kernel shrinks it under memory pressure.
pub fn is_writable(sock: BorrowedFd<'_>) -> io::Result<bool> {
    use rustix::event::{poll, PollFd, PollFlags, Timespec};
    let mut fds = [PollFd::new(&sock, PollFlags::OUT)];
    let ready = poll(&mut fds, Some(&Timespec { tv_sec: 0, tv_nsec: 0 }))?;
    Ok(ready > 0 && fds[0].revents().contains(PollFlags::OUT))
}

/// Bytes the socket's send buffer can still take: `SO_SNDBUF` (the kernel's cap on
/// queued bytes, autotuned unless set) minus `SIOCOUTQ` (bytes written and not yet
/// acknowledged). An estimate: the kernel also charges per-packet overhead against
/// the cap, so a write of this size may be taken only in part.
pub fn send_room(sock: BorrowedFd<'_>) -> io::Result<usize> {
    let cap = sockopt::socket_send_buffer_size(sock)?;
    let mut queued: libc::c_int = 0;
    // SAFETY: SIOCOUTQ (same number as TIOCOUTQ) on a socket writes exactly one int
    // through its argument, which points to `queued`, a live, writable c_int. The
    // descriptor is borrowed, so it stays open. (rustix has no wrapper for SIOCOUTQ.)
    let ret = unsafe { libc::ioctl(sock.as_raw_fd(), libc::TIOCOUTQ, &mut queued as *mut libc::c_int) };
    cvt(ret)?;
    Ok(cap.saturating_sub(queued.max(0) as usize))
}

/// The calling thread's kernel id (for its CPU time in /proc/self/task/TID/stat).
pub fn current_tid() -> u32 {
    rustix::thread::gettid().as_raw_nonzero().get() as u32
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn options_round_trip_and_are_inherited() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        set_congestion_control(listener.as_fd(), "reno").unwrap();
        set_notsent_lowat(listener.as_fd(), 131072).unwrap();
        set_max_pacing_rate(listener.as_fd(), 10_000_000).unwrap();
        assert!(set_congestion_control(listener.as_fd(), "no-such-algorithm").is_err());
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        assert_eq!(congestion_control(server.as_fd()).unwrap(), "reno");
        assert_eq!(notsent_lowat(server.as_fd()).unwrap(), 131072);
        let _ = incoming_cpu(server.as_fd()).unwrap();
        // A socket that has received nothing has no incoming CPU (the kernel's -1).
        let idle = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        assert_eq!(incoming_cpu(idle.as_fd()).unwrap_err().kind(), io::ErrorKind::NotFound);
        let info = tcp_info(client.as_fd()).unwrap();
        assert!(info.snd_cwnd_segments > 0, "{info:?}");
        assert!(current_tid() > 0);
    }

    #[test]
    fn writable_until_unsent_bytes_pass_the_low_water_mark() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let _client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        assert!(is_writable(server.as_fd()).unwrap());
        // The client never reads: once more than the mark is unsent, the kernel
        // stops calling the socket writable though its buffer has room.
        set_notsent_lowat(server.as_fd(), 16 * 1024).unwrap();
        server.set_nonblocking(true).unwrap();
        let chunk = [7u8; 4096];
        let mut written = 0;
        while is_writable(server.as_fd()).unwrap() {
            written += std::io::Write::write(&mut &server, &chunk).unwrap();
            assert!(written < 64 << 20, "still writable after {written} bytes");
        }
        assert!(send_room(server.as_fd()).unwrap() > 0, "the buffer itself is not full");
    }
}
