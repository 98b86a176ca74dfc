//! The cache against a small origin on 127.0.0.1 (a thread per connection writing
//! scripted answers, counting the requests it gets) and a store in a temporary
//! directory: herds collapsing on expiry, lifetimes under a second, and answers of
//! unknown length streamed and stored.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::*;
use crate::config::{Cache as CacheConfig, CacheDir, Origin as Table};

/// What the test origin does for one request.
enum Step {
    Write(Vec<u8>),
    Sleep(u64),
    /// Closes the connection (the rest of the script is not run).
    Close,
}

/// A scripted origin: `answer(n, request head)` for the n-th request (from 0).
struct TestOrigin {
    port: u16,
    requests: Arc<AtomicUsize>,
    /// When each request's head arrived.
    asked_at: Arc<Mutex<Vec<Instant>>>,
    stop: Arc<AtomicBool>,
}

type Script = Arc<dyn Fn(usize, &str) -> Vec<Step> + Send + Sync>;

impl TestOrigin {
    fn start(answer: impl Fn(usize, &str) -> Vec<Step> + Send + Sync + 'static) -> TestOrigin {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let (requests, stop) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicBool::new(false)));
        let asked_at = Arc::new(Mutex::new(Vec::new()));
        let answer: Script = Arc::new(answer);
        let (r, s, t) = (requests.clone(), stop.clone(), asked_at.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if s.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(conn) = conn else { continue };
                let (r, t, answer) = (r.clone(), t.clone(), answer.clone());
                std::thread::spawn(move || serve(conn, &r, &t, &answer));
            }
        });
        TestOrigin { port, requests, asked_at, stop }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/", self.port)
    }

    fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }
}

impl Drop for TestOrigin {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

fn serve(mut conn: TcpStream, requests: &AtomicUsize, asked_at: &Mutex<Vec<Instant>>, answer: &Script) {
    let mut buf = Vec::new();
    loop {
        let end = loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            let mut piece = [0u8; 4096];
            match conn.read(&mut piece) {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&piece[..n]),
            }
        };
        let head = String::from_utf8_lossy(&buf.drain(..end).collect::<Vec<u8>>()).into_owned();
        asked_at.lock().unwrap().push(Instant::now());
        let n = requests.fetch_add(1, Ordering::SeqCst);
        for step in answer(n, &head) {
            match step {
                Step::Write(b) => {
                    if conn.write_all(&b).is_err() {
                        return;
                    }
                }
                Step::Sleep(ms) => std::thread::sleep(Duration::from_millis(ms)),
                Step::Close => return,
            }
        }
    }
}

/// A 206 of the whole of `body` (the slice asked for), with `fields`.
fn partial(body: &[u8], fields: &str) -> Vec<u8> {
    let mut r = partial_head(body.len() as u64, fields);
    r.extend_from_slice(body);
    r
}

/// The head of a 206 of the whole of an object of `n` bytes, with `fields`.
fn partial_head(n: u64, fields: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 206 Partial Content\r\nContent-Range: bytes 0-{}/{n}\r\nContent-Length: {n}\r\n{fields}\r\n",
        n - 1
    )
    .into_bytes()
}

fn chunk(bytes: &[u8]) -> Vec<u8> {
    let mut c = format!("{:x}\r\n", bytes.len()).into_bytes();
    c.extend_from_slice(bytes);
    c.extend_from_slice(b"\r\n");
    c
}

const SLICE: u64 = 64 * 1024;

fn cache_for(url: &str, table_toml: &str, dir: &std::path::Path) -> Arc<Cache> {
    let mut t: Table = toml::from_str(&format!("prefix = \"/live/\"\nurls = []\n{table_toml}")).unwrap();
    t.urls = vec![url.to_string()];
    let origins = crate::origin::Origins::start(&[t], &[None], 1).unwrap();
    let cfg = CacheConfig {
        slice_bytes: SLICE,
        dirs: vec![CacheDir { path: dir.to_path_buf(), max_size_bytes: 1 << 30, min_free_bytes: 0 }],
        fsync: false,
        node_name: None,
    };
    let store = Store::open(&cfg, Box::new(HashMap::new)).unwrap();
    Cache::new(origins, store)
}

fn key(path: &str) -> Arc<Key> {
    Arc::new(Key::new(path.as_bytes(), path.trim_start_matches("/live/").as_bytes(), None, &[]))
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

/// `n` viewers asking for `key` at once, on one worker's runtime.
async fn herd(cache: &Arc<Cache>, key: &Arc<Key>, n: usize) -> Vec<Opened> {
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..n {
        let (c, k) = (cache.clone(), key.clone());
        set.spawn(async move { c.open(0, &k, 0).await });
    }
    let mut out = Vec::new();
    while let Some(r) = set.join_next().await {
        out.push(r.unwrap());
    }
    out
}

fn version(o: &Opened) -> Option<Vec<u8>> {
    match o {
        Opened::Object { meta, .. } => meta.etag.clone(),
        _ => None,
    }
}

/// An origin whose playlist moves on at every request (its `n`th answer is
/// version `v{n}`), answering after `delay_ms`.
fn playlist_origin(delay_ms: u64) -> TestOrigin {
    TestOrigin::start(move |n, _| {
        let body = format!("#EXTM3U\n#EXT-X-MEDIA-SEQUENCE:{n}\n");
        vec![Step::Sleep(delay_ms), Step::Write(partial(body.as_bytes(), &format!("ETag: \"v{n}\"\r\n")))]
    })
}

/// The version a viewer got, which must be fresh: a stored copy (a hit), or the
/// answer of a refresh under way it joined as the copy expired; never a stale one.
fn fresh_version(o: &Opened) -> Option<Vec<u8>> {
    match o {
        Opened::Object { meta, status: CacheStatus::Hit | CacheStatus::Miss | CacheStatus::Revalidated } => {
            assert!(unix_now_ms() < meta.fresh_until_ms + 5, "served past its lifetime");
            meta.etag.clone()
        }
        _ => panic!("a viewer did not get a fresh version: {:?}", version(o)),
    }
}

/// Waves of 5 viewers every `every_ms` for `for_ms`: each must get a fresh
/// version (`fresh_version`); returns the versions they got.
async fn fresh_waves(
    cache: &Arc<Cache>,
    k: &Arc<Key>,
    every_ms: u64,
    for_ms: u64,
) -> std::collections::BTreeSet<Option<Vec<u8>>> {
    let mut versions = std::collections::BTreeSet::new();
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(for_ms) {
        for o in herd(cache, k, 5).await {
            versions.insert(fresh_version(&o));
        }
        tokio::time::sleep(Duration::from_millis(every_ms)).await;
    }
    versions
}

/// A playlist with a lifetime of 300 ms: a herd of 50 arriving as it expires
/// makes one origin request, and each gets the new version; 50 arriving while it
/// is fresh make none.
#[test]
fn a_herd_on_an_expired_playlist_makes_one_origin_request() {
    // Slow enough that the whole herd arrives while the request is under way.
    let origin = playlist_origin(50);
    let dir = tempfile::tempdir().unwrap();
    let cache = cache_for(&origin.url(), "default_ttl = \"300ms\"", dir.path());
    let k = key("/live/a.m3u8");
    runtime().block_on(async {
        let first = herd(&cache, &k, 50).await;
        assert_eq!(origin.requests(), 1, "a cold herd: one request");
        assert!(first.iter().all(|o| version(o).as_deref() == Some(b"\"v0\"")));
        let fresh = herd(&cache, &k, 50).await;
        assert_eq!(origin.requests(), 1, "fresh: no request");
        assert!(fresh.iter().all(|o| matches!(o, Opened::Object { status: CacheStatus::Hit, .. })));
        let m = cache.store.object(&k.hash).unwrap();
        let left = m.fresh_until_ms - unix_now_ms();
        assert!((0..=300).contains(&left), "fresh for 300 ms from the answer: {left} ms left");
        tokio::time::sleep(Duration::from_millis(left as u64 + 5)).await;
        let expired = herd(&cache, &k, 50).await;
        assert_eq!(origin.requests(), 2, "expired: one request for the whole herd");
        assert!(expired.iter().all(|o| version(o).as_deref() == Some(b"\"v1\"")), "the new version to all");
        // Waves of viewers for 1.2 s, one every 20 ms: about one request per lifetime.
        let start = Instant::now();
        while start.elapsed() < Duration::from_millis(1200) {
            herd(&cache, &k, 5).await;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let n = origin.requests() - 2;
        assert!((3..=5).contains(&n), "1.2 s of waves with a 300 ms lifetime: {n} requests");
    });
}

/// `refresh_ahead_percent = 50` on a playlist fresh for 1 s: under waves of
/// viewers every 20 ms for 3 s, its timer revalidates it in the background (first
/// at half its lifetime, then one round trip before expiry), so every viewer gets
/// a fresh version (never a stale one; a viewer who comes as the copy expires
/// joins the refresh under way), the version moves on, and the origin sees about
/// one request per lifetime.
#[test]
fn refresh_ahead_replaces_a_playlist_before_it_expires() {
    let origin = playlist_origin(50);
    let dir = tempfile::tempdir().unwrap();
    let cache = cache_for(&origin.url(), "default_ttl = \"1s\"\nrefresh_ahead_percent = 50", dir.path());
    let k = key("/live/a.m3u8");
    runtime().block_on(async {
        herd(&cache, &k, 5).await;
        assert_eq!(origin.requests(), 1);
        let versions = fresh_waves(&cache, &k, 20, 3000).await;
        let n = origin.requests() - 1;
        assert!((2..=4).contains(&n), "3 s, refreshed once per 1 s lifetime: {n} requests");
        assert_eq!(cache.stats.refreshed_ahead.get() as usize, n, "each counted");
        assert!(versions.len() >= 4, "the version moved on: {versions:?}");
    });
    // The origin gone first: a refresh still under way fails and writes nothing
    // into the directory about to be removed.
    drop(origin);
    drop(cache);
}

/// Viewers in bursts further apart than the lifetime (as a live playlist's are,
/// all released by one refresh): no hit falls in the refresh window, so a timer
/// refreshes the copy and every burst after the first gets a fresh stored one.
/// After the first refresh (at the window's start) each is sent one origin
/// round trip before expiry: about one per lifetime. Once nobody asks for two
/// lifetimes, the refreshes stop.
#[test]
fn refresh_ahead_keeps_a_playlist_fresh_between_bursts() {
    let origin = playlist_origin(30);
    let dir = tempfile::tempdir().unwrap();
    let cache = cache_for(&origin.url(), "default_ttl = \"1s\"\nrefresh_ahead_percent = 20", dir.path());
    let k = key("/live/a.m3u8");
    runtime().block_on(async {
        herd(&cache, &k, 5).await;
        for burst in 1..=3 {
            tokio::time::sleep(Duration::from_millis(1500)).await;
            for o in herd(&cache, &k, 5).await {
                match &o {
                    Opened::Object { meta, status: CacheStatus::Hit } => {
                        assert!(unix_now_ms() < meta.fresh_until_ms, "burst {burst}: served past its lifetime")
                    }
                    _ => panic!("burst {burst}: a viewer did not get a stored, fresh copy: {:?}", version(&o)),
                }
            }
        }
        // The first request, a refresh at 0.8 s, then one per lifetime: each
        // answer is fresh for 1 s from its arrival, and the next refresh is
        // sent as long before its expiry as this one took (not at 0.8 s).
        let at = origin.asked_at.lock().unwrap().clone();
        assert!(at.len() >= 4, "{} origin requests", at.len());
        for w in at[1..].windows(2) {
            let gap = w[1] - w[0];
            assert!(gap >= Duration::from_millis(900), "refreshes {gap:?} apart, for a lifetime of 1 s");
        }
        // Nobody asks for 2 lifetimes: the refreshes stop.
        tokio::time::sleep(Duration::from_millis(2500)).await;
        let stopped = origin.requests();
        tokio::time::sleep(Duration::from_millis(1200)).await;
        assert_eq!(origin.requests(), stopped, "refreshed with nobody asking");
        assert!(lock(&cache.kept_fresh).is_empty());
    });
    drop(origin);
    drop(cache);
}

/// A 404 kept for a 250 ms negative_ttl: a herd makes one request, then none
/// until it expires, then one again.
#[test]
fn a_herd_on_a_missing_segment_makes_one_request_per_negative_ttl() {
    let origin = TestOrigin::start(|_, _| {
        vec![Step::Sleep(30), Step::Write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n".to_vec())]
    });
    let dir = tempfile::tempdir().unwrap();
    let cache = cache_for(&origin.url(), "negative_ttl = \"250ms\"", dir.path());
    let k = key("/live/9.ts");
    runtime().block_on(async {
        let all = herd(&cache, &k, 50).await;
        assert!(all.iter().all(|o| matches!(o, Opened::Object { meta, .. } if meta.status == 404)));
        assert_eq!(origin.requests(), 1);
        herd(&cache, &k, 50).await;
        assert_eq!(origin.requests(), 1, "within negative_ttl");
        tokio::time::sleep(Duration::from_millis(260)).await;
        herd(&cache, &k, 50).await;
        assert_eq!(origin.requests(), 2, "after negative_ttl: asked again, once");
    });
}

/// The chunks of a live segment: 5 pieces of 30,000 bytes (the object spans three
/// slices of 64 KiB), `gap` ms apart, and a clean end unless `cut`.
fn live_answer(gap: u64, cut: bool) -> (Vec<u8>, impl Fn(usize, &str) -> Vec<Step> + Send + Sync) {
    let body: Vec<u8> = (0..150_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8).collect();
    let b = body.clone();
    let answer = move |_: usize, _: &str| {
        let mut steps = vec![Step::Write(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: video/mp2t\r\nETag: \"seg\"\r\n\r\n"
                .to_vec(),
        )];
        for (i, piece) in b.chunks(30_000).enumerate() {
            if cut && i == 3 {
                // Half a chunk, then the connection closes.
                let c = chunk(piece);
                steps.push(Step::Write(c[..c.len() / 2].to_vec()));
                steps.push(Step::Close);
                return steps;
            }
            steps.push(Step::Write(chunk(piece)));
            steps.push(Step::Sleep(gap));
        }
        steps.push(Step::Write(b"0\r\n\r\n".to_vec()));
        steps
    };
    (body, answer)
}

fn read_all(file: &std::fs::File, len: u64) -> Vec<u8> {
    let mut v = vec![0; len as usize];
    file.read_exact_at(&mut v, 0).unwrap();
    v
}

/// A 200 without a length is streamed once to every viewer, late ones included,
/// and stored whole once it ended cleanly: later requests are hits of its size,
/// every slice in the store.
#[test]
fn an_answer_of_unknown_length_is_streamed_then_stored() {
    let (body, answer) = live_answer(40, false);
    let origin = TestOrigin::start(answer);
    let dir = tempfile::tempdir().unwrap();
    let cache = cache_for(&origin.url(), "", dir.path());
    let k = key("/live/1.ts");
    runtime().block_on(async {
        let first = herd(&cache, &k, 20).await;
        let lives: Vec<Arc<Live>> = first
            .iter()
            .map(|o| match o {
                Opened::Live(l) => l.clone(),
                other => panic!("streamed, not {other:?}"),
            })
            .collect();
        assert!(lives.iter().all(|l| Arc::ptr_eq(l, &lives[0])), "one stream for all");
        assert_eq!(lives[0].content_type.as_deref(), Some(&b"video/mp2t"[..]));
        // Part of it arrives before the rest is sent.
        let mut rx = lives[0].body.clone();
        let t0 = Instant::now();
        let _ = rx.wait_for(|s| s.written > 0).await;
        let first_piece = t0.elapsed();
        assert!(!lives[0].ended(), "the first piece is out before the end ({first_piece:?})");
        // A late joiner gets the same stream.
        let late = cache.open(0, &k, 0).await;
        assert!(matches!(&late, Opened::Live(l) if Arc::ptr_eq(l, &lives[0])), "{late:?}");
        let size = lives[0].complete().await.unwrap();
        assert_eq!(read_all(&lives[0].file(), size), body);
        assert_eq!(origin.requests(), 1);
        // Stored once the stream leaves: a hit of the size it turned out to have.
        let start = Instant::now();
        while cache.live_of(&k).is_some() && start.elapsed() < Duration::from_secs(5) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let hit = cache.open(0, &k, 0).await;
        let Opened::Object { meta, status: CacheStatus::Hit } = &hit else { panic!("a hit, not {hit:?}") };
        assert_eq!((meta.size, meta.etag.as_deref()), (body.len() as u64, Some(&b"\"seg\""[..])));
        let mut stored = Vec::new();
        for index in 0..3 {
            let s = cache.store.slice(&k.hash, meta, index).expect("every slice stored");
            stored.extend(std::fs::read(&s.path).unwrap());
        }
        assert_eq!(stored, body);
        assert_eq!(origin.requests(), 1, "no request for the hit");
    });
}

/// A live body cut mid-chunk fails its stream and stores nothing: the next
/// request asks the origin again.
#[test]
fn a_cut_answer_of_unknown_length_fails_and_is_not_stored() {
    let (_, answer) = live_answer(5, true);
    let origin = TestOrigin::start(answer);
    let dir = tempfile::tempdir().unwrap();
    let cache = cache_for(&origin.url(), "", dir.path());
    let k = key("/live/2.ts");
    runtime().block_on(async {
        let Opened::Live(live) = cache.open(0, &k, 0).await else { panic!("streamed") };
        let end = live.complete().await;
        assert!(end.is_err(), "a cut body is a failure: {end:?}");
        let written = live.body.borrow().written;
        assert!((90_000..120_000).contains(&written), "the three whole chunks were passed on, no more: {written}");
        let start = Instant::now();
        while cache.live_of(&k).is_some() && start.elapsed() < Duration::from_secs(5) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(cache.store.object(&k.hash).is_none(), "nothing stored");
        let again = cache.open(0, &k, 0).await;
        assert!(matches!(again, Opened::Live(_)), "asked again: {again:?}");
        assert_eq!(origin.requests(), 2);
    });
}

/// Everything a viewer's connection was sent.
#[derive(Default)]
struct Sink(Vec<u8>);

impl crate::transport::Transport for Sink {
    const KIND: crate::counters::TransportKind = crate::counters::TransportKind::Plain;

    async fn read(&mut self, _: &mut Vec<u8>) -> std::io::Result<usize> {
        Ok(0)
    }

    async fn write_all(&mut self, bytes: &[u8], _: bool) -> Result<(), crate::transport::SendError> {
        self.0.extend_from_slice(bytes);
        Ok(())
    }

    async fn send_file(
        &mut self,
        file: &std::fs::File,
        offset: u64,
        len: u64,
    ) -> Result<(), crate::transport::SendError> {
        let mut buf = vec![0; len as usize];
        file.read_exact_at(&mut buf, offset)?;
        self.0.extend_from_slice(&buf);
        Ok(())
    }

    fn body_bytes_sent(&self) -> u64 {
        0
    }

    async fn close(&mut self, _: bool) {}
}

/// A live body fed by hand: `pieces` written one by one, then `end`; what a
/// viewer following it from the start is sent, chunked or not.
fn followed(pieces: &[&[u8]], end: Result<(), Failure>, chunked: bool) -> (Vec<u8>, Result<u64, String>) {
    let file = Arc::new(fill::memory_file());
    let (tx, rx) = tokio::sync::watch::channel(FillState { file: Some(file.clone()), written: 0, end: None });
    let live = Live {
        key: b"/live/x.ts".to_vec(),
        etag: None,
        last_modified: None,
        content_type: None,
        stored_at: 0,
        body: rx,
    };
    runtime().block_on(async {
        let feed = async {
            let mut written = 0u64;
            for p in pieces {
                file.write_all_at(p, written).unwrap();
                written += p.len() as u64;
                tx.send_modify(|s| s.written = written);
                // Each piece reaches the viewer before the next is written.
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            tx.send_modify(|s| s.end = Some(end));
        };
        let mut io = Sink::default();
        let mut progress = crate::server::pagecache::Progress::default();
        let (r, ()) = tokio::join!(live::follow_live(&mut io, &live, chunked, &mut progress), feed);
        (io.0, r.map_err(|e| e.to_string()))
    })
}

#[test]
fn a_live_body_is_sent_a_chunk_per_piece_and_ends_with_the_last_chunk() {
    let (out, r) = followed(&[b"abc", b"0123456789abcdef!"], Ok(()), true);
    assert_eq!(String::from_utf8(out).unwrap(), "3\r\nabc\r\n11\r\n0123456789abcdef!\r\n0\r\n\r\n");
    assert_eq!(r, Ok(3 + 2 + 4 + 2 + 5), "framing bytes: each size line and CRLF, and the last chunk");
    let (out, r) = followed(&[b"abc", b"de"], Ok(()), false);
    assert_eq!((out.as_slice(), r), (&b"abcde"[..], Ok(0)), "HTTP/1.0: the bytes alone");
}

#[test]
fn a_cut_live_body_ends_the_response_without_the_last_chunk() {
    let cut = Failure::Origin { kind: "reset", detail: "reset".into(), timeout: false };
    let (out, r) = followed(&[b"abc", b"de"], Err(cut), true);
    assert_eq!(String::from_utf8(out).unwrap(), "3\r\nabc\r\n2\r\nde\r\n", "what arrived, and no last chunk");
    assert!(r.is_err());
}

/// A playlist compressed for a herd asking as it arrives (its slice still being
/// filled: they wait for the fill, not the store) and once stored: the same
/// compressed file for all, one origin request, and a segment type never.
#[test]
fn a_playlist_is_compressed_once_per_version_while_filling_or_stored() {
    let body = "#EXTM3U\n#EXT-X-TARGETDURATION:1\n#EXTINF:1.0,\nseg1.ts\n".repeat(40);
    let b = body.clone();
    let origin = TestOrigin::start(move |_, _| {
        let answer = partial(b.as_bytes(), "ETag: \"p1\"\r\nContent-Type: application/vnd.apple.mpegurl\r\n");
        let (head, rest) = answer.split_at(200);
        // The body comes slowly: the herd asks while the slice is filled.
        vec![Step::Write(head.to_vec()), Step::Sleep(100), Step::Write(rest.to_vec())]
    });
    let dir = tempfile::tempdir().unwrap();
    let cache = cache_for(&origin.url(), "", dir.path());
    let k = key("/live/p.m3u8");
    runtime().block_on(async {
        let opened = herd(&cache, &k, 1).await;
        let Opened::Object { meta, .. } = &opened[0] else { panic!("{:?}", opened[0]) };
        let mut set = tokio::task::JoinSet::new();
        for _ in 0..20 {
            let (c, k, m) = (cache.clone(), k.clone(), meta.clone());
            set.spawn(async move { c.gzipped(&k, &m).await });
        }
        let mut files = Vec::new();
        while let Some(g) = set.join_next().await {
            files.push(g.unwrap().expect("compressed once the fill ended"));
        }
        assert!(files.iter().all(|g| Arc::ptr_eq(g, &files[0])), "one compression for the herd");
        let g = &files[0];
        let mut packed = vec![0; g.len as usize];
        g.file.read_exact_at(&mut packed, 0).unwrap();
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(&packed[..]).read_to_end(&mut out).unwrap();
        assert_eq!(out, body.as_bytes());
        assert!(g.len < body.len() as u64 / 4);
        let again = cache.gzipped(&k, meta).await.unwrap();
        assert!(Arc::ptr_eq(&again, g), "kept for the version");
        assert_eq!(origin.requests(), 1);
    });
}

/// An origin of one 4-slice object (`ETag: "t"`), answering each `Range` with
/// exactly those bytes, and recording the ranges asked for.
fn title_origin(ranges: Arc<Mutex<Vec<String>>>) -> (Vec<u8>, TestOrigin) {
    let body: Vec<u8> = (0..4 * SLICE).map(|i| (i % 251) as u8).collect();
    let b = body.clone();
    let origin = TestOrigin::start(move |_, head| {
        let range = head
            .lines()
            .find_map(|l| l.to_ascii_lowercase().strip_prefix("range: bytes=").map(str::to_string))
            .expect("a range request");
        ranges.lock().unwrap().push(range.clone());
        let (a, z) = range.split_once('-').unwrap();
        let (a, z) = (a.parse::<usize>().unwrap(), z.parse::<usize>().unwrap().min(b.len() - 1));
        let mut r = format!(
            "HTTP/1.1 206 Partial Content\r\nContent-Range: bytes {a}-{z}/{}\r\nContent-Length: {}\r\nETag: \"t\"\r\n\r\n",
            b.len(),
            z + 1 - a
        )
        .into_bytes();
        r.extend_from_slice(&b[a..=z]);
        vec![Step::Write(r)]
    });
    (body, origin)
}

/// Waits up to 5 s for slices `indices` of `key` to be stored.
fn stored_soon(cache: &Cache, key: &Key, meta: &ObjectMeta, indices: &[u64]) -> bool {
    let until = Instant::now() + Duration::from_secs(5);
    while Instant::now() < until {
        if indices.iter().all(|&i| cache.store.indexed(&key.hash, meta, i)) && cache.in_flight() == 0 {
            return true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    false
}

/// `read_ahead_slices = 1`: the miss on slice 0 also fetches slice 1, once, and
/// stored whole; a viewer reaching slice 1 fetches slice 2, and only that (the
/// last slice has none after it). Off, a miss fetches its slice alone.
#[test]
fn read_ahead_fetches_the_next_slice_once() {
    let rt = runtime();
    for ahead in [0, 1] {
        let ranges = Arc::new(Mutex::new(Vec::new()));
        let (body, origin) = title_origin(ranges.clone());
        let dir = tempfile::tempdir().unwrap();
        let cache = cache_for(&origin.url(), &format!("read_ahead_slices = {ahead}"), dir.path());
        let k = key("/live/title.mp4");
        let opened = rt.block_on(herd(&cache, &k, 20));
        let Opened::Object { meta, .. } = &opened[0] else { panic!("{:?}", opened[0]) };
        assert_eq!(meta.size, body.len() as u64);
        let want: Vec<u64> = (0..=ahead).collect();
        assert!(stored_soon(&cache, &k, meta, &want), "slices {want:?} stored");
        let slice = |i: u64| format!("{}-{}", i * SLICE, (i + 1) * SLICE - 1);
        assert_eq!(*ranges.lock().unwrap(), want.iter().map(|&i| slice(i)).collect::<Vec<_>>());
        let f = cache.store.slice(&k.hash, meta, ahead).unwrap();
        assert_eq!(
            read_all(&std::fs::File::open(&f.path).unwrap(), SLICE),
            body[(ahead * SLICE) as usize..][..SLICE as usize]
        );
        if ahead == 0 {
            assert_eq!(cache.stats.read_ahead.get(), 0);
            assert!(!cache.store.indexed(&k.hash, meta, 1));
            drop(origin);
            continue;
        }
        assert_eq!(cache.stats.read_ahead.get(), 1);
        // Reaching slice 1 (stored) and then slice 3, the last: slice 2 once.
        for _ in 0..3 {
            rt.block_on(async { cache.read_ahead(0, &k, meta, 1, false) });
        }
        assert!(rt.block_on(async { cache.read_ahead(0, &k, meta, 3, false) }).is_empty());
        assert!(stored_soon(&cache, &k, meta, &[0, 1, 2]));
        assert_eq!(ranges.lock().unwrap().len(), 3, "{:?}", ranges.lock().unwrap());
        assert_eq!(ranges.lock().unwrap()[2], slice(2));
        assert!(!cache.store.indexed(&k.hash, meta, 3));
        assert_eq!(cache.stats.read_ahead.get(), 2);
        drop(origin);
    }
}

/// Viewers asking steadily (a wave every 10 ms) for a playlist kept fresh by
/// `refresh_ahead_percent`: every one gets a fresh copy, and the origin is asked
/// about once per lifetime, not once per lifetime less the window (as when a hit
/// in the window also sent a refresh: 830-850 ms apart).
#[test]
fn refresh_ahead_under_steady_viewers_asks_once_per_lifetime() {
    let origin = playlist_origin(30);
    let dir = tempfile::tempdir().unwrap();
    let cache = cache_for(&origin.url(), "default_ttl = \"1s\"\nrefresh_ahead_percent = 20", dir.path());
    let k = key("/live/a.m3u8");
    runtime().block_on(async {
        herd(&cache, &k, 5).await;
        fresh_waves(&cache, &k, 10, 6500).await;
        let at = origin.asked_at.lock().unwrap().clone();
        let gaps: Vec<u128> = at.windows(2).map(|w| (w[1] - w[0]).as_millis()).collect();
        assert!(
            (6..=8).contains(&at.len()),
            "{} origin requests in 6.5 s for a lifetime of 1 s: gaps {gaps:?} ms",
            at.len()
        );
        for g in &gaps[1..] {
            assert!(*g >= 900, "refreshes {g} ms apart, for a lifetime of 1 s: {gaps:?}");
        }
    });
    drop(origin);
    drop(cache);
}

/// Bytes a fill holds back to tell its viewers of them together are told within
/// the hold even when the origin then stalls: a viewer never waits on a stalled
/// origin for bytes already written. The origin sends the slice's first 1000 bytes,
/// 1000 more 30 ms later, then nothing for 1.5 s, then the rest.
#[test]
fn held_bytes_are_told_while_the_origin_stalls() {
    let body: Vec<u8> = (0..SLICE).map(|i| (i % 251) as u8).collect();
    let b = body.clone();
    let origin = TestOrigin::start(move |_, _| {
        let mut head = partial_head(SLICE, "ETag: \"s\"\r\n");
        head.extend_from_slice(&b[..1000]);
        vec![
            Step::Write(head),
            Step::Sleep(30),
            Step::Write(b[1000..2000].to_vec()),
            Step::Sleep(1500),
            Step::Write(b[2000..].to_vec()),
        ]
    });
    let dir = tempfile::tempdir().unwrap();
    let cache = cache_for(&origin.url(), "", dir.path());
    let k = key("/live/stall.mp4");
    let rt = runtime();
    let started = Instant::now();
    let opened = rt.block_on(herd(&cache, &k, 1));
    let Opened::Object { meta, .. } = &opened[0] else { panic!("{:?}", opened[0]) };
    let (mut rx, joined) = rt.block_on(async { cache.slice_fill(0, &k, meta, 0, None, None) });
    assert!(joined, "the open started the fill of slice 0");
    let told_2000 = rt.block_on(async {
        loop {
            if rx.borrow_and_update().written >= 2000 {
                return started.elapsed();
            }
            rx.changed().await.expect("the fill goes on");
        }
    });
    assert!(told_2000 < Duration::from_millis(800), "2000 bytes told after {told_2000:?}: not before the stall ended");
    assert!(stored_soon(&cache, &k, meta, &[0]), "the slice stored once the rest came");
    let f = cache.store.slice(&k.hash, meta, 0).unwrap();
    assert_eq!(read_all(&std::fs::File::open(&f.path).unwrap(), SLICE), body);
    assert_eq!(origin.requests(), 1);
}

/// A fill that fails tells its viewers of every byte it wrote first: a viewer
/// whose range ends before the failure gets all of it, even when the failure
/// comes within the hold. The origin sends 1000 bytes, 1000 more 30 ms later,
/// and closes the connection at once.
#[test]
fn a_failing_fill_tells_what_it_wrote_before_it_ends() {
    let body: Vec<u8> = (0..SLICE).map(|i| (i % 241) as u8).collect();
    let b = body.clone();
    let origin = TestOrigin::start(move |_, _| {
        let mut head = partial_head(SLICE, "ETag: \"c\"\r\n");
        head.extend_from_slice(&b[..1000]);
        vec![Step::Write(head), Step::Sleep(30), Step::Write(b[1000..2000].to_vec()), Step::Close]
    });
    let dir = tempfile::tempdir().unwrap();
    let cache = cache_for(&origin.url(), "", dir.path());
    let k = key("/live/cut.mp4");
    let rt = runtime();
    let opened = rt.block_on(herd(&cache, &k, 1));
    let Opened::Object { meta, .. } = &opened[0] else { panic!("{:?}", opened[0]) };
    let (mut io, mut progress) = (Sink::default(), crate::server::pagecache::Progress::default());
    let sent = rt.block_on(async {
        let (rx, joined) = cache.slice_fill(0, &k, meta, 0, None, None);
        assert!(joined, "the open started the fill of slice 0");
        serve::follow(&mut io, rx, 0, Some(2000), &mut progress).await
    });
    assert!(sent.is_ok(), "{sent:?}");
    assert_eq!(io.0, body[..2000]);
    assert!(!cache.store.indexed(&k.hash, meta, 0), "a cut slice is not kept");
}
