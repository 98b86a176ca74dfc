//! `linerate bench` resumes TLS sessions with the linerate server by default (a
//! session's second connection resumes with the ticket its first one received), and
//! makes a full handshake on every connection with `--no-resume`.

use std::time::Duration;

use crate::bench_support::{bench, num};
use crate::common::tls::{start_server, TestCa};
use crate::common::Content;

/// Runs one bench worker, one session, a new connection per request, for a second.
fn handshakes(extra: &[&str]) -> serde_json::Value {
    let content = Content::new();
    content.write_random("small.bin", 4096, 21);
    let ca = TestCa::new();
    let server = start_server(&ca, content.path(), &["--workers", "1"]);
    let base = server.tls_url("/");
    let mut args = vec!["--base-url", &base, "--files", "small.bin", "--cacert", ca.ca_arg()];
    args.extend_from_slice(&["--sessions", "1", "--workers", "1", "--duration", "1", "--max-rate"]);
    args.extend_from_slice(&["--segment-bytes", "1024", "--connection-per-request", "--json"]);
    args.extend_from_slice(extra);
    bench(&args, Duration::from_secs(30)).json()
}

#[test]
fn a_second_connection_resumes_and_no_resume_does_not() {
    let j = handshakes(&[]);
    assert_eq!(num(&j, "errors_total"), 0.0, "{j:#}");
    assert_eq!(j["resume"], true, "{j:#}");
    let (full, resumed) = (num(&j, "handshakes_full"), num(&j, "handshakes_resumed"));
    // Only the very first connection has no ticket to offer.
    assert_eq!(full, 1.0, "{j:#}");
    assert!(resumed >= 5.0, "{j:#}");
    // Every connection made a handshake, but the one the run's end may cut before
    // its handshake finished (one session: at most one).
    let unfinished = num(&j, "connections") - (full + resumed);
    assert!((0.0..=1.0).contains(&unfinished), "{j:#}");
    assert!(num(&j, "requests") >= resumed, "every connection carried a request: {j:#}");
    assert!(num(&j, "handshakes_per_s") > 0.0, "{j:#}");

    let j = handshakes(&["--no-resume"]);
    assert_eq!(num(&j, "errors_total"), 0.0, "{j:#}");
    assert_eq!(j["resume"], false, "{j:#}");
    assert_eq!(num(&j, "handshakes_resumed"), 0.0, "{j:#}");
    assert!(num(&j, "handshakes_full") >= 5.0, "{j:#}");
}

#[test]
fn kept_alive_sessions_make_one_handshake_each() {
    let content = Content::new();
    content.write_random("v.bin", 1 << 20, 22);
    let ca = TestCa::new();
    let server = start_server(&ca, content.path(), &["--workers", "1"]);
    let base = server.tls_url("/");
    let args = [
        "--base-url",
        &base,
        "--files",
        "v.bin",
        "--cacert",
        ca.ca_arg(),
        "--sessions",
        "3",
        "--workers",
        "1",
        "--duration",
        "1",
        "--max-rate",
        "--segment-bytes",
        "65536",
        "--json",
    ];
    let j = bench(&args, Duration::from_secs(30)).json();
    assert_eq!(num(&j, "errors_total"), 0.0, "{j:#}");
    assert!(num(&j, "requests") > 3.0, "{j:#}");
    // Three connections, kept alive all run long: one handshake each, no more.
    assert_eq!(num(&j, "handshakes_full") + num(&j, "handshakes_resumed"), 3.0, "{j:#}");
}
