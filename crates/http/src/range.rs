//! Byte ranges (RFC 9110 section 14).
//!
//! [`evaluate`] takes a Range field and the representation length and decides
//! between the whole representation (no Range, an invalid one, or one the server
//! chooses to ignore), a list of satisfiable ranges, or 416.
//!
//! Multi-range requests are where range support gets abused: thousands of tiny or
//! overlapping ranges make a small request expand into a response many times the
//! file's size. Two defences, both allowed by RFC 9110 section 14.2:
//! - a request with more range-specs than `max_ranges` is served whole (ignored);
//! - overlapping ranges, and ranges separated by less than a part header's worth of
//!   bytes, are coalesced, so the parts never add up to more than the file.
//!
//! Nothing here allocates: specs and ranges are held in fixed arrays of
//! [`MAX_RANGES`], the most `max_ranges` can be.

/// A satisfiable range, inclusive at both ends as in `Content-Range`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ByteRange {
    pub first: u64,
    pub last: u64,
}

impl ByteRange {
    pub fn len_bytes(&self) -> u64 {
        self.last - self.first + 1
    }
}

/// Ranges closer than this are merged into one part: a part header costs about as much.
pub const COALESCE_GAP_BYTES: u64 = 80;

/// The most range-specs a Range field can have and still be honoured, whatever
/// `max_ranges` asks (`limits.max_ranges` is validated to at most this).
pub const MAX_RANGES: usize = 64;

/// Up to [`MAX_RANGES`] satisfiable ranges, in a fixed array: deciding a Range
/// field allocates nothing. Reads as a slice.
#[derive(Clone, Copy)]
pub struct Ranges {
    len: usize,
    items: [ByteRange; MAX_RANGES],
}

impl Ranges {
    const fn new() -> Ranges {
        Ranges { len: 0, items: [ByteRange { first: 0, last: 0 }; MAX_RANGES] }
    }

    /// Appends `r`: callers push at most as many ranges as there were specs.
    fn push(&mut self, r: ByteRange) {
        self.items[self.len] = r;
        self.len += 1;
    }
}

impl std::ops::Deref for Ranges {
    type Target = [ByteRange];

    fn deref(&self) -> &[ByteRange] {
        &self.items[..self.len]
    }
}

impl std::ops::DerefMut for Ranges {
    fn deref_mut(&mut self) -> &mut [ByteRange] {
        &mut self.items[..self.len]
    }
}

impl PartialEq for Ranges {
    fn eq(&self, other: &Ranges) -> bool {
        **self == **other
    }
}

impl Eq for Ranges {}

impl std::fmt::Debug for Ranges {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        (**self).fmt(f)
    }
}

// A decision lives on the stack for the time of one plan; boxing its ranges would be
// the allocation this type exists to avoid.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, PartialEq, Eq)]
pub enum RangeDecision {
    /// Serve the whole representation with 200.
    Whole,
    /// Serve these ranges with 206 (one range: a plain 206; several: multipart).
    Partial(Ranges),
    /// None of the ranges is satisfiable: 416 with `Content-Range: bytes */len`.
    Unsatisfiable,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Spec {
    /// `first-` or `first-last`.
    From { first: u64, last: Option<u64> },
    /// `-suffix`.
    Suffix(u64),
}

/// Decides what to send for `range` (the Range field value) on a representation of
/// `len` bytes. `max_ranges == 0` disables range support.
pub fn evaluate(range: &[u8], len: u64, max_ranges: usize) -> RangeDecision {
    let mut specs = [Spec::Suffix(0); MAX_RANGES];
    let cap = max_ranges.min(specs.len());
    let Some(count) = parse(range, &mut specs[..cap]) else {
        return RangeDecision::Whole;
    };
    // An empty representation has no bytes to give a range of (and no way to write
    // its Content-Range), so it is always served whole.
    if len == 0 {
        return RangeDecision::Whole;
    }
    let mut ranges = Ranges::new();
    for spec in &specs[..count] {
        match *spec {
            Spec::From { first, .. } if first >= len => {}
            Spec::From { first, last } => {
                ranges.push(ByteRange { first, last: last.map_or(len - 1, |l| l.min(len - 1)) })
            }
            Spec::Suffix(0) => {}
            Spec::Suffix(n) => ranges.push(ByteRange { first: len.saturating_sub(n), last: len - 1 }),
        }
    }
    if ranges.is_empty() {
        return RangeDecision::Unsatisfiable;
    }
    coalesce(&mut ranges);
    RangeDecision::Partial(ranges)
}

/// Parses `bytes=spec, spec, ...` into `out`. Returns the number of specs, or None
/// when the field is syntactically invalid, uses another unit, or has more specs
/// than `out` can hold (the caller then ignores it).
fn parse(value: &[u8], out: &mut [Spec]) -> Option<usize> {
    let value = crate::request::trim(value);
    let eq = value.iter().position(|&b| b == b'=')?;
    if !value[..eq].eq_ignore_ascii_case(b"bytes") {
        return None;
    }
    let mut count = 0;
    for item in value[eq + 1..].split(|&b| b == b',') {
        let item = crate::request::trim(item);
        if item.is_empty() {
            continue; // the list rule allows empty elements
        }
        let dash = item.iter().position(|&b| b == b'-')?;
        let (a, b) = (&item[..dash], &item[dash + 1..]);
        let spec = if a.is_empty() {
            Spec::Suffix(number(b)?)
        } else {
            let first = number(a)?;
            let last = if b.is_empty() { None } else { Some(number(b)?) };
            if last.is_some_and(|l| l < first) {
                return None;
            }
            Spec::From { first, last }
        };
        *out.get_mut(count)? = spec;
        count += 1;
    }
    (count > 0).then_some(count)
}

/// `1*DIGIT`; values beyond u64 saturate (they are past any file's end anyway).
fn number(s: &[u8]) -> Option<u64> {
    if s.is_empty() || !s.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(s.iter().fold(0u64, |n, &d| n.saturating_mul(10).saturating_add((d - b'0') as u64)))
}

/// Merges overlapping and nearly adjacent ranges. When nothing needs merging the
/// client's order is kept (RFC 9110 section 14.6 asks for the requested order);
/// otherwise the merged result is in ascending order, which the same section permits
/// for coalesced ranges.
fn coalesce(ranges: &mut Ranges) {
    let mut sorted = *ranges;
    // Unstable, as it never allocates; ranges with equal starts always merge, so
    // their order makes no difference.
    sorted.sort_unstable_by_key(|r| r.first);
    let mut merged = Ranges::new();
    for &r in sorted.iter() {
        match merged.last_mut() {
            Some(prev) if r.first <= prev.last.saturating_add(COALESCE_GAP_BYTES) => {
                prev.last = prev.last.max(r.last);
            }
            _ => merged.push(r),
        }
    }
    if merged.len() < ranges.len() {
        *ranges = merged;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(first: u64, last: u64) -> ByteRange {
        ByteRange { first, last }
    }

    fn ranges(rs: &[ByteRange]) -> Ranges {
        let mut out = Ranges::new();
        rs.iter().for_each(|&r| out.push(r));
        out
    }

    fn eval(v: &str, len: u64) -> RangeDecision {
        evaluate(v.as_bytes(), len, 16)
    }

    #[test]
    fn single_ranges() {
        assert_eq!(eval("bytes=0-9", 100), RangeDecision::Partial(ranges(&[r(0, 9)])));
        assert_eq!(eval("bytes=90-", 100), RangeDecision::Partial(ranges(&[r(90, 99)])));
        assert_eq!(eval("bytes=90-1000", 100), RangeDecision::Partial(ranges(&[r(90, 99)])));
        assert_eq!(eval("bytes=-10", 100), RangeDecision::Partial(ranges(&[r(90, 99)])));
        assert_eq!(eval("bytes=-1000", 100), RangeDecision::Partial(ranges(&[r(0, 99)])));
        assert_eq!(eval("BYTES = 5-5", 100), RangeDecision::Whole); // space before '=' is not allowed
        assert_eq!(eval("Bytes=5-5", 100), RangeDecision::Partial(ranges(&[r(5, 5)])));
        assert_eq!(eval(" bytes=0-0 ", 1), RangeDecision::Partial(ranges(&[r(0, 0)])));
        assert_eq!(eval("bytes=0-99999999999999999999999", 10), RangeDecision::Partial(ranges(&[r(0, 9)])));
    }

    #[test]
    fn unsatisfiable() {
        assert_eq!(eval("bytes=100-", 100), RangeDecision::Unsatisfiable);
        assert_eq!(eval("bytes=100-200", 100), RangeDecision::Unsatisfiable);
        assert_eq!(eval("bytes=-0", 100), RangeDecision::Unsatisfiable);
        assert_eq!(eval("bytes=200-300, 400-", 100), RangeDecision::Unsatisfiable);
        assert_eq!(eval("bytes=99999999999999999999999-", 100), RangeDecision::Unsatisfiable);
    }

    #[test]
    fn invalid_fields_are_ignored() {
        for v in [
            "",
            "bytes=",
            "bytes=a-b",
            "bytes=5-4",
            "items=0-1",
            "bytes=1",
            "bytes=--1",
            "bytes=-",
            "bytes 0-1",
            "bytes=0-1;x",
            "bytes=+1-2",
        ] {
            assert_eq!(eval(v, 100), RangeDecision::Whole, "{v:?}");
        }
    }

    #[test]
    fn empty_representation_is_served_whole() {
        assert_eq!(eval("bytes=0-", 0), RangeDecision::Whole);
        assert_eq!(eval("bytes=-5", 0), RangeDecision::Whole);
    }

    #[test]
    fn multiple_ranges() {
        assert_eq!(
            eval("bytes=0-9, 500-599,,-10", 1000),
            RangeDecision::Partial(ranges(&[r(0, 9), r(500, 599), r(990, 999)]))
        );
        // Unsatisfiable members are dropped; if one is left, it is a single range.
        assert_eq!(eval("bytes=0-9, 5000-", 1000), RangeDecision::Partial(ranges(&[r(0, 9)])));
    }

    #[test]
    fn overlapping_and_close_ranges_are_coalesced() {
        assert_eq!(eval("bytes=0-99,50-150", 1000), RangeDecision::Partial(ranges(&[r(0, 150)])));
        assert_eq!(eval("bytes=500-599,0-9", 1000), RangeDecision::Partial(ranges(&[r(500, 599), r(0, 9)])));
        assert_eq!(eval("bytes=500-599,0-9,5-20", 1000), RangeDecision::Partial(ranges(&[r(0, 20), r(500, 599)])));
        assert_eq!(eval("bytes=0-9,20-29", 1000), RangeDecision::Partial(ranges(&[r(0, 29)])));
        // The amplification attack: many copies of the whole file become one range.
        let attack = format!("bytes={}", vec!["0-"; 16].join(","));
        assert_eq!(eval(&attack, 1000), RangeDecision::Partial(ranges(&[r(0, 999)])));
    }

    #[test]
    fn too_many_ranges_are_ignored() {
        let many = format!(
            "bytes={}",
            (0..17).map(|i| format!("{}-{}", i * 1000, i * 1000 + 1)).collect::<Vec<_>>().join(",")
        );
        assert_eq!(eval(&many, 100_000), RangeDecision::Whole);
        assert_eq!(evaluate(b"bytes=0-1", 100, 0), RangeDecision::Whole);
    }

    /// For any field, the bytes to send never exceed the representation.
    #[test]
    fn never_amplifies() {
        let tokens = ["0-", "-1", "5-9", "0-999", "3-", ",", "-0", "998-"];
        for n in 0..8u32.pow(6) {
            let mut v = String::from("bytes=");
            let mut k = n;
            for i in 0..6 {
                if i > 0 {
                    v.push(',');
                }
                v.push_str(tokens[(k % 8) as usize]);
                k /= 8;
            }
            if let RangeDecision::Partial(rs) = eval(&v, 1000) {
                let total: u64 = rs.iter().map(|r| r.len_bytes()).sum();
                assert!(total <= 1000, "{v}: {rs:?}");
                assert!(rs.iter().all(|r| r.first <= r.last && r.last < 1000), "{v}");
            }
        }
    }
}
