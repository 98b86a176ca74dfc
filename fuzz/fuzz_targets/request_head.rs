//! Request heads (`linerate_http::request`) and body discarding (`linerate_http::body`).
//!
//! Input: four control bytes (limits, split point, body limit), then the bytes a
//! client sent. Properties:
//! - parsing never panics, and `Complete(n)` has `0 < n <= input length`;
//! - the answer does not depend on how the bytes arrived: parsing a prefix (as the
//!   server does after a short read) and then the whole input agree: a complete head
//!   in the prefix is the same head in the whole, a refused prefix is refused whole,
//!   and a prefix that needs more bytes holds no complete head;
//! - the parsed head alone (`input[..n]`) parses to the same request;
//! - `may_be_complete` never hides a complete head, from any scan position;
//! - discarding the body that follows gives the same result (consumed bytes, error,
//!   done) whether it is fed whole or in arbitrary pieces.
#![no_main]

use libfuzzer_sys::fuzz_target;
use linerate_http::body::{Discard, DiscardError};
use linerate_http::request::{may_be_complete, BodyFraming, Limits, Parsed, Request, RequestError};
use linerate_http::{Method, Version};

/// Everything a parsed request exposes, comparable.
#[derive(Debug, PartialEq, Eq)]
struct Seen {
    method: Method,
    version: Version,
    keep_alive: bool,
    body: BodyFraming,
    expect_continue: bool,
    method_name: Vec<u8>,
    target: Vec<u8>,
    fields: [Option<Vec<u8>>; 8],
}

fn seen(r: &Request) -> Seen {
    let own = |v: Option<&[u8]>| v.map(<[u8]>::to_vec);
    Seen {
        method: r.method,
        version: r.version,
        keep_alive: r.keep_alive,
        body: r.body,
        expect_continue: r.expect_continue,
        method_name: r.method_name().to_vec(),
        target: r.target().to_vec(),
        fields: [
            own(r.range()),
            own(r.if_range()),
            own(r.if_match()),
            own(r.if_none_match()),
            own(r.if_modified_since()),
            own(r.if_unmodified_since()),
            own(r.origin()),
            own(r.cors_request_method()),
        ],
    }
}

fn parse(req: &mut Request, buf: &[u8], limits: &Limits) -> Result<Parsed, RequestError> {
    let result = req.parse(buf, limits);
    if let Ok(Parsed::Complete(n)) = result {
        assert!(n > 0 && n <= buf.len(), "Complete({n}) of {} bytes", buf.len());
    }
    result
}

/// Feeds `input` the way a connection does: `feed` sees the unconsumed bytes of
/// everything received so far; `cuts` are the ends of successive reads.
fn discard(framing: BodyFraming, limit: u64, input: &[u8], cuts: &[usize]) -> (Result<usize, DiscardError>, bool) {
    let mut d = match Discard::new(framing, limit) {
        Ok(d) => d,
        Err(e) => return (Err(e), false),
    };
    let mut pos = 0;
    for &avail in cuts.iter().chain(std::iter::once(&input.len())) {
        let avail = avail.clamp(pos, input.len());
        match d.feed(&input[pos..avail]) {
            Ok(n) => {
                assert!(n <= avail - pos);
                pos += n;
            }
            Err(e) => return (Err(e), d.is_done()),
        }
        if d.is_done() {
            break;
        }
    }
    (Ok(pos), d.is_done())
}

fn check_body(framing: BodyFraming, limit: u64, input: &[u8], ctl: u8) {
    let whole = discard(framing, limit, input, &[]);
    // Two split patterns: a fixed step, and cuts spread by the control byte.
    let step = 1 + (ctl as usize % 7);
    let cuts: Vec<usize> = (1..=input.len() / step).map(|i| i * step).collect();
    assert_eq!(discard(framing, limit, input, &cuts), whole, "fed in steps of {step}");
    let at = input.len() * ctl as usize / 255;
    assert_eq!(discard(framing, limit, input, &[at]), whole, "split at {at}");
}

fuzz_target!(|data: &[u8]| {
    let Some((ctl, input)) = data.split_first_chunk::<4>() else {
        return;
    };
    // Small limits, so that inputs of a few hundred bytes reach them.
    let limits = Limits {
        max_head_bytes: 32 + ctl[0] as usize * 4,
        max_uri_bytes: 8 + ctl[1] as usize,
        max_headers: 1 + (ctl[2] % 24) as usize,
    };
    let split = input.len() * ctl[3] as usize / 255;

    let mut whole_req = Request::default();
    let whole = parse(&mut whole_req, input, &limits);
    let mut prefix_req = Request::default();
    let prefix = parse(&mut prefix_req, &input[..split], &limits);

    match (&prefix, &whole) {
        (Ok(Parsed::Complete(n)), _) => {
            assert_eq!(whole, Ok(Parsed::Complete(*n)), "head complete in the first {split} bytes");
            assert_eq!(seen(&prefix_req), seen(&whole_req));
        }
        (Err(e), _) => assert!(whole.is_err(), "prefix of {split} bytes refused ({e:?}) but whole gives {whole:?}"),
        (Ok(Parsed::Partial), Ok(Parsed::Complete(n))) => assert!(*n > split, "Complete({n}) hidden in {split} bytes"),
        (Ok(Parsed::Partial), _) => {}
    }

    if let Ok(Parsed::Complete(n)) = whole {
        // The head alone is the same head.
        let mut alone = Request::default();
        assert_eq!(parse(&mut alone, &input[..n], &limits), Ok(Parsed::Complete(n)));
        assert_eq!(seen(&alone), seen(&whole_req));
        // Reusing a request object forgets the previous one.
        let mut reused = Request::default();
        let _ = reused.parse(b"HEAD /x HTTP/1.0\r\nRange: bytes=0-1\r\nConnection: keep-alive\r\n\r\n", &limits);
        assert_eq!(parse(&mut reused, input, &limits), Ok(Parsed::Complete(n)));
        assert_eq!(seen(&reused), seen(&whole_req));
        // The completeness hint must let the server find this head whatever it had scanned before.
        assert!(may_be_complete(input, 0));
        if !may_be_complete(&input[..split], 0) {
            assert!(may_be_complete(input, split), "hint hides the head after a read ending at {split}");
        }
        let limit = ctl[2] as u64 * 8;
        check_body(whole_req.body, limit, &input[n..], ctl[3]);
    } else {
        // Reach the chunked decoder directly as well.
        check_body(BodyFraming::Chunked, ctl[0] as u64 * 8, input, ctl[3]);
    }
});
