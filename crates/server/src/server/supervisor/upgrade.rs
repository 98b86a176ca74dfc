//! Binary upgrades without a lost connection.
//!
//! On SIGUSR2 the running server starts the binary it was started from (the same
//! path, so a package upgrade that replaced the file starts the new version) with
//! the same command line, handing it its listening sockets, the admin socket
//! included. They are the very same sockets, not new members of the `SO_REUSEPORT`
//! groups: a connection waiting in an accept queue is in the one queue both
//! processes accept from, so neither process closing its copy can reset it (a
//! socket closes with its last descriptor, and the new process holds one).
//!
//! 1. The old process stops its interrupt-moderation controller (which restores the
//!    NICs' settings), then starts the new process with the sockets inherited: their
//!    numbers, group by group in member order, and the address each group was
//!    configured with are in its environment ([`ENV`]), with one end of a Unix
//!    socket pair on which it says when it is ready. It is started as a grandchild
//!    whose parent exits at once, so the service manager adopts it: systemd only
//!    supervises a main process that is its own child (of another it warns "not our
//!    child" and, at stop, kills it without waiting for its drain).
//! 2. The child takes over the sockets whose address its own configuration still
//!    lists (binding new ones only for addresses or workers it has more of), starts
//!    its workers on them and its admin endpoint, tells a service manager it is the
//!    main process now (`MAINPID`, `READY`), writes the pid file, and says `ready`.
//! 3. The old process then stops accepting (its workers drop their copies of the
//!    sockets: the child keeps accepting from the same queues), hands the main pid
//!    to the service manager, closes its admin endpoint, and drains its transfers
//!    for up to `timeouts.drain` as at SIGTERM; it exits 0.
//!
//! If the child exits, or is not ready within `timeouts.upgrade` (it is then
//! stopped), the old process logs why, rewrites its pid file, restarts the
//! moderation controller and serves on as if nothing happened: it never stopped
//! accepting.

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;

/// The environment variable that carries the hand-over to the new process:
/// `v1 from=PID ready=FD` followed by one `ROLE@ADDR=FD,FD,...` per socket group,
/// where ROLE is `serve` or `admin` and ADDR the address the group was configured
/// with (port 0 included).
pub const ENV: &str = "LINERATE_UPGRADE";

/// What a socket group is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// HTTP or HTTPS listeners (the new configuration decides which).
    Serve,
    Admin,
}

impl Role {
    fn name(self) -> &'static str {
        match self {
            Role::Serve => "serve",
            Role::Admin => "admin",
        }
    }
}

/// The sockets a new process was handed, not yet taken.
pub struct Inherited {
    groups: Vec<InheritedGroup>,
    ready: UnixStream,
}

struct InheritedGroup {
    role: Role,
    configured: SocketAddr,
    sockets: Vec<TcpListener>,
}

impl Inherited {
    /// The hand-over from the environment, if this process was started by an upgrade.
    /// A malformed one, or one whose descriptors are not what it says, is an error:
    /// the new process must not serve with half of its sockets.
    /// The variable is removed from the environment at once, so that nothing this
    /// process starts inherits it (called before any thread is started).
    pub fn from_env() -> anyhow::Result<Option<Inherited>> {
        let Some(value) = std::env::var_os(ENV) else { return Ok(None) };
        std::env::remove_var(ENV);
        let value = value.into_string().map_err(|_| anyhow::anyhow!("{ENV} is not UTF-8"))?;
        Inherited::parse(&value).with_context(|| format!("taking over the sockets handed over in {ENV}"))
    }

    fn parse(value: &str) -> anyhow::Result<Option<Inherited>> {
        let mut words = value.split_ascii_whitespace();
        anyhow::ensure!(words.next() == Some("v1"), "unknown hand-over format {value:?}");
        // The process handing over waits for this one: if it is gone (or is this
        // very process), the variable was passed on some other way and the
        // descriptors it names are not a hand-over.
        let from: u32 = field(words.next(), "from")?;
        if from == std::process::id() || !linerate_sys::inherit::is_running(from) {
            tracing::warn!("ignoring {ENV}: process {from}, which set it, is not running");
            return Ok(None);
        }
        let ready_fd: i32 = field(words.next(), "ready")?;
        let ready = linerate_sys::inherit::adopt_unix_stream(ready_fd)?;
        let mut groups = Vec::new();
        for word in words {
            let (role, rest) = word.split_once('@').with_context(|| format!("bad group {word:?}"))?;
            let role = match role {
                "serve" => Role::Serve,
                "admin" => Role::Admin,
                _ => anyhow::bail!("bad role in {word:?}"),
            };
            let (addr, fds) = rest.rsplit_once('=').with_context(|| format!("bad group {word:?}"))?;
            let configured: SocketAddr = addr.parse().with_context(|| format!("bad address in {word:?}"))?;
            let mut sockets = Vec::new();
            for fd in fds.split(',') {
                let fd: i32 = fd.parse().with_context(|| format!("bad descriptor in {word:?}"))?;
                sockets.push(linerate_sys::inherit::adopt_tcp_listener(fd)?);
            }
            groups.push(InheritedGroup { role, configured, sockets });
        }
        Ok(Some(Inherited { groups, ready }))
    }

    /// The sockets of the group for `addr`: the group configured with that very
    /// address, or else one whose sockets are bound to it (a fixed port named
    /// where a port-0 address was before, or the other way round).
    pub fn take(&mut self, role: Role, addr: SocketAddr) -> Option<Vec<TcpListener>> {
        let same = |g: &InheritedGroup| g.role == role && g.configured == addr;
        let bound = |g: &InheritedGroup| {
            g.role == role
                && g.sockets
                    .first()
                    .and_then(|s| s.local_addr().ok())
                    .is_some_and(|b| b == addr || (addr.port() == 0 && b.ip() == addr.ip()))
        };
        let i = self.groups.iter().position(same).or_else(|| self.groups.iter().position(bound))?;
        Some(self.groups.remove(i).sockets)
    }

    /// Closes the sockets the new configuration does not use (an address removed
    /// from it) and returns the channel to report readiness on.
    pub fn finish(self) -> UnixStream {
        for g in self.groups {
            let n = g.sockets.len();
            tracing::warn!(
                address = %g.configured,
                sockets = n,
                "upgrade: the configuration no longer lists this {} address; its inherited sockets are closed",
                g.role.name()
            );
        }
        self.ready
    }
}

fn field<T: std::str::FromStr>(word: Option<&str>, name: &str) -> anyhow::Result<T> {
    word.and_then(|w| w.strip_prefix(name)?.strip_prefix('='))
        .and_then(|v| v.parse().ok())
        .with_context(|| format!("missing or bad `{name}=`"))
}

/// Tells the old process that this one serves. Called once every worker has its
/// sockets and the admin endpoint runs.
pub fn report_ready(mut ready: UnixStream) {
    if let Err(e) = ready.write_all(b"ready\n") {
        // The old process is gone or gave up on us: we serve all the same.
        tracing::warn!("upgrade: cannot tell the previous process that this one is ready: {e}");
    }
}

/// Duplicates of the running server's listening sockets, kept by the supervisor
/// so that it can hand them over while the workers own theirs.
pub struct Handover {
    groups: Vec<(Role, SocketAddr, Vec<OwnedFd>)>,
    exe: PathBuf,
    args: Vec<OsString>,
}

/// How an upgrade ended, from the old process's side.
pub enum Outcome {
    /// The new process (this pid) serves.
    Ready(u32),
    /// It did not start; why.
    Failed(String),
}

/// An upgrade under way.
pub struct Pending {
    pub pid: u32,
    pub started: Instant,
}

impl Handover {
    /// `exe` is the binary to start (the path this process was started from,
    /// resolved at start-up so that a file replaced since is the one started).
    pub fn new(exe: PathBuf) -> Handover {
        Handover { groups: Vec::new(), exe, args: std::env::args_os().skip(1).collect() }
    }

    /// The binary an upgrade starts.
    pub fn exe(&self) -> &std::path::Path {
        &self.exe
    }

    /// Records a group (all its sockets, in member order).
    pub fn add(&mut self, role: Role, configured: SocketAddr, sockets: &[TcpListener]) -> std::io::Result<()> {
        let dups = sockets.iter().map(|s| s.as_fd().try_clone_to_owned()).collect::<std::io::Result<Vec<_>>>()?;
        self.groups.push((role, configured, dups));
        Ok(())
    }

    /// Starts the new binary with the sockets inherited. `report` is called once,
    /// from a thread of its own, with the outcome.
    pub fn start(&self, timeout: Duration, report: impl FnOnce(Outcome) + Send + 'static) -> anyhow::Result<Pending> {
        let (ours, theirs) = UnixStream::pair().context("socketpair")?;
        let mut env = format!("v1 from={} ready={}", std::process::id(), theirs.as_raw_fd());
        let mut keep = vec![theirs.as_fd()];
        for (role, configured, fds) in &self.groups {
            let list: Vec<String> = fds.iter().map(|fd| fd.as_raw_fd().to_string()).collect();
            env.push_str(&format!(" {}@{configured}={}", role.name(), list.join(",")));
            keep.extend(fds.iter().map(|fd| fd.as_fd()));
        }
        let mut cmd = Command::new(&self.exe);
        cmd.args(&self.args).env(ENV, env).stdin(Stdio::null());
        // A grandchild, adopted by the service manager at once: systemd supervises
        // a main process properly only if it is its own child.
        let pid = linerate_sys::inherit::spawn_detached(&mut cmd, &keep)
            .with_context(|| format!("cannot start {}", self.exe.display()))?;
        drop(theirs);
        std::thread::Builder::new()
            .name("linerate-upgrade".into())
            .spawn(move || report(watch(pid, ours, timeout)))
            .context("cannot start the upgrade watcher")?;
        Ok(Pending { pid, started: Instant::now() })
    }
}

/// Waits for the new process to say it is ready, to exit (its end of the socket
/// closes), or to run out of time (it is then stopped).
fn watch(pid: u32, ours: UnixStream, timeout: Duration) -> Outcome {
    let _ = ours.set_read_timeout(Some(timeout));
    let mut line = String::new();
    let read = BufReader::new(&ours).read_line(&mut line);
    match read {
        Ok(_) if line == "ready\n" => Outcome::Ready(pid),
        Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
            let how = stop(pid, Duration::from_secs(5));
            Outcome::Failed(format!(
                "new process {pid} was not ready within {}; {how}",
                humantime::format_duration(timeout)
            ))
        }
        // Closed without a word: it is exiting (its own messages say why; a process
        // closes its descriptors a moment before it is gone), or it closed the
        // channel, which a working linerate never does.
        _ => {
            let deadline = Instant::now() + Duration::from_secs(2);
            while linerate_sys::inherit::is_running(pid) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            if !linerate_sys::inherit::is_running(pid) {
                return Outcome::Failed(format!("new process {pid} exited before it was ready"));
            }
            let how = stop(pid, Duration::from_secs(5));
            Outcome::Failed(format!("new process {pid} closed its channel before it was ready; {how}"))
        }
    }
}

/// Stops a process that is not this one's child: SIGTERM, SIGKILL after `grace`.
fn stop(pid: u32, grace: Duration) -> &'static str {
    use linerate_sys::inherit::{is_running, signal, Signal};
    let _ = signal(pid, Signal::Term);
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        if !is_running(pid) {
            return "stopped it";
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = signal(pid, Signal::Kill);
    "killed it (it ignored SIGTERM)"
}

/// `linerate upgrade`: asks the server whose pid `pid_file` holds to upgrade
/// (SIGUSR2) and waits for the outcome, which the pid file tells: it is replaced
/// with the new process's pid once that serves, or with the same pid when the new
/// binary did not start. Returns the new pid.
pub fn request(pid_file: &std::path::Path, timeout: Duration) -> anyhow::Result<u32> {
    use std::os::unix::fs::MetadataExt;
    let stamp = |m: &std::fs::Metadata| (m.ino(), m.mtime(), m.mtime_nsec());
    let before = std::fs::metadata(pid_file).with_context(|| format!("cannot read {}", pid_file.display()))?;
    let old = super::service::read_pid(pid_file)?;
    linerate_sys::inherit::signal(old, linerate_sys::inherit::Signal::Usr2)
        .with_context(|| format!("cannot signal process {old} (from {})", pid_file.display()))?;
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
        let Ok(now) = std::fs::metadata(pid_file) else {
            anyhow::ensure!(
                std::path::Path::new(&format!("/proc/{old}")).exists(),
                "the server (pid {old}) stopped during the upgrade"
            );
            continue;
        };
        if stamp(&now) == stamp(&before) {
            continue;
        }
        match super::service::read_pid(pid_file) {
            Ok(new) if new != old => return Ok(new),
            Ok(_) => anyhow::bail!(
                "upgrade failed: the new binary did not start; the running server (pid {old}) kept serving (its log says why)"
            ),
            Err(_) => continue, // being replaced
        }
    }
    anyhow::bail!("no outcome within {}: see the server's log", humantime::format_duration(timeout))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hand_over_from_a_process_that_is_gone_is_ignored() {
        // The numbers would not even be looked at: the sender check comes first.
        let mut gone = std::process::Command::new("true").spawn().unwrap();
        gone.wait().unwrap();
        let v = format!("v1 from={} ready=99 serve@127.0.0.1:0=98", gone.id());
        assert!(Inherited::parse(&v).unwrap().is_none());
        let v = format!("v1 from={} ready=99", std::process::id());
        assert!(Inherited::parse(&v).unwrap().is_none(), "from this very process");
    }

    #[test]
    fn malformed_hand_overs_are_errors() {
        for v in ["v2 from=1", "v1", "v1 from=x"] {
            assert!(Inherited::parse(v).is_err(), "{v}");
        }
        // A live sender, but a descriptor that is not a Unix socket (stdout).
        let v = format!("v1 from={} ready=1", std::os::unix::process::parent_id());
        assert!(Inherited::parse(&v).is_err());
    }
}
