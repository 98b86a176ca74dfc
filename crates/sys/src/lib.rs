//! The only place in linerate that calls the kernel directly.
//!
//! Every public function here is a small, safe wrapper around one Linux syscall (or
//! a short fixed sequence of them) shaped the way the server needs it: `sendfile`
//! on a borrowed socket, `send` with `MSG_MORE`, `preadv`, `openat2` with
//! `RESOLVE_BENEATH`, CPU affinity, resource limits, page-cache residency, kernel
//! TLS, NIC settings. The rules, so that the rest of the workspace can
//! `#![forbid(unsafe_code)]`:
//!
//! - wrappers take borrowed file descriptors (`BorrowedFd`) so a call can never
//!   outlive the descriptor it uses, and return `io::Result` whose `raw_os_error()`
//!   is the kernel's errno (callers match on `EAGAIN`, `ENOSYS`, `EPERM`, `EXDEV`);
//! - the plain syscalls go through [rustix](https://docs.rs/rustix): `sendfile`,
//!   `send`, `preadv`/`preadv2(RWF_NOWAIT)`, `openat2`/`openat`, `fstat`/`fstatat`,
//!   `fcntl`, `posix_fadvise`, `statvfs`, affinity and `getcpu`, `gettid`, rlimits,
//!   the clock tick rate, socket creation, `sendto`/`recv` and the socket options it
//!   has typed wrappers for. Its Linux backend makes the syscall itself (inline assembly, on
//!   glibc and musl alike), with no allocation and no extra syscall per call, and
//!   its errors convert to `io::Error` with the same errno;
//! - `unsafe` with libc remains only where no safe wrapper exists: `readahead`,
//!   `cachestat` (syscall 451), socket options rustix lacks (`TCP_INFO`, `TCP_ULP`,
//!   `TCP_NOTSENT_LOWAT`, `SO_MAX_PACING_RATE`, the kTLS keys: a closed set of
//!   pointer-free options, `ByteOption`), `SIOCOUTQ`, the kTLS record-type control
//!   messages of `recvmsg`/`sendmsg`, `SO_ATTACH_REUSEPORT_CBPF`, the ethtool ioctl
//!   (an `unsafe fn`: its soundness depends on the command matching the buffer)
//!   and the guard-paged buffers some of its commands need, and the NUMA calls
//!   (`set_mempolicy`, `get_mempolicy`, `mmap` + `mincore`), and `sched_setscheduler`
//!   (for `SCHED_IDLE`);
//! - every `unsafe` block carries a `SAFETY:` comment stating the invariant it relies
//!   on, and every `unsafe fn` a `# Safety` section (both enforced by clippy:
//!   `undocumented_unsafe_blocks`, `missing_safety_doc`);
//! - kernel quirks are written down at the call site with the kernel version.
//!
//! Modules: [`ktls`] (kernel TLS), [`sockdiag`] (kTLS offload state per socket),
//! [`numa`] (memory policy, page nodes), [`pagecache`] (page-cache residency
//! without blocking, fadvise), [`tcp`] (TCP_INFO, SO_INCOMING_CPU,
//! per-socket TCP settings), [`reuseport`]
//! (steering connections with classic BPF), [`ethtool`] (NIC
//! coalescing, stats, features), [`clock`] (clock ticks), [`inherit`] (descriptors
//! handed to a new binary at an upgrade, and taken over in it; signals).

#![deny(clippy::undocumented_unsafe_blocks, clippy::missing_safety_doc, unsafe_op_in_unsafe_fn)]
#![deny(unreachable_pub)]

pub mod clock;
pub mod ethtool;
pub mod inherit;
pub mod ktls;
pub mod numa;
pub mod pagecache;
pub mod reuseport;
pub mod sockdiag;
pub mod tcp;

use std::io;
use std::io::IoSliceMut;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use rustix::fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags};
use rustix::net::SendFlags;
use rustix::process::{Resource, Rlimit};
use rustix::thread::CpuSet;

/// Linux moves at most this many bytes in one `sendfile` call (`MAX_RW_COUNT`,
/// `INT_MAX & PAGE_MASK`); larger requests are silently shortened, so callers loop.
pub const SENDFILE_MAX_BYTES: usize = 0x7fff_f000;

fn cvt(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

fn cvt_size(ret: isize) -> io::Result<usize> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret as usize)
    }
}

fn cvt_long(ret: libc::c_long) -> io::Result<libc::c_long> {
    if ret == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// A file offset as the kernel takes it (`loff_t`, signed 64 bits). Larger values
/// are refused here with `InvalidInput` rather than passed on.
fn file_offset(offset: u64) -> io::Result<u64> {
    if offset > i64::MAX as u64 {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "offset beyond off64_t"));
    }
    Ok(offset)
}

/// Refuses a path with a NUL byte before the kernel sees it (`InvalidInput`, no
/// errno), as `std::fs` does.
fn check_path(path: &Path) -> io::Result<&Path> {
    if path.as_os_str().as_bytes().contains(&0) {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"));
    }
    Ok(path)
}

/// The socket options this crate sets or reads as raw bytes: those rustix has no
/// typed wrapper for. Each takes its value by copy, with no pointer inside that the
/// kernel would follow, so any bytes of any length are memory-safe to pass (the
/// kernel validates them); that is what makes [`setsockopt_bytes`] and
/// [`getsockopt_bytes`] sound, and why they take this closed set and not any
/// level and name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ByteOption {
    /// `TCP_INFO`: a `struct tcp_info`, truncated to the buffer.
    TcpInfo,
    /// `TCP_ULP`: the name of an upper-layer protocol.
    TcpUlp,
    /// `TCP_NOTSENT_LOWAT`: an int.
    TcpNotsentLowat,
    /// `SO_MAX_PACING_RATE`: a u32 or u64.
    MaxPacingRate,
    /// `SOL_TLS`/`TLS_TX`, `TLS_RX`: a `struct tls12_crypto_info_*`, all bytes.
    TlsTx,
    TlsRx,
    /// `SOL_TLS`/`TLS_TX_ZEROCOPY_RO`: an int.
    TlsTxZerocopyRo,
}

impl ByteOption {
    fn level_and_name(self) -> (libc::c_int, libc::c_int) {
        match self {
            ByteOption::TcpInfo => (libc::IPPROTO_TCP, libc::TCP_INFO),
            ByteOption::TcpUlp => (libc::IPPROTO_TCP, ktls::TCP_ULP),
            ByteOption::TcpNotsentLowat => (libc::IPPROTO_TCP, libc::TCP_NOTSENT_LOWAT),
            ByteOption::MaxPacingRate => (libc::SOL_SOCKET, libc::SO_MAX_PACING_RATE),
            ByteOption::TlsTx => (ktls::SOL_TLS, ktls::TLS_TX),
            ByteOption::TlsRx => (ktls::SOL_TLS, ktls::TLS_RX),
            ByteOption::TlsTxZerocopyRo => (ktls::SOL_TLS, ktls::TLS_TX_ZEROCOPY_RO),
        }
    }
}

/// `setsockopt` with a byte buffer as the value.
pub(crate) fn setsockopt_bytes(sock: BorrowedFd<'_>, option: ByteOption, value: &[u8]) -> io::Result<()> {
    let (level, name) = option.level_and_name();
    let len = libc::socklen_t::try_from(value.len())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "socket option value too long"))?;
    // SAFETY: `value` is valid for reads of `len` bytes for the duration of the call,
    // and the kernel reads no more than that and writes nothing. Every `ByteOption`
    // takes its value by copy, with no pointer inside for the kernel to follow, so
    // no other memory is touched whatever the bytes. The descriptor is borrowed, so
    // it stays open across the call.
    let ret = unsafe { libc::setsockopt(sock.as_raw_fd(), level, name, value.as_ptr().cast(), len) };
    cvt(ret).map(drop)
}

/// `getsockopt` into a byte buffer; returns how many bytes the kernel wrote.
pub(crate) fn getsockopt_bytes(sock: BorrowedFd<'_>, option: ByteOption, buf: &mut [u8]) -> io::Result<usize> {
    let (level, name) = option.level_and_name();
    let mut len = libc::socklen_t::try_from(buf.len()).unwrap_or(libc::socklen_t::MAX);
    // SAFETY: `buf` is valid for writes of `len` bytes (`len` is at most its length)
    // and `len` is a live, writable socklen_t; for every `ByteOption` the kernel
    // writes at most `len` bytes into `buf`, follows no pointer inside it, and stores
    // the number written in `len`. The descriptor is borrowed.
    let ret = unsafe { libc::getsockopt(sock.as_raw_fd(), level, name, buf.as_mut_ptr().cast(), &mut len) };
    cvt(ret).map(|_| (len as usize).min(buf.len()))
}

/// Sends up to `count` bytes of `file`, starting at `offset`, to `socket` without
/// copying them through user space. Returns the number of bytes sent; the file
/// offset of `file` is not used or changed.
///
/// `Ok(0)` with `count > 0` means the file ended before `offset` (it was truncated
/// after the response was planned): the caller must treat it as truncation, not retry.
/// A non-blocking socket whose buffer is full gives `ErrorKind::WouldBlock`.
pub fn sendfile(socket: BorrowedFd<'_>, file: BorrowedFd<'_>, offset: u64, count: usize) -> io::Result<usize> {
    let mut off = file_offset(offset)?;
    Ok(rustix::fs::sendfile(socket, file, Some(&mut off), count.min(SENDFILE_MAX_BYTES))?)
}

/// Sends `buf` on a connected socket. With `more = true` the kernel is told that
/// more data follows at once (`MSG_MORE`), so a response head waits for the first
/// body bytes and they leave in the same segment, without a cork/uncork pair.
/// Never raises `SIGPIPE` (`MSG_NOSIGNAL`): a closed peer gives `EPIPE`.
pub fn send(socket: BorrowedFd<'_>, buf: &[u8], more: bool) -> io::Result<usize> {
    let flags = if more { SendFlags::NOSIGNAL | SendFlags::MORE } else { SendFlags::NOSIGNAL };
    Ok(rustix::net::send(socket, buf, flags)?)
}

/// Reserves the disk blocks for bytes `0..len` of `file` without changing its
/// size (`fallocate(2)` with `FALLOC_FL_KEEP_SIZE`): later writes there find their
/// blocks allocated, which costs less than allocating them write by write. Fails
/// with `EOPNOTSUPP` on file systems without it and `ENOSPC` when the disk is full.
pub fn preallocate(file: BorrowedFd<'_>, len: u64) -> io::Result<()> {
    Ok(rustix::fs::fallocate(file, rustix::fs::FallocateFlags::KEEP_SIZE, 0, len)?)
}

/// Starts reading `len` bytes of `file` at `offset` into the page cache
/// (`readahead(2)`). The pages are allocated by the calling thread, under its
/// memory policy: a thread on a disk's NUMA node fills the cache on that node.
pub fn readahead(file: BorrowedFd<'_>, offset: u64, len: usize) -> io::Result<()> {
    let offset = file_offset(offset)? as libc::off64_t;
    // SAFETY: readahead(2) takes no pointers, so no memory is at stake; the
    // descriptor is borrowed, so it stays open across the call. (rustix has no
    // wrapper for it.)
    cvt_size(unsafe { libc::readahead(file.as_raw_fd(), offset, len) })?;
    Ok(())
}

/// Reads from `file` at `offset` into several buffers with one `preadv`, filling
/// them in order. Used to read file data straight into the payload slots of a
/// batch of TLS records. Returns the bytes read; fewer than asked means the file
/// ended (0 at or past its end). At most `IOV_MAX` (1024) buffers are used per call.
pub fn preadv(file: BorrowedFd<'_>, bufs: &mut [IoSliceMut<'_>], offset: u64) -> io::Result<usize> {
    let offset = file_offset(offset)?;
    Ok(rustix::io::preadv(file, bufs, offset)?)
}

const OPEN_FLAGS: OFlags = OFlags::RDONLY.union(OFlags::CLOEXEC).union(OFlags::NONBLOCK).union(OFlags::NOCTTY);

/// Opens `path` (relative) below the directory `dir` for reading, refusing any
/// resolution that leaves `dir`: `..` above it, absolute paths, and symlinks whose
/// target is outside it (`openat2` with `RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS`,
/// Linux 5.6+). An escape fails with `EXDEV`; a kernel without `openat2` gives
/// `ENOSYS` and the caller chooses a fallback.
///
/// The descriptor is opened `O_NONBLOCK` so that a FIFO in the content tree cannot
/// block the worker; call [`set_blocking`] once it is known to be a regular file.
pub fn open_beneath(dir: BorrowedFd<'_>, path: &Path) -> io::Result<OwnedFd> {
    let resolve = ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS;
    Ok(rustix::fs::openat2(dir, check_path(path)?, OPEN_FLAGS, Mode::empty(), resolve)?)
}

/// Opens `path` relative to `dir` for reading with plain `openat`, following
/// symlinks wherever they point. Used when the configuration allows symlinks out of
/// the content root, and as the fallback when the kernel has no `openat2`.
pub fn open_at(dir: BorrowedFd<'_>, path: &Path) -> io::Result<OwnedFd> {
    Ok(rustix::fs::openat(dir, check_path(path)?, OPEN_FLAGS, Mode::empty())?)
}

/// Clears `O_NONBLOCK` on a descriptor (used on regular files after
/// [`open_beneath`], so reads of cold pages block inside `sendfile` as usual
/// instead of returning `EAGAIN` on filesystems that honour the flag).
pub fn set_blocking(fd: BorrowedFd<'_>) -> io::Result<()> {
    let flags = rustix::fs::fcntl_getfl(fd)?;
    if flags.contains(OFlags::NONBLOCK) {
        rustix::fs::fcntl_setfl(fd, flags - OFlags::NONBLOCK)?;
    }
    Ok(())
}

/// What kind of object a path or descriptor refers to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileKind {
    Regular,
    Directory,
    Other,
}

/// The parts of `struct stat` the server uses to build validators and detect change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileStat {
    pub kind: FileKind,
    pub dev: u64,
    pub ino: u64,
    pub size_bytes: u64,
    /// Modification time, nanoseconds since the Unix epoch (may be negative).
    pub mtime_ns: i128,
    /// Status-change time, nanoseconds since the Unix epoch; changes on rename-over,
    /// truncate and chmod, so it catches replacements that keep size and mtime.
    pub ctime_ns: i128,
}

impl FileStat {
    // The field types of `struct stat` differ between architectures (the casts are
    // no-ops on some of them).
    #[allow(clippy::unnecessary_cast)]
    fn from_raw(st: &rustix::fs::Stat) -> FileStat {
        let kind = match FileType::from_raw_mode(st.st_mode) {
            FileType::RegularFile => FileKind::Regular,
            FileType::Directory => FileKind::Directory,
            _ => FileKind::Other,
        };
        FileStat {
            kind,
            dev: st.st_dev as u64,
            ino: st.st_ino as u64,
            size_bytes: st.st_size.max(0) as u64,
            mtime_ns: st.st_mtime as i128 * 1_000_000_000 + st.st_mtime_nsec as i128,
            ctime_ns: st.st_ctime as i128 * 1_000_000_000 + st.st_ctime_nsec as i128,
        }
    }

    /// Modification time in whole seconds since the epoch (HTTP dates have no fraction).
    pub fn mtime_secs(&self) -> i64 {
        self.mtime_ns.div_euclid(1_000_000_000) as i64
    }
}

/// An anonymous file in memory (`memfd_create(2)`), close-on-exec: bytes that are
/// to be sent with `sendfile` like a file's but never kept on disk (a response passed
/// through from an origin, or one whose cache directory is full).
pub fn memfd(name: &str) -> io::Result<std::fs::File> {
    let name = std::ffi::CString::new(name).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    Ok(rustix::fs::memfd_create(&name, rustix::fs::MemfdFlags::CLOEXEC)?.into())
}

/// `fstat` on an open descriptor.
pub fn fstat(fd: BorrowedFd<'_>) -> io::Result<FileStat> {
    Ok(FileStat::from_raw(&rustix::fs::fstat(fd)?))
}

/// `fstatat` of `path` relative to `dir`, following symlinks. Cheaper than an open
/// when all the caller needs is to know whether a cached descriptor is still the
/// file that `path` names.
pub fn stat_at(dir: BorrowedFd<'_>, path: &Path) -> io::Result<FileStat> {
    Ok(FileStat::from_raw(&rustix::fs::statat(dir, check_path(path)?, AtFlags::empty())?))
}

/// Bytes an unprivileged process may still write on the file system holding `path`
/// (`statvfs`: available blocks times the fragment size). The root-reserved blocks
/// are left out, as they are of what `df` shows as available.
pub fn free_bytes(path: &Path) -> io::Result<u64> {
    let st = rustix::fs::statvfs(path)?;
    Ok(st.f_bavail.saturating_mul(st.f_frsize))
}

/// The CPUs the calling thread may run on (its affinity mask), in ascending order.
pub fn allowed_cpus() -> io::Result<Vec<usize>> {
    let set = rustix::thread::sched_getaffinity(None)?;
    Ok((0..CpuSet::MAX_CPU).filter(|&cpu| set.is_set(cpu)).collect())
}

/// Pins the calling thread to one CPU.
pub fn pin_current_thread(cpu: usize) -> io::Result<()> {
    if cpu >= CpuSet::MAX_CPU {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "CPU number out of range"));
    }
    let mut set = CpuSet::new();
    set.set(cpu);
    Ok(rustix::thread::sched_setaffinity(None, &set)?)
}

/// Lets the calling thread run on any of `cpus` (and no other).
pub fn pin_current_thread_to(cpus: &[usize]) -> io::Result<()> {
    if cpus.is_empty() || cpus.iter().any(|&c| c >= CpuSet::MAX_CPU) {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "empty CPU list or CPU number out of range"));
    }
    let mut set = CpuSet::new();
    for &cpu in cpus {
        set.set(cpu);
    }
    Ok(rustix::thread::sched_setaffinity(None, &set)?)
}

/// Moves the calling thread (and the threads it starts afterwards) to the idle
/// scheduling class, `SCHED_IDLE`: it runs when no thread of the normal class wants
/// the CPU, so background work does not take CPU time from the threads serving
/// requests.
pub fn set_current_thread_idle() -> io::Result<()> {
    /// The kernel's `struct sched_param`, one `int`. The syscall is made directly:
    /// libc's struct differs between glibc and musl, and musl's
    /// `sched_setscheduler` does not call the kernel.
    #[repr(C)]
    struct SchedParam {
        sched_priority: libc::c_int,
    }
    let param = SchedParam { sched_priority: 0 };
    // SAFETY: pid 0 names the calling thread; `param` is an initialised struct of
    // the kernel's layout that lives across the call, which only reads it.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_sched_setscheduler,
            0 as libc::c_long,
            libc::c_long::from(libc::SCHED_IDLE),
            &param as *const SchedParam,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The CPU the calling thread is running on right now (`getcpu`).
pub fn current_cpu() -> io::Result<usize> {
    Ok(rustix::thread::sched_getcpu())
}

/// Soft and hard limits on open files of this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileLimit {
    pub soft: u64,
    pub hard: u64,
}

/// Reads `RLIMIT_NOFILE`. An unlimited value reads as `u64::MAX` (`RLIM_INFINITY`).
pub fn nofile_limit() -> io::Result<FileLimit> {
    let lim = rustix::process::getrlimit(Resource::Nofile);
    Ok(FileLimit { soft: lim.current.unwrap_or(u64::MAX), hard: lim.maximum.unwrap_or(u64::MAX) })
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit (what a server that holds
/// thousands of sockets wants) and returns the limits now in force.
pub fn raise_nofile_limit() -> io::Result<FileLimit> {
    let cur = nofile_limit()?;
    if cur.soft < cur.hard {
        let hard = (cur.hard != u64::MAX).then_some(cur.hard);
        rustix::process::setrlimit(Resource::Nofile, Rlimit { current: hard, maximum: hard })?;
    }
    nofile_limit()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::fd::AsFd;

    #[test]
    fn sendfile_sends_the_range_and_reports_truncation() {
        let dir = std::env::temp_dir().join(format!("linerate-sys-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("f");
        std::fs::File::create(&path).unwrap().write_all(b"0123456789").unwrap();
        let file = std::fs::File::open(&path).unwrap();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        assert_eq!(send(server.as_fd(), b"head:", true).unwrap(), 5);
        assert_eq!(sendfile(server.as_fd(), file.as_fd(), 3, 4).unwrap(), 4);
        // Past the end of the file: 0, the truncation signal.
        assert_eq!(sendfile(server.as_fd(), file.as_fd(), 10, 4).unwrap(), 0);
        drop(server);
        let mut got = String::new();
        let mut client = client;
        client.read_to_string(&mut got).unwrap();
        assert_eq!(got, "head:3456");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn free_bytes_reads_the_file_system_of_a_path() {
        let free = free_bytes(&std::env::temp_dir()).unwrap();
        assert!(free > 0, "a temporary directory with no free byte");
        assert!(free_bytes(Path::new("/nonexistent/linerate")).is_err());
    }

    #[test]
    fn open_beneath_refuses_escapes() {
        let dir = std::env::temp_dir().join(format!("linerate-sys-b-{}", std::process::id()));
        let root = dir.join("root");
        std::fs::create_dir_all(&root).unwrap();
        std::fs::write(dir.join("secret"), b"x").unwrap();
        std::fs::write(root.join("ok"), b"y").unwrap();
        std::os::unix::fs::symlink("../secret", root.join("out")).unwrap();
        std::os::unix::fs::symlink("ok", root.join("in")).unwrap();
        let rootfd = std::fs::File::open(&root).unwrap();
        let fd = rootfd.as_fd();
        match open_beneath(fd, Path::new("ok")) {
            Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => return, // pre-5.6 kernel
            r => assert!(r.is_ok()),
        }
        assert!(open_beneath(fd, Path::new("in")).is_ok());
        for bad in ["../secret", "out", "/etc/passwd"] {
            let e = open_beneath(fd, Path::new(bad)).unwrap_err();
            assert_eq!(e.raw_os_error(), Some(libc::EXDEV), "{bad}");
        }
        // The plain variant follows the outward symlink (used only when configured).
        assert!(open_at(fd, Path::new("out")).is_ok());
        let st = fstat(open_beneath(fd, Path::new("ok")).unwrap().as_fd()).unwrap();
        assert_eq!(st.kind, FileKind::Regular);
        assert_eq!(st.size_bytes, 1);
        assert_eq!(stat_at(fd, Path::new("in")).unwrap().ino, st.ino);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn opened_files_are_nonblocking_until_set_blocking() {
        let dir = std::env::temp_dir().join(format!("linerate-sys-n-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("f"), b"z").unwrap();
        let dirfd = std::fs::File::open(&dir).unwrap();
        let file = open_at(dirfd.as_fd(), Path::new("f")).unwrap();
        let flags = rustix::fs::fcntl_getfl(&file).unwrap();
        assert!(flags.contains(OFlags::NONBLOCK), "{flags:?}");
        set_blocking(file.as_fd()).unwrap();
        let flags = rustix::fs::fcntl_getfl(&file).unwrap();
        assert!(!flags.contains(OFlags::NONBLOCK), "{flags:?}");
        assert_eq!(rustix::io::fcntl_getfd(&file).unwrap(), rustix::io::FdFlags::CLOEXEC);
        // Refused before the kernel: no errno, as std::fs does it.
        for e in [
            open_at(dirfd.as_fd(), Path::new("f\0x")).unwrap_err(),
            open_beneath(dirfd.as_fd(), Path::new("f\0x")).unwrap_err(),
            stat_at(dirfd.as_fd(), Path::new("f\0x")).unwrap_err(),
            sendfile(dirfd.as_fd(), file.as_fd(), 1 << 63, 1).unwrap_err(),
            preadv(file.as_fd(), &mut [], u64::MAX).unwrap_err(),
        ] {
            assert_eq!((e.kind(), e.raw_os_error()), (io::ErrorKind::InvalidInput, None), "{e}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn preadv_fills_buffers_in_order() {
        let dir = std::env::temp_dir().join(format!("linerate-sys-p-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("f");
        std::fs::write(&path, b"abcdefghij").unwrap();
        let file = std::fs::File::open(&path).unwrap();
        let (mut a, mut b) = ([0u8; 3], [0u8; 4]);
        let n =
            preadv(file.as_fd(), &mut [std::io::IoSliceMut::new(&mut a), std::io::IoSliceMut::new(&mut b)], 2).unwrap();
        assert_eq!((n, &a, &b), (7, b"cde", b"fghi"));
        let n =
            preadv(file.as_fd(), &mut [std::io::IoSliceMut::new(&mut a), std::io::IoSliceMut::new(&mut b)], 8).unwrap();
        assert_eq!((n, &a[..2]), (2, &b"ij"[..]));
        assert_eq!(preadv(file.as_fd(), &mut [std::io::IoSliceMut::new(&mut a)], 10).unwrap(), 0);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// The scheduling policy of a thread of this process (field 41 of its `stat`).
    fn policy_of(tid: i32) -> u32 {
        let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).unwrap();
        // The command name (field 2) may hold spaces: count from after its ')'.
        let after = &stat[stat.rfind(')').unwrap() + 2..];
        after.split(' ').nth(41 - 3).unwrap().parse().unwrap()
    }

    #[test]
    fn idle_class_is_the_calling_threads_and_its_childrens_only() {
        let me = rustix::thread::gettid().as_raw_nonzero().get();
        std::thread::spawn(move || {
            let tid = rustix::thread::gettid().as_raw_nonzero().get();
            assert_eq!(policy_of(tid), libc::SCHED_OTHER as u32);
            set_current_thread_idle().unwrap();
            assert_eq!(policy_of(tid), libc::SCHED_IDLE as u32);
            let child =
                std::thread::spawn(|| policy_of(rustix::thread::gettid().as_raw_nonzero().get())).join().unwrap();
            assert_eq!(child, libc::SCHED_IDLE as u32, "a thread it starts inherits the class");
        })
        .join()
        .unwrap();
        assert_eq!(policy_of(me), libc::SCHED_OTHER as u32, "the other threads keep theirs");
    }

    #[test]
    fn affinity_round_trip() {
        let cpus = allowed_cpus().unwrap();
        assert!(!cpus.is_empty());
        let cpu = *cpus.last().unwrap();
        std::thread::spawn(move || {
            pin_current_thread(cpu).unwrap();
            assert_eq!(allowed_cpus().unwrap(), vec![cpu]);
            assert_eq!(current_cpu().unwrap(), cpu);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn nofile_limit_is_readable_and_raisable() {
        let before = nofile_limit().unwrap();
        let after = raise_nofile_limit().unwrap();
        assert_eq!(after.soft, before.hard);
        assert_eq!(after.hard, before.hard);
    }
}
