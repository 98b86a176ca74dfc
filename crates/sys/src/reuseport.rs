//! Steering new connections within a `SO_REUSEPORT` group with a classic BPF
//! program (`SO_ATTACH_REUSEPORT_CBPF`, Linux 4.5+).
//!
//! The program runs for each incoming SYN and returns the index of the group
//! member that gets the connection: the order in which the sockets joined (bound)
//! the group. An index past the last member makes the kernel fall back to its
//! usual hash over all members. The program can read the CPU that is processing
//! the SYN (`SKF_AD_CPU`), the packet's flow hash (`SKF_AD_RXHASH`, 0 when the
//! NIC or stack computed none) and a random number (`SKF_AD_RANDOM`).

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

/// One classic BPF instruction (`struct sock_filter`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Insn {
    pub code: u16,
    pub jt: u8,
    pub jf: u8,
    pub k: u32,
}

/// Instruction codes used here (linux/filter.h, linux/bpf_common.h): class |
/// size or operation | source. BPF_LD, BPF_W and BPF_K are 0.
pub mod op {
    pub const LD_W_ABS: u16 = 0x20; // BPF_LD | BPF_W | BPF_ABS
    pub const JEQ_K: u16 = 0x15; // BPF_JMP (0x05) | BPF_JEQ (0x10) | BPF_K
    pub const MOD_K: u16 = 0x94; // BPF_ALU (0x04) | BPF_MOD (0x90) | BPF_K
    pub const ADD_K: u16 = 0x04; // BPF_ALU | BPF_ADD (0x00) | BPF_K
    pub const RET_K: u16 = 0x06; // BPF_RET | BPF_K
    pub const RET_A: u16 = 0x16; // BPF_RET (0x06) | BPF_A (0x10)
    /// Ancillary data offsets (`SKF_AD_OFF + ...`).
    pub const AD_CPU: u32 = (-0x1000i32) as u32 + 36;
    pub const AD_RXHASH: u32 = (-0x1000i32) as u32 + 32;
    pub const AD_RANDOM: u32 = (-0x1000i32) as u32 + 56;
}

// `Insn` is passed to the kernel as `struct sock_filter`.
const _: () = assert!(
    std::mem::size_of::<Insn>() == std::mem::size_of::<libc::sock_filter>()
        && std::mem::align_of::<Insn>() == std::mem::align_of::<libc::sock_filter>()
);

/// The longest program the kernel accepts (`BPF_MAXINSNS`).
pub const MAX_INSNS: usize = 4096;

/// Attaches `program` to the reuseport group `sock` belongs to (any member will do).
pub fn attach_reuseport_cbpf(sock: BorrowedFd<'_>, program: &[Insn]) -> io::Result<()> {
    if program.is_empty() || program.len() > MAX_INSNS {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "program length out of range"));
    }
    let fprog = libc::sock_fprog { len: program.len() as u16, filter: program.as_ptr() as *mut libc::sock_filter };
    // SAFETY: `Insn` is `#[repr(C)]` with the layout of `struct sock_filter` (u16, u8,
    // u8, u32: 8 bytes, no padding); `fprog` is a live `struct sock_fprog` whose
    // `len` (1..=MAX_INSNS, checked above) is the number of instructions `filter`
    // points at, in `program`, which outlives the call. The kernel copies the program
    // and never writes through the pointer (the `*mut` is the C type's). The
    // descriptor is borrowed. (rustix has no wrapper for SO_ATTACH_REUSEPORT_CBPF.)
    let ret = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_ATTACH_REUSEPORT_CBPF,
            (&fprog as *const libc::sock_fprog).cast(),
            std::mem::size_of::<libc::sock_fprog>() as libc::socklen_t,
        )
    };
    if ret == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    fn reuseport_listener(port: u16) -> std::net::TcpListener {
        // std cannot set SO_REUSEPORT before bind: build the listener with rustix.
        use rustix::net::{AddressFamily, SocketFlags, SocketType};
        let sock =
            rustix::net::socket_with(AddressFamily::INET, SocketType::STREAM, SocketFlags::CLOEXEC, None).unwrap();
        rustix::net::sockopt::set_socket_reuseport(&sock, true).unwrap();
        rustix::net::bind(&sock, &std::net::SocketAddrV4::new(std::net::Ipv4Addr::LOCALHOST, port)).unwrap();
        rustix::net::listen(&sock, 16).unwrap();
        std::net::TcpListener::from(sock)
    }

    /// A program that always answers "member 1" sends every connection there.
    #[test]
    fn program_picks_the_member() {
        let first = reuseport_listener(0);
        let port = first.local_addr().unwrap().port();
        let second = reuseport_listener(port);
        let prog = [Insn { code: op::RET_K, jt: 0, jf: 0, k: 1 }];
        attach_reuseport_cbpf(first.as_fd(), &prog).unwrap();
        second.set_nonblocking(true).unwrap();
        first.set_nonblocking(true).unwrap();
        let mut clients = Vec::new();
        for _ in 0..8 {
            clients.push(std::net::TcpStream::connect(("127.0.0.1", port)).unwrap());
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(first.accept().is_err(), "member 0 got a connection");
        for _ in 0..8 {
            second.accept().expect("member 1 has every connection");
        }
        assert!(attach_reuseport_cbpf(first.as_fd(), &[]).is_err());
    }
}
