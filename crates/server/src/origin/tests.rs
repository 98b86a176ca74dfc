//! The origin client against real sockets on 127.0.0.1: servers started by each
//! test (raw TCP writing canned bytes; a rustls server on a thread for HTTPS), the
//! client on its own origin runtime.

use std::future::Future;
use std::io::{Read as _, Write as _};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustls::pki_types::pem::PemObject;

use super::connect::IDLE_CONNECTION_SECS;
use super::content_range::ContentRange;
use super::error::KINDS;
use super::stats::FIRST_BYTE_SECONDS;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinSet;

use super::*;
use crate::config::Origin;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A table with short timeouts, so that a test waiting on one stays fast.
fn table(prefix: &str, urls: &[String]) -> Origin {
    let mut t: Origin = toml::from_str(&format!("prefix = {prefix:?}\nurls = []")).unwrap();
    t.urls = urls.to_vec();
    t.connect_timeout = ms(500);
    t.first_byte_timeout = ms(300);
    t.idle_timeout = ms(300);
    t
}

/// What a test server does once it has read a request head.
#[derive(Clone)]
enum Reply {
    /// Writes these bytes and reads the next request.
    Keep(Vec<u8>),
    /// Writes these bytes and closes the connection.
    Close(Vec<u8>),
    /// Writes these bytes and then neither reads nor writes, nor closes.
    Stall(Vec<u8>),
    /// Waits, writes these bytes and reads the next request (an origin holding
    /// a blocking request).
    Delay(Duration, Vec<u8>),
}

fn response(head: &str, body: &str) -> Vec<u8> {
    format!("{head}\r\n\r\n{body}").into_bytes()
}

fn ok(body: &str) -> Vec<u8> {
    response(&format!("HTTP/1.1 200 OK\r\nContent-Length: {}", body.len()), body)
}

/// A raw HTTP server: reads request heads, answers the n-th (counted across its
/// connections) with `reply(n)`. Dropping it stops it and closes its connections.
struct Server {
    port: u16,
    accepts: Arc<AtomicUsize>,
    heads: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Server {
    async fn start(reply: impl Fn(usize) -> Reply + Send + Sync + 'static) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let accepts = Arc::new(AtomicUsize::new(0));
        let heads = Arc::new(Mutex::new(Vec::new()));
        let reply = Arc::new(reply);
        let (a, h) = (accepts.clone(), heads.clone());
        let task = tokio::spawn(async move {
            // Dropped with this task: every connection task is aborted with it.
            let mut connections = JoinSet::new();
            loop {
                let (socket, _) = listener.accept().await.unwrap();
                a.fetch_add(1, Ordering::SeqCst);
                connections.spawn(serve(socket, reply.clone(), h.clone()));
            }
        });
        Server { port, accepts, heads, task }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/", self.port)
    }

    fn accepts(&self) -> usize {
        self.accepts.load(Ordering::SeqCst)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve(
    mut socket: TcpStream,
    reply: Arc<dyn Fn(usize) -> Reply + Send + Sync>,
    heads: Arc<Mutex<Vec<String>>>,
) {
    let mut buf = Vec::new();
    loop {
        let end = loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            let mut piece = [0u8; 4096];
            match socket.read(&mut piece).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&piece[..n]),
            }
        };
        let head: Vec<u8> = buf.drain(..end).collect();
        let n = {
            let mut heads = heads.lock().unwrap();
            heads.push(String::from_utf8_lossy(&head).into_owned());
            heads.len() - 1
        };
        match reply(n) {
            Reply::Keep(bytes) => {
                if socket.write_all(&bytes).await.is_err() {
                    return;
                }
            }
            Reply::Close(bytes) => {
                let _ = socket.write_all(&bytes).await;
                return;
            }
            Reply::Delay(wait, bytes) => {
                tokio::time::sleep(wait).await;
                if socket.write_all(&bytes).await.is_err() {
                    return;
                }
            }
            Reply::Stall(bytes) => {
                let _ = socket.write_all(&bytes).await;
                std::future::pending::<()>().await;
            }
        }
    }
}

/// A port nothing listens on.
fn refused_url() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    format!("http://127.0.0.1:{port}/")
}

/// Runs `f` on the origin runtime, as the cache will, and waits for its result.
async fn on_origin<T, F>(origins: &Arc<Origins>, f: impl FnOnce(Arc<Origins>) -> F) -> T
where
    T: Send + 'static,
    F: Future<Output = T> + Send + 'static,
{
    let (tx, rx) = oneshot::channel();
    let fut = f(origins.clone());
    origins.spawn(async move {
        let _ = tx.send(fut.await);
    });
    rx.await.unwrap()
}

/// A response as the test saw it: head, the body bytes that came, how the body ended.
struct Fetched {
    status: u16,
    url: usize,
    headers: http::HeaderMap,
    content_range: Result<Option<ContentRange>, String>,
    body: Vec<u8>,
    end: Result<(), OriginError>,
}

async fn fetch(origins: &Arc<Origins>, table: usize, req: OriginRequest) -> Result<Fetched, OriginError> {
    on_origin(origins, move |o| async move {
        let mut r = o.fetch(table, &req).await?;
        let mut body = Vec::new();
        let end = loop {
            match r.chunk().await {
                Ok(Some(piece)) => body.extend_from_slice(&piece),
                Ok(None) => break Ok(()),
                Err(e) => break Err(e),
            }
        };
        let content_range = r.content_range().map_err(|e| e.to_string());
        Ok(Fetched { status: r.status, url: r.url, headers: r.headers.clone(), content_range, body, end })
    })
    .await
}

fn get(path: &str) -> OriginRequest {
    OriginRequest { path: path.as_bytes().to_vec(), ..OriginRequest::default() }
}

fn errors(stats: &UrlStats, kind: &str) -> u64 {
    stats.errors.iter().find(|e| e.0 == kind).unwrap().1
}

async fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(3);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(ms(10)).await;
    }
}

#[test]
fn route_picks_the_longest_prefix_and_returns_the_rest() {
    let url = vec!["http://127.0.0.1:1/".to_string()];
    let tables = [table("/vod/", &url), table("/vod/live/", &url), table("/a/", &url)];
    let origins = Origins::start(&tables, &[], 1).unwrap();
    assert_eq!(origins.route(b"/vod/a/b.mp4"), Some((0, &b"a/b.mp4"[..])));
    assert_eq!(origins.route(b"/vod/live/x.ts"), Some((1, &b"x.ts"[..])));
    assert_eq!(origins.route(b"/vod/livex.ts"), Some((0, &b"livex.ts"[..])));
    assert_eq!(origins.route(b"/a/"), Some((2, &b""[..])));
    assert_eq!(origins.route(b"/vod"), None);
    assert_eq!(origins.route(b"/b/x"), None);
    assert_eq!(origins.table(1).prefix, "/vod/live/");
}

#[test]
fn tasks_run_on_the_named_origin_threads() {
    let origins = Origins::start(&[], &[], 2).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    for _ in 0..4 {
        let tx = tx.clone();
        origins.spawn(async move {
            tx.send(std::thread::current().name().map(str::to_string)).unwrap();
        });
    }
    let mut names: Vec<String> = (0..4).map(|_| rx.recv().unwrap().unwrap()).collect();
    names.sort();
    assert_eq!(names, ["linerate-origin0", "linerate-origin0", "linerate-origin1", "linerate-origin1"]);
}

#[test]
fn spawn_here_stays_on_the_calling_origin_thread() {
    let origins = Origins::start(&[], &[], 2).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    for _ in 0..4 {
        let (o, tx) = (origins.clone(), tx.clone());
        origins.spawn(async move {
            let spawner = runtime::current();
            o.spawn_here(async move { tx.send((spawner, runtime::current())).unwrap() });
        });
    }
    let mut threads = Vec::new();
    for _ in 0..4 {
        let (spawner, ran) = rx.recv().unwrap();
        assert_eq!(spawner, ran);
        threads.push(ran.expect("on an origin thread").1);
    }
    threads.sort();
    assert_eq!(threads, [0, 0, 1, 1], "spawned in turn, each then kept on its thread");
    // From outside the origin threads: in turn, as `spawn`.
    assert_eq!(runtime::current(), None);
    for _ in 0..2 {
        let tx = tx.clone();
        origins.spawn_here(async move { tx.send((None, runtime::current())).unwrap() });
    }
    let mut outside: Vec<usize> = (0..2).map(|_| rx.recv().unwrap().1.unwrap().1).collect();
    outside.sort();
    assert_eq!(outside, [0, 1]);
}

#[tokio::test]
async fn the_request_carries_exactly_linerates_fields() {
    let server = Server::start(|n| match n {
        0 => Reply::Keep(ok("ok")),
        _ => Reply::Keep(response("HTTP/1.1 200 OK\r\nContent-Length: 1000", "")),
    })
    .await;
    let mut t = table("/vod/", &[format!("{}media/", server.url())]);
    t.forward_headers = vec!["X-Request-Id".into()];
    let origins = Origins::start(&[t], &[], 1).unwrap();
    let req = OriginRequest {
        head: false,
        path: "a b/é.mp4".as_bytes().to_vec(),
        query: Some(b"t=1".to_vec()),
        range: Some((0, 99)),
        if_none_match: Some(b"\"abc\"".to_vec()),
        if_modified_since: Some(b"Wed, 21 Oct 2015 07:28:00 GMT".to_vec()),
        forwarded: vec![("X-Request-Id".into(), b"42".to_vec()), ("Cookie".into(), b"session=1".to_vec())],
        via: Some(b"1.1 proxy.example".to_vec()),
        peers: true,
        only_if_cached: false,
        hold: false,
    };
    let got = fetch(&origins, 0, req).await.unwrap();
    assert_eq!((got.status, got.url, &got.body[..], got.end.is_ok()), (200, 0, &b"ok"[..], true));

    let head = OriginRequest { head: true, ..get("x.mp4") };
    let got = fetch(&origins, 0, head).await.unwrap();
    assert_eq!((got.status, got.body.len(), got.end.is_ok()), (200, 0, true), "a HEAD's body is empty");
    assert_eq!(got.headers["content-length"], "1000");

    let heads = server.heads.lock().unwrap().clone();
    let lines = |head: &str| -> (String, Vec<String>) {
        let mut lines: Vec<String> = head.trim_end().split("\r\n").map(str::to_string).collect();
        let first = lines.remove(0);
        lines.sort();
        (first, lines)
    };
    let host = format!("host: 127.0.0.1:{}", server.port);
    let version = concat!("user-agent: linerate/", env!("CARGO_PKG_VERSION"));
    let mut want = vec![
        "accept-encoding: identity".to_string(),
        host.clone(),
        "if-modified-since: Wed, 21 Oct 2015 07:28:00 GMT".into(),
        "if-none-match: \"abc\"".into(),
        "range: bytes=0-99".into(),
        version.into(),
        "x-request-id: 42".into(),
        format!("via: 1.1 proxy.example, 1.1 test.{}", std::process::id()),
    ];
    want.sort();
    assert_eq!(lines(&heads[0]), ("GET /media/a%20b/%C3%A9.mp4?t=1 HTTP/1.1".to_string(), want));
    let via = format!("via: 1.1 test.{}", std::process::id());
    let mut want = vec!["accept-encoding: identity".to_string(), host, version.into(), via];
    want.sort();
    assert_eq!(lines(&heads[1]), ("HEAD /media/x.mp4 HTTP/1.1".to_string(), want));
    assert_eq!(server.accepts(), 1, "the HEAD reused the connection");
}

#[tokio::test]
async fn fails_over_on_a_refused_connection() {
    let server = Server::start(|_| Reply::Keep(ok("second"))).await;
    let origins = Origins::start(&[table("/v/", &[refused_url(), server.url()])], &[], 1).unwrap();
    let got = fetch(&origins, 0, get("a")).await.unwrap();
    assert_eq!((got.status, got.url, &got.body[..]), (200, 1, &b"second"[..]));
    let stats = origins.stats();
    assert_eq!((stats[0].requests, errors(&stats[0], "connect")), (1, 1));
    assert_eq!((stats[1].requests, stats[1].responses_by_class, stats[1].body_bytes), (1, [0, 1, 0, 0, 0], 6));
    assert_eq!(stats[1].first_byte_count, 1);
    assert_eq!(stats[1].first_byte_buckets.len(), FIRST_BYTE_SECONDS.len() + 1);
}

#[tokio::test]
async fn fails_over_on_a_5xx_and_returns_the_last_one() {
    let busy = Server::start(|_| Reply::Keep(response("HTTP/1.1 503 Busy\r\nContent-Length: 4", "busy"))).await;
    let fine = Server::start(|_| Reply::Keep(ok("fine"))).await;
    let tables = [table("/a/", &[busy.url(), fine.url()]), table("/b/", &[busy.url(), busy.url()])];
    let origins = Origins::start(&tables, &[], 1).unwrap();
    let got = fetch(&origins, 0, get("x")).await.unwrap();
    assert_eq!((got.status, got.url, &got.body[..]), (200, 1, &b"fine"[..]));
    let e = fetch(&origins, 1, get("x")).await.err().unwrap();
    assert!(matches!(e, OriginError::Status(503)), "{e:?}");
    assert_eq!(e.kind(), "status");
    let stats = origins.stats();
    assert_eq!((stats[0].responses_by_class[4], errors(&stats[0], "status")), (1, 1));
    assert_eq!((stats[2].requests, stats[3].requests), (1, 1));
}

#[tokio::test]
async fn fails_over_on_a_first_byte_timeout() {
    let silent = Server::start(|_| Reply::Stall(Vec::new())).await;
    let fine = Server::start(|_| Reply::Keep(ok("fine"))).await;
    let mut t = table("/a/", &[silent.url(), fine.url()]);
    t.first_byte_timeout = ms(200);
    let origins = Origins::start(&[t], &[], 1).unwrap();
    let started = Instant::now();
    let got = fetch(&origins, 0, get("x")).await.unwrap();
    assert_eq!((got.status, got.url), (200, 1));
    assert!(started.elapsed() >= ms(200));
    assert_eq!(errors(&origins.stats()[0], "timeout"), 1);
    assert_eq!(silent.accepts(), 1);
}

#[tokio::test]
async fn a_held_request_waits_hold_timeout_and_does_not_fail_over() {
    // The origin answers after 400 ms, past first_byte_timeout (200 ms) but
    // within hold_timeout: a held request gets the answer.
    let slow = Server::start(|_| Reply::Delay(ms(400), ok("playlist"))).await;
    let mut t = table("/a/", &[slow.url()]);
    t.first_byte_timeout = ms(200);
    t.hold_timeout = ms(1000);
    let origins = Origins::start(&[t], &[], 1).unwrap();
    let held = OriginRequest { hold: true, ..get("p.m3u8") };
    let got = fetch(&origins, 0, held).await.unwrap();
    assert_eq!((got.status, got.body.as_slice()), (200, &b"playlist"[..]));
    assert!(matches!(fetch(&origins, 0, get("p.m3u8")).await, Err(OriginError::Timeout(Phase::FirstByte))));
    // Past hold_timeout: a timeout, and the next URL is not asked.
    let silent = Server::start(|_| Reply::Stall(Vec::new())).await;
    let fine = Server::start(|_| Reply::Keep(ok("fine"))).await;
    let mut t = table("/a/", &[silent.url(), fine.url()]);
    t.hold_timeout = ms(300);
    let origins = Origins::start(&[t], &[], 1).unwrap();
    let started = Instant::now();
    let e = fetch(&origins, 0, OriginRequest { hold: true, ..get("p.m3u8") }).await.err();
    assert!(matches!(e, Some(OriginError::Timeout(Phase::FirstByte))), "{e:?}");
    assert!(started.elapsed() >= ms(300));
    assert_eq!(fine.accepts(), 0);
}

#[tokio::test]
async fn a_404_is_returned_without_failover() {
    let missing = Server::start(|_| Reply::Keep(response("HTTP/1.1 404 Not Found\r\nContent-Length: 0", ""))).await;
    let other = Server::start(|_| Reply::Keep(ok("other"))).await;
    let origins = Origins::start(&[table("/a/", &[missing.url(), other.url()])], &[], 1).unwrap();
    let got = fetch(&origins, 0, get("x")).await.unwrap();
    assert_eq!((got.status, got.url), (404, 0));
    assert_eq!(other.accepts(), 0);
    assert_eq!(origins.stats()[0].responses_by_class, [0, 0, 0, 1, 0]);
}

#[tokio::test]
async fn a_body_that_stalls_times_out() {
    let server =
        Server::start(|_| Reply::Stall(response("HTTP/1.1 200 OK\r\nContent-Length: 100", "0123456789"))).await;
    let origins = Origins::start(&[table("/a/", &[server.url()])], &[], 1).unwrap();
    let started = Instant::now();
    let got = fetch(&origins, 0, get("x")).await.unwrap();
    assert_eq!(got.body, b"0123456789");
    assert!(matches!(got.end, Err(OriginError::Timeout(Phase::Idle))), "{:?}", got.end);
    assert!(started.elapsed() >= ms(300));
    let stats = &origins.stats()[0];
    assert_eq!((stats.body_bytes, errors(stats, "timeout")), (10, 1));
    wait_for("the stalled connection to close", || origins.stats()[0].open_connections == 0).await;
}

#[tokio::test]
async fn a_body_shorter_or_longer_than_its_content_length_fails() {
    let server = Server::start(|n| match n {
        0 => Reply::Close(response("HTTP/1.1 200 OK\r\nContent-Length: 100", "0123456789")),
        _ => Reply::Keep(response("HTTP/1.1 200 OK\r\nContent-Length: 5", "0123456789")),
    })
    .await;
    let origins = Origins::start(&[table("/a/", &[server.url()])], &[], 1).unwrap();
    let short = fetch(&origins, 0, get("x")).await.unwrap();
    assert_eq!(short.body, b"0123456789");
    match short.end {
        Err(OriginError::BadResponse(e)) => assert!(e.contains("after 10 bytes"), "{e}"),
        e => panic!("{e:?}"),
    }
    let long = fetch(&origins, 0, get("x")).await.unwrap();
    assert_eq!(long.body, b"01234");
    match long.end {
        Err(OriginError::BadResponse(e)) => assert!(e.contains("more than its Content-Length"), "{e}"),
        e => panic!("{e:?}"),
    }
    assert_eq!(errors(&origins.stats()[0], "bad_response"), 2);
}

#[tokio::test]
async fn a_head_over_64_kib_is_refused() {
    let big = format!("HTTP/1.1 200 OK\r\nX-Big: {}\r\nContent-Length: 0", "a".repeat(HEAD_LIMIT_BYTES));
    let server = Server::start(move |_| Reply::Keep(response(&big, ""))).await;
    let origins = Origins::start(&[table("/a/", &[server.url()])], &[], 1).unwrap();
    let e = fetch(&origins, 0, get("x")).await.err().unwrap();
    assert!(matches!(e, OriginError::BadResponse(_)), "{e:?}");
    assert!(e.to_string().contains("too large"), "{e}");
    assert!(!e.fails_over());
}

#[tokio::test]
async fn content_range_of_a_206_is_checked() {
    let server = Server::start(|n| match n {
        0 => Reply::Keep(response(
            "HTTP/1.1 206 Partial Content\r\nContent-Range: bytes 2-3/10\r\nContent-Length: 2",
            "ab",
        )),
        _ => Reply::Keep(response(
            "HTTP/1.1 206 Partial Content\r\nContent-Range: bytes 3-2/10\r\nContent-Length: 2",
            "ab",
        )),
    })
    .await;
    let origins = Origins::start(&[table("/a/", &[server.url()])], &[], 1).unwrap();
    let got = fetch(&origins, 0, OriginRequest { range: Some((2, 3)), ..get("x") }).await.unwrap();
    assert_eq!(got.content_range, Ok(Some(ContentRange { first: Some((2, 3)), total: Some(10) })));
    let got = fetch(&origins, 0, OriginRequest { range: Some((2, 3)), ..get("x") }).await.unwrap();
    assert!(got.content_range.unwrap_err().contains("last byte before the first"));
    assert!(server.heads.lock().unwrap()[0].contains("range: bytes=2-3\r\n"));
}

#[tokio::test]
async fn a_refused_answer_counts_as_a_bad_response_and_closes_its_connection() {
    // The lying origin of tests/origin/cache-tests: a 206 of another range than
    // the one asked for, refused by the cache before its body is read.
    let server = Server::start(|_| {
        Reply::Keep(response("HTTP/1.1 206 Partial Content\r\nContent-Range: bytes 4-5/10\r\nContent-Length: 2", "ab"))
    })
    .await;
    let origins = Origins::start(&[table("/a/", &[server.url()])], &[], 1).unwrap();
    for _ in 0..2 {
        on_origin(&origins, |o| async move {
            let mut r = o.fetch(0, &OriginRequest { range: Some((2, 3)), ..get("x") }).await.unwrap();
            r.refuse("a Content-Range other than the range asked for");
        })
        .await;
    }
    assert_eq!(errors(&origins.stats()[0], "bad_response"), 2);
    assert_eq!(server.accepts(), 2, "a refused answer's connection is not reused");
    wait_for("both connections to close", || origins.stats()[0].open_connections == 0).await;
}

#[tokio::test]
async fn keep_alive_reuses_one_connection_until_the_origin_closes_it() {
    let server = Server::start(|n| match n {
        0 => Reply::Keep(ok("one")),
        _ => Reply::Close(ok("two")),
    })
    .await;
    let origins = Origins::start(&[table("/a/", &[server.url()])], &[], 1).unwrap();
    assert_eq!(fetch(&origins, 0, get("1")).await.unwrap().body, b"one");
    assert_eq!(origins.stats()[0].open_connections, 1, "kept open, idle");
    assert_eq!(origins.tables[0].urls[0].idle_count(), 1);
    assert_eq!(fetch(&origins, 0, get("2")).await.unwrap().body, b"two");
    assert_eq!(server.accepts(), 1);
    wait_for("the closed connection to be counted out", || origins.stats()[0].open_connections == 0).await;
    // The pooled handle of the closed connection is never used again.
    let third = fetch(&origins, 0, get("3")).await.unwrap();
    assert_eq!((third.status, server.accepts()), (200, 2));
}

#[tokio::test]
async fn a_pooled_connection_is_reused_only_on_the_origin_thread_that_opened_it() {
    let server = Server::start(|_| Reply::Keep(ok("x"))).await;
    let origins = Origins::start(&[table("/a/", &[server.url()])], &[], 2).unwrap();
    // Tasks go to the two threads in turn: each opens one connection, then
    // reuses its own, never the other thread's.
    let mut threads = Vec::new();
    for n in 0..6 {
        let got = on_origin(&origins, move |o| async move {
            let mut r = o.fetch(0, &get(&n.to_string())).await?;
            while r.chunk().await?.is_some() {}
            Ok::<_, OriginError>(runtime::current())
        })
        .await
        .unwrap();
        threads.push(got.expect("on an origin thread").1);
    }
    threads.sort();
    assert_eq!(threads, [0, 0, 0, 1, 1, 1]);
    assert_eq!(server.accepts(), 2, "one connection per thread");
    assert_eq!(origins.tables[0].urls[0].idle_count(), 2);
}

#[tokio::test]
async fn no_idle_connection_is_kept_when_max_idle_is_zero() {
    let server = Server::start(|_| Reply::Keep(ok("x"))).await;
    let mut t = table("/a/", &[server.url()]);
    t.max_idle_connections = 0;
    let origins = Origins::start(&[t], &[], 1).unwrap();
    fetch(&origins, 0, get("1")).await.unwrap();
    fetch(&origins, 0, get("2")).await.unwrap();
    assert_eq!(server.accepts(), 2);
    wait_for("both connections to close", || origins.stats()[0].open_connections == 0).await;
}

#[tokio::test]
async fn an_idle_connection_is_closed_once_expired() {
    let server = Server::start(|_| Reply::Keep(ok("x"))).await;
    let origins = Origins::start(&[table("/a/", &[server.url()])], &[], 1).unwrap();
    fetch(&origins, 0, get("1")).await.unwrap();
    let url = &origins.tables[0].urls[0];
    url.sweep();
    assert_eq!((url.idle_count(), origins.stats()[0].open_connections), (1, 1), "not expired yet");
    url.age_idle(Duration::from_secs(IDLE_CONNECTION_SECS));
    url.sweep();
    assert_eq!(url.idle_count(), 0);
    wait_for("the expired connection to close", || origins.stats()[0].open_connections == 0).await;
}

/// A CA certificate (PEM) and an issuer to sign with.
struct Ca {
    pem: String,
    params: rcgen::CertificateParams,
    key: rcgen::KeyPair,
}

fn ca(name: &str) -> Ca {
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params.distinguished_name.push(rcgen::DnType::CommonName, name);
    let key = rcgen::KeyPair::generate().unwrap();
    let pem = params.self_signed(&key).unwrap().pem();
    Ca { pem, params, key }
}

/// A certificate for `localhost` signed by `ca`, and its key.
fn leaf(ca: &Ca) -> (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>) {
    let params = rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, &rcgen::Issuer::from_params(&ca.params, &ca.key)).unwrap();
    let key = PrivateKeyDer::from_pem_slice(key.serialize_pem().as_bytes()).unwrap();
    (vec![CertificateDer::from(cert.der().to_vec())], key)
}

/// What the HTTPS test server saw: the SNI name and the request head.
type Seen = std::io::Result<(Option<String>, String)>;

/// An HTTPS server on a thread for one connection: answers one request with
/// `body` and closes. The thread ends by itself (a deadline on the accept and the reads).
fn tls_server(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    body: String,
) -> (u16, std::thread::JoinHandle<Seen>) {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let thread = std::thread::spawn(move || -> Seen {
        listener.set_nonblocking(true)?;
        let deadline = Instant::now() + Duration::from_secs(5);
        let tcp = loop {
            match listener.accept() {
                Ok((tcp, _)) => break tcp,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock && Instant::now() < deadline => {
                    std::thread::sleep(ms(5))
                }
                Err(e) => return Err(e),
            }
        };
        drop(listener);
        tcp.set_nonblocking(false)?;
        tcp.set_read_timeout(Some(Duration::from_secs(5)))?;
        let conn = rustls::ServerConnection::new(Arc::new(config)).map_err(std::io::Error::other)?;
        let mut tls = rustls::StreamOwned::new(conn, tcp);
        let mut head = Vec::new();
        while !head.ends_with(b"\r\n\r\n") {
            let mut byte = [0u8; 1];
            match tls.read(&mut byte) {
                Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
                Ok(_) => head.push(byte[0]),
                // A timed read is not restarted after a stop and continue (signal(7)).
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        tls.write_all(&ok(&body))?;
        tls.conn.send_close_notify();
        tls.flush()?;
        let sni = tls.conn.server_name().map(str::to_string);
        Ok((sni, String::from_utf8_lossy(&head).into_owned()))
    });
    (port, thread)
}

#[tokio::test]
async fn https_verifies_against_the_ca_file() {
    let dir = tempfile::tempdir().unwrap();
    let (good, other) = (ca("good CA"), ca("other CA"));
    std::fs::write(dir.path().join("good.pem"), &good.pem).unwrap();
    std::fs::write(dir.path().join("other.pem"), &other.pem).unwrap();

    // Many TLS records: the body is read across reads of the socket.
    let body: String = (0..300_000).map(|i| char::from(b'a' + (i % 26) as u8)).collect();
    let (chain, key) = leaf(&good);
    let (port, server) = tls_server(chain, key, body.clone());
    let mut t = table("/a/", &[format!("https://localhost:{port}/")]);
    t.ca_file = Some(dir.path().join("good.pem"));
    let origins = Origins::start(&[t], &[], 1).unwrap();
    let got = fetch(&origins, 0, get("x")).await.unwrap();
    assert_eq!((got.status, got.body == body.as_bytes(), got.end.is_ok()), (200, true, true));
    let (sni, head) = server.join().unwrap().unwrap();
    assert_eq!(sni.as_deref(), Some("localhost"));
    assert!(head.starts_with("GET /x HTTP/1.1\r\n"), "{head}");
    assert!(head.contains(&format!("\r\nhost: localhost:{port}\r\n")), "{head}");

    let (chain, key) = leaf(&good);
    let (port, server) = tls_server(chain, key, "ok".into());
    let mut t = table("/a/", &[format!("https://localhost:{port}/")]);
    t.ca_file = Some(dir.path().join("other.pem"));
    let origins = Origins::start(&[table("/b/", &[refused_url()]), t], &[], 1).unwrap();
    match fetch(&origins, 1, get("x")).await.err().unwrap() {
        OriginError::Connect(e) => {
            assert!(e.contains("not trusted"), "{e}");
            assert!(e.contains("origin[1].ca_file"), "{e}");
        }
        e => panic!("{e:?}"),
    }
    assert!(server.join().unwrap().is_err(), "the server saw the handshake fail");
}

#[test]
fn ca_file_problems_name_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let url = vec!["https://localhost:1/".to_string()];
    let mut t = table("/b/", &url);
    t.ca_file = Some(dir.path().join("missing.pem"));
    let e = Origins::start(&[table("/a/", &url), t.clone()], &[], 1).err().unwrap().to_string();
    assert!(e.starts_with("origin[1].ca_file: ") && e.contains("cannot read"), "{e}");
    std::fs::write(dir.path().join("empty.pem"), "").unwrap();
    t.ca_file = Some(dir.path().join("empty.pem"));
    let e = Origins::start(&[t], &[], 1).err().unwrap().to_string();
    assert!(e.starts_with("origin[0].ca_file: ") && e.contains("contains no certificate"), "{e}");
}

#[test]
fn error_kinds_are_the_metric_labels() {
    let all = [
        OriginError::Connect(String::new()),
        OriginError::Timeout(Phase::Connect),
        OriginError::Status(502),
        OriginError::Reset(String::new()),
        OriginError::BadResponse(String::new()),
        OriginError::Denied(403, None),
        OriginError::Loop,
    ];
    assert_eq!(all.iter().map(OriginError::kind).collect::<Vec<_>>(), KINDS);
    assert!(!OriginError::Timeout(Phase::Idle).fails_over());
    assert!(OriginError::Timeout(Phase::FirstByte).fails_over());
    assert!(!OriginError::Denied(403, None).fails_over());
    assert!(!OriginError::Loop.fails_over());
}

fn s3_table(prefix: &str, urls: &[String]) -> (Origin, Arc<crate::config::S3Credentials>) {
    let mut t = table(prefix, urls);
    t.s3 = Some(toml::from_str("bucket = \"media\"\nregion = \"us-east-1\"").unwrap());
    let c = crate::config::S3Credentials {
        access_key_id: "AKIDTEST".into(),
        secret_access_key: crate::config::Secret("NOT-SHOWN-SECRET".into()),
        session_token: None,
        source: "a test".into(),
    };
    (t, Arc::new(c))
}

#[tokio::test]
async fn s3_requests_are_signed_path_style() {
    let server = Server::start(|_| Reply::Keep(ok("object"))).await;
    let (t, c) = s3_table("/s3/", &[server.url()]);
    let origins = Origins::start(&[t], &[Some(c)], 1).unwrap();
    let req = OriginRequest { range: Some((0, 5)), ..get("dir/a b.mp4") };
    let got = fetch(&origins, 0, req).await.unwrap();
    assert_eq!((got.status, &got.body[..]), (200, &b"object"[..]));
    let head = server.heads.lock().unwrap()[0].to_ascii_lowercase();
    assert!(head.starts_with("get /media/dir/a%20b.mp4 http/1.1\r\n"), "{head}");
    assert!(head.contains("\r\nx-amz-content-sha256: unsigned-payload\r\n"), "{head}");
    assert!(head.contains("\r\nx-amz-date: "), "{head}");
    assert!(head.contains("\r\nauthorization: aws4-hmac-sha256 credential=akidtest/"), "{head}");
    assert!(head.contains("signedheaders=accept-encoding;host;range;x-amz-content-sha256;x-amz-date,"), "{head}");
    assert!(!head.contains("not-shown-secret"), "{head}");
}

#[tokio::test]
async fn an_s3_refusal_is_denied_counted_and_not_passed_on() {
    let body = "<?xml version=\"1.0\"?><Error><Code>InvalidAccessKeyId</Code></Error>";
    let denied = response(
        &format!("HTTP/1.1 403 Forbidden\r\nContent-Type: application/xml\r\nContent-Length: {}", body.len()),
        body,
    );
    let server = Server::start(move |_| Reply::Keep(denied.clone())).await;
    let (t, c) = s3_table("/s3/", &[server.url()]);
    let plain = table("/plain/", &[server.url()]);
    let origins = Origins::start(&[t, plain], &[Some(c), None], 1).unwrap();
    for _ in 0..3 {
        match fetch(&origins, 0, get("a.mp4")).await {
            Err(OriginError::Denied(403, Some(code))) => assert_eq!(code, "InvalidAccessKeyId"),
            other => panic!("{:?}", other.map(|f| f.status)),
        }
    }
    assert_eq!(errors(&origins.stats()[0], "denied"), 3, "every refusal is counted");
    // A plain origin's 403 is an answer like any other: passed on.
    assert_eq!(fetch(&origins, 1, get("a.mp4")).await.unwrap().status, 403);
    assert_eq!(errors(&origins.stats()[1], "denied"), 0);
    let logged = origins.tables[0].denied_logged.load(Ordering::Relaxed);
    assert!(logged > 0, "the first refusal was logged");
    assert!(Origins::start(&[s3_table("/s3/", &[server.url()]).0], &[], 1).is_err(), "no credentials, no start");
}

/// Which of `parents` (their `host:port`) an object of `key` tries first.
fn first_parent(key: &str, parents: &[&Server]) -> usize {
    let ids: Vec<String> = parents.iter().map(|s| format!("127.0.0.1:{}", s.port)).collect();
    (0..ids.len()).max_by_key(|&i| parent::score(key.as_bytes(), &ids[i])).unwrap()
}

#[tokio::test]
async fn parents_are_asked_first_by_key_then_the_origin() {
    let a = Server::start(|_| Reply::Keep(ok("from a"))).await;
    let b = Server::start(|_| Reply::Keep(ok("from b"))).await;
    let origin = Server::start(|_| Reply::Keep(ok("from origin"))).await;
    let mut t = table("/vod/", &[format!("{}media/", origin.url())]);
    t.parents = vec![format!("http://127.0.0.1:{}", a.port), format!("http://127.0.0.1:{}", b.port)];
    let origins = Origins::start(&[t], &[], 1).unwrap();
    let mut seen = [0, 0];
    for n in 0..8 {
        let path = format!("t{n}/seg.m4s");
        let want = first_parent(&format!("/vod/{path}"), &[&a, &b]);
        for _ in 0..2 {
            let got = fetch(&origins, 0, get(&path)).await.unwrap();
            assert_eq!(got.body, if want == 0 { &b"from a"[..] } else { &b"from b"[..] }, "{path}");
        }
        seen[want] += 1;
    }
    assert!(seen[0] > 0 && seen[1] > 0, "8 keys on one parent: {seen:?}");
    let head = a.heads.lock().unwrap()[0].clone();
    assert!(head.starts_with("GET /vod/t"), "a parent is asked for the viewer's path: {head}");
    assert!(head.contains(&format!("via: 1.1 test.{}\r\n", std::process::id())), "{head}");
    assert_eq!(origin.heads.lock().unwrap().len(), 0, "the origin is not asked while the parents answer");
    let stats = origins.parent_stats();
    assert_eq!(stats.iter().map(|p| p.stats.requests).sum::<u64>(), 16);
    assert!(stats.iter().all(|p| p.up));
}

#[tokio::test]
async fn a_failing_parent_is_skipped_then_the_origin_answers() {
    // A 5xx moves on without marking the parent down; no connection marks it down.
    let busy = Server::start(|_| Reply::Keep(response("HTTP/1.1 503 No\r\nContent-Length: 0", ""))).await;
    let origin = Server::start(|_| Reply::Keep(ok("from origin"))).await;
    let dead = refused_url();
    let mut t = table("/vod/", &[origin.url()]);
    t.parents = vec![format!("http://127.0.0.1:{}", busy.port), dead.clone()];
    let origins = Origins::start(&[t], &[], 1).unwrap();
    for n in 0..4 {
        let got = fetch(&origins, 0, get(&format!("{n}.mp4"))).await.unwrap();
        assert_eq!(got.body, b"from origin");
    }
    let stats = origins.parent_stats();
    let (busy_stats, dead_stats) = (&stats[0], &stats[1]);
    assert!(busy_stats.up, "a 5xx does not mark a parent down");
    assert_eq!(busy_stats.stats.requests, 4);
    assert!(!dead_stats.up);
    assert_eq!((dead_stats.stats.requests, dead_stats.marked_down), (1, 1), "asked once, then skipped");
    assert_eq!(errors(&dead_stats.stats, "connect"), 1);
    assert_eq!(origin.heads.lock().unwrap().len(), 4);
}

#[tokio::test]
async fn a_parents_508_ends_the_request() {
    let looping = Server::start(|_| Reply::Keep(response("HTTP/1.1 508 Loop Detected\r\nContent-Length: 0", ""))).await;
    let origin = Server::start(|_| Reply::Keep(ok("from origin"))).await;
    let mut t = table("/vod/", &[origin.url()]);
    t.parents = vec![format!("http://127.0.0.1:{}", looping.port)];
    let origins = Origins::start(&[t], &[], 1).unwrap();
    assert!(matches!(fetch(&origins, 0, get("a.mp4")).await, Err(OriginError::Loop)));
    assert_eq!(origin.heads.lock().unwrap().len(), 0, "a loop is not hidden by the origin");
    assert_eq!(errors(&origins.parent_stats()[0].stats, "loop"), 1);
    assert!(origins.parent_stats()[0].up);
}

#[test]
fn via_entries_are_matched_by_received_by_name() {
    assert!(via_names(b"1.1 edge:8080", b"edge:8080"));
    assert!(via_names(b"1.0 cdn (x), 1.1   edge:8080 (linerate)", b"edge:8080"));
    assert!(!via_names(b"1.1 edge:8081, 1.1 edge:80800", b"edge:8080"));
    assert!(!via_names(b"edge:8080", b"edge:8080"), "the first word is the protocol");
    assert!(!via_names(b"", b"edge:8080"));
}

#[test]
fn this_node_is_left_out_of_its_parents() {
    let mut t = table("/vod/", &["http://127.0.0.1:1/".into()]);
    t.parents = vec!["http://127.0.0.1:8081".into(), "http://127.0.0.1:8082".into()];
    let node = Node { name: "n".into(), listen: vec!["0.0.0.0:8081".parse().unwrap()] };
    let origins = Origins::start_as(&[t], &[], 1, node).unwrap();
    let parents: Vec<String> = origins.parent_stats().into_iter().map(|p| p.stats.url).collect();
    assert_eq!(parents, ["http://127.0.0.1:8082"]);
}

#[tokio::test]
async fn peers_are_asked_only_if_cached_then_the_parents_and_the_origin() {
    // `has` answers from its store; `lacks` answers 504; `dead` refuses connections.
    let has = Server::start(|_| Reply::Keep(ok("from peer"))).await;
    let lacks =
        Server::start(|_| Reply::Keep(response("HTTP/1.1 504 Gateway Timeout\r\nContent-Length: 7", "missing"))).await;
    let parent = Server::start(|_| Reply::Keep(ok("from parent"))).await;
    let origin = Server::start(|_| Reply::Keep(ok("from origin"))).await;
    let mut t = table("/vod/", &[origin.url()]);
    t.peers = vec![format!("http://127.0.0.1:{}", lacks.port)];
    t.parents = vec![format!("http://127.0.0.1:{}", parent.port)];
    let mut with_has = t.clone();
    with_has.prefix = "/live/".into();
    with_has.peers = vec![format!("http://127.0.0.1:{}", has.port)];
    let origins = Origins::start(&[t, with_has], &[], 1).unwrap();
    let stored = |path: &str| OriginRequest { peers: true, ..get(path) };

    // A peer that has it answers; nobody else is asked.
    let got = fetch(&origins, 1, stored("a.mp4")).await.unwrap();
    assert_eq!(got.body, b"from peer");
    let head = has.heads.lock().unwrap()[0].to_ascii_lowercase();
    assert!(head.starts_with("get /live/a.mp4 ") && head.contains("\r\ncache-control: only-if-cached\r\n"), "{head}");
    assert_eq!(origin.heads.lock().unwrap().len(), 0);

    // A peer's 504 is a miss: on to the parent, on the same connection next time.
    for _ in 0..3 {
        assert_eq!(fetch(&origins, 0, stored("b.mp4")).await.unwrap().body, b"from parent");
    }
    let peer = &origins.peer_stats()[0];
    assert_eq!((peer.stats.requests, peer.misses, peer.up), (3, 3, true));
    assert_eq!(errors(&peer.stats, "status"), 0, "a 504 is a miss, not an error");
    assert_eq!(lacks.accepts.load(Ordering::Relaxed), 1, "the 504's body was read: its connection kept");
    assert!(!parent.heads.lock().unwrap()[0].to_ascii_lowercase().contains("only-if-cached"));

    // A passed-through request skips the peers.
    assert_eq!(fetch(&origins, 0, get("c.mp4")).await.unwrap().body, b"from parent");
    assert_eq!(origins.peer_stats()[0].stats.requests, 3);
}

#[tokio::test]
async fn a_dead_peer_is_marked_down_and_peer_tries_bounds_the_asking() {
    let lacks: Vec<Server> = {
        let mut v = Vec::new();
        for _ in 0..3 {
            v.push(
                Server::start(|_| Reply::Keep(response("HTTP/1.1 504 Gateway Timeout\r\nContent-Length: 0", ""))).await,
            );
        }
        v
    };
    let origin = Server::start(|_| Reply::Keep(ok("from origin"))).await;
    let mut t = table("/vod/", &[origin.url()]);
    t.peers = lacks.iter().map(|s| format!("http://127.0.0.1:{}", s.port)).collect();
    t.peers.push(refused_url().trim_end_matches('/').to_string());
    t.peer_tries = 2;
    let origins = Origins::start(&[t], &[], 1).unwrap();
    for n in 0..20 {
        let req = OriginRequest { peers: true, ..get(&format!("t{n}.mp4")) };
        assert_eq!(fetch(&origins, 0, req).await.unwrap().body, b"from origin");
    }
    let stats = origins.peer_stats();
    let asked: u64 = stats.iter().map(|p| p.stats.requests).sum();
    // Two per request (the dead one counts as asked), the dead one once, then skipped.
    assert_eq!(asked, 40);
    let dead = &stats[3];
    assert_eq!((dead.up, dead.marked_down, dead.stats.requests), (false, 1, 1));
    assert_eq!(origin.heads.lock().unwrap().len(), 20);
}

#[tokio::test]
async fn a_peers_404_is_a_miss_and_its_5xx_an_error() {
    let gone = Server::start(|_| Reply::Keep(response("HTTP/1.1 404 Not Found\r\nContent-Length: 0", ""))).await;
    let broken = Server::start(|_| Reply::Keep(response("HTTP/1.1 500 No\r\nContent-Length: 0", ""))).await;
    let origin = Server::start(|_| Reply::Keep(ok("from origin"))).await;
    let mut t = table("/vod/", &[origin.url()]);
    t.peers = [&gone, &broken].iter().map(|s| format!("http://127.0.0.1:{}", s.port)).collect();
    let origins = Origins::start(&[t], &[], 1).unwrap();
    let req = OriginRequest { peers: true, ..get("a.mp4") };
    assert_eq!(fetch(&origins, 0, req).await.unwrap().body, b"from origin");
    let stats = origins.peer_stats();
    assert_eq!((stats[0].misses, errors(&stats[0].stats, "status")), (1, 0));
    assert_eq!((stats[1].misses, errors(&stats[1].stats, "status"), stats[1].up), (0, 1, true));
}
