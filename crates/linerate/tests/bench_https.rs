//! `linerate bench` over HTTPS (rustls client) against Debian's nginx with a
//! certificate made for the test: trusted with `--cacert`, accepted with
//! `--insecure`, refused when neither is given; TLS 1.2 sessions resumed by session
//! ID and by ticket.

use std::time::Duration;

use crate::bench_support::{bench, num, test_certs, Nginx};
use crate::common::Content;

#[test]
fn https_sessions_verify_bytes_with_a_test_ca_or_insecure() {
    let content = Content::new();
    content.write_random("v1.bin", 1 << 20, 11);
    content.write_random("v2.bin", 333_333, 12);
    let certs = tempfile::tempdir().unwrap();
    let tc = test_certs(certs.path());
    let nginx = Nginx::start(content.path(), Some((&tc.cert, &tc.key)));
    let base = format!("https://127.0.0.1:{}/", nginx.port);
    let root = content.root_arg();
    let cacert = tc.ca.to_str().unwrap();
    let common =
        ["--base-url", &base, "--files", "v1.bin,v2.bin", "--segment-bytes", "65536", "--verify", &root, "--json"];

    for trust in [&["--cacert", cacert][..], &["--insecure"][..]] {
        let mut args = common.to_vec();
        args.extend_from_slice(trust);
        args.extend_from_slice(&["--sessions", "4", "--duration", "1", "--max-rate"]);
        let j = bench(&args, Duration::from_secs(30)).json();
        assert_eq!(num(&j, "errors_total"), 0.0, "{trust:?}: {j:#}");
        assert!(num(&j, "requests") > 4.0, "{trust:?}: {j:#}");
        assert_eq!(num(&j, "verified_bytes"), num(&j, "bytes"), "{trust:?}");
        assert!(num(&j, "bytes") > 0.0);
    }

    // Paced over TLS too.
    let mut args = common.to_vec();
    args.extend_from_slice(&["--cacert", cacert, "--sessions", "3", "--duration", "2", "--bitrate-mbps", "1"]);
    let j = bench(&args, Duration::from_secs(30)).json();
    assert_eq!(num(&j, "errors_total"), 0.0, "{j:#}");
    assert!(num(&j, "plays_started") >= 3.0, "{j:#}");
    assert_eq!(num(&j, "rebuffers"), 0.0, "{j:#}");
}

#[test]
fn an_untrusted_certificate_is_refused_clearly() {
    let content = Content::new();
    content.write_random("v.bin", 100_000, 13);
    let certs = tempfile::tempdir().unwrap();
    let tc = test_certs(certs.path());
    let nginx = Nginx::start(content.path(), Some((&tc.cert, &tc.key)));
    let base = format!("https://127.0.0.1:{}/", nginx.port);
    let run = bench(&["--base-url", &base, "--files", "v.bin", "--duration", "1"], Duration::from_secs(20));
    assert!(!run.success);
    assert!(run.stderr.contains("TLS") && run.stderr.contains("certificate"), "{}", run.stderr);
    // A CA file that is not a certificate.
    let bogus = certs.path().join("bogus.pem");
    std::fs::write(&bogus, "not a certificate\n").unwrap();
    let run = bench(
        &["--base-url", &base, "--files", "v.bin", "--duration", "1", "--cacert", bogus.to_str().unwrap()],
        Duration::from_secs(20),
    );
    assert!(!run.success);
    assert!(run.stderr.contains("no PEM certificate"), "{}", run.stderr);
}

#[test]
fn tls12_sessions_resume_by_session_id_and_by_ticket() {
    let content = Content::new();
    content.write_random("s.bin", 4096, 14);
    let certs = tempfile::tempdir().unwrap();
    let tc = test_certs(certs.path());
    let cacert = tc.ca.to_str().unwrap();
    for (how, directives) in [
        ("session ID", "ssl_protocols TLSv1.2; ssl_session_tickets off; ssl_session_cache shared:T:1m;"),
        ("ticket", "ssl_protocols TLSv1.2; ssl_session_tickets on; ssl_session_cache off;"),
    ] {
        let nginx = Nginx::start_with(content.path(), Some((&tc.cert, &tc.key)), directives);
        let base = format!("https://127.0.0.1:{}/", nginx.port);
        let common = ["--base-url", &base, "--files", "s.bin", "--cacert", cacert, "--sessions", "2", "--workers", "1"];
        let load = ["--duration", "1", "--max-rate", "--segment-bytes", "1024", "--connection-per-request", "--json"];
        let j = bench(&[&common[..], &load[..]].concat(), Duration::from_secs(30)).json();
        assert_eq!(num(&j, "errors_total"), 0.0, "{how}: {j:#}");
        // Each session's first connection is a full handshake, all later ones resume.
        assert_eq!(num(&j, "handshakes_full"), 2.0, "{how}: {j:#}");
        assert!(num(&j, "handshakes_resumed") >= 5.0, "{how}: {j:#}");

        let j = bench(&[&common[..], &load[..], &["--no-resume"][..]].concat(), Duration::from_secs(30)).json();
        assert_eq!(num(&j, "handshakes_resumed"), 0.0, "{how}: {j:#}");
        assert!(num(&j, "handshakes_full") >= 5.0, "{how}: {j:#}");
    }
}
