//! Timeouts and limits: slow clients, idle connections, clients that stop reading,
//! connection caps, and running out of file descriptors.

use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::common::*;

fn config(c: &Content, extra: &str) -> ConfigFile {
    ConfigFile::new(&format!("root = {:?}\nworkers = 1\n{extra}\n", c.path()))
}

/// Reads until EOF or error; returns bytes read and how long it took.
fn read_to_close(s: &mut TcpStream, limit: Duration) -> (Vec<u8>, Duration) {
    let start = Instant::now();
    let data = read_until_close(s, limit);
    (data, start.elapsed())
}

#[test]
fn slow_head_gets_408_and_close() {
    let c = Content::new();
    c.write("a.txt", b"A");
    let cfg = config(&c, "[timeouts]\nheader = \"1s\"");
    let s = Server::start(&["--config", cfg.arg()]);

    // A head that never completes.
    let mut sock = TcpStream::connect(s.addr()).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    sock.write_all(b"GET /a.txt HTTP/1.1\r\nHost: x\r\n").unwrap();
    let (data, took) = read_to_close(&mut sock, Duration::from_secs(10));
    let r = parse_response(&data).unwrap_or_else(|| {
        panic!(
            "no 408 response: {} bytes {:?} after {took:?}; the server's log:\n{}",
            data.len(),
            String::from_utf8_lossy(&data),
            s.stderr()
        )
    });
    assert_eq!(r.status, 408);
    assert!(took < Duration::from_secs(4), "{took:?}");

    // Slowloris: one byte every 200 ms does not extend the deadline.
    let mut sock = TcpStream::connect(s.addr()).unwrap();
    sock.set_nonblocking(false).unwrap();
    let start = Instant::now();
    let mut closed_after = None;
    for b in b"GET /a.txt HTTP/1.1\r\nHost: x\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa" {
        if sock.write_all(&[*b]).is_err() {
            closed_after = Some(start.elapsed());
            break;
        }
        // The trickle itself: a slow client is the behaviour under test.
        std::thread::sleep(Duration::from_millis(200));
        if start.elapsed() > Duration::from_secs(8) {
            break;
        }
    }
    let closed_after = closed_after.unwrap_or_else(|| {
        let (_, _) = read_to_close(&mut sock, Duration::from_secs(5));
        start.elapsed()
    });
    assert!(closed_after < Duration::from_secs(5), "trickling client kept for {closed_after:?}");
}

#[test]
fn idle_connections_are_closed() {
    let c = Content::new();
    c.write("a.txt", b"A");
    let cfg = config(&c, "[timeouts]\nheader = \"1s\"\nkeepalive = \"1s\"");
    let s = Server::start(&["--config", cfg.arg()]);

    // Connected, never sent anything: closed silently after the header timeout.
    let mut sock = TcpStream::connect(s.addr()).unwrap();
    let (data, took) = read_to_close(&mut sock, Duration::from_secs(10));
    assert!(data.is_empty());
    assert!(took >= Duration::from_millis(800) && took < Duration::from_secs(4), "{took:?}");

    // Idle after a response: closed after the keep-alive timeout.
    let mut sock = TcpStream::connect(s.addr()).unwrap();
    sock.write_all(b"GET /a.txt HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let (data, took) = read_to_close(&mut sock, Duration::from_secs(10));
    assert_eq!(parse_response(&data).unwrap().body, b"A");
    assert!(took >= Duration::from_millis(800) && took < Duration::from_secs(4), "{took:?}");
}

#[test]
fn client_that_stops_reading_is_dropped_after_send_timeout() {
    let c = Content::new();
    let size = 64 << 20;
    c.write_random("big.bin", size, 3);
    let cfg = config(&c, "[timeouts]\nsend = \"1s\"");
    let s = Server::start(&["--config", cfg.arg()]);
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    sock.set_recv_buffer_size(64 * 1024).unwrap();
    sock.connect(&s.addr().into()).unwrap();
    let mut sock: TcpStream = sock.into();
    sock.write_all(b"GET /big.bin HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    // Read nothing until the server gives up (after ~1 s without progress): it
    // counts a timeout.
    let gave_up = eventually(Duration::from_secs(10), || s.metric("linerate_errors_total{kind=\"timeout\"}") >= 1.0);
    let start = Instant::now();
    let (data, _) = read_to_close(&mut sock, Duration::from_secs(20));
    assert!(data.len() < size / 2, "server kept sending: {} bytes", data.len());
    assert!(start.elapsed() < Duration::from_secs(10));
    assert!(gave_up, "no send timeout counted");
}

#[test]
fn connection_cap_pauses_accepting() {
    let c = Content::new();
    c.write("a.txt", b"A");
    let cfg = config(&c, "[limits]\nmax_connections_per_worker = 2\n[timeouts]\nheader = \"30s\"");
    let s = Server::start(&["--config", cfg.arg()]);
    let held1 = TcpStream::connect(s.addr()).unwrap();
    let held2 = TcpStream::connect(s.addr()).unwrap();
    // Both accepted: the worker is full.
    assert!(eventually(Duration::from_secs(5), || s.metric_sum("linerate_connections") >= 2.0));
    // The third connection is queued by the kernel but not served while full.
    let mut third = TcpStream::connect(s.addr()).unwrap();
    third.set_read_timeout(Some(Duration::from_millis(700))).unwrap();
    third.write_all(b"GET /a.txt HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
    let cpu_before = s.cpu_ticks();
    let mut buf = [0u8; 1024];
    assert!(crate::common::read_some(&mut third, &mut buf).is_err(), "served beyond the connection cap");
    assert!(s.cpu_ticks() - cpu_before < 20, "the server spun while full");
    drop(held1);
    third.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let data = read_until_close(&mut third, Duration::from_secs(5));
    assert_eq!(parse_response(&data).unwrap().body, b"A");
    drop(held2);
}

#[test]
fn out_of_file_descriptors_backs_off_and_recovers() {
    let c = Content::new();
    c.write("a.txt", b"A");
    let cfg = config(
        &c,
        "[limits]\nmax_connections_per_worker = 1000\n[timeouts]\nheader = \"30s\"\n[open_file_cache]\nentries = 4",
    );
    // 48 descriptors: a few for the runtime and listener, the rest for connections.
    let s = Server::start_wrapped(&["prlimit", "--nofile=48:48"], &["--config", cfg.arg()]);
    let held: Vec<TcpStream> = (0..80).map(|_| TcpStream::connect(s.addr()).unwrap()).collect();
    // Out of descriptors: it says so.
    eventually(Duration::from_secs(5), || s.stderr().contains("accept failed"));
    let ticks_per_sec = 100; // USER_HZ on Linux
    let before = s.cpu_ticks();
    // Two seconds with connections it cannot take: the CPU it spends meanwhile is
    // what is measured, so this pause is the test, not a wait.
    std::thread::sleep(Duration::from_secs(2));
    let used = s.cpu_ticks() - before;
    assert!(used < 2 * ticks_per_sec / 5, "server burnt {used} ticks in 2 s while out of descriptors");
    assert!(s.stderr().contains("accept failed"), "{}", s.stderr());
    drop(held);
    // Once descriptors are free again, it serves.
    assert!(eventually(Duration::from_secs(10), || {
        let out = curl(&["--max-time", "2", &s.url("/a.txt")]);
        out.status.success() && out.stdout == b"A"
    }));
}
