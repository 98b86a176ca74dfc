//! HTTPS with real clients: curl for each protocol version and cipher suite, SNI,
//! ranges over TLS, a 256 MiB file, pipelining and key updates through a rustls
//! client, openssl s_client for ALPN and resumption, certificate reload, start-up
//! errors, and the same bytes through the plain and TLS paths.

use std::io::Write;
use std::process::Stdio;
use std::time::Duration;

use crate::common;
use crate::common::tls::TestCa;
use crate::common::*;

struct Setup {
    ca: TestCa,
    content: Content,
    server: Server,
    data: Vec<u8>,
}

fn setup_with(extra: &[&str]) -> Setup {
    let ca = TestCa::new();
    let content = Content::new();
    let data = content.write_random("movie.mp4", 3 << 20, 5);
    content.write("small.txt", b"0123456789");
    let server = common::tls::start_server(&ca, content.path(), extra);
    Setup { ca, content, server, data }
}

fn setup() -> Setup {
    setup_with(&[])
}

impl Setup {
    /// curl over HTTPS to `path`, trusting the test CA; `extra` are more curl arguments.
    fn curl(&self, path: &str, extra: &[&str]) -> std::process::Output {
        let port = self.server.tls_addrs[0].port();
        let resolve = format!("localhost:{port}:127.0.0.1");
        let url = self.server.tls_url(path);
        let mut args = vec!["--cacert", self.ca.ca_arg(), "--resolve", &resolve];
        args.extend_from_slice(extra);
        args.push(&url);
        curl(&args)
    }
}

#[test]
fn start_up_says_which_tls_mode_is_active() {
    let s = setup();
    let log = s.server.stderr();
    let modes: Vec<&str> = log.lines().filter(|l| l.contains("tls_mode=")).collect();
    assert_eq!(modes.len(), 1, "one mode line expected:\n{log}");
    assert!(modes[0].contains("tls_mode=userspace") || modes[0].contains("tls_mode=ktls-tx-rx"), "{log}");
    assert_eq!(s.server.tls_addrs.len(), 1);
}

#[test]
fn every_version_and_cipher_suite_serves_correct_bytes() {
    let s = setup();
    let cases: &[(&[&str], &str)] = &[
        (&["--tlsv1.3", "--tls13-ciphers", "TLS_AES_128_GCM_SHA256"], "TLSv1.3 / TLS_AES_128_GCM_SHA256"),
        (&["--tlsv1.3", "--tls13-ciphers", "TLS_AES_256_GCM_SHA384"], "TLSv1.3 / TLS_AES_256_GCM_SHA384"),
        (&["--tlsv1.3", "--tls13-ciphers", "TLS_CHACHA20_POLY1305_SHA256"], "TLSv1.3 / TLS_CHACHA20_POLY1305_SHA256"),
        (
            &["--tls-max", "1.2", "--ciphers", "ECDHE-ECDSA-AES128-GCM-SHA256"],
            "TLSv1.2 / ECDHE-ECDSA-AES128-GCM-SHA256",
        ),
        (
            &["--tls-max", "1.2", "--ciphers", "ECDHE-ECDSA-AES256-GCM-SHA384"],
            "TLSv1.2 / ECDHE-ECDSA-AES256-GCM-SHA384",
        ),
        (
            &["--tls-max", "1.2", "--ciphers", "ECDHE-ECDSA-CHACHA20-POLY1305"],
            "TLSv1.2 / ECDHE-ECDSA-CHACHA20-POLY1305",
        ),
    ];
    for (flags, negotiated) in cases {
        let mut args = vec!["-v", "--fail"];
        args.extend_from_slice(flags);
        let out = s.curl("/movie.mp4", &args);
        let log = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{negotiated}: {log}");
        assert!(log.contains(&format!("SSL connection using {negotiated}")), "{negotiated}: {log}");
        assert!(log.contains("ALPN: server accepted http/1.1"), "{log}");
        assert!(out.stdout == s.data, "{negotiated}: body differs");
    }
    // TLS 1.1 and below are refused.
    let out = s.curl("/small.txt", &["--tlsv1.1", "--tls-max", "1.1"]);
    assert!(!out.status.success());
}

#[test]
fn ranges_and_multipart_over_tls() {
    let s = setup();
    let out = s.curl("/movie.mp4", &["-i", "-r", "16380-16400"]);
    let r = parse_response(&out.stdout).unwrap();
    assert_eq!(r.status, 206);
    assert_eq!(r.body, &s.data[16380..=16400]);
    let out = s.curl("/movie.mp4", &["-i", "-r", "0-99,20000-40000,-7"]);
    let r = parse_response(&out.stdout).unwrap();
    assert_eq!(r.status, 206);
    assert_eq!(r.header("content-length").unwrap().parse::<usize>().unwrap(), r.body.len());
    let body = &r.body;
    for (first, last) in [(0usize, 99usize), (20000, 40000)] {
        assert!(body.windows(last - first + 1).any(|w| w == &s.data[first..=last]), "part {first}-{last} missing");
    }
    assert!(body.ends_with(b"--\r\n"));
}

#[test]
fn sni_chooses_the_certificate() {
    let ca = TestCa::new();
    let (c1, k1) = ca.issue("default", &["default.test"], -1, 30);
    let (c2, k2) = ca.issue("video", &["video.test", "*.cdn.test"], -1, 30);
    let content = Content::new();
    content.write("a.txt", b"A");
    let cfg = ConfigFile::new(&format!(
        "root = {:?}\ntls_listen = [\"127.0.0.1:0\"]\n[tls]\ncert = {c1:?}\nkey = {k1:?}\n[[tls.certificates]]\ncert = {c2:?}\nkey = {k2:?}\n",
        content.path()
    ));
    let s = Server::start(&["--config", cfg.arg()]);
    let port = s.tls_addrs[0].port();
    for name in ["default.test", "video.test", "edge7.cdn.test"] {
        // curl checks the certificate against the name: it succeeds only if the
        // server picked the certificate that covers it.
        let out = curl(&[
            "--cacert",
            ca.ca_arg(),
            "--resolve",
            &format!("{name}:{port}:127.0.0.1"),
            &format!("https://{name}:{port}/a.txt"),
        ]);
        assert!(out.status.success(), "{name}: {}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(out.stdout, b"A");
    }
    // An unknown name gets the default certificate (and so fails verification).
    let out = curl(&[
        "--cacert",
        ca.ca_arg(),
        "--resolve",
        &format!("other.test:{port}:127.0.0.1"),
        &format!("https://other.test:{port}/a.txt"),
    ]);
    assert!(!out.status.success());
    let subject = s_client(port, &["-servername", "other.test"], ca.ca_arg(), b"");
    assert!(subject.contains("CN = default.test") || subject.contains("CN=default.test"), "{subject}");
}

#[test]
fn large_file_over_tls_arrives_intact() {
    let s = setup();
    let big = s.content.write_random("big.bin", 256 << 20, 77);
    let want = sha256_hex(&big);
    drop(big);
    let port = s.server.tls_addrs[0].port();
    let out = tool("sh")
        .args([
            "-c",
            &format!(
                "curl -sS --fail --cacert {} --resolve localhost:{port}:127.0.0.1 {} | sha256sum",
                s.ca.ca_arg(),
                s.server.tls_url("/big.bin")
            ),
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout).split_whitespace().next(), Some(want.as_str()));
}

#[test]
fn pipelining_over_tls() {
    let s = setup();
    let mut tls = common::tls::connect(s.server.tls_addrs[0], "localhost", &s.ca.ca_pem);
    let req = "GET /small.txt HTTP/1.1\r\nHost: localhost\r\n\r\n\
               GET /movie.mp4 HTTP/1.1\r\nHost: localhost\r\nRange: bytes=100-199\r\n\r\n\
               HEAD /movie.mp4 HTTP/1.1\r\nHost: localhost\r\n\r\n\
               GET /movie.mp4 HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
    let raw = common::tls::exchange(&mut tls, req.as_bytes());
    let text_heads = String::from_utf8_lossy(&raw).matches("HTTP/1.1 ").count();
    assert_eq!(text_heads, 4);
    let first = split_responses(&raw[..raw.windows(4).position(|w| w == b"HEAD").unwrap_or(raw.len())]);
    assert_eq!(first[0].body, b"0123456789");
    assert_eq!(first[1].body, &s.data[100..200]);
    assert!(raw.ends_with(&s.data[s.data.len() - 1000..]), "last response carries the whole file");
}

/// The client renews its keys mid-connection (TLS 1.3 KeyUpdate, asking the server
/// to renew too); both directions keep working. Under kernel TLS the server closes
/// instead, which the client sees as the end of the connection.
#[test]
fn key_update_mid_connection() {
    let s = setup();
    let mut tls = common::tls::connect(s.server.tls_addrs[0], "localhost", &s.ca.ca_pem);
    tls.write_all(b"GET /small.txt HTTP/1.1\r\nHost: localhost\r\n\r\n").unwrap();
    let mut first = vec![0u8; 0];
    let mut buf = [0u8; 4096];
    while !first.ends_with(b"0123456789") {
        let n = std::io::Read::read(&mut tls, &mut buf).unwrap();
        assert!(n > 0);
        first.extend_from_slice(&buf[..n]);
    }
    tls.conn.refresh_traffic_keys().unwrap();
    let raw =
        common::tls::exchange(&mut tls, b"GET /movie.mp4 HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    if s.server.stderr().contains("tls_mode=userspace") {
        let r = parse_response(&raw).unwrap();
        assert_eq!(r.status, 200);
        assert!(r.body == s.data, "body after key update differs");
    } else {
        assert!(raw.is_empty(), "kernel TLS closes on a key update");
    }
}

/// `openssl s_client`: returns its output. `input` is written to its stdin.
fn s_client(port: u16, extra: &[&str], ca: &str, input: &[u8]) -> String {
    let mut child = tool("openssl")
        .args(["s_client", "-connect", &format!("127.0.0.1:{port}"), "-CAfile", ca])
        .args(extra)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(input).unwrap();
    let out = child.wait_with_output().unwrap();
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

#[test]
fn alpn_and_session_resumption() {
    let s = setup();
    let port = s.server.tls_addrs[0].port();
    let out = s_client(port, &["-alpn", "h2,http/1.1", "-servername", "localhost"], s.ca.ca_arg(), b"");
    assert!(out.contains("ALPN protocol: http/1.1"), "{out}");
    assert!(out.contains("Verify return code: 0 (ok)"), "{out}");
    // A client that only speaks h2 is refused rather than misunderstood.
    let out = s_client(port, &["-alpn", "h2", "-servername", "localhost"], s.ca.ca_arg(), b"");
    assert!(out.contains("no application protocol") || out.contains("alert number 120"), "{out}");

    let dir = tempfile::tempdir().unwrap();
    for version in ["-tls1_3", "-tls1_2"] {
        let sess = dir.path().join(format!("sess{version}"));
        let sess = sess.to_str().unwrap();
        // TLS 1.3 tickets arrive after the handshake: send a request so they are read.
        let req = b"GET /small.txt HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
        let first =
            s_client(port, &[version, "-servername", "localhost", "-sess_out", sess, "-ign_eof"], s.ca.ca_arg(), req);
        assert!(first.contains("0123456789"), "{version}: {first}");
        let second =
            s_client(port, &[version, "-servername", "localhost", "-sess_in", sess, "-ign_eof"], s.ca.ca_arg(), req);
        assert!(second.contains("Reused, TLSv1."), "{version} resumption: {second}");
        assert!(second.contains("0123456789"), "{version}: {second}");
    }
}

/// A TLS 1.2 client that tries to renegotiate is refused with the no_renegotiation
/// alert, and the connection closes (rather than hanging or resetting silently).
#[test]
fn renegotiation_is_refused_with_an_alert() {
    let s = setup();
    let port = s.server.tls_addrs[0].port();
    let mut child = tool("openssl")
        .args(["s_client", "-connect", &format!("127.0.0.1:{port}"), "-tls1_2", "-CAfile", s.ca.ca_arg()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Both streams as they come, to see the alert while s_client is still running.
    let collect = |pipe: Box<dyn std::io::Read + Send>| {
        let text = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let sink = text.clone();
        let reader = std::thread::spawn(move || {
            for line in std::io::BufRead::lines(std::io::BufReader::new(pipe)).map_while(Result::ok) {
                let mut s = sink.lock().unwrap();
                s.push_str(&line);
                s.push('\n');
            }
        });
        (text, reader)
    };
    let (stdout, out_reader) = collect(Box::new(child.stdout.take().unwrap()));
    let (stderr, err_reader) = collect(Box::new(child.stderr.take().unwrap()));
    // "R" on its own line asks s_client to renegotiate; keep stdin open until the
    // server's answer is in.
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"R\n").unwrap();
    let said = || format!("{}{}", stdout.lock().unwrap(), stderr.lock().unwrap());
    eventually(Duration::from_secs(10), || said().contains("no renegotiation"));
    drop(stdin);
    child.wait().unwrap();
    out_reader.join().unwrap();
    err_reader.join().unwrap();
    let text = said();
    assert!(text.contains("RENEGOTIATING"), "{text}");
    assert!(text.contains("no renegotiation"), "{text}");
}

#[test]
fn plain_http_to_the_https_port_gets_400() {
    let s = setup();
    let raw = raw_exchange(s.server.tls_addrs[0], b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", Duration::from_secs(5));
    let r = parse_response(&raw).unwrap();
    assert_eq!(r.status, 400);
    assert!(String::from_utf8_lossy(&r.body).contains("HTTPS port"));
}

#[test]
fn certificate_problems_stop_the_start() {
    let ca = TestCa::new();
    let (cert, key) = ca.issue("ok", &["localhost"], -1, 30);
    let (_, other_key) = ca.issue("other", &["localhost"], -1, 30);
    let (expired, expired_key) = ca.issue("expired", &["localhost"], -30, -2);
    let content = Content::new();
    let root = content.root_arg();
    let missing = ca.dir.path().join("missing.pem");
    for (c, k, key_name, problem) in [
        (&cert, &other_key, "tls.key", "does not match"),
        (&expired, &expired_key, "tls.cert", "expired on"),
        (&missing, &key, "tls.cert", "cannot read"),
        (&cert, &cert, "tls.key", "private key"),
    ] {
        let out = std::process::Command::new(BIN)
            .args(["serve", "--root", &root, "--tls-listen", "127.0.0.1:0"])
            .args(["--cert", c.to_str().unwrap(), "--key", k.to_str().unwrap()])
            .output()
            .unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(key_name) && err.contains(problem), "want `{key_name}` and `{problem}` in: {err}");
        assert!(out.stdout.is_empty(), "printed listening lines before failing");
    }
    let out = std::process::Command::new(BIN)
        .args(["serve", "--root", &root, "--tls-listen", "127.0.0.1:0"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("tls.cert"));
}

/// SIGHUP re-reads the certificate files: new connections get the new certificate,
/// while a transfer that started before finishes with the right bytes.
#[test]
fn certificate_reload_under_load() {
    let ca = TestCa::new();
    let (cert, key) = ca.issue("cur", &["localhost"], -1, 30);
    let content = Content::new();
    let data = content.write_random("big.bin", 24 << 20, 9);
    let s = Server::start(&[
        "--root",
        &content.root_arg(),
        "--tls-listen",
        "127.0.0.1:0",
        "--cert",
        cert.to_str().unwrap(),
        "--key",
        key.to_str().unwrap(),
    ]);
    let port = s.tls_addrs[0].port();
    let fingerprint = || {
        let out = s_client(port, &["-servername", "localhost"], ca.ca_arg(), b"");
        let pem_start = out.find("-----BEGIN CERTIFICATE-----").expect("certificate in output");
        let pem_end = out.find("-----END CERTIFICATE-----").unwrap();
        out[pem_start..pem_end].to_string()
    };
    let before = fingerprint();
    let out_dir = tempfile::tempdir().unwrap();
    let got = out_dir.path().join("got");
    let mut dl = tool("curl")
        .args(["-sS", "--fail", "--limit-rate", "8M", "--cacert", ca.ca_arg()])
        .args(["--resolve", &format!("localhost:{port}:127.0.0.1"), "-o", got.to_str().unwrap()])
        .arg(s.tls_url("/big.bin"))
        .spawn()
        .unwrap();
    let started = eventually(Duration::from_secs(10), || std::fs::metadata(&got).is_ok_and(|m| m.len() > 0));
    assert!(started, "the download did not start");
    // Rotate: a new certificate and key written over the same files.
    let (new_cert, new_key) = ca.issue("next", &["localhost"], -1, 60);
    std::fs::copy(&new_cert, &cert).unwrap();
    std::fs::copy(&new_key, &key).unwrap();
    s.signal("HUP");
    assert!(eventually(Duration::from_secs(5), || fingerprint() != before), "new certificate not served");
    assert!(dl.wait().unwrap().success(), "transfer across the reload failed");
    assert_eq!(sha256_hex(&std::fs::read(&got).unwrap()), sha256_hex(&data));
}

/// The same byte ranges through plain HTTP and HTTPS give the same bytes, equal to
/// the file's. (The qemu harness runs the same comparison with kernel TLS.)
#[test]
fn same_bytes_on_every_path() {
    let s = setup_with(&["--listen", "127.0.0.1:0"]);
    let ranges = ["0-0", "0-16383", "16383-16384", "1000-1048575", "3145000-", "-70000", "5-10,16000-17000,-3"];
    // Multipart boundaries differ per response: compare bodies with them blanked.
    let normalise = |raw: &[u8]| -> Vec<u8> {
        let r = parse_response(raw).unwrap();
        let ct = r.header("content-type").unwrap_or_default();
        match ct.strip_prefix("multipart/byteranges; boundary=") {
            Some(b) => String::from_utf8_lossy(&r.body).replace(b, "BOUNDARY").into_bytes(),
            None => r.body,
        }
    };
    for r in ranges {
        let plain = curl(&["--fail", "-i", "-r", r, &s.server.url("/movie.mp4")]);
        let tls = s.curl("/movie.mp4", &["--fail", "-i", "-r", r]);
        assert!(plain.status.success() && tls.status.success(), "{r}");
        let (plain, tls) = (normalise(&plain.stdout), normalise(&tls.stdout));
        assert!(plain == tls, "range {r}: plain and TLS bodies differ");
        if !r.contains(',') {
            let (a, b) = r.split_once('-').unwrap();
            let len = s.data.len();
            let (first, last) = match (a, b) {
                ("", n) => (len - n.parse::<usize>().unwrap(), len - 1),
                (a, "") => (a.parse().unwrap(), len - 1),
                (a, b) => (a.parse().unwrap(), b.parse().unwrap()),
            };
            assert!(tls == s.data[first..=last], "range {r} differs from the file");
        }
    }
}

/// Resident memory of a process in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// Established TCP connections from local `port` (the server's side) with bytes in
/// their send queue, from /proc/net/tcp.
fn with_unsent_bytes(port: u16) -> usize {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
    table
        .lines()
        .skip(1)
        .filter(|l| {
            // sl local_address rem_address st tx_queue:rx_queue ... (hexadecimal)
            let f: Vec<&str> = l.split_whitespace().collect();
            let hex = |s: &str| u64::from_str_radix(s, 16).ok();
            f.len() > 4
                && f[1].rsplit(':').next().and_then(hex) == Some(u64::from(port))
                && f[3] == "01"
                && f[4].split(':').next().and_then(hex).is_some_and(|q| q > 0)
        })
        .count()
}

#[test]
fn stalled_readers_pin_no_record_batches_and_still_get_every_byte() {
    // User-space TLS seals up to 16 records (256 KiB) per write. Viewers whose
    // sockets are full must not each keep such a batch while they wait: 100 of them
    // would pin 25 MiB. Small socket buffers on both sides make every socket fill.
    let cfg = ConfigFile::new("[tls]\nkernel_tls = \"off\"\n[tcp]\nsend_buffer_bytes = 65536\n");
    let s = setup_with(&["--config", cfg.arg(), "--workers", "1"]);
    let data = s.content.write_random("big.bin", 8 << 20, 31);
    let addr = s.server.tls_addrs[0];
    let mut conns = Vec::new();
    let mut heads = Vec::new();
    let before = rss_kib(s.server.pid());
    for _ in 0..100 {
        let mut tls = common::tls::connect_with(addr, "localhost", &s.ca.ca_pem, Some(16 * 1024));
        tls.write_all(b"GET /big.bin HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").unwrap();
        // Wait for the head, so the server is sending on every connection.
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        while !got.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = std::io::Read::read(&mut tls, &mut buf).unwrap();
            assert!(n > 0, "closed before the head");
            got.extend_from_slice(&buf[..n]);
        }
        conns.push(tls);
        heads.push(got);
    }
    // Every one of them stalled: the server holds bytes it cannot send on each.
    let stalled = eventually(Duration::from_secs(10), || with_unsent_bytes(addr.port()) >= 100);
    assert!(stalled, "{} of 100 connections stalled", with_unsent_bytes(addr.port()));
    let grown = rss_kib(s.server.pid()).saturating_sub(before);
    assert!(grown < 8 * 1024, "100 stalled TLS connections grew the server by {grown} KiB");
    // Some of them now read to the end: every byte arrives, in order.
    for (mut tls, head) in conns.drain(..3).zip(heads) {
        let mut raw = head;
        let mut buf = [0u8; 65536];
        loop {
            match std::io::Read::read(&mut tls, &mut buf) {
                Ok(0) => break,
                Ok(n) => raw.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => break,
                Err(e) => panic!("TLS read: {e}"),
            }
        }
        let r = parse_response(&raw).unwrap();
        assert_eq!(r.status, 200);
        assert!(r.body == data, "body differs after the socket was full");
    }
}
