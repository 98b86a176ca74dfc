//! The only place in linerate that calls the kernel directly.
//!
//! Every function here is a small, safe wrapper around one Linux syscall that no
//! well-kept library exposes the way the server needs it (`sendfile` on a borrowed
//! socket, `send` with `MSG_MORE`, `openat2` with `RESOLVE_BENEATH`, CPU affinity,
//! resource limits). The rules, so that the rest of the workspace can
//! `#![forbid(unsafe_code)]`:
//!
//! - wrappers take borrowed file descriptors (`BorrowedFd`) so a call can never
//!   outlive the descriptor it uses, and return `io::Result`;
//! - return codes go through [`cvt`] / [`cvt_size`], the one place that turns `-1`
//!   into `io::Error::last_os_error()`;
//! - every `unsafe` block carries a `SAFETY:` comment stating the invariant it relies on;
//! - kernel quirks are written down at the call site with the kernel version.
//!
//! Modules: [`ktls`] (kernel TLS), [`sockdiag`] (kTLS offload state per socket),
//! [`numa`] (memory policy, page nodes), [`pagecache`] (page-cache residency
//! without blocking, fadvise), [`tcp`] (TCP_INFO, SO_INCOMING_CPU,
//! per-socket TCP settings), [`reuseport`]
//! (steering connections with classic BPF), [`ethtool`] (NIC
//! coalescing, stats, features), [`clock`] (clock ticks).

pub mod clock;
pub mod ethtool;
pub mod ktls;
pub mod numa;
pub mod pagecache;
pub mod reuseport;
pub mod sockdiag;
pub mod tcp;

use std::ffi::{CString, OsStr};
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

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

/// `setsockopt` with a byte buffer as the value.
pub(crate) fn setsockopt_bytes(
    sock: BorrowedFd<'_>,
    level: libc::c_int,
    name: libc::c_int,
    value: &[u8],
) -> io::Result<()> {
    // SAFETY: `value` is valid for its length for the duration of the call and the
    // kernel only reads it; the descriptor is borrowed.
    let ret = unsafe {
        libc::setsockopt(sock.as_raw_fd(), level, name, value.as_ptr().cast(), value.len() as libc::socklen_t)
    };
    cvt(ret).map(drop)
}

/// `SO_RCVTIMEO`: a blocking receive on `sock` fails with `EAGAIN` after `timeout`.
pub(crate) fn set_recv_timeout(sock: BorrowedFd<'_>, timeout: std::time::Duration) -> io::Result<()> {
    // struct timeval is exactly these two fields on Linux, without padding.
    const _: () = assert!(
        std::mem::size_of::<libc::timeval>()
            == std::mem::size_of::<libc::time_t>() + std::mem::size_of::<libc::suseconds_t>()
    );
    let secs = libc::time_t::try_from(timeout.as_secs()).unwrap_or(libc::time_t::MAX);
    let usecs = timeout.subsec_micros() as libc::suseconds_t;
    let mut tv = [0u8; std::mem::size_of::<libc::timeval>()];
    let (sec_bytes, usec_bytes) = tv.split_at_mut(std::mem::size_of::<libc::time_t>());
    sec_bytes.copy_from_slice(&secs.to_ne_bytes());
    usec_bytes.copy_from_slice(&usecs.to_ne_bytes());
    setsockopt_bytes(sock, libc::SOL_SOCKET, libc::SO_RCVTIMEO, &tv)
}

/// `getsockopt` into a byte buffer; returns how many bytes the kernel wrote.
pub(crate) fn getsockopt_bytes(
    sock: BorrowedFd<'_>,
    level: libc::c_int,
    name: libc::c_int,
    buf: &mut [u8],
) -> io::Result<usize> {
    let mut len = buf.len() as libc::socklen_t;
    // SAFETY: `buf` is writable for `len` bytes; the kernel writes at most `len` and
    // stores the size written in `len`. The descriptor is borrowed.
    let ret = unsafe { libc::getsockopt(sock.as_raw_fd(), level, name, buf.as_mut_ptr().cast(), &mut len) };
    cvt(ret).map(|_| len as usize)
}

fn c_path(path: &Path) -> io::Result<CString> {
    c_bytes(path.as_os_str())
}

fn c_bytes(s: &OsStr) -> io::Result<CString> {
    CString::new(s.as_bytes()).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))
}

/// Sends up to `count` bytes of `file`, starting at `offset`, to `socket` without
/// copying them through user space. Returns the number of bytes sent; the file
/// offset of `file` is not used or changed.
///
/// `Ok(0)` with `count > 0` means the file ended before `offset` (it was truncated
/// after the response was planned): the caller must treat it as truncation, not retry.
/// A non-blocking socket whose buffer is full gives `ErrorKind::WouldBlock`.
pub fn sendfile(socket: BorrowedFd<'_>, file: BorrowedFd<'_>, offset: u64, count: usize) -> io::Result<usize> {
    let mut off: libc::off64_t =
        offset.try_into().map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "offset beyond off64_t"))?;
    let count = count.min(SENDFILE_MAX_BYTES);
    // SAFETY: both descriptors are borrowed, so they stay open for the call; `off`
    // is a live local the kernel writes the new offset into, and nothing else aliases it.
    let ret = unsafe { libc::sendfile64(socket.as_raw_fd(), file.as_raw_fd(), &mut off, count) };
    cvt_size(ret)
}

/// Sends `buf` on a connected socket. With `more = true` the kernel is told that
/// more data follows at once (`MSG_MORE`), so a response head waits for the first
/// body bytes and they leave in the same segment, without a cork/uncork pair.
/// Never raises `SIGPIPE` (`MSG_NOSIGNAL`): a closed peer gives `EPIPE`.
pub fn send(socket: BorrowedFd<'_>, buf: &[u8], more: bool) -> io::Result<usize> {
    let mut flags = libc::MSG_NOSIGNAL;
    if more {
        flags |= libc::MSG_MORE;
    }
    // SAFETY: `buf` is a valid slice for `buf.len()` bytes for the duration of the
    // call, and the kernel only reads from it; the descriptor is borrowed.
    let ret = unsafe { libc::send(socket.as_raw_fd(), buf.as_ptr().cast(), buf.len(), flags) };
    cvt_size(ret)
}

/// `struct open_how` of openat2(2), version 0 (24 bytes). libc's copy is
/// `#[non_exhaustive]`, so it cannot be built with a literal.
#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

/// Starts reading `len` bytes of `file` at `offset` into the page cache
/// (`readahead(2)`). The pages are allocated by the calling thread, under its
/// memory policy: a thread on a disk's NUMA node fills the cache on that node.
pub fn readahead(file: BorrowedFd<'_>, offset: u64, len: usize) -> io::Result<()> {
    let offset: libc::off64_t =
        offset.try_into().map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "offset beyond off64_t"))?;
    // SAFETY: no memory is passed; the descriptor is borrowed.
    cvt_size(unsafe { libc::readahead(file.as_raw_fd(), offset, len) })?;
    Ok(())
}

/// Reads from `file` at `offset` into several buffers with one `preadv`, filling
/// them in order. Used to read file data straight into the payload slots of a
/// batch of TLS records. Returns the bytes read; fewer than asked means the file
/// ended (0 at or past its end).
pub fn preadv(file: BorrowedFd<'_>, bufs: &mut [std::io::IoSliceMut<'_>], offset: u64) -> io::Result<usize> {
    let offset: libc::off64_t =
        offset.try_into().map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "offset beyond off64_t"))?;
    let count = bufs.len().min(1024) as libc::c_int; // IOV_MAX
                                                     // SAFETY: `IoSliceMut` is guaranteed ABI-compatible with `struct iovec` on Unix;
                                                     // each describes a writable buffer borrowed for the duration of the call, and the
                                                     // kernel writes at most each one's length. The descriptor is borrowed.
    let ret = unsafe { libc::preadv64(file.as_raw_fd(), bufs.as_mut_ptr().cast(), count, offset) };
    cvt_size(ret)
}

const OPEN_FLAGS: libc::c_int = libc::O_RDONLY | libc::O_CLOEXEC | libc::O_NONBLOCK | libc::O_NOCTTY;

/// Opens `path` (relative) below the directory `dir` for reading, refusing any
/// resolution that leaves `dir`: `..` above it, absolute paths, and symlinks whose
/// target is outside it (`openat2` with `RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS`,
/// Linux 5.6+). An escape fails with `EXDEV`; a kernel without `openat2` gives
/// `ENOSYS` and the caller chooses a fallback.
///
/// The descriptor is opened `O_NONBLOCK` so that a FIFO in the content tree cannot
/// block the worker; call [`set_blocking`] once it is known to be a regular file.
pub fn open_beneath(dir: BorrowedFd<'_>, path: &Path) -> io::Result<OwnedFd> {
    let path = c_path(path)?;
    let how =
        OpenHow { flags: OPEN_FLAGS as u64, mode: 0, resolve: libc::RESOLVE_BENEATH | libc::RESOLVE_NO_MAGICLINKS };
    // SAFETY: `path` is a NUL-terminated string and `how` a fully initialised
    // `open_how` that outlive the call; the size argument is the size of that struct,
    // as openat2(2) requires. On success the return value is a new descriptor that
    // nothing else owns, so wrapping it in `OwnedFd` is sound.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dir.as_raw_fd(),
            path.as_ptr(),
            &how as *const OpenHow,
            std::mem::size_of::<OpenHow>(),
        )
    };
    let fd = cvt_long(ret)?;
    // SAFETY: see above; a successful openat2 returns a descriptor fitting in c_int.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) })
}

/// Opens `path` relative to `dir` for reading with plain `openat`, following
/// symlinks wherever they point. Used when the configuration allows symlinks out of
/// the content root, and as the fallback when the kernel has no `openat2`.
pub fn open_at(dir: BorrowedFd<'_>, path: &Path) -> io::Result<OwnedFd> {
    let path = c_path(path)?;
    // SAFETY: `path` is NUL-terminated and lives across the call; a successful
    // openat returns a fresh descriptor owned by nobody else.
    let fd = cvt(unsafe { libc::openat(dir.as_raw_fd(), path.as_ptr(), OPEN_FLAGS) })?;
    // SAFETY: as above.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Clears `O_NONBLOCK` on a descriptor (used on regular files after
/// [`open_beneath`], so reads of cold pages block inside `sendfile` as usual
/// instead of returning `EAGAIN` on filesystems that honour the flag).
pub fn set_blocking(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: F_GETFL/F_SETFL take no pointers; the descriptor is borrowed.
    let flags = cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) })?;
    if flags & libc::O_NONBLOCK != 0 {
        // SAFETY: as above.
        cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags & !libc::O_NONBLOCK) })?;
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
    fn from_raw(st: &libc::stat64) -> FileStat {
        let kind = match st.st_mode & libc::S_IFMT {
            libc::S_IFREG => FileKind::Regular,
            libc::S_IFDIR => FileKind::Directory,
            _ => FileKind::Other,
        };
        FileStat {
            kind,
            dev: st.st_dev,
            ino: st.st_ino,
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

/// `fstat` on an open descriptor.
pub fn fstat(fd: BorrowedFd<'_>) -> io::Result<FileStat> {
    let mut st = MaybeUninit::<libc::stat64>::uninit();
    // SAFETY: `st` is writable memory of the right size; fstat64 fully initialises it
    // on success, and we only read it after checking the return code.
    cvt(unsafe { libc::fstat64(fd.as_raw_fd(), st.as_mut_ptr()) })?;
    // SAFETY: initialised by the successful call above.
    Ok(FileStat::from_raw(unsafe { st.assume_init_ref() }))
}

/// `fstatat` of `path` relative to `dir`, following symlinks. Cheaper than an open
/// when all the caller needs is to know whether a cached descriptor is still the
/// file that `path` names.
pub fn stat_at(dir: BorrowedFd<'_>, path: &Path) -> io::Result<FileStat> {
    let path = c_path(path)?;
    let mut st = MaybeUninit::<libc::stat64>::uninit();
    // SAFETY: `path` is NUL-terminated, `st` is writable and sized for stat64; it is
    // read only after a successful return.
    cvt(unsafe { libc::fstatat64(dir.as_raw_fd(), path.as_ptr(), st.as_mut_ptr(), 0) })?;
    // SAFETY: initialised by the successful call above.
    Ok(FileStat::from_raw(unsafe { st.assume_init_ref() }))
}

/// The CPUs the calling thread may run on (its affinity mask), in ascending order.
pub fn allowed_cpus() -> io::Result<Vec<usize>> {
    let mut set = MaybeUninit::<libc::cpu_set_t>::zeroed();
    // SAFETY: `set` is zeroed memory of size cpu_set_t, which is what we pass as the
    // size; the kernel writes at most that many bytes.
    cvt(unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), set.as_mut_ptr()) })?;
    // SAFETY: zero-initialised and then filled by the kernel; all bit patterns are valid.
    let set = unsafe { set.assume_init() };
    let max = 8 * std::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: CPU_ISSET reads a bit of a valid set; `cpu < max` keeps it in bounds.
    Ok((0..max).filter(|&cpu| unsafe { libc::CPU_ISSET(cpu, &set) }).collect())
}

/// Pins the calling thread to one CPU.
pub fn pin_current_thread(cpu: usize) -> io::Result<()> {
    let max = 8 * std::mem::size_of::<libc::cpu_set_t>();
    if cpu >= max {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "CPU number out of range"));
    }
    let mut set = MaybeUninit::<libc::cpu_set_t>::zeroed();
    // SAFETY: the set is zero-initialised (a valid empty set) and `cpu < max` keeps
    // CPU_SET within it; sched_setaffinity only reads `size_of::<cpu_set_t>()` bytes.
    unsafe {
        libc::CPU_SET(cpu, set.assume_init_mut());
        cvt(libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), set.as_ptr()))?;
    }
    Ok(())
}

/// Lets the calling thread run on any of `cpus` (and no other).
pub fn pin_current_thread_to(cpus: &[usize]) -> io::Result<()> {
    let max = 8 * std::mem::size_of::<libc::cpu_set_t>();
    if cpus.is_empty() || cpus.iter().any(|&c| c >= max) {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "empty CPU list or CPU number out of range"));
    }
    let mut set = MaybeUninit::<libc::cpu_set_t>::zeroed();
    // SAFETY: the set is zero-initialised (a valid empty set) and every `cpu < max`
    // keeps CPU_SET within it; sched_setaffinity only reads `size_of::<cpu_set_t>()` bytes.
    unsafe {
        for &cpu in cpus {
            libc::CPU_SET(cpu, set.assume_init_mut());
        }
        cvt(libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), set.as_ptr()))?;
    }
    Ok(())
}

/// The CPU the calling thread is running on right now (`sched_getcpu`).
pub fn current_cpu() -> io::Result<usize> {
    // SAFETY: no arguments, no memory touched.
    let cpu = cvt(unsafe { libc::sched_getcpu() })?;
    Ok(cpu as usize)
}

/// Soft and hard limits on open files of this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileLimit {
    pub soft: u64,
    pub hard: u64,
}

/// Reads `RLIMIT_NOFILE`.
pub fn nofile_limit() -> io::Result<FileLimit> {
    let mut lim = MaybeUninit::<libc::rlimit>::uninit();
    // SAFETY: `lim` is writable and sized for rlimit; read only after success.
    cvt(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, lim.as_mut_ptr()) })?;
    // SAFETY: initialised by the successful call.
    let lim = unsafe { lim.assume_init() };
    Ok(FileLimit { soft: lim.rlim_cur, hard: lim.rlim_max })
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit (what a server that holds
/// thousands of sockets wants) and returns the limits now in force.
pub fn raise_nofile_limit() -> io::Result<FileLimit> {
    let cur = nofile_limit()?;
    if cur.soft < cur.hard {
        let lim = libc::rlimit { rlim_cur: cur.hard, rlim_max: cur.hard };
        // SAFETY: `lim` is a valid rlimit read by the kernel during the call.
        cvt(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) })?;
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
