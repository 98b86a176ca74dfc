//! Shared helpers for the integration tests: start the real binary on a free
//! loopback port, talk to it with real clients (curl, raw sockets), and clean up.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub mod alone;
pub mod browser;
pub mod cold;
pub mod tls;

pub use alone::{alone, share, Share};

pub const BIN: &str = env!("CARGO_BIN_EXE_linerate");

/// Every test client comes from 127.0.0.1, and some tests open hundreds of
/// connections in a burst: the per-client limits are raised far above that (the
/// table is still used), unless the test sets them itself on the command line.
/// The limits' own tests start the server with `Server::spawn`.
fn loopback_client_limits(args: &[&str]) -> Vec<&'static str> {
    if args.contains(&"--max-client-connections") || args.contains(&"--max-client-connection-rate") {
        return Vec::new();
    }
    vec!["--max-client-connections", "1000000", "--max-client-connection-rate", "1000000"]
}

/// A running `linerate serve`.
pub struct Server {
    pub child: Child,
    /// Plain HTTP addresses, in the order printed.
    pub addrs: Vec<SocketAddr>,
    /// HTTPS addresses, in the order printed.
    pub tls_addrs: Vec<SocketAddr>,
    /// The admin endpoint, unless disabled.
    pub admin_addr: Option<SocketAddr>,
    stderr: Arc<Mutex<String>>,
    /// Declared last, so given back once the process is gone.
    _share: Share,
}

impl Server {
    /// Starts `linerate serve --listen 127.0.0.1:0 <args>` and waits for it to print
    /// its address.
    pub fn start(args: &[&str]) -> Server {
        Server::start_with(args, |_| {})
    }

    /// Like `start`, with a chance to adjust the command (environment, limits).
    pub fn start_with(args: &[&str], adjust: impl FnOnce(&mut Command)) -> Server {
        let mut cmd = Command::new(BIN);
        cmd.arg("serve");
        if !args.contains(&"--listen") {
            cmd.args(["--listen", "127.0.0.1:0"]);
        }
        if !args.contains(&"--admin") && !args.contains(&"--no-admin") {
            cmd.args(["--admin", "127.0.0.1:0"]);
        }
        cmd.args(loopback_client_limits(args));
        cmd.args(args);
        adjust(&mut cmd);
        Server::spawn(cmd)
    }

    /// Starts `linerate serve <args>` under a wrapper command that execs it (such as
    /// `prlimit` or `strace`), so the child is linerate or traces it.
    pub fn start_wrapped(wrapper: &[&str], args: &[&str]) -> Server {
        let mut cmd = tool(wrapper[0]);
        cmd.args(&wrapper[1..])
            .args(["--", BIN, "serve", "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"])
            .args(loopback_client_limits(args))
            .args(args);
        Server::spawn(cmd)
    }

    /// Starts `linerate serve <args>` exactly as given (nothing added but the pipes).
    pub fn spawn(mut cmd: Command) -> Server {
        let share = share();
        let listens = cmd.get_args().filter(|a| *a == "--listen" || *a == "--tls-listen").count().max(1);
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("start linerate");
        let stderr = Arc::new(Mutex::new(String::new()));
        let err_pipe = child.stderr.take().unwrap();
        let sink = stderr.clone();
        let err_reader = std::thread::spawn(move || {
            for line in BufReader::new(err_pipe).lines().map_while(Result::ok) {
                let mut s = sink.lock().unwrap();
                s.push_str(&line);
                s.push('\n');
            }
        });
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut addrs = Vec::new();
        let mut tls_addrs = Vec::new();
        let mut admin_addr = None;
        let mut line = String::new();
        loop {
            line.clear();
            if out.read_line(&mut line).unwrap_or(0) == 0 {
                let status = child.wait().unwrap();
                // Its last words: the reader ends at the pipe's end.
                eventually(Duration::from_secs(2), || err_reader.is_finished());
                panic!("linerate exited ({status}) before listening:\n{}", stderr.lock().unwrap());
            }
            if let Some(a) = line.trim().strip_prefix("listening http://") {
                addrs.push(a.parse().unwrap());
            } else if let Some(a) = line.trim().strip_prefix("listening https://") {
                tls_addrs.push(a.parse().unwrap());
            } else if let Some(a) = line.trim().strip_prefix("listening admin http://") {
                admin_addr = Some(a.parse().unwrap());
            }
            // All listening lines come in one write: once the expected ones are in,
            // take any others (from a config file) that arrived with them.
            if addrs.len() + tls_addrs.len() >= listens && !out.buffer().starts_with(b"listening ") {
                break;
            }
        }
        // Keep draining stdout so the server never blocks on a full pipe.
        std::thread::spawn(move || {
            let mut sink = Vec::new();
            let _ = out.read_to_end(&mut sink);
        });
        Server { child, addrs, tls_addrs, admin_addr, stderr, _share: share }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addrs[0]
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr(), path)
    }

    /// `http://ADMIN/path` on the admin endpoint.
    pub fn admin_url(&self, path: &str) -> String {
        format!("http://{}{}", self.admin_addr.expect("admin endpoint enabled"), path)
    }

    /// `https://localhost:PORT/path` for the first HTTPS listener (the test
    /// certificates are issued for `localhost`).
    pub fn tls_url(&self, path: &str) -> String {
        format!("https://localhost:{}{}", self.tls_addrs[0].port(), path)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The value of the sample `series` (name and labels as /metrics writes them:
    /// `linerate_errors_total{kind="disk"}`); fails the test when there is none.
    pub fn metric(&self, series: &str) -> f64 {
        let text = self.metrics();
        let line = text.lines().find(|l| l.strip_prefix(series).is_some_and(|r| r.starts_with(' ')));
        line.and_then(|l| l.rsplit(' ').next()?.parse().ok()).unwrap_or_else(|| panic!("no {series} in:\n{text}"))
    }

    /// The sum of every sample of `name`, whatever its labels (0 when there is none).
    pub fn metric_sum(&self, name: &str) -> f64 {
        self.metrics()
            .lines()
            .filter(|l| l.starts_with(name) && matches!(l.as_bytes().get(name.len()), Some(b'{' | b' ')))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    fn metrics(&self) -> String {
        String::from_utf8_lossy(&curl(&["-sS", &self.admin_url("/metrics")]).stdout).into_owned()
    }

    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill").args([&format!("-{sig}"), &self.pid().to_string()]).status().unwrap();
        assert!(ok.success());
    }

    /// Waits for the process to exit, up to `limit`.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait().unwrap() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// utime + stime of the server process, in clock ticks.
    pub fn cpu_ticks(&self) -> u64 {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid())).unwrap();
        let after_comm = &stat[stat.rfind(')').unwrap() + 2..];
        let fields: Vec<&str> = after_comm.split_whitespace().collect();
        fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // A wrapper (strace, prlimit) may have a linerate child of its own: kill
        // the children first, so that none outlives the test.
        let _ = Command::new("pkill").args(["-KILL", "-P", &self.pid().to_string()]).status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A helper process that does not outlive its test: dropping this (when the test
/// ends, passed or failed) kills the process and reaps it.
pub struct Guarded {
    child: Child,
    group: bool,
    _share: Share,
}

impl Guarded {
    /// Starts `cmd`, killed when the guard is dropped.
    pub fn spawn(cmd: &mut Command) -> Guarded {
        let share = share();
        let child = cmd.spawn().unwrap_or_else(|e| panic!("start {:?}: {e}", cmd.get_program()));
        Guarded { child, group: false, _share: share }
    }

    /// Starts `cmd` as the leader of a process group of its own, and kills the whole
    /// group when the guard is dropped: for helpers that start processes of their own
    /// (chromedriver starts Chromium, which starts its zygote, renderers and crash
    /// handler), which killing the helper alone would leave running, reparented to
    /// init. The group does not get the terminal's Ctrl-C, so plain helpers use
    /// [`Guarded::spawn`].
    pub fn spawn_group(cmd: &mut Command) -> Guarded {
        std::os::unix::process::CommandExt::process_group(cmd, 0);
        let share = share();
        let child = cmd.spawn().unwrap_or_else(|e| panic!("start {:?}: {e}", cmd.get_program()));
        Guarded { child, group: true, _share: share }
    }
}

impl std::ops::Deref for Guarded {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.child
    }
}

impl std::ops::DerefMut for Guarded {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.child
    }
}

impl Drop for Guarded {
    fn drop(&mut self) {
        if self.group {
            // Before reaping the leader, while its pid still names the group.
            kill_group(self.child.id());
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// SIGKILL to every process of the process group `pgid` (`kill -KILL -- -PGID`).
pub fn kill_group(pgid: u32) {
    let _ = Command::new("kill")
        .args(["-KILL", "--", &format!("-{pgid}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// Runs a required external tool; fails the test with a clear message if missing.
pub fn tool(name: &str) -> Command {
    let found = Command::new("sh").args(["-c", &format!("command -v {name}")]).output().unwrap();
    assert!(
        found.status.success(),
        "`{name}` is not installed; run the README's test command (scripts/test), which installs test dependencies \
         (with --fast it skips the tests that need more than curl, openssl and python3: is this one missing from its list?)"
    );
    Command::new(name)
}

/// curl with the given arguments; returns its output (status not checked).
pub fn curl(args: &[&str]) -> Output {
    tool("curl").args(["-sS", "--max-time", "30"]).args(args).output().unwrap()
}

/// A rate-limited curl download of `url` into `out` in the background (`--fail`,
/// so an error status fails it); stdout carries `%{http_code} %{size_download}`.
pub fn slow_download(url: &str, rate: &str, out: &Path) -> Guarded {
    Guarded::spawn(
        tool("curl")
            .args(["-sS", "--fail", "--limit-rate", rate, "-o", out.to_str().unwrap()])
            .args(["-w", "%{http_code} %{size_download}", url])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()),
    )
}

/// A transfer in flight: a [`slow_download`] into a file of its own.
pub struct Download {
    pub curl: Guarded,
    /// The file curl writes.
    pub out: PathBuf,
    _dir: tempfile::TempDir,
}

/// Starts a [`slow_download`] of `url` at `rate` and returns once more than `past`
/// bytes of it have arrived.
pub fn download_past(url: &str, rate: &str, past: u64) -> Download {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("got");
    let curl = slow_download(url, rate, &out);
    let arrived = eventually(Duration::from_secs(10), || std::fs::metadata(&out).is_ok_and(|m| m.len() > past));
    assert!(arrived, "the download of {url} did not get past {past} bytes");
    Download { curl, out, _dir: dir }
}

/// A keep-alive connection to `addr` that has sent `request` and been answered:
/// returned once the whole answer (head and Content-Length bytes) is in, left
/// unread for the test.
pub fn answered_connection(addr: SocketAddr, request: &[u8]) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(request).unwrap();
    let mut buf = vec![0u8; 64 * 1024];
    let answered = eventually(Duration::from_secs(10), || {
        s.set_nonblocking(true).unwrap();
        let n = s.peek(&mut buf).unwrap_or(0);
        s.set_nonblocking(false).unwrap();
        parse_response(&buf[..n]).is_some_and(|r| {
            r.header("content-length").and_then(|l| l.parse().ok()).is_some_and(|len: usize| r.body.len() >= len)
        })
    });
    assert!(answered, "no answer to {:?}", String::from_utf8_lossy(request));
    s
}

/// The response status, header block and body of `curl -i`, for one request.
pub struct Response {
    pub status: u16,
    pub head: String,
    pub body: Vec<u8>,
}

impl Response {
    /// A header value by case-insensitive name.
    pub fn header(&self, name: &str) -> Option<String> {
        self.head.lines().skip(1).find_map(|l| {
            let (n, v) = l.split_once(':')?;
            n.trim().eq_ignore_ascii_case(name).then(|| v.trim().to_string())
        })
    }
}

/// One request with curl: `extra` are more curl arguments (headers, -I, -r).
pub fn get(url: &str, extra: &[&str]) -> Response {
    let mut args = vec!["-i", "--path-as-is"];
    args.extend_from_slice(extra);
    args.push(url);
    let out = curl(&args);
    assert!(out.status.success(), "curl {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    parse_response(&out.stdout)
        .unwrap_or_else(|| panic!("unparseable response: {:?}", String::from_utf8_lossy(&out.stdout)))
}

/// Splits a raw HTTP response (one) into status, head and body.
pub fn parse_response(raw: &[u8]) -> Option<Response> {
    let end = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = String::from_utf8_lossy(&raw[..end]).into_owned();
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    Some(Response { status, head, body: raw[end + 4..].to_vec() })
}

/// Sends `request` on a new connection and reads until the server closes it (or
/// `limit` passes). Returns everything read.
pub fn raw_exchange(addr: SocketAddr, request: &[u8], limit: Duration) -> Vec<u8> {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(limit)).unwrap();
    s.write_all(request).unwrap();
    read_until_close(&mut s, limit)
}

/// `Read::read`, retried when interrupted. A read with a socket timeout
/// (`SO_RCVTIMEO`) is not restarted after a signal handler runs in this process,
/// whatever `SA_RESTART` says, nor after the process is stopped and continued, even
/// without any handler (signal(7)). Unretried, that reads as a server fault.
pub fn read_some<R: Read + ?Sized>(r: &mut R, buf: &mut [u8]) -> std::io::Result<usize> {
    loop {
        match r.read(buf) {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            other => return other,
        }
    }
}

pub fn read_until_close(s: &mut TcpStream, limit: Duration) -> Vec<u8> {
    let deadline = Instant::now() + limit;
    let mut out = Vec::new();
    let mut buf = [0u8; 65536];
    while Instant::now() < deadline {
        match read_some(s, &mut buf) {
            Ok(0) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock || e.kind() == std::io::ErrorKind::TimedOut => break,
            Err(_) => break,
        }
    }
    out
}

/// Splits concatenated responses (as on a keep-alive connection) into
/// (status, head, body) using Content-Length. Responses without a length end the list.
pub fn split_responses(mut raw: &[u8]) -> Vec<Response> {
    let mut out = Vec::new();
    while let Some(end) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
        let head = String::from_utf8_lossy(&raw[..end]).into_owned();
        let status: u16 = head.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
        let len: usize = head
            .lines()
            .find_map(|l| l.split_once(':').filter(|(n, _)| n.eq_ignore_ascii_case("content-length")))
            .map(|(_, v)| v.trim().parse().unwrap())
            .unwrap_or(0);
        let is_head_only = status == 304 || status == 204;
        let body_len = if is_head_only { 0 } else { len.min(raw.len() - end - 4) };
        out.push(Response { status, head, body: raw[end + 4..end + 4 + body_len].to_vec() });
        raw = &raw[end + 4 + body_len..];
    }
    out
}

/// A content directory for a test.
pub struct Content {
    pub dir: tempfile::TempDir,
}

impl Content {
    pub fn new() -> Content {
        Content { dir: tempfile::tempdir().unwrap() }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn root_arg(&self) -> String {
        self.path().to_str().unwrap().to_string()
    }

    pub fn write(&self, rel: &str, data: &[u8]) -> PathBuf {
        let p = self.path().join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, data).unwrap();
        p
    }

    /// Writes `len` bytes of deterministic pseudo-random data.
    pub fn write_random(&self, rel: &str, len: usize, seed: u64) -> Vec<u8> {
        let data = pseudo_random(len, seed);
        self.write(rel, &data);
        data
    }
}

/// A config file in a directory of its own (never inside a served root).
pub struct ConfigFile {
    _dir: tempfile::TempDir,
    pub path: PathBuf,
}

impl ConfigFile {
    pub fn new(text: &str) -> ConfigFile {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("linerate.toml");
        std::fs::write(&path, text).unwrap();
        ConfigFile { _dir: dir, path }
    }

    pub fn rewrite(&self, text: &str) {
        std::fs::write(&self.path, text).unwrap();
    }

    pub fn arg(&self) -> &str {
        self.path.to_str().unwrap()
    }
}

/// Deterministic bytes (xorshift64*), fast enough for hundreds of MiB.
pub fn pseudo_random(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        out.extend_from_slice(&x.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes());
    }
    out.truncate(len);
    out
}

pub fn sha256_hex(data: &[u8]) -> String {
    use sha2::Digest;
    let d = sha2::Sha256::digest(data);
    d.iter().map(|b| format!("{b:02x}")).collect()
}

/// Waits until `f` is true or `limit` passes.
pub fn eventually(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}
