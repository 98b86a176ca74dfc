//! HTTP/1.1 over a raw socket: pipelining, keep-alive rules, malformed and
//! oversized requests, request bodies and smuggling attempts, path traversal.

use std::io::Write;
use std::net::TcpStream;
use std::time::Duration;

use crate::common::*;

const T: Duration = Duration::from_secs(5);

fn setup() -> (Content, Server) {
    let c = Content::new();
    c.write("root/a.txt", b"AAAA");
    c.write("root/b.txt", b"BBBBBBBB");
    c.write_random("root/big1.bin", 1 << 20, 7);
    c.write_random("root/big2.bin", 1 << 20, 8);
    c.write("secret.txt", b"TOP SECRET");
    std::os::unix::fs::symlink("../secret.txt", c.path().join("root/leak.txt")).unwrap();
    std::os::unix::fs::symlink("a.txt", c.path().join("root/alias.txt")).unwrap();
    let root = c.path().join("root");
    let s = Server::start(&["--root", root.to_str().unwrap()]);
    (c, s)
}

fn exchange(s: &Server, req: &str) -> Vec<u8> {
    raw_exchange(s.addr(), req.as_bytes(), T)
}

#[test]
fn pipelined_requests_are_answered_in_order() {
    let (_c, s) = setup();
    let req = "GET /a.txt HTTP/1.1\r\nHost: x\r\n\r\n\
               HEAD /b.txt HTTP/1.1\r\nHost: x\r\n\r\n\
               GET /b.txt HTTP/1.1\r\nHost: x\r\nRange: bytes=2-3\r\n\r\n\
               GET /missing HTTP/1.1\r\nHost: x\r\n\r\n\
               GET /a.txt HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    let raw = exchange(&s, req);
    // HEAD's Content-Length must not be taken as a body length: split by hand.
    let text = String::from_utf8_lossy(&raw);
    let heads: Vec<&str> = text.matches("HTTP/1.1 ").collect();
    assert_eq!(heads.len(), 5, "{text}");
    let statuses: Vec<&str> = text.split("HTTP/1.1 ").skip(1).map(|r| &r[..3]).collect();
    assert_eq!(statuses, ["200", "200", "206", "404", "200"]);
    assert!(text.contains("\r\n\r\nAAAAHTTP/1.1 200"), "first body directly followed by the HEAD answer");
    assert!(text.contains("Content-Range: bytes 2-3/8\r\n"));
    assert!(text.contains("\r\n\r\nBB"));
    assert!(text.ends_with("Connection: close\r\n\r\nAAAA"), "{text}");
}

#[test]
fn pipelined_large_responses_keep_their_order() {
    let (c, s) = setup();
    let big1 = std::fs::read(c.path().join("root/big1.bin")).unwrap();
    let big2 = std::fs::read(c.path().join("root/big2.bin")).unwrap();
    let mut req = String::new();
    for i in 0..6 {
        let f = if i % 2 == 0 { "big1" } else { "big2" };
        req.push_str(&format!("GET /{f}.bin HTTP/1.1\r\nHost: x\r\n\r\n"));
    }
    req.push_str("GET /a.txt HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    let raw = raw_exchange(s.addr(), req.as_bytes(), Duration::from_secs(20));
    let rs = split_responses(&raw);
    assert_eq!(rs.len(), 7);
    for (i, r) in rs[..6].iter().enumerate() {
        assert_eq!(r.status, 200);
        assert!(r.body == if i % 2 == 0 { big1.as_slice() } else { big2.as_slice() }, "response {i} body");
    }
    assert_eq!(rs[6].body, b"AAAA");
}

#[test]
fn keep_alive_rules() {
    let (_c, s) = setup();
    // HTTP/1.0 without keep-alive: closed after the response.
    let raw = exchange(&s, "GET /a.txt HTTP/1.0\r\n\r\n");
    let r = parse_response(&raw).unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.body, b"AAAA");
    assert_eq!(r.header("connection").as_deref(), Some("close"));

    // HTTP/1.0 with keep-alive: told so, and the connection serves a second request.
    let mut sock = TcpStream::connect(s.addr()).unwrap();
    sock.set_read_timeout(Some(T)).unwrap();
    sock.write_all(b"GET /a.txt HTTP/1.0\r\nConnection: keep-alive\r\n\r\n").unwrap();
    // The second request once the first is answered: not pipelined.
    let mut raw = read_until_contains(&mut sock, b"AAAA", T);
    sock.set_read_timeout(Some(T)).unwrap();
    sock.write_all(b"GET /b.txt HTTP/1.0\r\n\r\n").unwrap();
    raw.extend(read_until_close(&mut sock, T));
    let rs = split_responses(&raw);
    assert_eq!(rs.len(), 2, "{}", String::from_utf8_lossy(&raw));
    assert_eq!(rs[0].header("connection").as_deref(), Some("keep-alive"));
    assert_eq!(rs[1].body, b"BBBBBBBB");

    // HTTP/1.1 Connection: close is honoured.
    let raw = exchange(
        &s,
        "GET /a.txt HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\nGET /b.txt HTTP/1.1\r\nHost: x\r\n\r\n",
    );
    let rs = split_responses(&raw);
    assert_eq!(rs.len(), 1);
    assert_eq!(rs[0].header("connection").as_deref(), Some("close"));
}

#[test]
fn request_forms() {
    let (_c, s) = setup();
    let rs = split_responses(&exchange(
        &s,
        "\r\nGET http://example.com/a.txt HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    ));
    assert_eq!((rs[0].status, rs[0].body.as_slice()), (200, &b"AAAA"[..]));
    let rs = split_responses(&exchange(&s, "OPTIONS * HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"));
    assert_eq!(rs[0].status, 204);
    let rs = split_responses(&exchange(&s, "GET * HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"));
    assert_eq!(rs[0].status, 400);
}

/// Sends `req`, expects one response with `status` and the connection closed after it.
fn expect_status_and_close(s: &Server, req: &[u8], status: u16) {
    let raw = raw_exchange(s.addr(), req, T);
    let rs = split_responses(&raw);
    assert_eq!(rs.len(), 1, "{:?}", String::from_utf8_lossy(&raw));
    assert_eq!(rs[0].status, status, "{}", String::from_utf8_lossy(&req[..req.len().min(80)]));
    assert_eq!(rs[0].header("connection").as_deref(), Some("close"));
}

#[test]
fn malformed_and_oversized_requests() {
    let (_c, s) = setup();
    expect_status_and_close(&s, b"GARBAGE\r\n\r\nGET /a.txt HTTP/1.1\r\nHost: x\r\n\r\n", 400);
    expect_status_and_close(&s, b"GET /a.txt HTTP/1.1\r\nBad Header: x\r\n\r\n", 400);
    expect_status_and_close(&s, b"GET /a.txt HTTP/1.1\r\n\r\n", 400); // no Host
    expect_status_and_close(&s, b"GET /a.txt HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400);
    expect_status_and_close(&s, b"GET /a.txt HTTP/2.0\r\nHost: x\r\n\r\n", 505);
    let long_uri = format!("GET /{} HTTP/1.1\r\nHost: x\r\n\r\n", "a".repeat(9000));
    expect_status_and_close(&s, long_uri.as_bytes(), 414);
    let big_head = format!("GET /a.txt HTTP/1.1\r\nHost: x\r\nX-Fill: {}\r\n\r\n", "f".repeat(17 * 1024));
    expect_status_and_close(&s, big_head.as_bytes(), 431);
    let many: String = (0..150).map(|i| format!("X-{i}: v\r\n")).collect();
    expect_status_and_close(&s, format!("GET /a.txt HTTP/1.1\r\nHost: x\r\n{many}\r\n").as_bytes(), 431);
    // The server is still fine.
    assert_eq!(get(&s.url("/a.txt"), &[]).status, 200);
}

#[test]
fn request_bodies_are_consumed_exactly() {
    let (_c, s) = setup();
    // A GET with a Content-Length body, then a pipelined request: both answered.
    let raw = exchange(
        &s,
        "GET /a.txt HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhelloGET /b.txt HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    let rs = split_responses(&raw);
    assert_eq!(rs.len(), 2);
    assert_eq!((rs[0].body.as_slice(), rs[1].body.as_slice()), (&b"AAAA"[..], &b"BBBBBBBB"[..]));
    // Chunked body, including one whose data looks like a request.
    let raw = exchange(
        &s,
        "GET /a.txt HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n\
         1d\r\nGET /secret HTTP/1.1\r\nHost: x\r\n0\r\n\r\n\
         GET /b.txt HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    let rs = split_responses(&raw);
    assert_eq!(rs.len(), 2, "{}", String::from_utf8_lossy(&raw));
    assert_eq!(rs[1].body, b"BBBBBBBB");
    // A POST body is consumed before the 405, and the connection goes on.
    let raw = exchange(
        &s,
        "POST /a.txt HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabcGET /a.txt HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    let rs = split_responses(&raw);
    assert_eq!(rs.iter().map(|r| r.status).collect::<Vec<_>>(), [405, 200]);
}

#[test]
fn smuggling_attempts_are_refused_and_closed() {
    let (_c, s) = setup();
    // CL.TE and TE.CL: both framings present.
    expect_status_and_close(
        &s,
        b"GET /a.txt HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /b.txt HTTP/1.1\r\nHost: x\r\n\r\n",
        400,
    );
    expect_status_and_close(
        &s,
        b"GET /a.txt HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nContent-Length: 5\r\n\r\n",
        400,
    );
    expect_status_and_close(&s, b"GET /a.txt HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n", 400);
    expect_status_and_close(&s, b"GET /a.txt HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 400);
    // Bodies over the limit (64 KiB by default): 413.
    expect_status_and_close(&s, b"GET /a.txt HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n", 413);
}

#[test]
fn no_escape_from_the_root() {
    let (_c, s) = setup();
    for (target, status) in [
        ("/../secret.txt", 400),
        ("/%2e%2e/secret.txt", 400),
        ("/%2E%2E/%2e%2e/etc/passwd", 400),
        ("/a.txt/../../secret.txt", 400),
        ("/..%2fsecret.txt", 400),
        ("/a%2f..%2f..%2fsecret.txt", 400),
        ("/a.txt%00.mp4", 400),
        ("/leak.txt", 403),
        ("/%zz", 400),
    ] {
        let raw = exchange(&s, &format!("GET {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"));
        let text = String::from_utf8_lossy(&raw);
        assert!(!text.contains("TOP SECRET"), "{target} leaked: {text}");
        let rs = split_responses(&raw);
        assert_eq!(rs[0].status, status, "{target}: {text}");
    }
    // A symlink that stays inside the root is served.
    let rs = split_responses(&exchange(&s, "GET /alias.txt HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"));
    assert_eq!(rs[0].body, b"AAAA");
    // `..` that stays inside is normalised.
    let rs = split_responses(&exchange(&s, "GET /x/../a.txt HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"));
    assert_eq!(rs[0].body, b"AAAA");
}

#[test]
fn symlinks_out_of_the_root_when_configured() {
    let (c, _s) = setup();
    let cfg = ConfigFile::new(&format!("root = {:?}\nfollow_symlinks_outside_root = true\n", c.path().join("root")));
    let s = Server::start(&["--config", cfg.arg()]);
    let rs = split_responses(&exchange(&s, "GET /leak.txt HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"));
    assert_eq!(rs[0].body, b"TOP SECRET");
    // `..` is still refused.
    let rs = split_responses(&exchange(&s, "GET /../secret.txt HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"));
    assert_eq!(rs[0].status, 400);
}

#[test]
fn redirect_is_never_protocol_relative() {
    let (c, s) = setup();
    c.write("root/videos/index.html", b"<p>videos</p>");
    c.write("root/d x/%/index.html", b"x");
    for (target, location) in [
        ("/videos", "/videos/"),
        ("/videos?a=1&b", "/videos/?a=1&b"),
        ("//evil.example/../videos", "/videos/"),
        ("/\\evil.example/../videos", "/videos/"),
        ("//evil.example/%2e%2e/videos?x=//y", "/videos/?x=//y"),
        ("/d%20x/%25", "/d%20x/%25/"),
    ] {
        let raw = exchange(&s, &format!("GET {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"));
        let rs = split_responses(&raw);
        assert_eq!(rs.len(), 1, "{target}: {}", String::from_utf8_lossy(&raw));
        assert_eq!(rs[0].status, 301, "{target}");
        assert_eq!(rs[0].header("location").as_deref(), Some(location), "{target}");
    }
}

#[test]
fn error_after_head_request_carries_its_body() {
    let (_c, s) = setup();
    for bad in ["GARBAGE\r\n\r\n", "GET /a.txt HTTP/1.1\r\nBad Header: x\r\n\r\n", "GET /a.txt HTTP/2.0\r\n\r\n"] {
        let raw = exchange(&s, &format!("HEAD /a.txt HTTP/1.1\r\nHost: x\r\n\r\n{bad}"));
        // The HEAD answer has a Content-Length but no body: split after its head.
        let end = raw.windows(4).position(|w| w == b"\r\n\r\n").expect("a HEAD answer") + 4;
        let head = parse_response(&raw[..end]).unwrap();
        assert_eq!((head.status, head.header("content-length").as_deref()), (200, Some("4")));
        let err = parse_response(&raw[end..]).unwrap_or_else(|| panic!("{bad:?}: {}", String::from_utf8_lossy(&raw)));
        let len: usize = err.header("content-length").unwrap().parse().unwrap();
        assert!(len > 0);
        assert_eq!(err.body.len(), len, "{bad:?}: the error answer must carry its body");
        assert!(String::from_utf8_lossy(&err.body).starts_with(&err.status.to_string()), "{bad:?}");
    }
    // A head that never completes after a HEAD: the 408 carries its body too.
    let (c, _s) = setup();
    let cfg = ConfigFile::new(&format!("root = {:?}\n[timeouts]\nheader = \"1s\"\n", c.path().join("root")));
    let s = Server::start(&["--config", cfg.arg()]);
    let raw = exchange(&s, "HEAD /a.txt HTTP/1.1\r\nHost: x\r\n\r\nGET /a.txt HTTP/1.1\r\nHo");
    let end = raw.windows(4).position(|w| w == b"\r\n\r\n").expect("a HEAD answer") + 4;
    let err = parse_response(&raw[end..]).unwrap_or_else(|| panic!("{}", String::from_utf8_lossy(&raw)));
    assert_eq!((err.status, err.body.as_slice()), (408, &b"408 Request Timeout\n"[..]));
}

#[test]
fn split_request_body_keeps_the_connection() {
    let (_c, s) = setup();
    let mut sock = TcpStream::connect(s.addr()).unwrap();
    sock.set_read_timeout(Some(T)).unwrap();
    sock.write_all(b"GET /a.txt HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\nabc").unwrap();
    // The pauses split the body and the next request into reads of their own: a
    // client that sends in pieces, the behaviour under test.
    std::thread::sleep(Duration::from_millis(100));
    sock.write_all(b"defghij").unwrap();
    std::thread::sleep(Duration::from_millis(50));
    sock.write_all(b"GET /b.txt HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n").unwrap();
    let raw = read_until_close(&mut sock, T);
    let rs = split_responses(&raw);
    assert_eq!(rs.len(), 2, "{}", String::from_utf8_lossy(&raw));
    assert_eq!((rs[0].status, rs[0].body.as_slice()), (200, &b"AAAA"[..]));
    assert_eq!((rs[1].status, rs[1].body.as_slice()), (200, &b"BBBBBBBB"[..]));
}

/// Reads from `sock` until `want` has arrived (or `limit` passes); returns what was read.
fn read_until_contains(sock: &mut TcpStream, want: &[u8], limit: Duration) -> Vec<u8> {
    let deadline = std::time::Instant::now() + limit;
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    while !out.windows(want.len()).any(|w| w == want) {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            break;
        }
        sock.set_read_timeout(Some(left)).unwrap();
        match crate::common::read_some(sock, &mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
        }
    }
    out
}

#[test]
fn expect_100_continue_is_answered_before_the_body() {
    let (_c, s) = setup();
    for method in ["POST", "GET"] {
        let mut sock = TcpStream::connect(s.addr()).unwrap();
        sock.write_all(
            format!("{method} /a.txt HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n")
                .as_bytes(),
        )
        .unwrap();
        let interim = read_until_contains(&mut sock, b"\r\n\r\n", Duration::from_secs(1));
        assert_eq!(interim, b"HTTP/1.1 100 Continue\r\n\r\n", "{method}: {}", String::from_utf8_lossy(&interim));
        sock.write_all(b"hello").unwrap();
        sock.write_all(b"GET /b.txt HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
        let raw = read_until_close(&mut sock, T);
        let rs = split_responses(&raw);
        let want = if method == "GET" { 200 } else { 405 };
        assert_eq!(rs.iter().map(|r| r.status).collect::<Vec<_>>(), [want, 200], "{}", String::from_utf8_lossy(&raw));
        assert_eq!(rs[1].body, b"BBBBBBBB");
    }
    // Body already sent with the head: no interim answer is needed, none is sent.
    let raw = exchange(
        &s,
        "GET /a.txt HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello",
    );
    let rs = split_responses(&raw);
    assert_eq!(rs.iter().map(|r| r.status).collect::<Vec<_>>(), [200], "{}", String::from_utf8_lossy(&raw));
}

#[test]
fn expect_100_continue_over_the_body_limit_gets_413_without_100() {
    let (_c, s) = setup();
    let raw =
        exchange(&s, "POST /a.txt HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 1000000\r\n\r\n");
    let rs = split_responses(&raw);
    assert_eq!(rs.len(), 1, "{}", String::from_utf8_lossy(&raw));
    assert_eq!(rs[0].status, 413);
    assert_eq!(rs[0].header("connection").as_deref(), Some("close"));
}

#[test]
fn unknown_expectation_is_417() {
    let (_c, s) = setup();
    expect_status_and_close(&s, b"GET /a.txt HTTP/1.1\r\nHost: x\r\nExpect: 200-ok\r\nContent-Length: 0\r\n\r\n", 417);
    expect_status_and_close(
        &s,
        b"POST /a.txt HTTP/1.1\r\nHost: x\r\nExpect: 100-continue, x\r\nContent-Length: 5\r\n\r\n",
        417,
    );
}
