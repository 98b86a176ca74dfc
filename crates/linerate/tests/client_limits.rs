//! Limits per client (`[client_limits]`): connections at once per address or
//! prefix, new connections per second, and the minimum send rate of a response.
//! Each server is started with `Server::spawn`, so the test harness's raised
//! loopback limits are not added.

use std::io::Write;
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common;
use crate::common::*;

/// `linerate serve` with one worker and exactly this `[client_limits]` section
/// (plus `extra` top-level sections).
fn start(c: &Content, limits: &str, extra: &str) -> (Server, ConfigFile) {
    let cfg = ConfigFile::new(&format!("root = {:?}\nworkers = 1\n{extra}\n[client_limits]\n{limits}\n", c.path()));
    let mut cmd = Command::new(BIN);
    cmd.args(["serve", "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--config", cfg.arg()]);
    (Server::spawn(cmd), cfg)
}

/// A connection to `to` from the local address `from`.
fn connect_from(from: &str, to: SocketAddr) -> TcpStream {
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    let local: SocketAddr = SocketAddr::new(from.parse::<IpAddr>().unwrap(), 0);
    sock.bind(&local.into()).unwrap();
    sock.connect(&to.into()).unwrap();
    sock.into()
}

/// One keep-alive request on `s`; the status, or None if the server closed instead.
fn request(s: &mut TcpStream) -> Option<u16> {
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(b"GET /a.txt HTTP/1.1\r\nHost: x\r\n\r\n").ok()?;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        if let Some(r) = parse_response(&got) {
            let len: usize = r.header("content-length").and_then(|l| l.parse().ok()).unwrap_or(0);
            if r.body.len() >= len {
                return Some(r.status);
            }
        }
        match common::read_some(s, &mut buf) {
            Ok(0) | Err(_) => return parse_response(&got).map(|r| r.status),
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
}

/// What a refused connection gets, sending nothing: a 429 with Retry-After and
/// then the close, at once.
fn assert_refused(mut s: TcpStream) {
    s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let start = Instant::now();
    let data = read_until_close(&mut s, Duration::from_secs(2));
    assert!(start.elapsed() < Duration::from_millis(1500), "a refused connection was kept open");
    let r = parse_response(&data)
        .unwrap_or_else(|| panic!("no 429 on a refused connection: {:?}", String::from_utf8_lossy(&data)));
    assert_eq!(r.status, 429);
    assert_eq!(r.header("retry-after").as_deref(), Some("1"));
}

#[test]
fn connections_per_client_are_capped_and_given_back() {
    let c = Content::new();
    c.write("a.txt", b"A");
    let (s, _cfg) = start(&c, "max_connections = 3\nmax_new_connections_per_second = 0", "");
    let mut held: Vec<TcpStream> = (0..3).map(|_| connect_from("127.0.0.1", s.addr())).collect();
    for conn in &mut held {
        assert_eq!(request(conn), Some(200));
    }
    // The fourth is refused at once; the first three are still served.
    assert_refused(connect_from("127.0.0.1", s.addr()));
    for conn in &mut held {
        assert_eq!(request(conn), Some(200), "a connection within the limit was disturbed");
    }
    // Another address is another client (ipv4_prefix = 32 by default).
    let mut other = connect_from("127.0.0.2", s.addr());
    assert_eq!(request(&mut other), Some(200));
    // Closing one frees its place.
    held.pop();
    assert!(
        eventually(Duration::from_secs(5), || request(&mut connect_from("127.0.0.1", s.addr())) == Some(200)),
        "no connection accepted after one closed"
    );
    // At least the one above (waiting for the close to be seen may have cost more).
    assert!(s.metric("linerate_client_limit_refusals_total{limit=\"connections\"}") >= 1.0);
    assert_eq!(s.metric("linerate_client_limit_refusals_total{limit=\"rate\"}"), 0.0);
    // Refused connections are not accepted ones.
    let accepted = s.metric("linerate_connections_accepted_total");
    assert!(accepted >= 5.0, "{accepted}");
    // Refusals are summed up in one warning a minute at most, never logged one by one.
    assert!(s.stderr().matches("client limits refused").count() <= 1, "{}", s.stderr());
}

#[test]
fn a_prefix_counts_its_addresses_together() {
    let c = Content::new();
    c.write("a.txt", b"A");
    let (s, _cfg) = start(&c, "max_connections = 2\nmax_new_connections_per_second = 0\nipv4_prefix = 8", "");
    let mut a = connect_from("127.0.0.1", s.addr());
    let mut b = connect_from("127.0.0.2", s.addr());
    assert_eq!(request(&mut a), Some(200));
    assert_eq!(request(&mut b), Some(200));
    // 127.0.0.3 is in the same /8 as the two above.
    assert_refused(connect_from("127.0.0.3", s.addr()));
    drop(a);
    assert!(eventually(Duration::from_secs(5), || request(&mut connect_from("127.0.0.3", s.addr())) == Some(200)));
}

#[test]
fn new_connections_per_second_are_a_token_bucket() {
    let c = Content::new();
    c.write("a.txt", b"A");
    let (s, _cfg) = start(&c, "max_connections = 0\nmax_new_connections_per_second = 4\nnew_connections_burst = 4", "");
    // The burst goes through, the connections after it are refused (one token
    // comes back every 250 ms, and these ten take a few milliseconds).
    let mut outcomes = Vec::new();
    for _ in 0..10 {
        outcomes.push(request(&mut connect_from("127.0.0.1", s.addr())));
    }
    assert_eq!(&outcomes[..4], &[Some(200); 4], "{outcomes:?}");
    let refused = outcomes[4..].iter().filter(|o| *o != &Some(200)).count();
    assert!(refused >= 5, "{outcomes:?}");
    // Other addresses have their own bucket.
    assert_eq!(request(&mut connect_from("127.0.0.2", s.addr())), Some(200));
    // Tokens come back with time: the bucket refills by the clock (a token every
    // 250 ms, the test's own setting), so this pause is the input, and a longer one
    // on a busy machine only brings more. Polling instead would spend refused
    // attempts, which the count below must not include.
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(request(&mut connect_from("127.0.0.1", s.addr())), Some(200));
    let rate = s.metric("linerate_client_limit_refusals_total{limit=\"rate\"}");
    assert_eq!(rate, refused as f64);
}

/// Requests `path` on a connection with a small receive buffer and reads it at
/// about `bytes_per_sec` (in steps of 100 ms) for at most `limit`. Returns the
/// body bytes received and whether the server closed the connection early.
fn paced_download(to: SocketAddr, path: &str, bytes_per_sec: usize, limit: Duration) -> (usize, bool) {
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    sock.connect(&to.into()).unwrap();
    let mut s: TcpStream = sock.into();
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes()).unwrap();
    s.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
    let step = (bytes_per_sec / 10).max(1);
    let mut buf = vec![0u8; step];
    let mut total = 0;
    let start = Instant::now();
    let mut next = start;
    while start.elapsed() < limit {
        let mut got = 0;
        while got < step {
            match common::read_some(&mut s, &mut buf[got..]) {
                Ok(0) => return (total + got, true),
                Ok(n) => got += n,
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => break,
                Err(_) => return (total + got, true),
            }
        }
        total += got;
        next += Duration::from_millis(100);
        // The client's pace: slow on purpose.
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
    }
    (total, false)
}

#[test]
fn a_response_sent_below_the_minimum_rate_is_cut_a_viewer_above_it_is_not() {
    let c = Content::new();
    let size = 16 * 1024 * 1024;
    c.write_random("big.bin", size, 7);
    // 40 kB/s after 1 s; the send buffer is fixed small so the kernel's buffers
    // cannot hide the client's pace.
    let (s, _cfg) = start(
        &c,
        "max_connections = 0\nmax_new_connections_per_second = 0\nmin_send_rate = 40000\nmin_send_rate_after = \"1s\"",
        "[tcp]\nsend_buffer_bytes = 16384",
    );
    let addr = s.addr();
    // A viewer reading at 200 kB/s (five times the minimum) and a client reading
    // 2 kB/s, side by side for 5 s.
    let viewer = std::thread::spawn(move || paced_download(addr, "/big.bin", 200_000, Duration::from_secs(5)));
    let start = Instant::now();
    let (slow_bytes, slow_cut) = paced_download(addr, "/big.bin", 2_000, Duration::from_secs(8));
    let slow_took = start.elapsed();
    let (viewer_bytes, viewer_cut) = viewer.join().unwrap();
    assert!(slow_cut, "the slow client was not cut ({slow_bytes} bytes in {slow_took:?})");
    assert!(slow_took < Duration::from_secs(6), "cut only after {slow_took:?}");
    assert!(slow_bytes < size / 4, "{slow_bytes}");
    assert!(!viewer_cut, "a viewer above the minimum rate was cut after {viewer_bytes} bytes");
    assert!(viewer_bytes > 600_000, "the viewer read only {viewer_bytes} bytes");
    assert_eq!(s.metric("linerate_errors_total{kind=\"slow_client\"}"), 1.0);
}

/// The same cut on both TLS send paths: user-space records, and the kernel's when
/// it has TLS (otherwise `auto` is user space again).
#[test]
fn tls_responses_below_the_minimum_rate_are_cut() {
    let ca = common::tls::TestCa::new();
    let c = Content::new();
    c.write_random("big.bin", 16 * 1024 * 1024, 9);
    for mode in ["off", "auto"] {
        let cfg = ConfigFile::new(&format!(
            "[tls]\nkernel_tls = \"{mode}\"\n[tcp]\nsend_buffer_bytes = 16384\n\
             [client_limits]\nmin_send_rate = 40000\nmin_send_rate_after = \"1s\"\n"
        ));
        let s = common::tls::start_server(&ca, c.path(), &["--config", cfg.arg(), "--workers", "1"]);
        let mut tls = common::tls::connect_with(s.tls_addrs[0], "localhost", &ca.ca_pem, Some(4096));
        tls.write_all(b"GET /big.bin HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").unwrap();
        // About 2 kB/s: 200 bytes every 100 ms, until the server says it cut the
        // response (the client's TLS buffers would hide the cut for a while longer).
        let start = Instant::now();
        let slow = "linerate_errors_total{kind=\"slow_client\"}";
        let mut buf = [0u8; 200];
        let mut total = 0;
        let mut step = 0;
        while s.metric(slow) == 0.0 {
            assert!(start.elapsed() < Duration::from_secs(6), "kernel_tls = {mode}: not cut ({total} bytes)");
            for _ in 0..5 {
                step += 1;
                // The client's pace, as above.
                std::thread::sleep(
                    (start + Duration::from_millis(100 * step)).saturating_duration_since(Instant::now()),
                );
                match common::read_some(&mut tls, &mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => total += n,
                }
            }
        }
        // What the client still gets is what was already on its side: the
        // connection ends well before the file does.
        let mut rest = vec![0u8; 65536];
        let drain = Instant::now();
        loop {
            match common::read_some(&mut tls, &mut rest) {
                Ok(0) | Err(_) => break,
                Ok(n) => total += n,
            }
            assert!(drain.elapsed() < Duration::from_secs(5), "kernel_tls = {mode}: the connection goes on");
        }
        assert!(total < 1024 * 1024, "kernel_tls = {mode}: {total} bytes arrived after all");
        assert_eq!(s.metric("linerate_errors_total{kind=\"slow_client\"}"), 1.0, "kernel_tls = {mode}");
    }
}

#[test]
fn a_reload_applies_new_limits_to_new_connections() {
    let c = Content::new();
    c.write("a.txt", b"A");
    let (s, cfg) = start(&c, "max_connections = 1\nmax_new_connections_per_second = 0", "");
    let mut first = connect_from("127.0.0.1", s.addr());
    assert_eq!(request(&mut first), Some(200));
    assert_refused(connect_from("127.0.0.1", s.addr()));
    cfg.rewrite(&format!(
        "root = {:?}\nworkers = 1\n[client_limits]\nmax_connections = 2\nmax_new_connections_per_second = 0\n",
        c.path()
    ));
    s.signal("HUP");
    assert!(
        eventually(Duration::from_secs(5), || request(&mut connect_from("127.0.0.1", s.addr())) == Some(200)),
        "the raised limit was not applied: {}",
        s.stderr()
    );
    assert_eq!(request(&mut first), Some(200), "the connection open across the reload still counts and works");
}
