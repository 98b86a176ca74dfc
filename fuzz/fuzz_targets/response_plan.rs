//! Response plans (`linerate_http::plan`): Range and conditionals against a file.
//!
//! Input: 24 control bytes (file length, modification time, clock, max_ranges,
//! boundary seed, method), then `\n`-separated values for Range, If-Range, If-Match,
//! If-None-Match, If-Modified-Since and If-Unmodified-Since. Properties:
//! - the plan's Content-Length is exactly the number of body bytes the server sends
//!   for its layout: the range's length for a single range; for multipart, every
//!   part head and the closing delimiter as written, plus every part's length;
//! - every range lies within the file, multipart parts do not overlap and together
//!   never exceed the file (coalescing bounds the amplification);
//! - the status and body agree (304/412/416 and HEAD-less empty bodies have length
//!   0; 200 sends the whole file);
//! - the head `write_fields` writes is valid HTTP, its Content-Length equals the
//!   plan's, and each Content-Range states the range sent.
#![no_main]

use libfuzzer_sys::fuzz_target;
use linerate_http::conditional::Validators;
use linerate_http::plan::{plan_file, Body, FileInfo, FilePlan};
use linerate_http::range::ByteRange;
use linerate_http::request::{Limits, Parsed, Request};
use linerate_http::response::HeadWriter;
use linerate_http::Status;

const CONTENT_TYPES: [&str; 4] = ["video/mp4", "application/octet-stream", "text/plain; charset=utf-8", "a/b"];
const FIELDS: [&str; 6] =
    ["Range", "If-Range", "If-Match", "If-None-Match", "If-Modified-Since", "If-Unmodified-Since"];

/// The fields of a written head (status code, then name/value pairs).
fn fields_of(head: &[u8]) -> (u16, Vec<(String, Vec<u8>)>) {
    let mut storage = [httparse::EMPTY_HEADER; 32];
    let mut resp = httparse::Response::new(&mut storage);
    let status = resp.parse(head).expect("the written head is valid HTTP");
    assert_eq!(status, httparse::Status::Complete(head.len()), "head ends with its empty line");
    let fields = resp.headers.iter().map(|h| (h.name.to_ascii_lowercase(), h.value.to_vec())).collect();
    (resp.code.unwrap(), fields)
}

fn field<'a>(fields: &'a [(String, Vec<u8>)], name: &str) -> Option<&'a [u8]> {
    let mut found = fields.iter().filter(|(n, _)| n == name);
    let first = found.next().map(|(_, v)| v.as_slice());
    assert!(found.next().is_none(), "{name} written twice");
    first
}

fn range_value(r: &ByteRange, len: u64) -> Vec<u8> {
    format!("bytes {}-{}/{}", r.first, r.last, len).into_bytes()
}

fn check_within(r: &ByteRange, len: u64) {
    assert!(r.first <= r.last && r.last < len, "{r:?} outside a file of {len} bytes");
}

fn check(plan: &FilePlan, file: &FileInfo<'_>) {
    let len = file.len_bytes;
    let ct = file.content_type;
    // What the server sends as the body for this layout (server::conn::send_file).
    let sent: u64 = match &plan.body {
        Body::Empty => 0,
        Body::Range(r) => {
            check_within(r, len);
            r.len_bytes()
        }
        Body::Multipart(mp) => {
            assert!(mp.ranges.len() >= 2, "multipart with {} part(s)", mp.ranges.len());
            let mut sorted = mp.ranges.clone();
            sorted.sort_by_key(|r| r.first);
            for w in sorted.windows(2) {
                assert!(w[0].last < w[1].first, "overlapping parts {:?}", mp.ranges);
            }
            let mut scratch = Vec::new();
            let mut total = 0u64;
            let mut data = 0u64;
            for (i, r) in mp.ranges.iter().enumerate() {
                check_within(r, len);
                mp.write_part_head(i, ct, len, &mut scratch);
                // The part head is a delimiter line and a head of its own.
                let boundary_line = [b"\r\n--", mp.boundary(), b"\r\n"].concat();
                assert!(scratch.starts_with(&boundary_line));
                let mut part_fields = [httparse::EMPTY_HEADER; 4];
                let parsed = httparse::parse_headers(&scratch[boundary_line.len()..], &mut part_fields)
                    .expect("a part head is valid");
                let httparse::Status::Complete((n, hs)) = parsed else { panic!("part head incomplete") };
                assert_eq!(boundary_line.len() + n, scratch.len());
                let cr = hs.iter().find(|h| h.name == "Content-Range").expect("part has Content-Range");
                assert_eq!(cr.value, range_value(r, len));
                total += scratch.len() as u64 + r.len_bytes();
                data += r.len_bytes();
            }
            mp.write_closing(&mut scratch);
            assert_eq!(scratch, [b"\r\n--", mp.boundary(), b"--\r\n"].concat());
            assert!(data <= len, "parts send {data} bytes of a {len}-byte file");
            total + scratch.len() as u64
        }
    };
    assert_eq!(plan.content_length, sent, "Content-Length vs body layout {:?}", plan.body);

    match plan.status {
        Status::Ok => {
            assert_eq!(plan.content_length, len);
            match &plan.body {
                Body::Empty => assert_eq!(len, 0),
                Body::Range(r) => assert_eq!((r.first, r.last), (0, len - 1)),
                Body::Multipart(_) => panic!("200 with multipart"),
            }
        }
        Status::PartialContent => assert!(!matches!(plan.body, Body::Empty), "206 without a body"),
        Status::NotModified | Status::PreconditionFailed | Status::RangeNotSatisfiable => {
            assert_eq!(plan.body, Body::Empty)
        }
        other => panic!("unexpected status {other:?}"),
    }

    let mut head = Vec::new();
    let mut w = HeadWriter::new(&mut head, plan.status);
    plan.write_fields(&mut w, file, true);
    w.finish();
    let (code, fields) = fields_of(&head);
    assert_eq!(code, plan.status.code());
    let cl = field(&fields, "content-length");
    if plan.status == Status::NotModified {
        assert_eq!(cl, None);
    } else {
        assert_eq!(cl, Some(plan.content_length.to_string().as_bytes()));
    }
    let content_range = field(&fields, "content-range");
    match (&plan.body, plan.status) {
        (Body::Range(r), Status::PartialContent) => assert_eq!(content_range, Some(&range_value(r, len)[..])),
        (_, Status::RangeNotSatisfiable) => assert_eq!(content_range, Some(format!("bytes */{len}").as_bytes())),
        _ => assert_eq!(content_range, None),
    }
    if let Body::Multipart(mp) = &plan.body {
        let ct = field(&fields, "content-type").expect("Content-Type");
        assert_eq!(ct, [b"multipart/byteranges; boundary=", mp.boundary()].concat());
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((ctl, rest)) = data.split_first_chunk::<24>() else {
        return;
    };
    let word = |i: usize| u64::from_le_bytes(ctl[i..i + 8].try_into().unwrap());
    // Mostly small files, sometimes huge ones.
    let len_bytes = word(0) >> (ctl[16] % 64);
    let last_modified_secs = word(8) as i64 >> (ctl[17] % 64);
    let now_secs = last_modified_secs.saturating_add(ctl[18] as i8 as i64);
    let max_ranges = (ctl[19] % 70) as usize;
    let seed = u32::from_le_bytes(ctl[20..24].try_into().unwrap()) as u64;
    let method = if ctl[16] & 0x80 != 0 { "HEAD" } else { "GET" };

    let mut raw = format!("{method} /f HTTP/1.1\r\nHost: h\r\n").into_bytes();
    for (name, value) in FIELDS.iter().zip(rest.split(|&b| b == b'\n')) {
        if value.first() == Some(&b'-') {
            continue; // a value starting with '-' means: no such field
        }
        raw.extend_from_slice(name.as_bytes());
        raw.extend_from_slice(b": ");
        raw.extend_from_slice(value);
        raw.extend_from_slice(b"\r\n");
    }
    raw.extend_from_slice(b"\r\n");
    let mut req = Request::default();
    if req.parse(&raw, &Limits::default()) != Ok(Parsed::Complete(raw.len())) {
        return; // not a request the server would plan a response for
    }
    let etag = format!("\"{:x}-{:x}\"", len_bytes, last_modified_secs);
    let file = FileInfo {
        len_bytes,
        validators: Validators { etag: etag.as_bytes(), last_modified_secs },
        content_type: CONTENT_TYPES[(ctl[17] >> 6) as usize],
        now_secs,
    };
    let plan = plan_file(&req, &file, max_ranges, seed);
    check(&plan, &file);
    // The plan depends on the boundary seed only through the boundary.
    let again = plan_file(&req, &file, max_ranges, seed ^ 0x5555);
    assert_eq!((again.status, again.content_length), (plan.status, plan.content_length));
});
