//! The connection state machine against an in-memory transport: keep-alive and
//! close rules, pipelining, HEAD, error statuses, multipart, truncation and
//! timeouts (on tokio's paused clock), with no socket and no worker.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::config::Config;
use crate::counters::tcp_info::Chooser;
use crate::counters::{TransportKind, WorkerCounters};
use crate::server::files::FileCache;
use crate::server::pagecache::memory::MemoryPages;
use crate::transport::SendError;
use answer::absolute_path;
use linerate_urlauth::Verdict;

/// What the mock saw: every byte written, and how the connection was closed.
#[derive(Default)]
struct Seen {
    out: RefCell<Vec<u8>>,
    /// `Some(linger)` once closed.
    closed: Cell<Option<bool>>,
}

struct Mock {
    input: VecDeque<Vec<u8>>,
    /// After the input: end of stream (true) or a client that sends nothing more.
    eof: bool,
    seen: Rc<Seen>,
    body_bytes: u64,
}

impl Transport for Mock {
    const KIND: TransportKind = TransportKind::Plain;

    async fn read(&mut self, buf: &mut Vec<u8>) -> io::Result<usize> {
        match self.input.pop_front() {
            Some(chunk) => {
                buf.extend_from_slice(&chunk);
                Ok(chunk.len())
            }
            None if self.eof => Ok(0),
            None => std::future::pending().await,
        }
    }

    async fn write_all(&mut self, bytes: &[u8], _more: bool) -> Result<(), SendError> {
        self.seen.out.borrow_mut().extend_from_slice(bytes);
        Ok(())
    }

    async fn send_file(&mut self, file: &File, offset: u64, len: u64) -> Result<(), SendError> {
        let mut buf = vec![0u8; len as usize];
        let n = file.read_at(&mut buf, offset)?;
        self.seen.out.borrow_mut().extend_from_slice(&buf[..n]);
        self.body_bytes += n as u64;
        if (n as u64) < len {
            return Err(SendError::Truncated);
        }
        Ok(())
    }

    fn body_bytes_sent(&self) -> u64 {
        self.body_bytes
    }

    async fn close(&mut self, linger: bool) {
        self.seen.closed.set(Some(linger));
    }
}

struct Run {
    out: String,
    linger: Option<bool>,
    counters: Arc<WorkerCounters>,
}

/// Serves `input` (chunks, then EOF or silence) from `root` with `config`.
async fn serve_mock(root: &Path, config: Config, input: &[&[u8]], eof: bool) -> Run {
    serve_mock_with(root, config, input, eof, None).await
}

/// Like `serve_mock`, with body ranges sent through `pages`.
async fn serve_mock_with(
    root: &Path,
    mut config: Config,
    input: &[&[u8]],
    eof: bool,
    pages: Option<MemoryPages>,
) -> Run {
    config.root = Some(root.to_owned());
    let settings = Settings::new(config, 1, 1024, None).unwrap();
    let c = &settings.config.open_file_cache;
    let counters = Arc::new(WorkerCounters::new(0, None, None, 0));
    let ctx =
        Context::new(0, FileCache::new(c.entries, c.valid), counters.clone(), pages, Chooser::new(0.0, 1), vec![], 7);
    *ctx.signed.borrow_mut() = settings.signed.clone();
    let seen = Rc::new(Seen::default());
    let io = Mock { input: input.iter().map(|c| c.to_vec()).collect(), eof, seen: seen.clone(), body_bytes: 0 };
    serve(
        io,
        &ctx,
        &settings,
        ConnInfo { peer: ([127, 0, 0, 1], 40000).into(), sampler: None, cross_domain: false, tls: None },
    )
    .await;
    let out = String::from_utf8_lossy(&seen.out.borrow()).into_owned();
    Run { out, linger: seen.closed.get(), counters }
}

fn content() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a"), b"alpha").unwrap();
    std::fs::write(dir.path().join("b"), b"0123456789").unwrap();
    let big: Vec<u8> = (0..20_000u32).map(|i| b'a' + (i % 26) as u8).collect();
    std::fs::write(dir.path().join("c"), big).unwrap();
    dir
}

fn statuses(out: &str) -> Vec<&str> {
    out.match_indices("HTTP/1.1 ").map(|(i, _)| &out[i + 9..i + 12]).collect()
}

#[tokio::test]
async fn pipelined_requests_are_answered_in_order_and_eof_closes_quietly() {
    let dir = content();
    let input: &[&[u8]] = &[b"GET /a HTTP/1.1\r\nHost: x\r\n\r\nGET /b HTTP/1.1\r\nHost: x\r\n\r\n"];
    let r = serve_mock(dir.path(), Config::default(), input, true).await;
    assert_eq!(statuses(&r.out), ["200", "200"]);
    let (first, second) = (r.out.find("alpha").unwrap(), r.out.find("0123456789").unwrap());
    assert!(first < second, "{}", r.out);
    assert!(!r.out.contains("Connection: close"));
    assert_eq!(r.linger, Some(false));
    assert_eq!(r.counters.requests(), 2);
}

#[tokio::test]
async fn head_gets_the_fields_and_no_body() {
    let dir = content();
    let r = serve_mock(dir.path(), Config::default(), &[b"HEAD /b HTTP/1.1\r\nHost: x\r\n\r\n"], true).await;
    assert_eq!(statuses(&r.out), ["200"]);
    assert!(r.out.contains("Content-Length: 10\r\n"), "{}", r.out);
    assert!(r.out.ends_with("\r\n\r\n"), "a body followed the head: {}", r.out);
}

#[tokio::test]
async fn malformed_request_gets_400_and_a_lingering_close() {
    let dir = content();
    let r = serve_mock(dir.path(), Config::default(), &[b"GARBAGE\r\n\r\n"], false).await;
    assert_eq!(statuses(&r.out), ["400"]);
    assert!(r.out.contains("Connection: close\r\n"));
    assert!(r.out.ends_with("400 Bad Request\n"), "{}", r.out);
    assert_eq!(r.linger, Some(true));
    assert_eq!(r.counters.errors_of(ErrorKind::BadRequest), 1);
}

#[tokio::test]
async fn connection_close_ends_after_one_response_and_lingers_over_unread_bytes() {
    let dir = content();
    let input: &[&[u8]] =
        &[b"GET /a HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\nGET /b HTTP/1.1\r\nHost: x\r\n\r\n"];
    let r = serve_mock(dir.path(), Config::default(), input, false).await;
    assert_eq!(statuses(&r.out), ["200"]);
    assert!(r.out.contains("Connection: close\r\n"));
    assert_eq!(r.linger, Some(true), "unread pipelined bytes: close must not reset");
}

#[tokio::test]
async fn unknown_method_gets_405_and_the_connection_goes_on() {
    let dir = content();
    let input: &[&[u8]] = &[b"DELETE /a HTTP/1.1\r\nHost: x\r\n\r\n", b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n"];
    let r = serve_mock(dir.path(), Config::default(), input, true).await;
    assert_eq!(statuses(&r.out), ["405", "200"]);
    assert!(r.out.contains("Allow: GET, HEAD, OPTIONS\r\n"));
}

#[tokio::test]
async fn missing_file_is_404_and_escape_is_400() {
    let dir = content();
    let input: &[&[u8]] = &[b"GET /nope HTTP/1.1\r\nHost: x\r\n\r\nGET /../a HTTP/1.1\r\nHost: x\r\n\r\n"];
    let r = serve_mock(dir.path(), Config::default(), input, true).await;
    assert_eq!(statuses(&r.out), ["404", "400"]);
}

#[tokio::test]
async fn multipart_ranges_carry_exact_parts() {
    let dir = content();
    // Far apart, so they are not merged into one range.
    let input: &[&[u8]] = &[b"GET /c HTTP/1.1\r\nHost: x\r\nRange: bytes=0-1,19998-19999\r\n\r\n"];
    let r = serve_mock(dir.path(), Config::default(), input, true).await;
    assert_eq!(statuses(&r.out), ["206"]);
    assert!(r.out.contains("multipart/byteranges; boundary="), "{}", r.out);
    assert!(r.out.contains("Content-Range: bytes 0-1/20000\r\n\r\nab\r\n"), "{}", r.out);
    assert!(r.out.contains("Content-Range: bytes 19998-19999/20000\r\n\r\nef\r\n"), "{}", r.out);
    // Content-Length counts exactly the body that followed the head.
    let head_end = r.out.find("\r\n\r\n").unwrap() + 4;
    let declared: usize =
        r.out.split("Content-Length: ").nth(1).unwrap().split("\r\n").next().unwrap().parse().unwrap();
    assert_eq!(declared, r.out.len() - head_end);
}

#[tokio::test]
async fn a_file_that_shrank_mid_response_closes_the_connection() {
    let dir = content();
    // The open-file cache trusts its entry for a minute, so the size planned is the
    // old one while the file now holds 3 bytes.
    let mut config = Config::default();
    config.open_file_cache.valid = Duration::from_secs(60);
    config.root = Some(dir.path().to_owned());
    let settings = Settings::new(config, 1, 1024, None).unwrap();
    let counters = Arc::new(WorkerCounters::new(0, None, None, 0));
    let ctx = Context::<MemoryPages>::new(
        0,
        FileCache::new(8, Duration::from_secs(60)),
        counters.clone(),
        None,
        Chooser::new(0.0, 1),
        vec![],
        7,
    );
    let seen = Rc::new(Seen::default());
    let io = || Mock {
        input: [b"GET /b HTTP/1.1\r\nHost: x\r\n\r\n".to_vec()].into(),
        eof: true,
        seen: seen.clone(),
        body_bytes: 0,
    };
    serve(
        io(),
        &ctx,
        &settings,
        ConnInfo { peer: ([127, 0, 0, 1], 40000).into(), sampler: None, cross_domain: false, tls: None },
    )
    .await;
    let f = std::fs::OpenOptions::new().write(true).open(dir.path().join("b")).unwrap();
    f.set_len(3).unwrap();
    seen.out.borrow_mut().clear();
    serve(
        io(),
        &ctx,
        &settings,
        ConnInfo { peer: ([127, 0, 0, 1], 40000).into(), sampler: None, cross_domain: false, tls: None },
    )
    .await;
    let out = String::from_utf8_lossy(&seen.out.borrow()).into_owned();
    assert!(out.contains("Content-Length: 10\r\n"), "{out}");
    assert!(out.ends_with("\r\n\r\n012"), "exactly the bytes the file still had: {out}");
    assert_eq!(counters.errors_of(ErrorKind::Truncated), 1);
    assert_eq!(seen.closed.get(), Some(false));
}

#[tokio::test(start_paused = true)]
async fn a_head_that_never_completes_gets_408() {
    let dir = content();
    let r = serve_mock(dir.path(), Config::default(), &[b"GET /a HTTP/1.1\r\nHost"], false).await;
    assert_eq!(statuses(&r.out), ["408"]);
    assert_eq!(r.linger, Some(true));
    assert_eq!(r.counters.errors_of(ErrorKind::Timeout), 1);
}

#[tokio::test(start_paused = true)]
async fn an_idle_keep_alive_connection_closes_quietly() {
    let dir = content();
    let started = tokio::time::Instant::now();
    let r = serve_mock(dir.path(), Config::default(), &[b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n"], false).await;
    assert_eq!(statuses(&r.out), ["200"], "no 408 for an idle connection");
    assert_eq!(r.linger, Some(false));
    assert!(started.elapsed() >= Config::default().timeouts.keepalive);
}

#[tokio::test]
async fn signed_prefixes_answer_403_and_410_and_the_connection_goes_on() {
    let dir = content();
    std::fs::create_dir(dir.path().join("premium")).unwrap();
    std::fs::write(dir.path().join("premium/a"), b"secret-a").unwrap();
    std::fs::write(dir.path().join("premium/index.html"), b"index").unwrap();
    let config = Config::from_toml(
        "[[signed]]\nprefix = \"/premium/\"\nmode = \"secure_link\"\nexpression = \"$secure_link_expires$uri secret\"\n",
    )
    .unwrap();
    // printf '%s' '2147483647/premium/a secret' | openssl md5 -binary | openssl base64 | tr +/ -_ | tr -d =
    let good = "md5=zVREElI7XMrS3RUG1oKwgw&expires=2147483647";
    // printf '%s' '1000000000/premium/a secret' | ... (expired in 2001)
    let expired = "md5=1uFr-sXy7LNH8sNTPNkNAw&expires=1000000000";
    // printf '%s' '2147483647/premium/ secret' | ...
    let dir_good = "md5=37HI6dVqu1Fn_D3NZFj3_Q&expires=2147483647";
    let requests = [
        format!("GET /premium/a?{good} HTTP/1.1\r\nHost: x\r\n\r\n"),
        "GET /premium/a HTTP/1.1\r\nHost: x\r\n\r\n".to_string(),
        format!("GET /premium/a?{expired} HTTP/1.1\r\nHost: x\r\n\r\n"),
        format!("HEAD /premium/a?{} HTTP/1.1\r\nHost: x\r\n\r\n", good.replace("zVRE", "zVRF")),
        "GET /a HTTP/1.1\r\nHost: x\r\n\r\n".to_string(),
        format!("GET /x/../premium//a?{good} HTTP/1.1\r\nHost: x\r\n\r\n"),
        format!("GET /premium/?{dir_good} HTTP/1.1\r\nHost: x\r\n\r\n"),
        format!("GET /premium/nothing-here?{good} HTTP/1.1\r\nHost: x\r\n\r\n"),
    ];
    let input: Vec<&[u8]> = requests.iter().map(|r| r.as_bytes()).collect();
    let r = serve_mock(dir.path(), config, &input, true).await;
    assert_eq!(statuses(&r.out), ["200", "403", "410", "403", "200", "200", "200", "403"], "{}", r.out);
    assert!(r.out.contains("410 Gone\n"), "{}", r.out);
    assert_eq!(r.out.matches("secret-a").count(), 2, "{}", r.out);
    let count = |label: &str| r.counters.signed[Verdict::LABELS.iter().position(|l| *l == label).unwrap()].get();
    assert_eq!(
        [count("allowed"), count("missing"), count("expired"), count("bad_signature")],
        [3, 1, 1, 2],
        "the unsigned /a is not counted"
    );
    assert_eq!(r.counters.responses[Status::Gone.index()].get(), 1);
}

#[test]
fn signed_urls_check_the_path_as_nginx_writes_uri() {
    let mut buf = Vec::new();
    for (relative, dir, want) in
        [("", true, "/"), ("", false, "/"), ("a/b.mp4", false, "/a/b.mp4"), ("a/d", true, "/a/d/")]
    {
        absolute_path(relative.as_bytes(), dir, &mut buf);
        assert_eq!(buf, want.as_bytes());
    }
}

/// The in-memory page cache: windows of 4 KiB, a fill takes `fill_ms` of the
/// paused clock, a connection waits at most 1 s for one.
fn memory_pages(fill_ms: u64) -> MemoryPages {
    MemoryPages::new(4096, Duration::from_millis(fill_ms), Duration::from_secs(1))
}

#[tokio::test(start_paused = true)]
async fn a_cold_range_waits_for_its_fills_and_its_bytes_are_exact() {
    let dir = content();
    let started = tokio::time::Instant::now();
    let input: &[&[u8]] = &[b"GET /c HTTP/1.1\r\nHost: x\r\nRange: bytes=100-10099\r\n\r\n"];
    let r = serve_mock_with(dir.path(), Config::default(), input, true, Some(memory_pages(300))).await;
    assert_eq!(statuses(&r.out), ["206"]);
    let body = &r.out[r.out.find("\r\n\r\n").unwrap() + 4..];
    let big: String = (0..20_000u32).map(|i| (b'a' + (i % 26) as u8) as char).collect();
    assert_eq!(body, &big[100..10100], "the bytes of windows 0, 1 and 2");
    // Three windows, each filled once, one after the other.
    assert_eq!(started.elapsed(), Duration::from_millis(900));
    assert_eq!(r.counters.errors_of(ErrorKind::Disk), 0);
}

#[tokio::test(start_paused = true)]
async fn a_resident_range_goes_at_once() {
    let dir = content();
    let pages = memory_pages(300);
    let ino = std::fs::metadata(dir.path().join("c")).unwrap();
    use std::os::unix::fs::MetadataExt;
    pages.make_resident((ino.dev(), ino.ino()), 0, 20_000);
    let started = tokio::time::Instant::now();
    let input: &[&[u8]] = &[b"GET /c HTTP/1.1\r\nHost: x\r\n\r\n"];
    let r = serve_mock_with(dir.path(), Config::default(), input, true, Some(pages)).await;
    assert_eq!(statuses(&r.out), ["200"]);
    let big: String = (0..20_000u32).map(|i| (b'a' + (i % 26) as u8) as char).collect();
    assert!(r.out.ends_with(&big), "the whole file");
    assert_eq!(started.elapsed(), Duration::ZERO, "no fill waited for");
}

#[tokio::test(start_paused = true)]
async fn a_failed_fill_cuts_the_response_and_closes_the_connection() {
    let dir = content();
    let pages = memory_pages(300);
    pages.failing.set(true);
    // The second request never gets an answer: the connection closes after the first.
    let input: &[&[u8]] = &[b"GET /c HTTP/1.1\r\nHost: x\r\n\r\nGET /a HTTP/1.1\r\nHost: x\r\n\r\n"];
    let r = serve_mock_with(dir.path(), Config::default(), input, true, Some(pages)).await;
    assert_eq!(statuses(&r.out), ["200"], "the head is out before the body needs the disk");
    assert!(r.out.contains("Content-Length: 20000\r\n"));
    assert!(r.out.ends_with("\r\n\r\n"), "no body byte was sent, none made up: {}", r.out);
    assert_eq!(r.counters.errors_of(ErrorKind::Disk), 1);
    assert_eq!(r.linger, Some(true), "closed, with the next request unread");
}

#[tokio::test(start_paused = true)]
async fn a_fill_past_the_timeout_closes_the_connection() {
    let dir = content();
    let started = tokio::time::Instant::now();
    let input: &[&[u8]] = &[b"GET /b HTTP/1.1\r\nHost: x\r\n\r\n"];
    let r = serve_mock_with(dir.path(), Config::default(), input, true, Some(memory_pages(5000))).await;
    assert_eq!(statuses(&r.out), ["200"]);
    assert!(r.out.ends_with("\r\n\r\n"), "{}", r.out);
    assert_eq!(started.elapsed(), Duration::from_secs(1), "waited for the fill timeout, no longer");
    assert_eq!(r.counters.errors_of(ErrorKind::Disk), 1);
}
