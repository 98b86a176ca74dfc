//! Deciding the response to a request for a file.
//!
//! [`plan_file`] combines preconditions, If-Range and Range into a [`FilePlan`]: the
//! status, the exact byte layout of the body, and its length, all known before a
//! single byte is sent. [`FilePlan::write_fields`] writes the representation's header
//! fields; [`Multipart`] produces the part headers of a `multipart/byteranges` body.
//! The server then sends the head and walks [`FilePlan::body`], sending part headers
//! from memory and file ranges with `sendfile`.
//!
//! Planning allocates nothing once buffers have grown: ranges are decided in fixed
//! arrays ([`range`]), and a multipart plan takes its range list from a small
//! per-thread pool and gives it back when dropped.

use std::cell::RefCell;

use crate::conditional::{self, Precondition, Validators};
use crate::range::{self, ByteRange, RangeDecision};
use crate::request::{Method, Request};
use crate::response::{range_value_len, write_range_value, HeadWriter, Status};

/// What the server knows about the file it is about to serve.
#[derive(Clone, Copy, Debug)]
pub struct FileInfo<'a> {
    pub len_bytes: u64,
    pub validators: Validators<'a>,
    pub content_type: &'a str,
    /// The Date of the response (seconds since the epoch): a Last-Modified date
    /// in If-Range is only honoured once it is at least a second older.
    pub now_secs: i64,
}

/// The layout of a response body.
#[derive(Debug, PartialEq, Eq)]
pub enum Body {
    /// No body (304, 412, 416, HEAD-like answers, or an empty file).
    Empty,
    /// One contiguous range of the file (the whole file for a 200).
    Range(ByteRange),
    /// `multipart/byteranges`: each range preceded by a part header, then a closing delimiter.
    Multipart(Multipart),
}

#[derive(Debug, PartialEq, Eq)]
pub struct FilePlan {
    pub status: Status,
    pub body: Body,
    /// The Content-Length of the body as a GET would send it.
    pub content_length: u64,
}

/// Plans the response to a GET or HEAD for a file. `max_ranges == 0` disables ranges;
/// `boundary_seed` makes the multipart boundary differ between responses.
pub fn plan_file(req: &Request, file: &FileInfo<'_>, max_ranges: usize, boundary_seed: u64) -> FilePlan {
    let empty = |status| FilePlan { status, body: Body::Empty, content_length: 0 };
    match conditional::evaluate(req, &file.validators) {
        Precondition::Failed => return empty(Status::PreconditionFailed),
        Precondition::NotModified => return empty(Status::NotModified),
        Precondition::Proceed => {}
    }
    let len = file.len_bytes;
    let whole = || FilePlan {
        status: Status::Ok,
        body: if len == 0 { Body::Empty } else { Body::Range(ByteRange { first: 0, last: len - 1 }) },
        content_length: len,
    };
    // Range handling is defined for GET only (RFC 9110 section 14.2).
    let Some(range_field) = req.range().filter(|_| req.method == Method::Get) else {
        return whole();
    };
    if let Some(if_range) = req.if_range() {
        if !conditional::if_range_matches(if_range, &file.validators, file.now_secs) {
            return whole();
        }
    }
    match range::evaluate(range_field, len, max_ranges) {
        RangeDecision::Whole => whole(),
        RangeDecision::Unsatisfiable => empty(Status::RangeNotSatisfiable),
        RangeDecision::Partial(ranges) if ranges.len() == 1 => FilePlan {
            status: Status::PartialContent,
            content_length: ranges[0].len_bytes(),
            body: Body::Range(ranges[0]),
        },
        RangeDecision::Partial(ranges) => {
            let mp = Multipart::new(&ranges, boundary_seed);
            // A multipart body adds part heads to up to the whole file; for a length
            // near u64::MAX (never a real file's: st_size is an i64) that sum does not
            // fit, and the Range field is ignored, as RFC 9110 section 14.2 allows.
            match mp.content_length(file.content_type, len) {
                Some(content_length) => {
                    FilePlan { status: Status::PartialContent, content_length, body: Body::Multipart(mp) }
                }
                None => whole(),
            }
        }
    }
}

impl FilePlan {
    /// Writes the representation fields for this plan: Content-Type, Content-Length,
    /// Content-Range, validators and Accept-Ranges.
    pub fn write_fields(&self, head: &mut HeadWriter<'_>, file: &FileInfo<'_>, ranges_enabled: bool) {
        let mut lm = [0u8; crate::date::HTTP_DATE_LEN];
        crate::date::format_secs(file.validators.last_modified_secs, &mut lm);
        match self.status {
            Status::NotModified => {
                // A 304 carries the validators (RFC 9110 section 15.4.5), no Content-Length.
                head.field("ETag", file.validators.etag).field("Last-Modified", &lm);
                return;
            }
            Status::PreconditionFailed => {
                head.field_u64("Content-Length", 0);
                return;
            }
            Status::RangeNotSatisfiable => {
                head.unsatisfied_range(file.len_bytes).field_u64("Content-Length", 0);
                return;
            }
            _ => {}
        }
        match &self.body {
            Body::Multipart(mp) => {
                let mut ct = [0u8; MULTIPART_TYPE.len() + BOUNDARY_LEN];
                let (media_type, boundary) = ct.split_at_mut(MULTIPART_TYPE.len());
                media_type.copy_from_slice(MULTIPART_TYPE);
                boundary.copy_from_slice(mp.boundary());
                head.field("Content-Type", &ct);
            }
            Body::Range(r) if self.status == Status::PartialContent => {
                head.field("Content-Type", file.content_type.as_bytes());
                head.content_range(r.first, r.last, file.len_bytes);
            }
            _ => {
                head.field("Content-Type", file.content_type.as_bytes());
            }
        }
        head.field_u64("Content-Length", self.content_length)
            .field("Last-Modified", &lm)
            .field("ETag", file.validators.etag)
            .field("Accept-Ranges", if ranges_enabled { b"bytes" } else { b"none" });
    }
}

const BOUNDARY_PREFIX: &[u8] = b"linerate-";
const BOUNDARY_LEN: usize = BOUNDARY_PREFIX.len() + 16;
/// The Content-Type of a multipart body, up to its boundary.
const MULTIPART_TYPE: &[u8] = b"multipart/byteranges; boundary=";
/// The pieces of a part head and of the closing delimiter, around the boundary, the
/// content type and the range: `\r\n--B\r\nContent-Type: T\r\nContent-Range: R\r\n\r\n`
/// and `\r\n--B--\r\n`.
const DELIMITER: &[u8] = b"\r\n--";
const PART_TYPE: &[u8] = b"\r\nContent-Type: ";
const PART_RANGE: &[u8] = b"\r\nContent-Range: ";
const PART_HEAD_END: &[u8] = b"\r\n\r\n";
const CLOSING_END: &[u8] = b"--\r\n";
/// Range lists kept per thread for the next multipart plans.
const SPARE_RANGE_LISTS: usize = 64;

thread_local! {
    /// Range lists of dropped multipart plans, for the next ones: a thread allocates
    /// a list only while it has more multipart plans alive at once than ever before
    /// (or more than `SPARE_RANGE_LISTS`), or for more ranges than a list held.
    static SPARE: RefCell<Vec<Vec<ByteRange>>> = const { RefCell::new(Vec::new()) };
}

/// The parts of a `multipart/byteranges` body.
#[derive(Debug, PartialEq, Eq)]
pub struct Multipart {
    pub ranges: Vec<ByteRange>,
    boundary: [u8; BOUNDARY_LEN],
}

impl Drop for Multipart {
    /// Gives the range list back to this thread's spares.
    fn drop(&mut self) {
        let mut list = std::mem::take(&mut self.ranges);
        list.clear();
        // Fails only while the thread exits: the list is then freed.
        let _ = SPARE.try_with(|spare| {
            let mut spare = spare.borrow_mut();
            if spare.len() < SPARE_RANGE_LISTS {
                spare.push(list);
            }
        });
    }
}

impl Multipart {
    fn new(parts: &[ByteRange], seed: u64) -> Multipart {
        let mut ranges = SPARE.try_with(|spare| spare.borrow_mut().pop()).ok().flatten().unwrap_or_default();
        ranges.extend_from_slice(parts);
        let mut boundary = [0u8; BOUNDARY_LEN];
        boundary[..BOUNDARY_PREFIX.len()].copy_from_slice(BOUNDARY_PREFIX);
        let mut x = splitmix64(seed);
        for b in boundary[BOUNDARY_PREFIX.len()..].iter_mut() {
            *b = b"0123456789abcdef"[(x & 15) as usize];
            x >>= 4;
        }
        Multipart { ranges, boundary }
    }

    pub fn boundary(&self) -> &[u8] {
        &self.boundary
    }

    /// Writes the delimiter and header of part `i` into `out` (cleared first).
    pub fn write_part_head(&self, i: usize, content_type: &str, total_len: u64, out: &mut Vec<u8>) {
        let r = self.ranges[i];
        out.clear();
        out.extend_from_slice(DELIMITER);
        out.extend_from_slice(&self.boundary);
        out.extend_from_slice(PART_TYPE);
        out.extend_from_slice(content_type.as_bytes());
        out.extend_from_slice(PART_RANGE);
        write_range_value(out, r.first, r.last, total_len);
        out.extend_from_slice(PART_HEAD_END);
    }

    /// Writes the closing delimiter into `out` (cleared first).
    pub fn write_closing(&self, out: &mut Vec<u8>) {
        out.clear();
        out.extend_from_slice(DELIMITER);
        out.extend_from_slice(&self.boundary);
        out.extend_from_slice(CLOSING_END);
    }

    /// The exact length of the whole multipart body, or `None` if it does not fit
    /// in a u64. Counted, not written: the part heads differ only in their range.
    pub fn content_length(&self, content_type: &str, total_len: u64) -> Option<u64> {
        let head_bytes = DELIMITER.len()
            + BOUNDARY_LEN
            + PART_TYPE.len()
            + content_type.len()
            + PART_RANGE.len()
            + PART_HEAD_END.len();
        let mut n: u64 = 0;
        for r in &self.ranges {
            let part_head = head_bytes + range_value_len(r.first, r.last, total_len);
            n = n.checked_add(part_head as u64)?.checked_add(r.len_bytes())?;
        }
        n.checked_add((DELIMITER.len() + BOUNDARY_LEN + CLOSING_END.len()) as u64)
    }
}

/// A 64-bit mixing function (SplitMix64's finaliser): spreads a counter into
/// boundary digits that differ between responses.
fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::Limits;

    const FILE: FileInfo<'static> = FileInfo {
        len_bytes: 1000,
        validators: Validators { etag: b"\"e\"", last_modified_secs: 1_700_000_000 },
        content_type: "video/mp4",
        now_secs: 1_700_000_100,
    };

    fn req(fields: &str) -> Request {
        req_m("GET", fields)
    }

    fn req_m(method: &str, fields: &str) -> Request {
        let raw = format!("{method} /f.mp4 HTTP/1.1\r\nHost: h\r\n{fields}\r\n");
        let mut r = Request::default();
        r.parse(raw.as_bytes(), &Limits::default()).unwrap();
        r
    }

    fn head_of(plan: &FilePlan) -> String {
        let mut buf = Vec::new();
        let mut h = HeadWriter::new(&mut buf, plan.status);
        plan.write_fields(&mut h, &FILE, true);
        h.finish();
        String::from_utf8(buf).unwrap()
    }

    #[test]
    fn whole_file() {
        let p = plan_file(&req(""), &FILE, 16, 0);
        assert_eq!(p.status, Status::Ok);
        assert_eq!(p.body, Body::Range(ByteRange { first: 0, last: 999 }));
        let h = head_of(&p);
        assert!(h.contains("Content-Length: 1000\r\n"), "{h}");
        assert!(h.contains("ETag: \"e\"\r\n"));
        assert!(h.contains("Last-Modified: Tue, 14 Nov 2023 22:13:20 GMT\r\n"));
        assert!(h.contains("Accept-Ranges: bytes\r\n"));
        assert!(!h.contains("Content-Range"));
    }

    #[test]
    fn single_range() {
        let p = plan_file(&req("Range: bytes=10-19\r\n"), &FILE, 16, 0);
        assert_eq!(p.status, Status::PartialContent);
        assert_eq!(p.content_length, 10);
        assert!(head_of(&p).contains("Content-Range: bytes 10-19/1000\r\n"));
        // HEAD ignores Range; If-Range mismatch serves the whole file.
        assert_eq!(plan_file(&req_m("HEAD", "Range: bytes=10-19\r\n"), &FILE, 16, 0).status, Status::Ok);
        assert_eq!(plan_file(&req("Range: bytes=10-19\r\nIf-Range: \"old\"\r\n"), &FILE, 16, 0).status, Status::Ok);
        assert_eq!(
            plan_file(&req("Range: bytes=10-19\r\nIf-Range: \"e\"\r\n"), &FILE, 16, 0).status,
            Status::PartialContent
        );
    }

    #[test]
    fn if_range_date_must_be_strong() {
        // 1_700_000_000 is Tue, 14 Nov 2023 22:13:20 GMT, FILE's Last-Modified.
        let r = req("Range: bytes=10-19\r\nIf-Range: Tue, 14 Nov 2023 22:13:20 GMT\r\n");
        assert_eq!(plan_file(&r, &FILE, 16, 0).status, Status::PartialContent);
        // Served within the second of the modification: the date is weak, 200 whole.
        let just_modified = FileInfo { now_secs: 1_700_000_000, ..FILE };
        let p = plan_file(&r, &just_modified, 16, 0);
        assert_eq!((p.status, p.content_length), (Status::Ok, 1000));
    }

    #[test]
    fn unsatisfiable_and_conditionals() {
        let p = plan_file(&req("Range: bytes=5000-\r\n"), &FILE, 16, 0);
        assert_eq!(p.status, Status::RangeNotSatisfiable);
        assert!(head_of(&p).contains("Content-Range: bytes */1000\r\n"));
        let p = plan_file(&req("If-None-Match: \"e\"\r\nRange: bytes=0-1\r\n"), &FILE, 16, 0);
        assert_eq!(p.status, Status::NotModified);
        let h = head_of(&p);
        assert!(h.contains("ETag") && !h.contains("Content-Length"), "{h}");
        assert_eq!(plan_file(&req("If-Match: \"x\"\r\n"), &FILE, 16, 0).status, Status::PreconditionFailed);
    }

    #[test]
    fn multipart_layout_matches_content_length() {
        let p = plan_file(&req("Range: bytes=0-9,500-509\r\n"), &FILE, 16, 42);
        let Body::Multipart(mp) = &p.body else { panic!("{p:?}") };
        let mut body = Vec::new();
        let mut scratch = Vec::new();
        for (i, r) in mp.ranges.iter().enumerate() {
            mp.write_part_head(i, FILE.content_type, FILE.len_bytes, &mut scratch);
            body.extend_from_slice(&scratch);
            body.extend(std::iter::repeat_n(b'x', r.len_bytes() as usize));
        }
        mp.write_closing(&mut scratch);
        body.extend_from_slice(&scratch);
        assert_eq!(body.len() as u64, p.content_length);
        let text = String::from_utf8(body).unwrap();
        let b = String::from_utf8(mp.boundary().to_vec()).unwrap();
        assert!(
            text.starts_with(&format!("\r\n--{b}\r\nContent-Type: video/mp4\r\nContent-Range: bytes 0-9/1000\r\n\r\n"))
        );
        assert!(text.ends_with(&format!("\r\n--{b}--\r\n")));
        assert!(head_of(&p).contains(&format!("Content-Type: multipart/byteranges; boundary={b}\r\n")));
        // Different seeds give different boundaries.
        let p2 = plan_file(&req("Range: bytes=0-9,500-509\r\n"), &FILE, 16, 43);
        let Body::Multipart(mp2) = &p2.body else { panic!() };
        assert_ne!(mp.boundary(), mp2.boundary());
    }

    /// Found by the `response_plan` fuzz target (a 10-million-run campaign): a file of
    /// u64::MAX - 1 bytes and `Range: bytes=0-1,90-` overflowed the multipart length.
    #[test]
    fn multipart_length_overflow_answers_whole_file() {
        let huge = FileInfo { len_bytes: u64::MAX - 1, ..FILE };
        let p = plan_file(&req("Range: bytes=0-1,90-\r\n"), &huge, 16, 0);
        assert_eq!(
            (p.status, p.body, p.content_length),
            (Status::Ok, Body::Range(ByteRange { first: 0, last: u64::MAX - 2 }), u64::MAX - 1)
        );
        // Lengths a real file can have (st_size is an i64) still get multipart.
        let big = FileInfo { len_bytes: i64::MAX as u64, ..FILE };
        let p = plan_file(&req("Range: bytes=0-1,90-\r\n"), &big, 16, 0);
        assert_eq!(p.status, Status::PartialContent);
        assert!(matches!(p.body, Body::Multipart(_)));
    }

    #[test]
    fn empty_file() {
        let empty = FileInfo { len_bytes: 0, ..FILE };
        let p = plan_file(&req("Range: bytes=0-\r\n"), &empty, 16, 0);
        assert_eq!((p.status, p.body, p.content_length), (Status::Ok, Body::Empty, 0));
    }
}
