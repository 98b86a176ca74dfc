//! Binary upgrades (SIGUSR2, `linerate upgrade`), reloads and certificate renewal
//! under load, a failed upgrade, and the systemd notifications.
//!
//! The server runs from a copy of the binary in a temporary directory, so that an
//! upgrade can replace that file (rename into place, as dpkg does) and the new
//! process really is a different file. All processes of a test are in one process
//! group, killed when the test ends; this test binary is their reaper
//! (`PR_SET_CHILD_SUBREAPER`), so the old and new processes an upgrade leaves are
//! collected here, by process group, rather than by init.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixDatagram;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::bench_support::{bench, num};
use crate::common;
use crate::common::tls::TestCa;
use crate::common::{eventually, get, share, Content, Share, BIN};
use linerate_sys::inherit::{self, Signal};

/// The tests here count connection resets and share the reaper role: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// A server started from its own copy of the binary, with every process it and its
/// successors start in one process group.
struct Fleet {
    dir: tempfile::TempDir,
    exe: PathBuf,
    config: PathBuf,
    pid_file: PathBuf,
    first: Child,
    pids: Vec<u32>,
    http: SocketAddr,
    https: Option<SocketAddr>,
    admin: SocketAddr,
    stdout: Arc<Mutex<Vec<String>>>,
    stderr: Arc<Mutex<String>>,
    /// Declared last, so given back once the processes are gone.
    _share: Share,
}

impl Fleet {
    /// The configuration file: `body` (top-level keys first, then sections) with the
    /// pid file, addresses and worker count.
    fn config_text(pid_file: &Path, https: bool, body: &str) -> String {
        let tls = if https { "tls_listen = [\"127.0.0.1:0\"]\n" } else { "" };
        let (top, sections) = body.find("\n[").map_or((body, ""), |i| body.split_at(i + 1));
        format!(
            "pid_file = {pid_file:?}\nlisten = [\"127.0.0.1:0\"]\n{tls}workers = 2\n{top}\n{sections}\n[admin]\nlisten = \"127.0.0.1:0\"\n"
        )
    }

    /// Rewrites the configuration (for a reload).
    fn rewrite(&self, body: &str) {
        std::fs::write(&self.config, Fleet::config_text(&self.pid_file, self.https.is_some(), body)).unwrap();
    }

    /// Writes the configuration and starts the server.
    fn start(body: &str, https: bool, env: &[(&str, &str)]) -> Fleet {
        let share = share();
        inherit::become_child_subreaper().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let exe = dir.path().join("linerate");
        std::fs::copy(BIN, &exe).unwrap();
        let pid_file = dir.path().join("linerate.pid");
        let config = dir.path().join("linerate.toml");
        std::fs::write(&config, Fleet::config_text(&pid_file, https, body)).unwrap();
        let mut cmd = Command::new(&exe);
        cmd.args(["serve", "--config", config.to_str().unwrap()])
            .env_remove("NOTIFY_SOCKET")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        let mut first = cmd.spawn().unwrap();
        let stderr = Arc::new(Mutex::new(String::new()));
        let sink = stderr.clone();
        let err = first.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                let mut s = sink.lock().unwrap();
                s.push_str(&line);
                s.push('\n');
            }
        });
        let stdout = Arc::new(Mutex::new(Vec::new()));
        let lines = stdout.clone();
        let out = first.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                lines.lock().unwrap().push(line);
            }
        });
        let wanted = if https { 3 } else { 2 };
        let got = eventually(Duration::from_secs(20), || stdout.lock().unwrap().len() >= wanted);
        assert!(got, "no listening lines; stderr:\n{}", stderr.lock().unwrap());
        let lines = stdout.lock().unwrap().clone();
        let find = |prefix: &str| lines.iter().find_map(|l| l.strip_prefix(prefix)).map(|a| a.parse().unwrap());
        let pid = first.id();
        Fleet {
            http: find("listening http://").unwrap(),
            https: find("listening https://"),
            admin: find("listening admin http://").unwrap(),
            dir,
            exe,
            config,
            pid_file,
            first,
            pids: vec![pid],
            stdout,
            stderr,
            _share: share,
        }
    }

    fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    fn current_pid(&self) -> u32 {
        std::fs::read_to_string(&self.pid_file).unwrap().trim().parse().unwrap()
    }

    /// Installs a fresh copy of the binary over the running one (a new file renamed
    /// into place) and runs `linerate upgrade`; returns its output and exit status.
    fn upgrade_to(&mut self, new_binary: &Path) -> (bool, String) {
        let staged = self.dir.path().join("linerate.new");
        std::fs::copy(new_binary, &staged).unwrap();
        std::fs::rename(&staged, &self.exe).unwrap();
        let out = Command::new(BIN)
            .args(["upgrade", "--config", self.config.to_str().unwrap(), "--timeout", "30"])
            .output()
            .unwrap();
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        let pid = self.current_pid();
        if !self.pids.contains(&pid) {
            self.pids.push(pid);
        }
        (out.status.success(), text)
    }

    fn metrics(&self) -> String {
        get(&format!("http://{}/metrics", self.admin), &[]).text()
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        let group = self.first.id();
        let _ = inherit::signal_group(group, Signal::Kill);
        let _ = self.first.wait();
        // Every process an upgrade started was adopted by this test process (a
        // subreaper). Only this fleet's are collected, by process group: a reap of
        // any child would also take those of tests running beside this one (curl,
        // their servers), whose own waits would then fail.
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.pids[1..].iter().any(|&p| inherit::is_running(p)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        for pid in adopted_in_group(group) {
            let _ = inherit::reap(Some(pid));
        }
    }
}

/// This process's children (its own or adopted) in the process group `group`.
fn adopted_in_group(group: u32) -> Vec<u32> {
    let me = std::process::id();
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            // After the command name, in parentheses: state, parent, process group.
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
            let fields: Vec<&str> = stat[stat.rfind(')').map_or(0, |i| i + 1)..].split_whitespace().collect();
            fields.get(1) == Some(&me.to_string().as_str()) && fields.get(2) == Some(&group.to_string().as_str())
        })
        .collect()
}

trait Text {
    fn text(&self) -> String;
}

impl Text for common::Response {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// The inode of the file a process runs.
fn exe_inode(pid: u32) -> u64 {
    std::fs::metadata(format!("/proc/{pid}/exe")).unwrap().ino()
}

/// A certbot-like renewal: the new certificate and key go to `archive/` under new
/// names, then the `live/` symlinks are swapped by rename.
fn renew(ca: &TestCa, live: &Path, n: u32, days: i64) {
    let (cert, key) = ca.issue(&format!("cert{n}"), &["127.0.0.1"], -1, days);
    for (file, target) in [("cert.pem", cert), ("key.pem", key)] {
        let tmp = live.join(format!(".{file}.new"));
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(target, &tmp).unwrap();
        std::fs::rename(&tmp, live.join(file)).unwrap();
    }
}

/// `linerate_tls_certificate_days_left` for the default certificate.
fn days_left(metrics: &str) -> Option<i64> {
    metrics
        .lines()
        .find(|l| l.starts_with("linerate_tls_certificate_days_left{") && l.contains("key=\"tls\""))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

/// Paced HTTP and HTTPS sessions check every byte for 20 s while the server is
/// reloaded 6 times (two configurations, and certificates renewed certbot-style)
/// and upgraded 3 times: no failed request, no wrong byte, no reset connection.
/// (`bench/upgrade.sh` is the 60 s form.)
#[test]
fn reloads_and_upgrades_under_load_lose_nothing() {
    let _serial = serial();
    let content = Content::new();
    let titles: Vec<String> = (0..4).map(|i| format!("t{i}.bin")).collect();
    for (i, t) in titles.iter().enumerate() {
        content.write_random(t, 3 << 20, 40 + i as u64);
    }
    let ca = TestCa::new();
    let live = ca.dir.path().join("live");
    std::fs::create_dir(&live).unwrap();
    renew(&ca, &live, 0, 60);
    let root = content.root_arg();
    let sections = format!(
        "[tls]\ncert = {:?}\nkey = {:?}\n[timeouts]\ndrain = \"10s\"\n",
        live.join("cert.pem"),
        live.join("key.pem")
    );
    let body = |n: u32| format!("root = {root:?}\ncache_control = \"max-age={n}\"\n{sections}");
    let mut fleet = Fleet::start(&body(0), true, &[]);
    let (http, https) = (fleet.http, fleet.https.unwrap());
    // Whole days left: the certificate's seconds may round either way.
    let near = |got: Option<i64>, want: i64| got.is_some_and(|d| d == want || d == want - 1);
    assert!(near(days_left(&fleet.metrics()), 60), "{}", fleet.metrics());

    let urls = ca.dir.path().join("urls.txt");
    let list: String =
        titles.iter().flat_map(|t| [format!("http://{http}/{t}\n"), format!("https://{https}/{t}\n")]).collect();
    std::fs::write(&urls, list).unwrap();
    let args: Vec<String> = [
        "--url-list",
        urls.to_str().unwrap(),
        "--verify",
        &root,
        "--cacert",
        ca.ca_arg(),
        "--sessions",
        "12",
        "--duration",
        "20",
        "--bitrate-mbps",
        "8",
        "--segment-bytes",
        "262144",
        "--startup-segments",
        "2",
        "--json",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let load = std::thread::spawn(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        bench(&args, Duration::from_secs(60))
    });

    // t = 1.5 s, 3 s, ...: reloads, with an upgrade after every second one, spread
    // over the load's 20 s (the schedule of the test, not a wait for anything).
    let mut upgrades = 0;
    for n in 1..=6u32 {
        std::thread::sleep(Duration::from_millis(1500));
        fleet.rewrite(&body(n));
        let renewed = n % 2 == 1;
        if renewed {
            renew(&ca, &live, n, 60 + i64::from(n));
        }
        inherit::signal(fleet.current_pid(), Signal::Hup).unwrap();
        // Renewals are issued for 61, 63, 65 days: each tells the one before apart.
        let want = if renewed { 60 + i64::from(n) } else { 60 + i64::from(n - 1) };
        assert!(
            eventually(Duration::from_secs(5), || near(days_left(&fleet.metrics()), want)),
            "reload {n}: the renewed certificate is not in use:\n{}\n{}",
            fleet.metrics(),
            fleet.stderr()
        );
        if n % 2 == 0 {
            // The reload is done (every worker has it) before the upgrade begins.
            let reloaded = || fleet.stderr().matches("configuration reloaded").count() == n as usize;
            assert!(eventually(Duration::from_secs(10), reloaded), "reload {n} not reported:\n{}", fleet.stderr());
            let old = fleet.current_pid();
            let (ok, out) = fleet.upgrade_to(Path::new(BIN));
            assert!(ok, "upgrade {n}: {out}\n{}", fleet.stderr());
            let new = fleet.current_pid();
            assert_ne!(new, old, "{out}");
            assert_eq!(exe_inode(new), std::fs::metadata(&fleet.exe).unwrap().ino(), "the new file runs");
            upgrades += 1;
        }
    }
    let run = load.join().unwrap();
    assert!(run.success, "{}", run.stderr);
    let j = run.json();
    eprintln!(
        "requests {} bytes {} verified {} reconnects {} resets {} errors {}",
        num(&j, "requests"),
        num(&j, "bytes"),
        num(&j, "verified_bytes"),
        num(&j, "reconnects"),
        num(&j, "resets"),
        num(&j, "errors_total")
    );
    assert_eq!(num(&j, "errors_total"), 0.0, "failed requests: {j:#}\n{}", fleet.stderr());
    assert_eq!(num(&j, "resets"), 0.0, "connections reset: {j:#}\n{}", fleet.stderr());
    assert!(num(&j, "bytes") > 0.0);
    assert_eq!(num(&j, "verified_bytes"), num(&j, "bytes"), "every byte checked");
    assert!(num(&j, "requests") > 200.0, "{j:#}");
    assert_eq!(upgrades, 3);
    let log = fleet.stderr();
    assert_eq!(log.matches("upgrade: the new process serves").count(), 3, "{log}");
    assert_eq!(log.matches("configuration reloaded").count(), 6, "{log}");
    assert!(!log.contains("reload failed") && !log.contains("upgrade failed"), "{log}");
    // Each old process drained and exited 0: the first is this test's child.
    let status = (0..100).find_map(|_| {
        std::thread::sleep(Duration::from_millis(100));
        fleet.first.try_wait().unwrap()
    });
    assert!(status.is_some_and(|s| s.success()), "first process: {status:?}\n{log}");
    // The new processes printed their addresses: the same ones, inherited.
    let lines = fleet.stdout.lock().unwrap().clone();
    assert_eq!(lines.iter().filter(|l| **l == format!("listening http://{http}")).count(), 4, "{lines:?}");
    assert_eq!(lines.iter().filter(|l| **l == format!("listening https://{https}")).count(), 4, "{lines:?}");
}

/// A new binary that exits at start, or never gets ready: the old server says so,
/// keeps serving on the same sockets (it never stopped), and can still upgrade.
#[test]
fn a_failed_upgrade_leaves_the_old_server_serving() {
    let _serial = serial();
    let content = Content::new();
    content.write("a.txt", b"still here");
    let mut fleet = Fleet::start(
        &format!("root = {:?}\n[timeouts]\nupgrade = \"2s\"\ndrain = \"2s\"\n", content.path()),
        false,
        &[],
    );
    let url = format!("http://{}/a.txt", fleet.http);
    let old = fleet.current_pid();
    let scripts = tempfile::tempdir().unwrap();
    let crash = scripts.path().join("crash");
    std::fs::write(&crash, "#!/bin/sh\necho 'new binary: cannot start' >&2\nexit 3\n").unwrap();
    let hang = scripts.path().join("hang");
    std::fs::write(&hang, "#!/bin/sh\nexec sleep 30\n").unwrap();
    for f in [&crash, &hang] {
        std::fs::set_permissions(f, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    }

    // A keep-alive connection across the attempts, and requests during them.
    let mut kept = std::net::TcpStream::connect(fleet.http).unwrap();
    let request = b"GET /a.txt HTTP/1.1\r\nHost: x\r\n\r\n";
    let exchange = |s: &mut std::net::TcpStream| {
        std::io::Write::write_all(s, request).unwrap();
        let mut buf = vec![0u8; 4096];
        let mut got = Vec::new();
        while !got.ends_with(b"still here") {
            let n = common::read_some(s, &mut buf).unwrap();
            assert!(n > 0, "closed");
            got.extend_from_slice(&buf[..n]);
        }
    };
    exchange(&mut kept);

    let (ok, out) = fleet.upgrade_to(&crash);
    assert!(!ok, "{out}");
    assert!(out.contains("upgrade failed") && out.contains(&format!("pid {old}")), "{out}");
    let log = fleet.stderr();
    assert!(log.contains("new binary: cannot start"), "the child's own message: {log}");
    assert!(log.contains("exited before it was ready; still serving"), "{log}");
    assert_eq!(fleet.current_pid(), old);
    assert_eq!(get(&url, &[]).text(), "still here");
    exchange(&mut kept);

    let (ok, out) = fleet.upgrade_to(&hang);
    assert!(!ok, "{out}");
    let log = fleet.stderr();
    assert!(log.contains("was not ready within 2s; stopped it"), "{log}");
    assert_eq!(get(&url, &[]).text(), "still here");
    exchange(&mut kept);
    let metrics = fleet.metrics();
    assert!(metrics.contains("linerate_upgrade_failures_total 2"), "{metrics}");

    // And a good binary still takes over afterwards.
    let (ok, out) = fleet.upgrade_to(Path::new(BIN));
    assert!(ok, "{out}\n{}", fleet.stderr());
    assert_ne!(fleet.current_pid(), old);
    assert_eq!(get(&url, &[]).text(), "still here");
}

/// With NOTIFY_SOCKET set, the server tells the service manager READY (with its
/// pid), RELOADING and READY around a reload, the new MAINPID at an upgrade, and
/// STOPPING at shutdown. Without it, nothing is sent (the other tests).
#[test]
fn systemd_notifications() {
    let _serial = serial();
    let content = Content::new();
    content.write("a.txt", b"A");
    let sockdir = tempfile::tempdir().unwrap();
    let path = sockdir.path().join("notify.sock");
    let sock = UnixDatagram::bind(&path).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let recv = || {
        let mut buf = vec![0u8; 4096];
        let n = sock.recv(&mut buf).expect("a notification");
        String::from_utf8(buf[..n].to_vec()).unwrap()
    };
    let mut fleet =
        Fleet::start(&format!("root = {:?}\n", content.path()), false, &[("NOTIFY_SOCKET", path.to_str().unwrap())]);
    let first = fleet.first.id();
    let m = recv();
    assert!(m.contains("READY=1\n") && m.contains(&format!("MAINPID={first}\n")), "{m:?}");

    inherit::signal(first, Signal::Hup).unwrap();
    let m = recv();
    assert!(m.contains("RELOADING=1\n") && m.contains("MONOTONIC_USEC="), "{m:?}");
    let m = recv();
    assert!(m.contains("READY=1\n") && m.contains("STATUS=configuration reloaded"), "{m:?}");

    let (ok, out) = fleet.upgrade_to(Path::new(BIN));
    assert!(ok, "{out}");
    let new = fleet.current_pid();
    // The old process's status, the new one's READY, the old one's MAINPID hand-over:
    // read until both the new READY and the hand-over have come.
    let mut seen = String::new();
    while !(seen.contains(&format!("MAINPID={new}\nSTATUS=handed over")) && seen.contains("READY=1")) {
        seen.push_str(&recv());
    }
    assert!(!seen.contains("STOPPING=1"), "the service goes on after a hand-over: {seen:?}");

    inherit::signal(new, Signal::Term).unwrap();
    // Both processes gone, then everything that was sent: one STOPPING, the new one's.
    assert!(eventually(Duration::from_secs(15), || !Path::new(&format!("/proc/{new}/exe")).exists()
        || std::fs::read_to_string(format!("/proc/{new}/stat")).is_ok_and(|s| s.contains(") Z "))));
    assert!(fleet.first.wait().unwrap().success());
    sock.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
    let mut buf = vec![0u8; 4096];
    while let Ok(n) = sock.recv(&mut buf) {
        seen.push_str(std::str::from_utf8(&buf[..n]).unwrap());
    }
    assert_eq!(seen.matches("STOPPING=1").count(), 1, "{seen:?}");
}
