//! The load generator's response reader (`linerate_loadgen::response`).
//!
//! Input: 14 control bytes, then cut points, then the bytes a server sent:
//! - byte 0: bit 0 set = the answer to a `HEAD` (`Expect::Head`), else to a range
//!   request (`Expect::Range`); bit 1 makes the range's length large (shifted 16 bits
//!   up); bits 2 to 7 shift the first byte position right;
//! - bytes 1-8: the range's first byte position; bytes 9-10: its length minus one;
//! - bytes 11-12: the length of a padding field (`X-Pad: aaa…`) inserted after the
//!   first line, so that heads reach the size limit;
//! - byte 13: how many cut points follow (0 to 7), each two bytes;
//! - the rest: the response, in which bytes 1, 2 and 3 stand for the range's first
//!   position, last position and length in decimal (so that matching heads are easy
//!   to reach).
//!
//! Properties:
//! - the outcome is the same fed whole or cut at the chosen points (a reused reader):
//!   the same result (need more, done, or the same error) and the same body bytes;
//! - a head is accepted exactly when an independent, strict reading of RFC 9110 says
//!   it answers the request: for a range, `206`, `Content-Length` fields all equal to
//!   the range's length (digits only), every `Content-Range` exactly `bytes
//!   FIRST-LAST/(COMPLETE|*)` for the requested range with COMPLETE past LAST, no
//!   `Transfer-Encoding`; for a HEAD, `200` with a `Content-Length`; the head is at
//!   most 16 KiB with at most 64 fields; `close` is HTTP/1.0 or `Connection: close`;
//! - a refusal for the status names the status the server sent;
//! - the body handed to the sink is exactly the bytes after the head, up to the
//!   declared length and never past it; the response is done exactly when they have
//!   all arrived, and a byte beyond them is an error.
#![no_main]

use libfuzzer_sys::fuzz_target;
use linerate_loadgen::response::{Expect, Head, Progress, ResponseError, ResponseReader};

/// The reader's limits (`response.rs`): the oracle applies the same ones.
const MAX_HEAD_BYTES: usize = 16 * 1024;
const MAX_HEADERS: usize = 64;

type Outcome = (Result<Progress, ResponseError>, Vec<u8>);

fn run(reader: &mut ResponseReader, expect: Expect, chunks: &[&[u8]]) -> Outcome {
    reader.start(expect);
    let mut body = Vec::new();
    let mut last = Ok(Progress::NeedMore);
    for c in chunks {
        last = reader.feed(c, &mut |b| body.extend_from_slice(b));
        if last.is_err() {
            break;
        }
    }
    (last, body)
}

/// 1*DIGIT, as a number.
fn digits(v: &[u8]) -> Option<u64> {
    if v.is_empty() || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    v.iter().try_fold(0u64, |n, &d| n.checked_mul(10)?.checked_add(u64::from(d - b'0')))
}

/// RFC 9110 section 14.4: `bytes FIRST-LAST/COMPLETE` or `bytes FIRST-LAST/*`, valid
/// (FIRST <= LAST < COMPLETE).
fn content_range(v: &[u8]) -> Option<(u64, u64)> {
    let rest = v.trim_ascii().strip_prefix(b"bytes ")?;
    let slash = rest.iter().position(|&b| b == b'/')?;
    let (span, complete) = (&rest[..slash], &rest[slash + 1..]);
    let dash = span.iter().position(|&b| b == b'-')?;
    let (first, last) = (digits(&span[..dash])?, digits(&span[dash + 1..])?);
    if first > last {
        return None;
    }
    if complete != b"*" && digits(complete)? <= last {
        return None;
    }
    Some((first, last))
}

/// What the response must do: `None` while the head is incomplete, else the head's
/// length and the head it is accepted as, or `Err` with the status when the status
/// is not the one expected (`Err(None)` when it is and the head is refused anyway).
fn oracle(data: &[u8], expect: Expect) -> Option<Result<(usize, Head), Option<u16>>> {
    let mut fields = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut resp = httparse::Response::new(&mut fields);
    let len = match resp.parse(&data[..data.len().min(MAX_HEAD_BYTES + 1)]) {
        Ok(httparse::Status::Complete(len)) if len <= MAX_HEAD_BYTES => len,
        Ok(httparse::Status::Partial) if data.len() <= MAX_HEAD_BYTES => return None,
        _ => return Some(Err(None)),
    };
    let status = resp.code.expect("a complete head has a status");
    let want = match expect {
        Expect::Head | Expect::Whole => 200,
        Expect::Range { .. } => 206,
    };
    let refused = Some(Err((status != want).then_some(status)));
    let headers: &[httparse::Header<'_>] = resp.headers;
    let field = |name: &'static str| headers.iter().filter(move |f| f.name.eq_ignore_ascii_case(name)).map(|f| f.value);
    let lengths: Vec<Option<u64>> = field("content-length").map(|v| digits(v.trim_ascii())).collect();
    let length = match lengths.first() {
        Some(&Some(n)) if lengths.iter().all(|&l| l == Some(n)) => n,
        _ => return refused,
    };
    if status != want || field("transfer-encoding").next().is_some() {
        return refused;
    }
    if let Expect::Range { first, last } = expect {
        let ranges: Vec<_> = field("content-range").map(content_range).collect();
        if length != last - first + 1 || ranges.is_empty() || ranges.iter().any(|&r| r != Some((first, last))) {
            return refused;
        }
    }
    let close = resp.version == Some(0)
        || field("connection").any(|v| v.split(|&b| b == b',').any(|t| t.trim_ascii().eq_ignore_ascii_case(b"close")));
    Some(Ok((len, Head { status, content_length: length, close })))
}

fn u16_at(c: &[u8], i: usize) -> u16 {
    u16::from_le_bytes([c[i], c[i + 1]])
}

fuzz_target!(|input: &[u8]| {
    if input.len() < 14 {
        return;
    }
    let (c, rest) = input.split_at(14);
    let ncuts = usize::from(c[13] % 8);
    if rest.len() < 2 * ncuts {
        return;
    }
    let (cuts, text) = rest.split_at(2 * ncuts);
    let first = u64::from_le_bytes(c[1..9].try_into().unwrap()) >> (c[0] >> 2);
    let mut len = u64::from(u16_at(c, 9)) + 1;
    if c[0] & 2 != 0 {
        len <<= 16;
    }
    let Some(last) = first.checked_add(len - 1) else { return };
    let expect = if c[0] & 1 == 1 { Expect::Head } else { Expect::Range { first, last } };

    let mut data = Vec::with_capacity(text.len() + 64);
    for &b in text {
        match b {
            1 => data.extend_from_slice(first.to_string().as_bytes()),
            2 => data.extend_from_slice(last.to_string().as_bytes()),
            3 => data.extend_from_slice(len.to_string().as_bytes()),
            _ => data.push(b),
        }
    }
    let pad = usize::from(u16_at(c, 11));
    if pad > 0 {
        if let Some(nl) = data.iter().position(|&b| b == b'\n') {
            let mut field = b"X-Pad: ".to_vec();
            field.resize(7 + pad, b'a');
            field.extend_from_slice(b"\r\n");
            data.splice(nl + 1..nl + 1, field);
        }
    }

    let mut reader = ResponseReader::default();
    let whole = run(&mut reader, expect, &[&data]);
    let head = reader.head();

    let mut points: Vec<usize> = cuts.chunks(2).map(|p| usize::from(u16_at(p, 0)) % (data.len() + 1)).collect();
    points.push(0);
    points.push(data.len());
    points.sort_unstable();
    let chunks: Vec<&[u8]> = points.windows(2).map(|w| &data[w[0]..w[1]]).collect();
    let split = run(&mut reader, expect, &chunks);
    assert_eq!(split, whole, "fed whole and cut at {points:?}: different outcomes");

    match oracle(&data, expect) {
        None => {
            assert_eq!(whole, (Ok(Progress::NeedMore), Vec::new()), "the head is incomplete");
            assert_eq!(head, None);
        }
        Some(Err(status)) => {
            assert!(whole.0.is_err(), "accepted a head the oracle refuses: {head:?} {expect:?}");
            assert!(whole.1.is_empty());
            if let Err(ResponseError::Status(s)) = whole.0 {
                assert_eq!(status, Some(s), "refused for status {s}, the oracle says {status:?}");
            }
        }
        Some(Ok((head_len, want))) => {
            assert_eq!(head, Some(want), "the head read differs from the oracle's ({expect:?})");
            let body_len = match expect {
                Expect::Head => 0,
                Expect::Range { .. } | Expect::Whole => want.content_length,
            };
            let end = (head_len as u64).saturating_add(body_len);
            let have = data.len() as u64;
            let sent = &data[head_len..data.len().min(end as usize)];
            assert_eq!(whole.1, sent, "the sink got other bytes than the body");
            match have.cmp(&end) {
                std::cmp::Ordering::Less => assert_eq!(whole.0, Ok(Progress::NeedMore)),
                std::cmp::Ordering::Equal => assert_eq!(whole.0, Ok(Progress::Done)),
                std::cmp::Ordering::Greater => assert!(
                    matches!(whole.0, Err(ResponseError::Protocol(_))),
                    "bytes past the end accepted: {:?}",
                    whole.0
                ),
            }
        }
    }
});
