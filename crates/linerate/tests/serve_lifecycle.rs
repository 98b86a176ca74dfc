//! Start-up, configuration errors, reload on SIGHUP, graceful shutdown.

use std::io::Write;
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::*;

#[test]
fn bad_configuration_is_refused_with_file_key_and_problem() {
    let c = Content::new();
    for (text, key, problem) in [
        ("rot = \"/srv\"\n", "rot", "unknown field"),
        ("[limits]\nmax_head_bytes = \"big\"\n", "limits.max_head_bytes", "invalid type"),
        ("[limits]\nmax_head_bytes = 10\n", "limits.max_head_bytes", "out of range"),
        ("[timeouts]\nsend = \"soon\"\n", "timeouts.send", ""),
        ("root = \"/nonexistent/dir\"\n", "root", "not a readable directory"),
        ("cache_control = \"a\\r\\nb\"\n", "cache_control", "control characters"),
    ] {
        let cfg = ConfigFile::new(&format!(
            "{}{text}",
            if text.starts_with("root") { String::new() } else { format!("root = {:?}\n", c.path()) }
        ));
        let out = Command::new(BIN).args(["serve", "--config", cfg.arg(), "--listen", "127.0.0.1:0"]).output().unwrap();
        assert!(!out.status.success(), "{text} was accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(cfg.arg()), "no file name in {err}");
        assert!(err.contains(key), "no key `{key}` in {err}");
        assert!(err.contains(problem), "no `{problem}` in {err}");
        assert!(out.stdout.is_empty(), "printed something before failing: {}", String::from_utf8_lossy(&out.stdout));
    }
    // No root at all.
    let out = Command::new(BIN).args(["serve", "--listen", "127.0.0.1:0"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--root"));
}

#[test]
fn check_config_prints_the_effective_configuration() {
    let c = Content::new();
    let cfg = ConfigFile::new(&format!("root = {:?}\nworkers = 3\n[limits]\nmax_ranges = 4\n", c.path()));
    let out = Command::new(BIN)
        .args(["serve", "--config", cfg.arg(), "--workers", "2", "--listen", "127.0.0.1:9", "--check-config"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("workers = 2"), "command line overrides the file: {text}");
    assert!(text.contains("max_ranges = 4"), "{text}");
    assert!(text.contains("\"127.0.0.1:9\""), "{text}");
    assert!(text.contains("max_head_bytes = 16384"), "defaults are shown: {text}");
    // What it prints is itself a valid configuration.
    let again = ConfigFile::new(&text);
    let out = Command::new(BIN).args(["serve", "--config", again.arg(), "--check-config"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn listens_on_several_addresses_with_port_zero() {
    let c = Content::new();
    c.write("a.txt", b"A");
    let s = Server::start(&[
        "--root",
        &c.root_arg(),
        "--listen",
        "127.0.0.1:0",
        "--listen",
        "127.0.0.2:0",
        "--workers",
        "2",
    ]);
    assert_eq!(s.addrs.len(), 2);
    for a in &s.addrs {
        assert_ne!(a.port(), 0);
        assert_eq!(curl(&[&format!("http://{a}/a.txt")]).stdout, b"A");
    }
}

#[test]
fn sigterm_drains_transfers_in_flight_and_exits_zero() {
    let c = Content::new();
    let data = c.write_random("big.bin", 24 << 20, 11);
    let mut s = Server::start(&["--root", &c.root_arg()]);
    // ~2 s at 12 MB/s, in flight.
    let mut dl = download_past(&s.url("/big.bin"), "12M", 0);
    // An idle keep-alive connection, which must not hold up the shutdown.
    let mut idle = answered_connection(s.addr(), b"GET /big.bin HTTP/1.1\r\nHost: x\r\nRange: bytes=0-0\r\n\r\n");
    s.signal("TERM");
    // New connections are refused soon after.
    assert!(
        eventually(Duration::from_secs(2), || TcpStream::connect(s.addr()).is_err()),
        "still accepting after SIGTERM"
    );
    let idle_closed = read_until_close(&mut idle, Duration::from_secs(3));
    assert!(parse_response(&idle_closed).is_some());
    let status = dl.curl.wait().unwrap();
    assert!(status.success(), "download cut short by shutdown");
    assert_eq!(sha256_hex(&std::fs::read(&dl.out).unwrap()), sha256_hex(&data));
    let exit = s.wait_exit(Duration::from_secs(10)).expect("server did not exit");
    assert!(exit.success(), "exit status {exit}");
}

#[test]
fn a_connection_opened_just_before_shutdown_is_answered() {
    let c = Content::new();
    c.write("a.txt", b"A");
    let mut s = Server::start(&["--root", &c.root_arg()]);
    // Connected (and accepted) but nothing sent yet when shutdown begins, as when a
    // client's TLS handshake ends just as an upgrade hands over: its client asks
    // a moment later and must get an answer, not a close it would not retry.
    let mut fresh = TcpStream::connect(s.addr()).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    s.signal("TERM");
    assert!(
        eventually(Duration::from_secs(2), || TcpStream::connect(s.addr()).is_err()),
        "still accepting after SIGTERM"
    );
    fresh.write_all(b"GET /a.txt HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let got = read_until_close(&mut fresh, Duration::from_secs(5));
    let r = parse_response(&got).unwrap_or_else(|| panic!("no response: {:?}", String::from_utf8_lossy(&got)));
    assert_eq!(r.status, 200);
    assert_eq!(r.body, b"A");
    assert_eq!(r.header("connection").as_deref(), Some("close"), "a draining server closes after answering");
    let exit = s.wait_exit(Duration::from_secs(10)).expect("server did not exit");
    assert!(exit.success(), "exit status {exit}");
}

#[test]
fn drain_timeout_bounds_shutdown() {
    let c = Content::new();
    c.write_random("big.bin", 64 << 20, 12);
    let cfg = ConfigFile::new(&format!("root = {:?}\n[timeouts]\ndrain = \"1s\"\n", c.path()));
    let mut s = Server::start(&["--config", cfg.arg()]);
    let mut dl = download_past(&s.url("/big.bin"), "4M", 0);
    let start = Instant::now();
    s.signal("INT");
    let exit = s.wait_exit(Duration::from_secs(10)).expect("server did not exit");
    assert!(exit.success());
    assert!(start.elapsed() < Duration::from_secs(4), "{:?}", start.elapsed());
    assert!(!dl.curl.wait().unwrap().success(), "the 16 s transfer cannot have completed");
}

#[test]
fn sighup_reloads_for_new_connections_without_dropping_old_ones() {
    let c = Content::new();
    let data = c.write_random("big.bin", 16 << 20, 13);
    c.write("a.txt", b"A");
    let base = format!("root = {:?}\n", c.path());
    let cfg = ConfigFile::new(&format!("{base}cache_control = \"max-age=1\"\n"));
    let s = Server::start(&["--config", cfg.arg()]);
    assert_eq!(get(&s.url("/a.txt"), &[]).header("cache-control").as_deref(), Some("max-age=1"));

    // A transfer in flight and an open keep-alive connection across the reload.
    let mut dl = download_past(&s.url("/big.bin"), "8M", 0);
    let mut kept = answered_connection(s.addr(), b"GET /a.txt HTTP/1.1\r\nHost: x\r\n\r\n");

    cfg.rewrite(&format!("{base}cache_control = \"max-age=2\"\n"));
    s.signal("HUP");
    assert!(eventually(Duration::from_secs(5), || {
        get(&s.url("/a.txt"), &[]).header("cache-control").as_deref() == Some("max-age=2")
    }));
    // The old connection still works, under the settings it started with.
    kept.write_all(b"GET /a.txt HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
    let rs = split_responses(&read_until_close(&mut kept, Duration::from_secs(5)));
    assert_eq!(rs.len(), 2);
    assert_eq!(rs[1].header("cache-control").as_deref(), Some("max-age=1"));

    // A broken file on reload is reported and ignored.
    cfg.rewrite(&format!("{base}cache_control = 5\n"));
    s.signal("HUP");
    assert!(eventually(Duration::from_secs(5), || s.stderr().contains("reload failed")));
    assert_eq!(get(&s.url("/a.txt"), &[]).header("cache-control").as_deref(), Some("max-age=2"));

    assert!(dl.curl.wait().unwrap().success());
    assert_eq!(sha256_hex(&std::fs::read(&dl.out).unwrap()), sha256_hex(&data));
}

/// A `[dim]` section for a NIC without coalescing support: the controller says so
/// at once and stops; the server serves on and stops cleanly.
#[test]
fn dim_section_runs_the_controller_beside_the_workers() {
    let c = Content::new();
    c.write("a.txt", b"A");
    let cfg = ConfigFile::new(&format!("root = {:?}\n[dim]\ninterfaces = [\"lo\"]\n", c.path()));
    let mut s = Server::start(&["--config", cfg.arg()]);
    assert!(
        eventually(Duration::from_secs(5), || s.stderr().contains("interrupt moderation stopped")),
        "{}",
        s.stderr()
    );
    assert!(s.stderr().contains("lo"), "{}", s.stderr());
    assert_eq!(curl(&[&s.url("/a.txt")]).stdout, b"A");
    s.signal("TERM");
    assert!(s.wait_exit(Duration::from_secs(10)).unwrap().success());
    // A bad value is refused by name.
    let bad = ConfigFile::new(&format!("root = {:?}\n[dim]\ninterval = \"1ms\"\n", c.path()));
    let out = Command::new(BIN).args(["serve", "--config", bad.arg(), "--check-config"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("dim.interval"));
}
