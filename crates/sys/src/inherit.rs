//! Handing descriptors to a new program, and taking them over in it.
//!
//! A binary upgrade starts the new binary as a child that inherits the running
//! server's listening sockets: the very same sockets, so the connections waiting in
//! their accept queues are the new process's to accept. Every descriptor the server
//! opens is close-on-exec; [`spawn_keeping`] clears that flag on the chosen ones in
//! the child only (between `fork` and `exec`), so no other descriptor leaks and the
//! parent's stay close-on-exec for whatever else it may start. The child names the
//! inherited descriptors by number (the parent tells it which in its environment) and
//! takes each over with [`adopt_tcp_listener`] or [`adopt_unix_stream`], which check
//! that the number is an open socket of the expected kind before owning it.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command};
use std::sync::Mutex;

use rustix::io::FdFlags;
use rustix::net::{AddressFamily, SocketType};

/// Starts `cmd` with `keep` left open across its `exec` (their close-on-exec flag is
/// cleared in the child after `fork`; the parent's descriptors are not touched).
/// The child sees them under the same numbers.
pub fn spawn_keeping(cmd: &mut Command, keep: &[BorrowedFd<'_>]) -> io::Result<Child> {
    let fds: Vec<RawFd> = keep.iter().map(|fd| fd.as_raw_fd()).collect();
    // SAFETY: the closure runs in the child between fork and exec, where only
    // async-signal-safe work is allowed: it allocates nothing (the vector was built
    // before the fork and is only read) and makes only fcntl(2) calls, which are
    // async-signal-safe. The descriptors are open in the child, since `keep` borrows
    // them in the parent for the whole call and fork duplicates the table; borrowing
    // them again in the child is therefore sound.
    unsafe {
        cmd.pre_exec(move || keep_open(&fds));
    }
    cmd.spawn()
}

/// Clears close-on-exec on `fds` (in a child, before exec).
fn keep_open(fds: &[RawFd]) -> io::Result<()> {
    for &fd in fds {
        // SAFETY: see the callers: each number is open in this process for the call.
        let fd = unsafe { BorrowedFd::borrow_raw(fd) };
        let flags = rustix::io::fcntl_getfd(fd)?;
        rustix::io::fcntl_setfd(fd, flags - FdFlags::CLOEXEC)?;
    }
    Ok(())
}

/// Like [`spawn_keeping`], but the program runs as a grandchild whose parent exits
/// at once, so that it is adopted by init or the nearest subreaper, which for a
/// service is its service manager: systemd supervises a main process well only if
/// it is systemd's own child (of one that is not, it says "Supervising process ...
/// which is not our child. We'll most likely not notice when it exits", and stops
/// the service with SIGKILL at once). Returns the program's pid. Its exit status is
/// not this process's to collect.
pub fn spawn_detached(cmd: &mut Command, keep: &[BorrowedFd<'_>]) -> io::Result<u32> {
    let fds: Vec<RawFd> = keep.iter().map(|fd| fd.as_raw_fd()).collect();
    // The intermediate process reports the grandchild's pid on this socket pair
    // (both ends close-on-exec: the program never sees them).
    let (mut ours, theirs) = UnixStream::pair()?;
    let report = theirs.as_raw_fd();
    // SAFETY: the closure runs in the child between fork and exec and does only
    // async-signal-safe work: fcntl(2) (see spawn_keeping), fork(2), write(2) of a
    // stack buffer and _exit(2); it allocates nothing. After fork(2), the
    // intermediate process only writes and exits (no destructor, no atfork-unsafe
    // library call); the grandchild goes on to exec as the single thread of its
    // process, exactly as a child of spawn_keeping does. `report` and the `fds` are
    // open in the child: fork duplicated the parent's table while `theirs` and `keep`
    // were borrowed by this call.
    unsafe {
        cmd.pre_exec(move || {
            keep_open(&fds)?;
            match libc::fork() {
                -1 => Err(io::Error::last_os_error()),
                0 => Ok(()),
                grandchild => {
                    let bytes = grandchild.to_ne_bytes();
                    let n = libc::write(report, bytes.as_ptr().cast(), bytes.len());
                    libc::_exit(if n == bytes.len() as isize { 0 } else { 1 })
                }
            }
        });
    }
    let result = cmd.spawn();
    drop(theirs);
    let mut intermediate = result?;
    let status = intermediate.wait()?;
    let mut pid = [0u8; 4];
    std::io::Read::read_exact(&mut ours, &mut pid)
        .map_err(|e| io::Error::new(e.kind(), format!("no pid from the intermediate process ({status}): {e}")))?;
    let pid = i32::from_ne_bytes(pid);
    u32::try_from(pid).map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "bad pid from the intermediate process"))
}

/// Descriptor numbers already taken over: each may be owned once.
static ADOPTED: Mutex<Vec<RawFd>> = Mutex::new(Vec::new());

/// Takes ownership of descriptor `fd`, inherited from the parent, after checking
/// that it is open and passes `check`; makes it close-on-exec again.
fn adopt(fd: RawFd, check: impl FnOnce(BorrowedFd<'_>) -> io::Result<()>) -> io::Result<OwnedFd> {
    let invalid = |what: String| io::Error::new(io::ErrorKind::InvalidInput, what);
    if fd <= 2 {
        return Err(invalid(format!("descriptor {fd} is standard input, output or error")));
    }
    let mut adopted = ADOPTED.lock().unwrap_or_else(|e| e.into_inner());
    if adopted.contains(&fd) {
        return Err(invalid(format!("descriptor {fd} is named twice")));
    }
    // Is the number open at all? fcntl(F_GETFD) on a closed number fails with EBADF
    // and touches nothing.
    // SAFETY: F_GETFD takes no argument and reads or writes no memory; a number that
    // is not open only makes it fail with EBADF.
    if unsafe { libc::fcntl(fd, libc::F_GETFD) } == -1 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(e.kind(), format!("descriptor {fd} was not inherited: {e}")));
    }
    // SAFETY: the number is open (checked just above) and, by the hand-over protocol,
    // was passed to this process for it to own: nothing else in the process refers to
    // it (stdio is excluded above and each number is adopted once, recorded in
    // ADOPTED under the lock). The borrow does not outlive this call.
    let borrowed = unsafe { BorrowedFd::borrow_raw(fd) };
    check(borrowed).map_err(|e| io::Error::new(e.kind(), format!("descriptor {fd}: {e}")))?;
    rustix::io::fcntl_setfd(borrowed, rustix::io::fcntl_getfd(borrowed)? | FdFlags::CLOEXEC)?;
    adopted.push(fd);
    // SAFETY: as above: an open descriptor handed to this process to own, owned by
    // nothing else, and recorded so that it is never owned twice.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Takes over an inherited listening TCP socket (IPv4 or IPv6), non-blocking.
pub fn adopt_tcp_listener(fd: RawFd) -> io::Result<std::net::TcpListener> {
    let owned = adopt(fd, |s| {
        let family = rustix::net::sockopt::socket_domain(s)?;
        if family != AddressFamily::INET && family != AddressFamily::INET6 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "not an IPv4 or IPv6 socket"));
        }
        if rustix::net::sockopt::socket_type(s)? != SocketType::STREAM {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "not a stream socket"));
        }
        if !rustix::net::sockopt::socket_acceptconn(s)? {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "not a listening socket"));
        }
        Ok(())
    })?;
    let listener = std::net::TcpListener::from(owned);
    listener.set_nonblocking(true)?;
    Ok(listener)
}

/// Takes over an inherited connected Unix stream socket (blocking).
pub fn adopt_unix_stream(fd: RawFd) -> io::Result<UnixStream> {
    let owned = adopt(fd, |s| {
        if rustix::net::sockopt::socket_domain(s)? != AddressFamily::UNIX {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "not a Unix socket"));
        }
        if rustix::net::sockopt::socket_type(s)? != SocketType::STREAM {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "not a stream socket"));
        }
        Ok(())
    })?;
    let stream = UnixStream::from(owned);
    stream.set_nonblocking(false)?;
    Ok(stream)
}

/// Signals a process can be sent with [`signal`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Signal {
    Hup,
    Term,
    Kill,
    Usr2,
}

/// Sends `sig` to process `pid` (`kill(2)`); `ESRCH` when there is no such process.
pub fn signal(pid: u32, sig: Signal) -> io::Result<()> {
    let raw = i32::try_from(pid).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "pid out of range"))?;
    let pid = rustix::process::Pid::from_raw(raw)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "pid 0 names a process group"))?;
    Ok(rustix::process::kill_process(pid, to_rustix(sig))?)
}

/// Sends `sig` to every process of process group `pgid`.
pub fn signal_group(pgid: u32, sig: Signal) -> io::Result<()> {
    let raw = i32::try_from(pgid).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "pgid out of range"))?;
    let pgid = rustix::process::Pid::from_raw(raw)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "pgid 0 is the caller's group"))?;
    Ok(rustix::process::kill_process_group(pgid, to_rustix(sig))?)
}

fn to_rustix(sig: Signal) -> rustix::process::Signal {
    match sig {
        Signal::Hup => rustix::process::Signal::HUP,
        Signal::Term => rustix::process::Signal::TERM,
        Signal::Kill => rustix::process::Signal::KILL,
        Signal::Usr2 => rustix::process::Signal::USR2,
    }
}

/// Makes this process the reaper of its orphaned descendants
/// (`PR_SET_CHILD_SUBREAPER`): a process whose parent exits is re-parented here
/// instead of to init, so [`reap`] can collect it. For supervisors and tests of
/// programs that start their own successors.
pub fn become_child_subreaper() -> io::Result<()> {
    Ok(rustix::process::set_child_subreaper(Some(rustix::process::getpid()))?)
}

/// Collects child (or adopted orphan) `pid`, or any one when `None`, if it has
/// exited, without waiting; returns the pid collected. `ECHILD` when there is none
/// of this process's to collect.
pub fn reap(pid: Option<u32>) -> io::Result<Option<u32>> {
    let pid = match pid {
        None => None,
        Some(pid) => {
            let raw =
                i32::try_from(pid).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "pid out of range"))?;
            Some(
                rustix::process::Pid::from_raw(raw)
                    .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "pid 0 names a process group"))?,
            )
        }
    };
    Ok(rustix::process::waitpid(pid, rustix::process::WaitOptions::NOHANG)?
        .map(|(pid, _)| pid.as_raw_nonzero().get() as u32))
}

/// Whether process `pid` exists and has not exited (a zombie waiting to be
/// collected counts as exited).
pub fn is_running(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command name, which is in parentheses.
        Ok(stat) => {
            stat.rfind(')').and_then(|i| stat[i + 1..].split_whitespace().next()).is_some_and(|s| s != "Z" && s != "X")
        }
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::fd::AsFd;

    #[test]
    fn a_kept_descriptor_reaches_the_child_and_others_do_not() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let other = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let (kept, other_fd) = (listener.as_raw_fd(), other.as_raw_fd());
        // The child says what its descriptors with those numbers are (the shell's
        // `[ -e ]` opens nothing), compared with the sockets the parent has there.
        let mut cmd = Command::new("/bin/sh");
        let script = format!("for n in {kept} {other_fd}; do readlink /proc/$$/fd/$n || echo closed; done");
        cmd.args(["-c", &script]).stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::null());
        let mut child = spawn_keeping(&mut cmd, &[listener.as_fd()]).unwrap();
        let mut out = String::new();
        child.stdout.take().unwrap().read_to_string(&mut out).unwrap();
        assert!(child.wait().unwrap().success());
        let mine = |fd: RawFd| std::fs::read_link(format!("/proc/self/fd/{fd}")).unwrap().display().to_string();
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 2, "{out}");
        assert_eq!(lines[0], mine(kept), "the kept socket is the same socket in the child");
        assert_ne!(lines[1], mine(other_fd), "the other socket leaked into the child");
        // The parent's copy is still close-on-exec.
        assert!(rustix::io::fcntl_getfd(&listener).unwrap().contains(FdFlags::CLOEXEC));
    }

    #[test]
    fn a_detached_program_is_not_our_child_and_keeps_its_descriptors() {
        become_child_subreaper().unwrap(); // its orphan comes back here, to be collected
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let kept = listener.as_raw_fd();
        let dir = std::env::temp_dir().join(format!("linerate-detached-{}", std::process::id()));
        let out = dir.with_extension("out");
        let script = format!("readlink /proc/$$/fd/{kept} > {0}.tmp; mv {0}.tmp {0}; sleep 1", out.display());
        let mut cmd = Command::new("/bin/sh");
        cmd.args(["-c", &script]);
        let pid = spawn_detached(&mut cmd, &[listener.as_fd()]).unwrap();
        // The intermediate process has exited and been collected: the program was
        // adopted (here, by this subreaper) before spawn_detached returned.
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        let ppid = stat[stat.rfind(')').unwrap() + 2..].split_whitespace().nth(1).unwrap().to_string();
        assert_eq!(ppid, std::process::id().to_string(), "{stat}");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !out.exists() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let text = std::fs::read_to_string(&out).unwrap();
        std::fs::remove_file(&out).unwrap();
        let mine = std::fs::read_link(format!("/proc/self/fd/{kept}")).unwrap().display().to_string();
        assert_eq!(text.trim(), mine, "the kept socket reached the program");
        assert!(is_running(pid));
        while reap(Some(pid)).unwrap().is_none() {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(!is_running(pid));
    }

    #[test]
    fn adoption_checks_the_kind_and_owns_once() {
        // A listening socket, released by its owner as a parent's would be by exec.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let fd = OwnedFd::from(listener);
        let raw = fd.as_raw_fd();
        std::mem::forget(fd); // ownership passes to adopt_tcp_listener
        let adopted = adopt_tcp_listener(raw).unwrap();
        assert_eq!(adopted.local_addr().unwrap(), addr);
        assert!(rustix::io::fcntl_getfd(&adopted).unwrap().contains(FdFlags::CLOEXEC));
        let e = adopt_tcp_listener(raw).unwrap_err();
        assert!(e.to_string().contains("twice"), "{e}");

        // A connected socket is not a listener; a Unix pair is not TCP.
        let (a, mut b) = UnixStream::pair().unwrap();
        let e = adopt_tcp_listener(a.as_raw_fd()).unwrap_err();
        assert!(e.to_string().contains("not an IPv4"), "{e}");
        let raw = OwnedFd::from(a);
        let n = raw.as_raw_fd();
        std::mem::forget(raw);
        let mut a = adopt_unix_stream(n).unwrap();
        a.write_all(b"x").unwrap();
        let mut got = [0u8; 1];
        b.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"x");

        // Standard output is never taken over. (A closed number is not tried here:
        // a parallel test could open it meanwhile.)
        assert!(adopt_tcp_listener(1).is_err());
    }
}
