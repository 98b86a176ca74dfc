//! No allocation per request once buffers have grown (ARCHITECTURE.md's promise for
//! `crates/http`), checked by counting: the requests below go through everything the
//! server asks of this crate per response (parse the head, resolve the path, look
//! up the media type, plan the response, write its head and, for a multipart body,
//! its part heads), first once to grow the reusable buffers, then many times under
//! a counting global allocator, which must see no allocation at all.
//!
//! The allocator is `stats_alloc`'s: a `GlobalAlloc` needs `unsafe`, which every
//! crate but `crates/sys` forbids. It counts every thread, so this is a binary of
//! its own without libtest's harness (`harness = false`), whose threads allocate.
#![forbid(unsafe_code)]

use std::alloc::System;

use linerate_http::conditional::Validators;
use linerate_http::date::DateCache;
use linerate_http::plan::{plan_file, Body, FileInfo};
use linerate_http::request::{Limits, Parsed};
use linerate_http::response::HeadWriter;
use linerate_http::{mime, path, Request, Status};
use stats_alloc::{Region, StatsAlloc, INSTRUMENTED_SYSTEM};

#[global_allocator]
static COUNTING: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// Requests counted per case, after the first.
const REQUESTS: u64 = 1000;

/// What a connection keeps from one request to the next.
#[derive(Default)]
struct Buffers {
    req: Request,
    path: Vec<u8>,
    head: Vec<u8>,
    part_head: Vec<u8>,
    date: DateCache,
}

/// Serves the head `raw` as `server::conn` does, up to the body's first byte; returns
/// the response's status and how many parts its body has.
fn serve(b: &mut Buffers, raw: &[u8], boundary_seed: u64) -> (Status, usize) {
    b.req.clear();
    assert_eq!(b.req.parse(raw, &Limits::default()), Ok(Parsed::Complete(raw.len())));
    path::resolve(b.req.target(), &mut b.path).expect("a valid target");
    let content_type = mime::extension(&b.path).and_then(mime::builtin_type).unwrap_or("application/octet-stream");
    let info = FileInfo {
        len_bytes: 10_000_000,
        validators: Validators { etag: b"\"5f-98967f\"", last_modified_secs: 1_700_000_000 },
        content_type,
        now_secs: b.date.now_secs(),
    };
    let plan = plan_file(&b.req, &info, 16, boundary_seed);
    b.head.clear();
    let mut head = HeadWriter::new(&mut b.head, plan.status);
    head.field("Date", b.date.now());
    plan.write_fields(&mut head, &info, true);
    head.finish();
    let parts = match &plan.body {
        Body::Empty => 0,
        Body::Range(_) => 1,
        Body::Multipart(mp) => {
            for i in 0..mp.ranges.len() {
                mp.write_part_head(i, content_type, info.len_bytes, &mut b.part_head);
            }
            mp.write_closing(&mut b.part_head);
            mp.ranges.len()
        }
    };
    (plan.status, parts)
}

/// Allocations (and reallocations) of `REQUESTS` requests after the first.
fn allocations(raw: &[u8], want: (Status, usize)) -> usize {
    let mut buffers = Buffers::default();
    assert_eq!(serve(&mut buffers, raw, 0), want, "{}", String::from_utf8_lossy(raw));
    let region = Region::new(COUNTING);
    for seed in 1..=REQUESTS {
        serve(&mut buffers, raw, seed);
    }
    let counted = region.change();
    counted.allocations + counted.reallocations
}

fn main() {
    let cases: [(&str, &[u8], (Status, usize)); 3] = [
        (
            "single range",
            b"GET /v/t1/seg-00042.m4s HTTP/1.1\r\nHost: cdn.example\r\nUser-Agent: player/1.0\r\n\
              Range: bytes=2097152-4194303\r\nIf-Range: \"5f-98967f\"\r\n\r\n",
            (Status::PartialContent, 1),
        ),
        (
            "multipart",
            b"GET /v/t1/movie.mp4 HTTP/1.1\r\nHost: cdn.example\r\nRange: bytes=0-99, 5000-5999, -500\r\n\r\n",
            (Status::PartialContent, 3),
        ),
        (
            "unsatisfiable range",
            b"GET /v/t1/movie.mp4 HTTP/1.1\r\nHost: cdn.example\r\nRange: bytes=20000000-\r\n\r\n",
            (Status::RangeNotSatisfiable, 0),
        ),
    ];
    let mut failed = Vec::new();
    for (name, raw, want) in cases {
        let n = allocations(raw, want);
        println!("{name}: {n} allocations in {REQUESTS} requests");
        if n != 0 {
            failed.push(name);
        }
    }
    assert!(failed.is_empty(), "requests that allocate once buffers have grown: {failed:?}");
    println!("{} passed, 0 failed", cases.len());
}
