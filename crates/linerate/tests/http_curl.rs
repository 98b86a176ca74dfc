//! HTTP behaviour as curl sees it: statuses, headers, ranges, conditionals, HEAD,
//! media types, directories, methods, CORS.

use std::time::{Duration, SystemTime};

use crate::common::*;

fn setup() -> (Content, Server) {
    let c = Content::new();
    c.write_random("video/movie.mp4", 100_000, 1);
    c.write("index.html", b"<html>root</html>");
    c.write("sub/index.html", b"<html>sub</html>");
    c.write("noindex/file.txt", b"x");
    c.write("seg.m4s", b"segment");
    c.write("live.m3u8", b"#EXTM3U\n");
    c.write("a.mpd", b"<MPD/>");
    c.write("odd.unknownext", b"?");
    c.write("space name.ts", b"ts!");
    let s = Server::start(&["--root", &c.root_arg()]);
    (c, s)
}

#[test]
fn full_get_has_the_expected_headers() {
    let (c, s) = setup();
    let r = get(&s.url("/video/movie.mp4"), &[]);
    assert_eq!(r.status, 200);
    assert_eq!(r.body, std::fs::read(c.path().join("video/movie.mp4")).unwrap());
    assert_eq!(r.header("content-type").as_deref(), Some("video/mp4"));
    assert_eq!(r.header("content-length").as_deref(), Some("100000"));
    assert_eq!(r.header("accept-ranges").as_deref(), Some("bytes"));
    assert_eq!(r.header("server").as_deref(), Some("linerate"));
    let etag = r.header("etag").unwrap();
    assert!(etag.starts_with('"') && etag.ends_with('"'), "{etag}");
    let lm = r.header("last-modified").unwrap();
    assert!(lm.ends_with(" GMT"), "{lm}");
    let date = r.header("date").unwrap();
    assert!(date.ends_with(" GMT"), "{date}");
}

#[test]
fn media_types() {
    let (_c, s) = setup();
    for (path, ty) in [
        ("/seg.m4s", "video/iso.segment"),
        ("/live.m3u8", "application/vnd.apple.mpegurl"),
        ("/a.mpd", "application/dash+xml"),
        ("/odd.unknownext", "application/octet-stream"),
        ("/space%20name.ts", "video/mp2t"),
        ("/index.html", "text/html; charset=utf-8"),
    ] {
        let r = get(&s.url(path), &["-I"]);
        assert_eq!(r.status, 200, "{path}");
        assert_eq!(r.header("content-type").as_deref(), Some(ty), "{path}");
    }
}

#[test]
fn head_has_get_headers_and_no_body() {
    let (_c, s) = setup();
    let get_r = get(&s.url("/video/movie.mp4"), &[]);
    let out = curl(&["-i", "-I", &s.url("/video/movie.mp4")]);
    let head = parse_response(&out.stdout).unwrap();
    assert_eq!(head.status, 200);
    assert!(head.body.is_empty());
    assert_eq!(head.header("content-length"), get_r.header("content-length"));
    assert_eq!(head.header("etag"), get_r.header("etag"));
}

#[test]
fn single_ranges() {
    let (c, s) = setup();
    let data = std::fs::read(c.path().join("video/movie.mp4")).unwrap();
    for (spec, first, last) in
        [("0-99", 0, 99), ("99990-", 99_990, 99_999), ("-10", 99_990, 99_999), ("500-500", 500, 500)]
    {
        let r = get(&s.url("/video/movie.mp4"), &["-H", &format!("Range: bytes={spec}")]);
        assert_eq!(r.status, 206, "{spec}");
        assert_eq!(r.header("content-range"), Some(format!("bytes {first}-{last}/100000")));
        assert_eq!(r.body, &data[first..=last], "{spec}");
    }
    // Past the end: 416 with the length.
    let r = get(&s.url("/video/movie.mp4"), &["-H", "Range: bytes=100000-"]);
    assert_eq!(r.status, 416);
    assert_eq!(r.header("content-range").as_deref(), Some("bytes */100000"));
    // Syntactically invalid: ignored.
    let r = get(&s.url("/video/movie.mp4"), &["-H", "Range: bytes=9-1"]);
    assert_eq!(r.status, 200);
    assert_eq!(r.body.len(), 100_000);
}

#[test]
fn multipart_ranges() {
    let (c, s) = setup();
    let data = std::fs::read(c.path().join("video/movie.mp4")).unwrap();
    let r = get(&s.url("/video/movie.mp4"), &["-H", "Range: bytes=0-9,1000-1099,-5"]);
    assert_eq!(r.status, 206);
    let ct = r.header("content-type").unwrap();
    let boundary = ct.strip_prefix("multipart/byteranges; boundary=").expect(&ct);
    assert_eq!(r.header("content-length").unwrap().parse::<usize>().unwrap(), r.body.len());
    let body = &r.body;
    let mut parts = Vec::new();
    let delim = format!("\r\n--{boundary}");
    let text = body.as_slice();
    let mut pos = 0;
    while let Some(i) = find(&text[pos..], delim.as_bytes()) {
        let start = pos + i + delim.len();
        if text[start..].starts_with(b"--") {
            break;
        }
        let head_end = start + find(&text[start..], b"\r\n\r\n").unwrap();
        let head = String::from_utf8_lossy(&text[start..head_end]).into_owned();
        let data_start = head_end + 4;
        let next = data_start + find(&text[data_start..], delim.as_bytes()).unwrap();
        parts.push((head, text[data_start..next].to_vec()));
        pos = next;
    }
    assert_eq!(parts.len(), 3);
    for ((head, part), (first, last)) in parts.iter().zip([(0usize, 9usize), (1000, 1099), (99_995, 99_999)]) {
        assert!(head.contains(&format!("Content-Range: bytes {first}-{last}/100000")), "{head}");
        assert!(head.contains("Content-Type: video/mp4"), "{head}");
        assert_eq!(part, &data[first..=last]);
    }
    assert!(body.ends_with(format!("\r\n--{boundary}--\r\n").as_bytes()));

    // curl's own multi-range option agrees.
    let r2 = get(&s.url("/video/movie.mp4"), &["-r", "0-9,1000-1099"]);
    assert_eq!(r2.status, 206);
    assert!(r2.header("content-type").unwrap().starts_with("multipart/byteranges"));
}

#[test]
fn overlapping_ranges_do_not_amplify() {
    let (_c, s) = setup();
    let many = vec!["0-"; 16].join(",");
    let r = get(&s.url("/video/movie.mp4"), &["-H", &format!("Range: bytes={many}")]);
    assert_eq!(r.status, 206);
    assert_eq!(r.body.len(), 100_000, "16 whole-file ranges collapse into one");
    // More ranges than the limit: served whole with 200.
    let too_many: Vec<String> = (0..17).map(|i| format!("{}-{}", i * 1000, i * 1000 + 10)).collect();
    let r = get(&s.url("/video/movie.mp4"), &["-H", &format!("Range: bytes={}", too_many.join(","))]);
    assert_eq!(r.status, 200);
}

#[test]
fn conditionals() {
    let (c, s) = setup();
    // Modified an hour ago: its Last-Modified is a strong validator (If-Range below).
    set_mtime(&c.path().join("video/movie.mp4"), SystemTime::now() - Duration::from_secs(3600));
    let url = s.url("/video/movie.mp4");
    let first = get(&url, &["-I"]);
    let etag = first.header("etag").unwrap();
    let lm = first.header("last-modified").unwrap();

    let r = get(&url, &["-H", &format!("If-None-Match: {etag}")]);
    assert_eq!(r.status, 304);
    assert!(r.body.is_empty());
    assert_eq!(r.header("etag").as_deref(), Some(etag.as_str()));
    assert_eq!(get(&url, &["-H", "If-None-Match: \"other\""]).status, 200);
    assert_eq!(get(&url, &["-H", &format!("If-Modified-Since: {lm}")]).status, 304);
    assert_eq!(get(&url, &["-H", "If-Modified-Since: Thu, 01 Jan 1998 00:00:00 GMT"]).status, 200);
    assert_eq!(get(&url, &["-H", "If-Match: \"other\""]).status, 412);
    assert_eq!(get(&url, &["-H", &format!("If-Match: {etag}")]).status, 200);
    assert_eq!(get(&url, &["-H", "If-Unmodified-Since: Thu, 01 Jan 1998 00:00:00 GMT"]).status, 412);
    // If-Range: matching validator gives the range, a stale one the whole file.
    let r = get(&url, &["-H", "Range: bytes=0-9", "-H", &format!("If-Range: {etag}")]);
    assert_eq!((r.status, r.body.len()), (206, 10));
    let r = get(&url, &["-H", "Range: bytes=0-9", "-H", &format!("If-Range: {lm}")]);
    assert_eq!((r.status, r.body.len()), (206, 10));
    let r = get(&url, &["-H", "Range: bytes=0-9", "-H", "If-Range: \"stale\""]);
    assert_eq!((r.status, r.body.len()), (200, 100_000));
}

#[test]
fn if_range_date_is_honoured_only_when_strong() {
    let (c, s) = setup();
    // A Last-Modified that is not at least a second before the response's Date may
    // hide a second change within the same second: the date is weak, the Range is
    // ignored and the whole file is sent. (An mtime ahead of the clock is the
    // deterministic way to be "within the second".)
    set_mtime(&c.path().join("video/movie.mp4"), SystemTime::now() + Duration::from_secs(3600));
    let url = s.url("/video/movie.mp4");
    let lm = get(&url, &["-I"]).header("last-modified").unwrap();
    let r = get(&url, &["-H", "Range: bytes=0-9", "-H", &format!("If-Range: {lm}")]);
    assert_eq!((r.status, r.body.len()), (200, 100_000));
    // The entity tag is strong whatever the time.
    let etag = get(&url, &["-I"]).header("etag").unwrap();
    let r = get(&url, &["-H", "Range: bytes=0-9", "-H", &format!("If-Range: {etag}")]);
    assert_eq!((r.status, r.body.len()), (206, 10));
}

fn set_mtime(path: &std::path::Path, t: SystemTime) {
    std::fs::File::options().write(true).open(path).unwrap().set_modified(t).unwrap();
}

#[test]
fn directories() {
    let (_c, s) = setup();
    let r = get(&s.url("/"), &[]);
    assert_eq!((r.status, r.body.as_slice()), (200, &b"<html>root</html>"[..]));
    let r = get(&s.url("/sub"), &[]);
    assert_eq!(r.status, 301);
    assert_eq!(r.header("location").as_deref(), Some("/sub/"));
    let r = get(&s.url("/sub?x=1"), &[]);
    assert_eq!(r.header("location").as_deref(), Some("/sub/?x=1"));
    let r = get(&s.url("/sub/"), &[]);
    assert_eq!((r.status, r.body.as_slice()), (200, &b"<html>sub</html>"[..]));
    // No index and no listing.
    assert_eq!(get(&s.url("/noindex/"), &[]).status, 403);
    // A file named with a trailing slash is not that file.
    assert_eq!(get(&s.url("/index.html/"), &[]).status, 404);
    assert_eq!(get(&s.url("/missing.mp4"), &[]).status, 404);
}

#[test]
fn other_methods_get_405_with_allow() {
    let (_c, s) = setup();
    for m in ["POST", "PUT", "DELETE", "PATCH", "BREW"] {
        let r = get(&s.url("/index.html"), &["-X", m]);
        assert_eq!(r.status, 405, "{m}");
        assert_eq!(r.header("allow").as_deref(), Some("GET, HEAD, OPTIONS"));
    }
    let r = get(&s.url("/index.html"), &["-X", "POST", "--data-binary", "hello"]);
    assert_eq!(r.status, 405);
    let r = get(&s.url("/index.html"), &["-X", "OPTIONS"]);
    assert_eq!(r.status, 204);
    assert_eq!(r.header("allow").as_deref(), Some("GET, HEAD, OPTIONS"));
}

#[test]
fn cors_and_cache_control_from_config() {
    let c = Content::new();
    c.write("a.mp4", b"0123456789");
    let cfg = ConfigFile::new(&format!(
        "root = {:?}\ncache_control = \"public, max-age=60\"\ncors_allow_origin = \"*\"\n",
        c.path()
    ));
    let s = Server::start(&["--config", cfg.arg()]);
    let r = get(&s.url("/a.mp4"), &["-H", "Origin: https://player.example"]);
    assert_eq!(r.header("access-control-allow-origin").as_deref(), Some("*"));
    assert!(r.header("access-control-expose-headers").unwrap().contains("Content-Range"));
    assert_eq!(r.header("cache-control").as_deref(), Some("public, max-age=60"));
    // Preflight for a range request from another origin.
    let r = get(
        &s.url("/a.mp4"),
        &["-X", "OPTIONS", "-H", "Origin: https://player.example", "-H", "Access-Control-Request-Method: GET"],
    );
    assert_eq!(r.status, 204);
    assert!(r.header("access-control-allow-headers").unwrap().contains("Range"));
    // Errors carry no cache-control.
    assert_eq!(get(&s.url("/none"), &[]).header("cache-control"), None);
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}
