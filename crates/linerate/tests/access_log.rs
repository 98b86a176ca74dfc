//! Access logs from the real server with real clients: one JSON record per response
//! over plain HTTP and HTTPS with the fields an operator bills and debugs from, the
//! query (signed-URL tokens) never written, nginx's `combined` format, sampling,
//! reopening on SIGUSR1 after a rotation, and a log that cannot be written costing
//! records, not responses.

use std::path::Path;
use std::time::Duration;

use crate::common;
use crate::common::tls::TestCa;
use crate::common::*;

fn records(path: &Path, at_least: usize) -> Vec<serde_json::Value> {
    let mut lines = Vec::new();
    // Workers hand records to the writer within about a second.
    let ok = eventually(Duration::from_secs(10), || {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        lines = text.lines().map(str::to_owned).collect();
        lines.len() >= at_least
    });
    assert!(ok, "{} records in {}, want {at_least}", lines.len(), path.display());
    lines.iter().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}"))).collect()
}

#[test]
fn json_records_over_plain_http() {
    let content = Content::new();
    let data = content.write_random("v/movie.mp4", 1 << 20, 3);
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let server =
        Server::start(&["--root", &content.root_arg(), "--workers", "1", "--access-log", log.to_str().unwrap()]);
    let url = server.url("/v/movie.mp4?token=SECRET-TOKEN&expires=99");
    let out =
        curl(&["-s", "-o", "/dev/null", "-r", "100-199", "-A", "player/2.0", "-e", "https://site.example/p", &url]);
    assert!(out.status.success());
    let head = curl(&["-s", "-I", &server.url("/v/movie.mp4")]);
    assert!(head.status.success());
    let missing = curl(&["-s", "-o", "/dev/null", &server.url("/nope")]);
    assert!(missing.status.success());
    // A request that cannot be parsed is a response too.
    let bad = raw_exchange(server.addr(), b"GET / HTTP/1.1\r\nHost: a b\r\n\r\n", Duration::from_secs(5));
    assert!(bad.starts_with(b"HTTP/1.1 400"), "{}", String::from_utf8_lossy(&bad));

    let r = records(&log, 4);
    assert_eq!(r.len(), 4, "{r:?}");
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(!text.contains("SECRET") && !text.contains("expires"), "the query must never be logged:\n{text}");

    let range = &r[0];
    assert_eq!(range["method"], "GET");
    assert_eq!(range["path"], "/v/movie.mp4");
    assert_eq!(range["query"], true);
    assert_eq!(range["status"], 206);
    assert_eq!(range["range"], "bytes=100-199");
    assert_eq!(range["body_bytes"], 100);
    assert!(range["bytes"].as_u64().unwrap() > 200, "head bytes counted too: {range}");
    assert_eq!(range["client"], "127.0.0.1");
    assert!(range["port"].as_u64().unwrap() > 0);
    assert_eq!(range["transport"], "plain");
    assert_eq!(range["tls_version"], serde_json::Value::Null);
    assert_eq!(range["user_agent"], "player/2.0");
    assert_eq!(range["referer"], "https://site.example/p");
    assert_eq!(range["worker"], 0);
    assert_eq!(range["cross_domain"], false);
    assert!(range["fill"].is_boolean());
    let (duration, ttfb) = (range["duration_ms"].as_f64().unwrap(), range["ttfb_ms"].as_f64().unwrap());
    assert!(ttfb >= 0.0 && ttfb <= duration && duration < 5000.0, "{range}");
    assert!(range["time"].as_str().unwrap().ends_with('Z'));

    assert_eq!((&r[1]["method"], &r[1]["status"], &r[1]["body_bytes"]), (&"HEAD".into(), &200.into(), &0.into()));
    assert_eq!((&r[1]["query"], &r[1]["range"]), (&false.into(), &serde_json::Value::Null));
    assert_eq!((&r[2]["status"], &r[2]["path"]), (&404.into(), &"/nope".into()));
    assert_eq!(r[3]["status"], 400);
    assert_eq!(data.len(), 1 << 20);
    assert_eq!(server.metric("linerate_access_log_records_total{result=\"written\"}"), 4.0);
    assert_eq!(server.metric("linerate_access_log_records_total{result=\"dropped\"}"), 0.0);
}

#[test]
fn https_records_carry_tls_version_cipher_and_sni() {
    let ca = TestCa::new();
    let content = Content::new();
    content.write_random("a.mp4", 300_000, 1);
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let server = common::tls::start_server(&ca, content.path(), &["--access-log", log.to_str().unwrap()]);
    let port = server.tls_addrs[0].port();
    let resolve = format!("localhost:{port}:127.0.0.1");
    let url = server.tls_url("/a.mp4");
    for version in [["--tlsv1.3", "--tls-max", "1.3"], ["--tlsv1.2", "--tls-max", "1.2"]] {
        let mut args = vec!["-s", "-o", "/dev/null", "--cacert", ca.ca_arg(), "--resolve", &resolve];
        args.extend(version);
        args.push(&url);
        assert!(curl(&args).status.success());
    }
    let r = records(&log, 2);
    let mut versions: Vec<&str> = r.iter().map(|v| v["tls_version"].as_str().unwrap()).collect();
    versions.sort();
    assert_eq!(versions, ["TLSv1.2", "TLSv1.3"]);
    for v in &r {
        assert_eq!(v["sni"], "localhost", "{v}");
        assert!(v["cipher"].as_str().unwrap().starts_with("TLS"), "{v}");
        assert!(["ktls", "usertls"].contains(&v["transport"].as_str().unwrap()), "{v}");
        assert_eq!((&v["status"], &v["body_bytes"]), (&200.into(), &300_000.into()));
    }
}

#[test]
fn combined_format_sampling_and_reopen_on_sigusr1() {
    let content = Content::new();
    content.write("a.txt", b"hello\n");
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let config = ConfigFile::new(&format!(
        "workers = 1\n[access_log]\npath = {:?}\nformat = \"combined\"\nsample = 2\n",
        log.to_str().unwrap()
    ));
    let server = Server::start(&["--root", &content.root_arg(), "--config", config.arg()]);
    for _ in 0..10 {
        assert!(curl(&["-s", "-o", "/dev/null", "-A", "tool \"x\"", &server.url("/a.txt?sig=abc")]).status.success());
    }
    let mut lines = Vec::new();
    assert!(eventually(Duration::from_secs(10), || {
        lines = std::fs::read_to_string(&log).unwrap_or_default().lines().map(str::to_owned).collect();
        lines.len() >= 5
    }));
    // And no more than 5 come: a worker hands its records over once its buffer is a
    // second old, so a sixth would have come within this pause. The server reports
    // neither the records it sampled out nor those it still holds, so there is no
    // count to wait for instead; it goes when it does.
    std::thread::sleep(Duration::from_millis(1200));
    let lines: Vec<String> = std::fs::read_to_string(&log).unwrap().lines().map(str::to_owned).collect();
    assert_eq!(lines.len(), 5, "one in two of 10 responses: {lines:?}");
    // 127.0.0.1 - - [23/Nov/2026:22:30:00 +0000] "GET /a.txt HTTP/1.1" 200 6 "-" "tool \x22x\x22"
    let l = &lines[0];
    assert!(l.starts_with("127.0.0.1 - - ["), "{l}");
    assert!(l.contains(" +0000] \"GET /a.txt HTTP/1.1\" 200 6 \"-\" \"tool \\x22x\\x22\""), "{l}");
    assert!(!l.contains("sig"), "{l}");

    // logrotate: rename, then SIGUSR1; new records go to a new file at the same path.
    let rotated = dir.path().join("access.log.1");
    std::fs::rename(&log, &rotated).unwrap();
    server.signal("USR1");
    assert!(eventually(Duration::from_secs(5), || server.metric("linerate_access_log_reopens_total") == 1.0));
    for _ in 0..2 {
        assert!(curl(&["-s", "-o", "/dev/null", &server.url("/a.txt")]).status.success());
    }
    assert!(eventually(Duration::from_secs(10), || {
        std::fs::read_to_string(&log).unwrap_or_default().lines().count() == 1
    }));
    assert_eq!(std::fs::read_to_string(&rotated).unwrap().lines().count(), 5);
    assert!(server.stderr().contains("access log reopened"), "{}", server.stderr());
}

#[test]
fn a_log_that_cannot_be_written_costs_records_not_responses() {
    let content = Content::new();
    content.write("a.txt", b"hello\n");
    // /dev/full takes the open and fails every write (ENOSPC): a full disk.
    let server = Server::start(&["--root", &content.root_arg(), "--access-log", "/dev/full"]);
    for _ in 0..20 {
        let r = get(&server.url("/a.txt"), &[]);
        assert_eq!((r.status, r.body.as_slice()), (200, &b"hello\n"[..]));
    }
    assert!(eventually(Duration::from_secs(10), || {
        server.metric("linerate_access_log_records_total{result=\"dropped\"}") == 20.0
    }));
    assert_eq!(server.metric("linerate_access_log_records_total{result=\"written\"}"), 0.0);
    let log = server.stderr();
    assert_eq!(log.matches("access log write failed").count(), 1, "said once:\n{log}");
}

#[test]
fn an_access_log_that_cannot_be_opened_stops_start_up() {
    let content = Content::new();
    let out = std::process::Command::new(BIN)
        .args(["serve", "--root", &content.root_arg(), "--listen", "127.0.0.1:0", "--no-admin"])
        .args(["--access-log", "/nonexistent-dir/access.log"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("access_log.path") && err.contains("/nonexistent-dir/access.log"), "{err}");
}
