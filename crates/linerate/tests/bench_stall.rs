//! `linerate bench` against a server that stalls on purpose: the bench must report
//! timeouts and rebuffers and exit on time, never hang.

use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::bench_support::{bench, num};

const SIZE: u64 = 4 << 20;

/// How the test server misbehaves.
#[derive(Clone, Copy)]
enum Stall {
    /// Answers HEADs and range requests that start before this offset in full;
    /// later ones get their head and half their body, then nothing, with the
    /// connection held open. (By offset, not by arrival order, so the sessions'
    /// start-up segments are served whatever order their requests come in.)
    AfterOffset(u64),
    /// Accepts connections and never answers anything.
    Always,
    /// Serves one connection (as `AfterOffset(0)`), then closes its listener.
    OneConnection,
}

/// A tiny HTTP server in a thread. Stops accepting when dropped; connection threads
/// end when the client closes.
struct StallingServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
}

impl StallingServer {
    fn start(stall: Stall) -> StallingServer {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let served = Arc::new(AtomicUsize::new(0));
        let flag = stop.clone();
        std::thread::spawn(move || {
            while !flag.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((s, _)) => {
                        let served = served.clone();
                        std::thread::spawn(move || serve(s, stall, &served));
                        if matches!(stall, Stall::OneConnection) {
                            return; // drops the listener: later connects are refused
                        }
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        StallingServer { addr, stop }
    }
}

impl Drop for StallingServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn serve(mut s: TcpStream, stall: Stall, served: &AtomicUsize) {
    s.set_nonblocking(false).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap(); // bounded even if the client never closes
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
            match crate::common::read_some(&mut s, &mut chunk) {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
            continue;
        };
        if matches!(stall, Stall::Always) {
            hold(&mut s);
            return;
        }
        let head = String::from_utf8_lossy(&buf[..end]).into_owned();
        buf.drain(..end + 4);
        if head.starts_with("HEAD ") {
            let _ = s.write_all(format!("HTTP/1.1 200 OK\r\nContent-Length: {SIZE}\r\n\r\n").as_bytes());
            continue;
        }
        let range = head.lines().find_map(|l| l.strip_prefix("Range: bytes=")).expect("a range request");
        let (a, b) = range.split_once('-').unwrap();
        let (a, b): (u64, u64) = (a.parse().unwrap(), b.parse().unwrap());
        let len = b - a + 1;
        let _ = s.write_all(
            format!(
                "HTTP/1.1 206 Partial Content\r\nContent-Range: bytes {a}-{b}/{SIZE}\r\nContent-Length: {len}\r\n\r\n"
            )
            .as_bytes(),
        );
        served.fetch_add(1, Ordering::Relaxed);
        let full_below = match stall {
            Stall::AfterOffset(offset) => offset,
            _ => 0,
        };
        if a < full_below {
            let _ = s.write_all(&vec![0u8; len as usize]);
        } else {
            let _ = s.write_all(&vec![0u8; len as usize / 2]);
            hold(&mut s);
            return;
        }
    }
}

/// Keeps the connection open without answering until the client goes away.
fn hold(s: &mut TcpStream) {
    let mut sink = [0u8; 4096];
    while let Ok(n) = crate::common::read_some(s, &mut sink) {
        if n == 0 {
            break;
        }
    }
}

#[test]
fn a_server_that_stalls_mid_stream_gives_timeouts_and_rebuffers_not_a_hang() {
    // Segments 0 and 1 (the start-up buffer) are answered; every later one stalls
    // half-way. 3 viewers x 2 start-up segments = 6 full answers. 64 KiB at 2 Mb/s
    // = 0.26 s per segment.
    let server = StallingServer::start(Stall::AfterOffset(2 * 65536));
    let base = format!("http://{}/", server.addr);
    let run = bench(
        &[
            "--base-url",
            &base,
            "--files",
            "title.mp4",
            "--sessions",
            "3",
            "--duration",
            "3",
            "--bitrate-mbps",
            "2",
            "--segment-bytes",
            "65536",
            "--startup-segments",
            "2",
            "--timeout",
            "0.5",
            "--json",
        ],
        Duration::from_secs(20),
    );
    let j = run.json();
    assert_eq!(num(&j, "plays_started"), 3.0, "{j:#}");
    assert!(num(&j, "errors.timeout") >= 3.0, "every stalled request times out: {j:#}");
    assert!(num(&j, "rebuffers") >= 3.0, "each viewer stalls: {j:#}");
    // Playback started at about 0 s and nothing arrived after: most of the watch
    // time was spent stalled.
    assert!(num(&j, "rebuffer_ratio") > 0.5, "{j:#}");
    assert!(num(&j, "stall_s") > 3.0, "{j:#}");
    assert_eq!(num(&j, "requests"), 6.0, "{j:#}");
    assert_eq!(num(&j, "sessions_dropped_at_backstop"), 0.0);
    assert!(run.elapsed < Duration::from_secs(8), "took {:?}", run.elapsed);
}

#[test]
fn a_server_that_never_answers_fails_discovery_in_bounded_time() {
    let server = StallingServer::start(Stall::Always);
    let base = format!("http://{}/", server.addr);
    let run = bench(
        &["--base-url", &base, "--files", "title.mp4", "--sessions", "2", "--duration", "2", "--timeout", "1"],
        Duration::from_secs(20),
    );
    assert!(!run.success);
    assert!(run.stderr.contains("no response within"), "{}", run.stderr);
    assert!(run.elapsed < Duration::from_secs(5), "took {:?}", run.elapsed);
}

#[test]
fn refused_connections_count_as_connect_errors_with_back_off() {
    // The server answers the discovery connection, then closes its listener: every
    // session's connect is refused.
    let server = StallingServer::start(Stall::OneConnection);
    let base = format!("http://{}/", server.addr);
    let run = bench(
        &["--base-url", &base, "--files", "title.mp4", "--sessions", "2", "--duration", "2", "--json"],
        Duration::from_secs(20),
    );
    let j = run.json();
    let connect = num(&j, "errors.connect");
    // Back-off of 200 ms doubling: about 4 attempts per session in 2 s, not thousands.
    assert!((2.0..=16.0).contains(&connect), "{j:#}");
    assert_eq!(num(&j, "errors_total"), connect);
    assert_eq!(num(&j, "plays_started"), 0.0);
    assert_eq!(num(&j, "plays_not_started"), 2.0);
    // Viewers that never saw a picture count in the play delay with their whole wait.
    assert_eq!(num(&j, "play_delay_ms.count"), 2.0);
    assert!(num(&j, "play_delay_ms.p50") >= 1900.0, "{j:#}");
    assert_eq!(num(&j, "requests"), 0.0);
    assert!(j["first_error"].as_str().unwrap().contains("connect"), "{j:#}");
}
