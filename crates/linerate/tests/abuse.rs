//! Abuse over raw sockets: thousands of malformed and adversarial requests against
//! the real binary, from several clients at once.
//!
//! Each case is one connection carrying one to two hundred requests built from valid
//! ones (files, ranges, multipart, HEAD, conditionals, request bodies of either
//! framing, directories, errors),
//! some of them damaged: random byte flips, insertions, deletions, duplicated,
//! dropped or swapped lines, truncation, huge fields, bare CR and LF, NUL, ambiguous
//! framing (Content-Length with Transfer-Encoding, conflicting lengths), chunked
//! garbage. A case's bytes leave in one write, in small pieces with pauses, or are
//! abandoned half-way (closed, or reset); some clients stop reading mid-answer.
//!
//! What comes back must be a stream of well-formed HTTP/1.1 responses with known
//! statuses; every 200 or 206 body is checked byte for byte against the file its
//! length names (each part of a multipart body too); the requests before the first
//! damaged one get exactly their expected answers; a request damaged so that it is
//! certainly invalid gets a 4xx or 5xx, after which the connection closes; and the
//! server closes every connection within its timeouts (no hang). Afterwards the
//! server is alive, serves a file and a range with the right bytes, has logged no
//! panic, and its /metrics answers.
//!
//! The run is seeded; the seed is printed, and `LINERATE_ABUSE_SEED=S` repeats it
//! (`LINERATE_ABUSE_CASE=N` runs case N alone). `LINERATE_ABUSE_REQUESTS` sets the
//! number of requests (default 3000) and `LINERATE_ABUSE_SECONDS` the time budget
//! (default 120 s) for a long run (docs/FUZZING.md).

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::common::*;

const DEFAULT_REQUESTS: usize = 3000;
const DEFAULT_SECONDS: u64 = 120;
/// Clients sending cases at once.
const CLIENTS: usize = 16;
/// How long an exchange may wait for the server to close after the client's last
/// byte: the server's timeouts (`timeouts.header` and `timeouts.keepalive`, 1 s
/// each here) plus slack for a loaded machine.
const CLOSE_LIMIT: Duration = Duration::from_secs(8);
/// The server's `timeouts.send`.
const SEND_TIMEOUT: Duration = Duration::from_secs(2);
/// Statuses the server may send to any request. 500 (an internal failure) and 503
/// (out of file descriptors) must not happen here.
const ALLOWED: [u16; 18] = [100, 200, 204, 206, 301, 304, 400, 403, 404, 405, 408, 412, 413, 414, 416, 417, 431, 505];
const HOST: &str = "Host: abuse.test\r\n";

/// The served files.
struct Site {
    text: Vec<u8>,
    index: Vec<u8>,
    big: Vec<u8>,
}

impl Site {
    /// The file of this length (the lengths differ), for checking any body.
    fn by_len(&self, len: u64) -> Option<&[u8]> {
        [&self.text, &self.index, &self.big].into_iter().find(|f| f.len() as u64 == len).map(|f| f.as_slice())
    }
}

#[derive(Clone, Debug)]
enum Want {
    Bytes(Vec<u8>),
    /// No body (HEAD, 204, 304).
    Nothing,
    /// A body this test does not predict (error pages, multipart).
    Any,
}

/// A request and what the server must answer while it is undamaged.
#[derive(Clone, Debug)]
struct Req {
    bytes: Vec<u8>,
    head: bool,
    status: u16,
    body: Want,
    /// The server closes after answering (HTTP/1.0 without keep-alive, Connection: close).
    closes: bool,
}

fn req(bytes: String, status: u16, body: Want) -> Req {
    let head = bytes.starts_with("HEAD ");
    Req { bytes: bytes.into_bytes(), head, status, body, closes: false }
}

/// A valid request with its expected answer.
fn valid(rng: &mut fastrand::Rng, site: &Site) -> Req {
    let big = &site.big;
    let len = big.len();
    // Fields that change nothing, sometimes.
    let extra = match rng.u8(0..4) {
        0 => "User-Agent: abuse/1\r\nAccept: */*\r\n".to_string(),
        1 => format!("X-Token: {}\r\n", rng.u64(..)),
        _ => String::new(),
    };
    let get = |target: &str, fields: &str| format!("GET {target} HTTP/1.1\r\n{HOST}{extra}{fields}\r\n");
    match rng.u8(0..19) {
        0 => req(get("/a.txt", ""), 200, Want::Bytes(site.text.clone())),
        1 => req(format!("HEAD /big.bin HTTP/1.1\r\n{HOST}{extra}\r\n"), 200, Want::Nothing),
        2 => {
            let first = rng.usize(..len);
            let last = rng.usize(first..len);
            let r = get("/big.bin", &format!("Range: bytes={first}-{last}\r\n"));
            req(r, 206, Want::Bytes(big[first..=last].to_vec()))
        }
        3 => {
            let n = rng.usize(1..len);
            let r = get("/big.bin", &format!("Range: bytes=-{n}\r\n"));
            req(r, 206, Want::Bytes(big[len - n..].to_vec()))
        }
        4 => {
            // Two ranges far enough apart not to be merged.
            let (a, b) = (rng.usize(..len / 2 - 200), rng.usize(len / 2..len));
            let r = get("/big.bin", &format!("Range: bytes={a}-{},{b}-\r\n", a + rng.usize(..100)));
            req(r, 206, Want::Any)
        }
        5 => req(get(&format!("/missing-{}.bin", rng.u32(..)), ""), 404, Want::Any),
        6 => req(get("/dir", ""), 301, Want::Any),
        7 => req(get("/dir/", ""), 200, Want::Bytes(site.index.clone())),
        8 => req(format!("POST /a.txt HTTP/1.1\r\n{HOST}Content-Length: 7\r\n{extra}\r\nname=va"), 405, Want::Any),
        9 => req(
            get("/a.txt", "Transfer-Encoding: chunked\r\n") + "4;ext=1\r\nbody\r\n0\r\nX-Trailer: t\r\n\r\n",
            200,
            Want::Bytes(site.text.clone()),
        ),
        10 => req(format!("OPTIONS /a.txt HTTP/1.1\r\n{HOST}{extra}\r\n"), 204, Want::Nothing),
        11 => Req {
            closes: true,
            ..req(format!("GET /a.txt HTTP/1.0\r\n{extra}\r\n"), 200, Want::Bytes(site.text.clone()))
        },
        12 => req(get("/big.bin", "If-None-Match: *\r\n"), 304, Want::Nothing),
        13 => req(get("/big.bin", &format!("Range: bytes={}-\r\n", len + rng.usize(..1000))), 416, Want::Bytes(vec![])),
        14 => req(
            get("/a.txt", "Expect: 100-continue\r\nContent-Length: 4\r\n") + "abcd",
            200,
            Want::Bytes(site.text.clone()),
        ),
        15 => Req { closes: true, ..req(get("/a.txt", "Connection: close\r\n"), 200, Want::Bytes(site.text.clone())) },
        16 => req(get("/big.bin", ""), 200, Want::Bytes(big.clone())),
        17 => req(get("/%2e%2e/secret.txt", ""), 400, Want::Any),
        _ => {
            // A body up to the limit (64 KiB on the wire), with either framing.
            let body = pseudo_random(rng.usize(..60_000), rng.u64(..));
            let r = if rng.bool() {
                let mut r = get("/a.txt", &format!("Content-Length: {}\r\n", body.len())).into_bytes();
                r.extend_from_slice(&body);
                r
            } else {
                let mut r = get("/a.txt", "Transfer-Encoding: chunked\r\n").into_bytes();
                for chunk in body.chunks(rng.usize(1..20_000)) {
                    r.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
                    r.extend_from_slice(chunk);
                    r.extend_from_slice(b"\r\n");
                }
                r.extend_from_slice(b"0\r\n\r\n");
                r
            };
            Req { bytes: r, head: false, status: 200, body: Want::Bytes(site.text.clone()), closes: false }
        }
    }
}

/// Where the head's empty line starts (just after the last field's CRLF).
fn head_end(bytes: &[u8]) -> usize {
    find(bytes, b"\r\n\r\n").map(|i| i + 2).unwrap_or(bytes.len())
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Adds a field line (without its CRLF) at the end of the head.
fn add_field(bytes: &mut Vec<u8>, field: &[u8]) {
    let at = head_end(bytes);
    let mut line = field.to_vec();
    line.extend_from_slice(b"\r\n");
    bytes.splice(at..at, line);
}

/// Damages the request so that it is certainly invalid; returns what was done.
fn make_invalid(rng: &mut fastrand::Rng, r: &mut Req) -> &'static str {
    let b = &mut r.bytes;
    let target_at = b.iter().position(|&c| c == b' ').map(|i| i + 2).unwrap_or(1);
    match rng.u8(0..21) {
        0 => {
            b.insert(target_at, 0);
            "NUL in the target"
        }
        1 => {
            add_field(b, b"X-Abuse: a\0b");
            "NUL in a field value"
        }
        2 => {
            add_field(b, b"X-Abuse: a\rb");
            "bare CR in a field value"
        }
        3 => {
            b.insert(1, rng.u8(1..9));
            "control byte in the method"
        }
        4 => {
            add_field(b, b"Content-Length: 5");
            add_field(b, b"Transfer-Encoding: chunked");
            "Content-Length with Transfer-Encoding"
        }
        5 => {
            add_field(b, b"Content-Length: 1");
            add_field(b, b"Content-Length: 2");
            "conflicting Content-Length"
        }
        6 => {
            let v = ["-1", "1e3", "0x10", "", "+5", "5 5", "99999999999999999999999"][rng.usize(..7)];
            add_field(b, format!("Content-Length: {v}").as_bytes());
            "invalid Content-Length"
        }
        7 => {
            let v = ["chunked, gzip", "gzip", "identity", "chunked, chunked"][rng.usize(..4)];
            add_field(b, format!("Transfer-Encoding: {v}").as_bytes());
            "Transfer-Encoding without a final chunked"
        }
        8 => {
            add_field(b, b"X-Fold: a\r\n  folded");
            "obsolete line folding"
        }
        9 => {
            add_field(b, b"X-Abuse : v");
            "space before the colon"
        }
        10 => {
            add_field(b, [&b"X(Abuse): v"[..], b"X Abuse: v", b": no name"][rng.usize(..3)]);
            "invalid field name"
        }
        11 => {
            b.splice(target_at..target_at, std::iter::repeat_n(b'u', 9000 + rng.usize(..4000)));
            "target over the URI limit"
        }
        12 => {
            let v = "v".repeat(17 * 1024 + rng.usize(..8192));
            add_field(b, format!("X-Big: {v}").as_bytes());
            "field over the head limit"
        }
        13 => {
            for i in 0..(101 + rng.usize(..200)) {
                add_field(b, format!("X-{i}: {i}").as_bytes());
            }
            "too many fields"
        }
        14 => {
            let at = find(b, b" HTTP/1.").map(|i| i + 1).unwrap_or(0);
            let v = [&b"HTTP/2.0"[..], b"HTTP/1.x", b"HTPT/1.1", b"http/1.1", b"HTTP/11 "][rng.usize(..5)];
            b.splice(at..at + 8, v.iter().copied());
            "bad version"
        }
        15 => {
            add_field(b, b"Host: one.test");
            add_field(b, b"Host: two.test");
            "two Host fields"
        }
        16 => {
            match find(b, HOST.as_bytes()) {
                Some(at) => {
                    b.drain(at..at + HOST.len());
                }
                // HTTP/1.0 has no Host to drop: the version becomes 1.1 without one.
                None => {
                    let at = find(b, b" HTTP/1.0").unwrap();
                    b[at + 8] = b'1';
                }
            }
            "HTTP/1.1 without Host"
        }
        17 => {
            add_field(b, b"Expect: 200-ok");
            "unknown expectation"
        }
        18 => {
            add_field(b, b"Content-Length: 100000000");
            "body over the limit"
        }
        19 => {
            let garbage = [
                "zz\r\n",
                "5\r\nhelloXX",
                "5\nhello\r\n0\r\n\r\n",
                "5\r\nhello\n0\r\n\r\n",
                "0\r\nX-T: 1\n\r\n",
                "fffffffffffffffffffffff\r\n",
                "-5\r\n",
            ][rng.usize(..7)];
            *b = format!("GET /a.txt HTTP/1.1\r\n{HOST}Transfer-Encoding: chunked\r\n\r\n{garbage}").into_bytes();
            "chunked garbage"
        }
        _ => {
            let line_end = find(b, b"\r\n").unwrap();
            match rng.u8(0..3) {
                0 => {
                    let at = find(b, b" HTTP/1.").unwrap();
                    b.drain(at..line_end);
                }
                1 => b.insert(0, b' '),
                _ => {
                    b.splice(line_end..line_end, *b" extra");
                }
            }
            "malformed request line"
        }
    }
}

/// Bytes more likely than others to upset a parser.
const SPICY: &[u8] = b"\0\r\n \t:;,=-/%\"\\*?#@\x7f\x80\xff0123456789azAZ";

/// Damages the request at random: it may stay valid, or not. Returns what was done.
fn mutate(rng: &mut fastrand::Rng, b: &mut Vec<u8>) -> &'static str {
    if b.is_empty() {
        b.push(b'G');
    }
    let at = rng.usize(..b.len());
    let lines = |b: &[u8]| -> Vec<(usize, usize)> {
        let mut out = Vec::new();
        let mut start = 0;
        for (i, &c) in b.iter().enumerate() {
            if c == b'\n' {
                out.push((start, i + 1));
                start = i + 1;
            }
        }
        out
    };
    let spicy = |rng: &mut fastrand::Rng| if rng.bool() { SPICY[rng.usize(..SPICY.len())] } else { rng.u8(..) };
    match rng.u8(0..16) {
        0 => {
            b[at] ^= 1 << rng.u8(0..8);
            "bit flip"
        }
        1 => {
            b[at] = spicy(rng);
            "byte replaced"
        }
        2 => {
            let n = rng.usize(1..9);
            let ins: Vec<u8> = (0..n).map(|_| spicy(rng)).collect();
            b.splice(at..at, ins);
            "bytes inserted"
        }
        3 => {
            let end = (at + rng.usize(1..17)).min(b.len());
            b.drain(at..end);
            "bytes deleted"
        }
        4..=6 => {
            let ls = lines(b);
            if ls.len() < 2 {
                b.truncate(at);
                return "truncated";
            }
            let (s, e) = ls[rng.usize(..ls.len())];
            match rng.u8(0..3) {
                0 => {
                    let line = b[s..e].to_vec();
                    b.splice(s..s, line);
                    "line duplicated"
                }
                1 => {
                    b.drain(s..e);
                    "line dropped"
                }
                _ => {
                    let (s2, e2) = ls[rng.usize(..ls.len())];
                    let (first, second) = if s < s2 { ((s, e), (s2, e2)) } else { ((s2, e2), (s, e)) };
                    if first == second {
                        return "nothing";
                    }
                    let mut out = b[..first.0].to_vec();
                    out.extend_from_slice(&b[second.0..second.1]);
                    out.extend_from_slice(&b[first.1..second.0]);
                    out.extend_from_slice(&b[first.0..first.1]);
                    out.extend_from_slice(&b[second.1..]);
                    *b = out;
                    "lines swapped"
                }
            }
        }
        7 => {
            b.truncate(at);
            "truncated"
        }
        8 => {
            let end = (at + rng.usize(1..32)).min(b.len());
            let piece = b[at..end].to_vec();
            let times = rng.usize(2..(20_000 / piece.len()).max(3));
            b.splice(at..at, piece.repeat(times));
            "span repeated"
        }
        9 => {
            b.insert(at, if rng.bool() { b'\r' } else { b'\n' });
            "bare CR or LF"
        }
        10 => {
            let end = (at + rng.usize(1..16)).min(b.len());
            for c in &mut b[at..end] {
                *c = if c.is_ascii_lowercase() { c.to_ascii_uppercase() } else { c.to_ascii_lowercase() };
            }
            "case changed"
        }
        11 => {
            let mut out = Vec::with_capacity(b.len());
            for (i, &c) in b.iter().enumerate() {
                if !(c == b'\r' && b.get(i + 1) == Some(&b'\n')) {
                    out.push(c);
                }
            }
            *b = out;
            "CRLF to LF"
        }
        12 => {
            let value: Vec<u8> = (0..rng.usize(..40)).map(|_| spicy(rng)).collect();
            let mut field = [&b"X-"[..], &rng.u32(..).to_string().into_bytes(), b": "].concat();
            field.extend_from_slice(&value);
            add_field(b, &field);
            "field with random bytes"
        }
        13 => {
            // A Range, If-Range or validator field with random contents.
            let numbers = ["0", "1", "99", "149999", "150000", "18446744073709551615", "18446744073709551616", ""];
            let mut v = String::from(if rng.u8(0..8) == 0 { "bites=" } else { "bytes=" });
            for i in 0..rng.usize(1..20) {
                if i > 0 {
                    v.push_str([",", ", ", ",,", " ,"][rng.usize(..4)]);
                }
                v.push_str(numbers[rng.usize(..numbers.len())]);
                v.push_str(["-", "", "--", "-"][rng.usize(..4)]);
                if rng.bool() {
                    v.push_str(&rng.u32(..200_000).to_string());
                }
            }
            let name = ["Range", "Range", "Range", "If-Range", "If-None-Match", "If-Modified-Since", "If-Match"]
                [rng.usize(..7)];
            add_field(b, format!("{name}: {v}").as_bytes());
            "random Range or validator"
        }
        14 => {
            // A target that tries to leave the root or confuse normalisation.
            let target = ODD_TARGETS[rng.usize(..ODD_TARGETS.len())];
            let start = b.iter().position(|&c| c == b' ').map_or(0, |i| i + 1);
            let end = b[start..].iter().position(|&c| c == b' ').map_or(b.len(), |i| start + i);
            b.splice(start..end, target.bytes());
            "odd target"
        }
        _ => {
            // A slice of the request, repeated: a long pipeline of fragments.
            let end = (at + rng.usize(1..200)).min(b.len());
            let piece = b[at..end].to_vec();
            b.extend(std::iter::repeat_n(piece, rng.usize(1..50)).flatten());
            "fragment repeated at the end"
        }
    }
}

/// Targets for the "odd target" damage: traversal in every spelling, encoded
/// separators and NUL, dot segments, absolute and asterisk forms, symlinks out of
/// the root. Whatever the answer, a 200 must carry one of the served files.
const ODD_TARGETS: &[&str] = &[
    "/a.txt?x=1&y=%00",
    "/a.txt#fragment",
    "//a.txt",
    "/./a.txt",
    "/dir/../a.txt",
    "/dir/%2e%2e/a.txt",
    "/%2e%2e/secret.txt",
    "/..%2fsecret.txt",
    "/dir/..%2f..%2fsecret.txt",
    "/%2E%2E/%2E%2E/secret.txt",
    "/a%2etxt",
    "/%61.txt",
    "/a.txt%00",
    "/a.txt%00.html",
    "/a.txt%",
    "/a.txt%zz",
    "/dir%2f",
    "/dir%2findex.html",
    "http://abuse.test/a.txt",
    "http://other.test/../secret.txt",
    "*",
    "/\\..\\secret.txt",
    "/a.txt/",
    "/dir//index.html",
    "/.%2e/secret.txt",
    "/%c0%ae%c0%ae/secret.txt",
    "/../../../../../../../../../../secret.txt",
    "/..",
    "/.",
    "/leak.txt",
    "/dir/../leak.txt",
    "/dir/",
    "",
    "a.txt",
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// One write, then the client's half-close.
    Whole,
    /// Small writes with pauses, then the half-close.
    Pieces,
    /// One write, and the connection stays open: the server must close it itself.
    KeepOpen,
    /// Part of the bytes, then close (sometimes with a reset) without reading.
    Abandon,
    /// One write, read a little, then close.
    ReadSome,
    /// One write, then nothing read for longer than the server's send timeout.
    StopReading,
}

struct Case {
    reqs: Vec<Req>,
    /// The first damaged request, and whether it is certainly invalid.
    damaged: Option<(usize, bool)>,
    what: Vec<String>,
    mode: Mode,
}

impl Case {
    fn bytes(&self) -> Vec<u8> {
        self.reqs.iter().flat_map(|r| r.bytes.iter().copied()).collect()
    }
}

fn case_seed(seed: u64, index: usize) -> u64 {
    // splitmix64 of the pair, so neighbouring cases share nothing.
    let mut z = seed ^ (index as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// How many requests a case carries: the first draw from its generator.
fn case_len(rng: &mut fastrand::Rng) -> usize {
    match rng.u8(0..100) {
        0..=59 => 1,
        60..=89 => rng.usize(2..=4),
        90..=98 => rng.usize(5..=12),
        _ => rng.usize(50..=200),
    }
}

fn make_case(seed: u64, site: &Site) -> Case {
    let mut rng = fastrand::Rng::with_seed(seed);
    let n = case_len(&mut rng);
    let mut reqs: Vec<Req> = (0..n).map(|_| valid(&mut rng, site)).collect();
    let mut what = Vec::new();
    let damaged = match rng.u8(0..100) {
        0..=14 => None,
        roll => {
            let k = rng.usize(..n);
            let invalid = roll < 50;
            if invalid {
                what.push(format!("request {k}: {}", make_invalid(&mut rng, &mut reqs[k])));
            } else {
                for _ in 0..rng.usize(1..4) {
                    what.push(format!("request {k}: {}", mutate(&mut rng, &mut reqs[k].bytes)));
                }
            }
            // Sometimes later requests are damaged too.
            for (j, r) in reqs.iter_mut().enumerate().skip(k + 1) {
                if rng.u8(0..4) == 0 {
                    what.push(format!("request {j}: {}", mutate(&mut rng, &mut r.bytes)));
                }
            }
            Some((k, invalid))
        }
    };
    let total: usize = reqs.iter().map(|r| r.bytes.len()).sum();
    let mode = match rng.u8(0..100) {
        0..=59 => Mode::Whole,
        60..=79 if total < 8192 => Mode::Pieces,
        80..=82 => Mode::KeepOpen,
        83..=92 => Mode::Abandon,
        93..=98 => Mode::ReadSome,
        99 => Mode::StopReading,
        _ => Mode::Whole,
    };
    Case { reqs, damaged, what, mode }
}

#[derive(Debug)]
struct Resp {
    status: u16,
    close: bool,
    content_type: Option<String>,
    content_range: Option<String>,
    body: Vec<u8>,
}

/// Splits a response stream. `heads[i]`: request `i` is known to be a HEAD (for the
/// undamaged prefix); later, a body-less answer is recognised by the next response
/// starting right after its head. Returns the responses (interim 100s left out) and
/// the first problem, if any. `cut_ok`: a reset may have cut the stream short.
fn split(raw: &[u8], heads: &[bool], any_head: bool, cut_ok: bool) -> (Vec<Resp>, Option<String>) {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < raw.len() {
        let mut fields = [httparse::EMPTY_HEADER; 64];
        let mut r = httparse::Response::new(&mut fields);
        let n = match r.parse(&raw[pos..]) {
            Ok(httparse::Status::Complete(n)) => n,
            Ok(httparse::Status::Partial) if cut_ok => break,
            Ok(httparse::Status::Partial) => return (out, Some(format!("response head cut short at byte {pos}"))),
            Err(e) => return (out, Some(format!("invalid response head at byte {pos}: {e}"))),
        };
        let status = r.code.unwrap_or(0);
        let reason = r.reason.unwrap_or("");
        if r.version != Some(1) || reason.is_empty() || !ALLOWED.contains(&status) {
            return (out, Some(format!("bad status line at byte {pos}: {:?}", show(&raw[pos..pos + n.min(60)]))));
        }
        let field = |name: &str| {
            r.headers
                .iter()
                .find(|h| h.name.eq_ignore_ascii_case(name))
                .map(|h| String::from_utf8_lossy(h.value).into_owned())
        };
        if status == 100 {
            if !r.headers.is_empty() {
                return (out, Some("a 100 Continue with fields".into()));
            }
            pos += n;
            continue;
        }
        let cl = field("content-length");
        let i = out.len();
        let len = match status {
            204 | 304 => 0,
            _ => {
                let Some(cl) = cl.as_deref().and_then(|v| v.parse::<usize>().ok()) else {
                    return (out, Some(format!("response {i} ({status}) without a valid Content-Length")));
                };
                let rest = &raw[pos + n..];
                let head_only = match heads.get(i) {
                    Some(&h) => h,
                    None => cl > 0 && (rest.starts_with(b"HTTP/1.1 ") || (rest.is_empty() && any_head)),
                };
                if head_only {
                    0
                } else {
                    cl
                }
            }
        };
        if pos + n + len > raw.len() {
            if cut_ok {
                break;
            }
            return (out, Some(format!("response {i} ({status}) body cut short")));
        }
        let close = field("connection").is_some_and(|v| v.eq_ignore_ascii_case("close"));
        out.push(Resp {
            status,
            close,
            content_type: field("content-type"),
            content_range: field("content-range"),
            body: raw[pos + n..pos + n + len].to_vec(),
        });
        pos += n + len;
        if close && pos < raw.len() {
            return (out, Some(format!("{} bytes after a Connection: close answer", raw.len() - pos)));
        }
    }
    (out, None)
}

/// "bytes FIRST-LAST/LEN" → (first, last, len).
fn content_range(v: &str) -> Option<(usize, usize, u64)> {
    let (span, len) = v.strip_prefix("bytes ")?.split_once('/')?;
    let (first, last) = span.split_once('-')?;
    Some((first.parse().ok()?, last.parse().ok()?, len.parse().ok()?))
}

/// A 200 or 206 body must be exactly the bytes of the file (and ranges) it claims.
fn check_body(r: &Resp, site: &Site) -> Result<(), String> {
    match r.status {
        200 if !r.body.is_empty() => match site.by_len(r.body.len() as u64) {
            Some(f) if f == r.body.as_slice() => Ok(()),
            _ => Err(format!("200 body of {} bytes is no file's bytes", r.body.len())),
        },
        206 if r.body.is_empty() => Ok(()), // an answer to HEAD
        206 => {
            let ct = r.content_type.as_deref().unwrap_or("");
            if let Some(boundary) = ct.strip_prefix("multipart/byteranges; boundary=") {
                return check_multipart(&r.body, boundary, site);
            }
            let cr = r.content_range.as_deref().unwrap_or("");
            let (first, last, len) = content_range(cr).ok_or(format!("206 with Content-Range {cr:?}"))?;
            let file = site.by_len(len).ok_or(format!("206 for a file of {len} bytes"))?;
            if last < first || last >= file.len() || file[first..=last] != r.body[..] {
                return Err(format!("206 {cr}: body of {} bytes is not those bytes", r.body.len()));
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

fn check_multipart(body: &[u8], boundary: &str, site: &Site) -> Result<(), String> {
    let delimiter = format!("\r\n--{boundary}");
    let mut rest = body;
    let mut parts = 0;
    loop {
        rest = rest.strip_prefix(delimiter.as_bytes()).ok_or(format!("multipart: no delimiter after {parts} parts"))?;
        if rest == b"--\r\n" {
            break;
        }
        rest = rest.strip_prefix(b"\r\n").ok_or("multipart: delimiter not followed by CRLF")?;
        let end = find(rest, b"\r\n\r\n").ok_or("multipart: part head without end")?;
        let head = String::from_utf8_lossy(&rest[..end]).into_owned();
        let cr = head
            .lines()
            .find_map(|l| l.strip_prefix("Content-Range: "))
            .ok_or(format!("multipart part without Content-Range: {head:?}"))?;
        let (first, last, len) = content_range(cr).ok_or(format!("multipart part Content-Range {cr:?}"))?;
        let file = site.by_len(len).ok_or(format!("multipart part of a file of {len} bytes"))?;
        let data = &rest[end + 4..];
        let n = last.checked_sub(first).map(|d| d + 1).filter(|&n| n <= data.len() && last < file.len());
        let n = n.ok_or(format!("multipart part {cr} runs past the body or file"))?;
        if data[..n] != file[first..=last] {
            return Err(format!("multipart part {cr}: wrong bytes"));
        }
        rest = &data[n..];
        parts += 1;
    }
    if parts < 2 {
        return Err(format!("multipart body with {parts} parts"));
    }
    Ok(())
}

/// Printable excerpt of bytes for a failure message.
fn show(b: &[u8]) -> String {
    let s: String = b.iter().take(400).flat_map(|&c| std::ascii::escape_default(c)).map(char::from).collect();
    if b.len() > 400 {
        format!("{s}... ({} bytes)", b.len())
    } else {
        s
    }
}

#[derive(Default)]
struct Tally {
    cases: usize,
    requests: usize,
    by_class: [usize; 6],
    codes: std::collections::BTreeMap<u16, usize>,
    /// Cases whose stream a write error or reset may have cut (checked less).
    cut: usize,
}

enum End {
    Closed,
    Reset,
    TimedOut,
}

/// Reads until the server closes, resets, or `deadline` passes.
fn read_all(s: &mut TcpStream, deadline: Instant, limit: Option<usize>) -> (Vec<u8>, End) {
    let mut out = Vec::new();
    let mut buf = [0u8; 65536];
    loop {
        let now = Instant::now();
        if now >= deadline {
            return (out, End::TimedOut);
        }
        s.set_read_timeout(Some(deadline - now)).unwrap();
        match s.read(&mut buf) {
            Ok(0) => return (out, End::Closed),
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => return (out, End::Reset),
        }
        if limit.is_some_and(|l| out.len() >= l) {
            return (out, End::Closed);
        }
    }
}

/// Runs one case; returns the statuses seen, or what went wrong.
fn run_case(addr: SocketAddr, seed: u64, site: &Site, tally: &Mutex<Tally>) -> Result<(), String> {
    let case = make_case(seed, site);
    let bytes = case.bytes();
    let mut rng = fastrand::Rng::with_seed(seed ^ 0x5eed);
    let mut s = TcpStream::connect(addr).map_err(|e| format!("connect: {e}"))?;
    s.set_nodelay(true).unwrap();
    if case.mode == Mode::Abandon {
        let n = rng.usize(..=bytes.len());
        let _ = s.write_all(&bytes[..n]);
        if rng.bool() {
            // A reset instead of a FIN.
            let _ = socket2::SockRef::from(&s).set_linger(Some(Duration::ZERO));
        }
        drop(s);
        let mut t = tally.lock().unwrap();
        t.cases += 1;
        t.requests += case.reqs.len();
        return Ok(());
    }
    // The bytes go out from a thread of their own while this one reads, as a
    // pipelining client does: neither side waits for the other to drain.
    let mut writer = s.try_clone().unwrap();
    let (raw, end, write_failed) = std::thread::scope(|scope| {
        let sender = scope.spawn(|| {
            let mut failed = false;
            if case.mode == Mode::Pieces {
                let mut at = 0;
                while at < bytes.len() && !failed {
                    let n = rng.usize(1..=64).min(bytes.len() - at);
                    failed = writer.write_all(&bytes[at..at + n]).is_err();
                    at += n;
                    if rng.u8(0..4) == 0 {
                        // A client that sends in pieces, with pauses: the behaviour.
                        std::thread::sleep(Duration::from_micros(rng.u64(0..2000)));
                    }
                }
            } else {
                failed = writer.write_all(&bytes).is_err();
            }
            if case.mode != Mode::KeepOpen {
                let _ = writer.shutdown(Shutdown::Write);
            }
            failed
        });
        if case.mode == Mode::StopReading {
            // A client that stops reading for longer than the send timeout: the
            // behaviour under test. (Sixteen clients share the server's counters,
            // so its timeout cannot be told apart to wait for it instead.)
            std::thread::sleep(SEND_TIMEOUT + Duration::from_millis(500));
        }
        let limit = (case.mode == Mode::ReadSome).then(|| (seed % 20_000) as usize + 1);
        let (raw, end) = read_all(&mut s, Instant::now() + CLOSE_LIMIT, limit);
        if limit.is_some() {
            // Unblocks the sender, if the server is not reading either.
            let _ = s.shutdown(Shutdown::Both);
        }
        (raw, end, sender.join().unwrap())
    });
    let context = |msg: String| {
        format!(
            "{msg}\n  mode {:?}, damage {:?}\n  sent: {}\n  received: {}",
            case.mode,
            case.what,
            show(&bytes),
            show(&raw)
        )
    };
    if matches!(end, End::TimedOut) {
        return Err(context(format!("the server did not close the connection within {CLOSE_LIMIT:?}")));
    }
    let cut = write_failed || matches!(end, End::Reset) || matches!(case.mode, Mode::ReadSome | Mode::StopReading);
    let prefix = case.damaged.map_or(case.reqs.len(), |(k, _)| k);
    let heads: Vec<bool> = case.reqs[..prefix].iter().map(|r| r.head).collect();
    let any_head = find(&bytes, b"HEAD").is_some();
    let (resps, problem) = split(&raw, &heads, any_head, cut);
    if let Some(p) = problem {
        return Err(context(p));
    }
    for r in &resps {
        check_body(r, site).map_err(context)?;
    }
    // The undamaged requests get exactly their answers.
    let mut closed = false;
    for (i, want) in case.reqs[..prefix].iter().enumerate() {
        let Some(r) = resps.get(i) else {
            if cut {
                break;
            }
            return Err(context(format!("no answer to request {i}, which is valid")));
        };
        if r.status != want.status {
            return Err(context(format!("request {i}: status {}, want {}", r.status, want.status)));
        }
        match &want.body {
            Want::Bytes(b) if *b != r.body => return Err(context(format!("request {i}: wrong body"))),
            Want::Nothing if !r.body.is_empty() => return Err(context(format!("request {i}: a body"))),
            _ => {}
        }
        if r.close != want.closes {
            return Err(context(format!("request {i}: Connection: close is {}, want {}", r.close, want.closes)));
        }
        if want.closes {
            closed = true;
            break;
        }
    }
    // A request that is certainly invalid gets an error, and is the last answered.
    if let (Some((k, true)), false) = (case.damaged, closed) {
        match resps.get(k) {
            Some(r) if r.status < 400 || !r.close || resps.len() != k + 1 => {
                return Err(context(format!(
                    "invalid request {k}: status {}, Connection: close {}, {} answers in all",
                    r.status,
                    r.close,
                    resps.len()
                )));
            }
            None if !cut => return Err(context(format!("no answer to invalid request {k}"))),
            _ => {}
        }
    }
    let mut t = tally.lock().unwrap();
    t.cases += 1;
    t.requests += case.reqs.len();
    t.cut += usize::from(cut);
    for r in &resps {
        t.by_class[(r.status / 100) as usize] += 1;
        *t.codes.entry(r.status).or_default() += 1;
    }
    Ok(())
}

fn env_number(name: &str) -> Option<u64> {
    std::env::var(name).ok().map(|v| v.parse().unwrap_or_else(|_| panic!("{name}={v:?} is not a number")))
}

#[test]
fn malformed_and_adversarial_requests_never_break_the_server() {
    let site = Site {
        text: b"plain text, served to abusive clients\n".to_vec(),
        index: b"<!doctype html><title>index</title>\n".to_vec(),
        big: pseudo_random(150_000, 0xab05e),
    };
    let c = Content::new();
    c.write("root/a.txt", &site.text);
    c.write("root/dir/index.html", &site.index);
    c.write("root/big.bin", &site.big);
    c.write("secret.txt", b"outside the root");
    std::os::unix::fs::symlink("../secret.txt", c.path().join("root/leak.txt")).unwrap();
    let cfg = ConfigFile::new(&format!(
        "root = {:?}\nworkers = 2\n[timeouts]\nheader = \"1s\"\nkeepalive = \"1s\"\nsend = \"{}s\"\n",
        c.path().join("root"),
        SEND_TIMEOUT.as_secs()
    ));
    let mut server = Server::start(&["--config", cfg.arg()]);
    let addr = server.addr();

    let seed = env_number("LINERATE_ABUSE_SEED").unwrap_or_else(|| fastrand::u64(..));
    let requests = env_number("LINERATE_ABUSE_REQUESTS").unwrap_or(DEFAULT_REQUESTS as u64) as usize;
    let budget = Duration::from_secs(env_number("LINERATE_ABUSE_SECONDS").unwrap_or(DEFAULT_SECONDS));
    eprintln!("abuse: seed {seed} (LINERATE_ABUSE_SEED={seed} repeats this run), {requests} requests");
    // The cases: as many as it takes to send `requests` requests, or the one asked for.
    let cases: Vec<usize> = match env_number("LINERATE_ABUSE_CASE") {
        Some(i) => vec![i as usize],
        None => {
            let (mut total, mut out) = (0, Vec::new());
            while total < requests {
                total += case_len(&mut fastrand::Rng::with_seed(case_seed(seed, out.len())));
                out.push(out.len());
            }
            out
        }
    };

    let start = Instant::now();
    let next = AtomicUsize::new(0);
    let tally = Mutex::new(Tally::default());
    let failures = Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..CLIENTS {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= cases.len() || start.elapsed() > budget || failures.lock().unwrap().len() >= 10 {
                    break;
                }
                let seed_i = case_seed(seed, cases[i]);
                if let Err(e) = run_case(addr, seed_i, &site, &tally) {
                    failures.lock().unwrap().push(format!("case {} (LINERATE_ABUSE_CASE={}): {e}", cases[i], cases[i]));
                }
            });
        }
    });
    let took = start.elapsed();
    let t = tally.into_inner().unwrap();
    eprintln!(
        "abuse: {} cases, {} requests in {:.1} s; answers 1xx {} 2xx {} 3xx {} 4xx {} 5xx {}; {} streams cut by a reset or early close; statuses {:?}",
        t.cases,
        t.requests,
        took.as_secs_f64(),
        t.by_class[1],
        t.by_class[2],
        t.by_class[3],
        t.by_class[4],
        t.by_class[5],
        t.cut,
        t.codes
    );
    let failures = failures.into_inner().unwrap();
    assert!(failures.is_empty(), "seed {seed}: {} failing cases:\n{}", failures.len(), failures.join("\n\n"));
    if t.cases < cases.len() {
        eprintln!("abuse: time budget of {budget:?} reached after {} of {} cases", t.cases, cases.len());
    }

    // The server is still whole.
    assert!(server.child.try_wait().unwrap().is_none(), "linerate exited:\n{}", server.stderr());
    let rs = split_responses(&raw_exchange(
        addr,
        format!("GET /big.bin HTTP/1.1\r\n{HOST}\r\nGET /big.bin HTTP/1.1\r\n{HOST}Range: bytes=1000-65999\r\nConnection: close\r\n\r\n")
            .as_bytes(),
        Duration::from_secs(10),
    ));
    assert_eq!(rs.len(), 2);
    assert_eq!(rs[0].status, 200);
    assert!(rs[0].body == site.big, "whole file after the abuse");
    assert_eq!(rs[1].status, 206);
    assert!(rs[1].body == site.big[1000..66000], "range after the abuse");
    let metrics = raw_exchange(
        server.admin_addr.unwrap(),
        b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        Duration::from_secs(10),
    );
    let m = parse_response(&metrics).expect("an answer from /metrics");
    assert_eq!(m.status, 200);
    assert!(String::from_utf8_lossy(&m.body).contains("linerate_"), "metrics: {}", m.head);
    let log = server.stderr();
    assert!(!log.to_lowercase().contains("panic"), "the server logged a panic:\n{log}");
    // Not a run that tested nothing: both valid answers and refusals in numbers.
    let answers: usize = t.by_class.iter().sum();
    assert!(t.by_class[2] * 10 > answers && t.by_class[4] * 10 > answers, "answers by class: {:?}", t.by_class);
}
