//! Conditional requests (RFC 9110 section 13) against a file's validators.
//!
//! The server's entity tags are strong: they change whenever the inode, size or
//! modification time changes. Evaluation follows the order of RFC 9110 section
//! 13.2.2: If-Match, else If-Unmodified-Since (412 on failure); then If-None-Match,
//! else If-Modified-Since (304 for GET and HEAD); If-Range is checked separately when
//! ranges are about to be served, and honours only strong validators.

use crate::date;
use crate::request::{trim, Request};

/// A representation's validators.
#[derive(Clone, Copy, Debug)]
pub struct Validators<'a> {
    /// The strong entity tag, quotes included: `"..."`.
    pub etag: &'a [u8],
    /// Last modification, whole seconds since the Unix epoch.
    pub last_modified_secs: i64,
}

impl Validators<'_> {
    /// Last-Modified as the response states it (clamped to the years an HTTP date
    /// can express), so that a client's copy of the field compares equal.
    fn last_modified_as_sent(&self) -> i64 {
        self.last_modified_secs.clamp(0, date::MAX_SECS)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Precondition {
    /// Serve the representation (200 or 206).
    Proceed,
    /// 304 Not Modified.
    NotModified,
    /// 412 Precondition Failed.
    Failed,
}

/// Evaluates the preconditions of a GET or HEAD request.
pub fn evaluate(req: &Request, v: &Validators<'_>) -> Precondition {
    let last_modified = v.last_modified_as_sent();
    if let Some(list) = req.if_match() {
        if !list_matches(list, v.etag, Comparison::Strong) {
            return Precondition::Failed;
        }
    } else if let Some(since) = req.if_unmodified_since().and_then(date::parse_secs) {
        if last_modified > since {
            return Precondition::Failed;
        }
    }
    if let Some(list) = req.if_none_match() {
        if list_matches(list, v.etag, Comparison::Weak) {
            return Precondition::NotModified;
        }
    } else if let Some(since) = req.if_modified_since().and_then(date::parse_secs) {
        if last_modified <= since {
            return Precondition::NotModified;
        }
    }
    Precondition::Proceed
}

/// Whether an If-Range value still names this representation, so that its Range
/// may be honoured (RFC 9110 section 13.1.5: only a strong validator may). An
/// entity tag must match strongly. A date must equal Last-Modified exactly and
/// be strong: a modification time has one-second resolution, so it is strong
/// only once that second is over, when it is at least one second before
/// `now_secs`, the Date of the response (section 8.8.2.2); a file modified
/// within the current second may change again under the same date. Anything else
/// (weak tags, weak or bad dates) does not match, and the whole file is served.
pub fn if_range_matches(value: &[u8], v: &Validators<'_>, now_secs: i64) -> bool {
    let value = trim(value);
    if value.starts_with(b"\"") || value.starts_with(b"W/") {
        return matches!(parse_tag(value), Some((tag, false, rest)) if rest.is_empty() && tag == v.etag);
    }
    let last_modified = v.last_modified_as_sent();
    date::parse_secs(value) == Some(last_modified) && now_secs.saturating_sub(last_modified) >= 1
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Comparison {
    Strong,
    Weak,
}

/// Whether `list` (`*` or a comma-separated list of entity tags) contains `etag`.
/// A malformed list matches nothing.
fn list_matches(list: &[u8], etag: &[u8], cmp: Comparison) -> bool {
    let mut rest = trim(list);
    if rest == b"*" {
        return true;
    }
    while !rest.is_empty() {
        let Some((tag, weak, after)) = parse_tag(rest) else {
            return false;
        };
        if tag == etag && (cmp == Comparison::Weak || !weak) {
            return true;
        }
        rest = trim(after);
        match rest.first() {
            Some(b',') => rest = trim(&rest[1..]),
            None => break,
            Some(_) => return false,
        }
        // Empty list elements (", ,") are allowed.
        while let Some(b',') = rest.first() {
            rest = trim(&rest[1..]);
        }
    }
    false
}

/// `[W/]"opaque"` at the start of `s`: the quoted opaque tag (with quotes), whether
/// it was weak, and what follows.
fn parse_tag(s: &[u8]) -> Option<(&[u8], bool, &[u8])> {
    let (weak, s) = match s.strip_prefix(b"W/") {
        Some(rest) => (true, rest),
        None => (false, s),
    };
    if s.first() != Some(&b'"') {
        return None;
    }
    let close = s[1..].iter().position(|&b| b == b'"')? + 1;
    Some((&s[..=close], weak, &s[close + 1..]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::Limits;

    const V: Validators<'static> = Validators { etag: b"\"abc\"", last_modified_secs: 1_700_000_000 };
    // 1_700_000_000 is Tue, 14 Nov 2023 22:13:20 GMT.
    const LM: &str = "Tue, 14 Nov 2023 22:13:20 GMT";
    const BEFORE: &str = "Tue, 14 Nov 2023 22:13:19 GMT";
    const AFTER: &str = "Tue, 14 Nov 2023 22:13:21 GMT";

    fn eval(fields: &str) -> Precondition {
        let raw = format!("GET / HTTP/1.1\r\nHost: h\r\n{fields}\r\n");
        let mut r = Request::default();
        r.parse(raw.as_bytes(), &Limits::default()).unwrap();
        evaluate(&r, &V)
    }

    #[test]
    fn if_none_match() {
        assert_eq!(eval("If-None-Match: \"abc\"\r\n"), Precondition::NotModified);
        assert_eq!(eval("If-None-Match: W/\"abc\"\r\n"), Precondition::NotModified);
        assert_eq!(eval("If-None-Match: \"x\", \"abc\"\r\n"), Precondition::NotModified);
        assert_eq!(eval("If-None-Match: *\r\n"), Precondition::NotModified);
        assert_eq!(eval("If-None-Match: \"x\"\r\n"), Precondition::Proceed);
        assert_eq!(eval("If-None-Match: abc\r\n"), Precondition::Proceed);
        // If-None-Match wins over If-Modified-Since.
        assert_eq!(eval(&format!("If-None-Match: \"x\"\r\nIf-Modified-Since: {LM}\r\n")), Precondition::Proceed);
    }

    #[test]
    fn if_modified_since() {
        assert_eq!(eval(&format!("If-Modified-Since: {LM}\r\n")), Precondition::NotModified);
        assert_eq!(eval(&format!("If-Modified-Since: {AFTER}\r\n")), Precondition::NotModified);
        assert_eq!(eval(&format!("If-Modified-Since: {BEFORE}\r\n")), Precondition::Proceed);
        assert_eq!(eval("If-Modified-Since: yesterday\r\n"), Precondition::Proceed);
    }

    #[test]
    fn dates_compare_with_last_modified_as_sent() {
        // An mtime past year 9999 is sent as the last second of 9999.
        let v = Validators { etag: b"\"abc\"", last_modified_secs: 400_000_000_000 };
        let raw = "GET / HTTP/1.1\r\nHost: h\r\nIf-Modified-Since: Fri, 31 Dec 9999 23:59:59 GMT\r\n\r\n";
        let mut r = Request::default();
        r.parse(raw.as_bytes(), &Limits::default()).unwrap();
        assert_eq!(evaluate(&r, &v), Precondition::NotModified);
    }

    #[test]
    fn if_match_and_unmodified_since() {
        assert_eq!(eval("If-Match: \"abc\"\r\n"), Precondition::Proceed);
        assert_eq!(eval("If-Match: *\r\n"), Precondition::Proceed);
        assert_eq!(eval("If-Match: W/\"abc\"\r\n"), Precondition::Failed);
        assert_eq!(eval("If-Match: \"x\"\r\n"), Precondition::Failed);
        assert_eq!(eval(&format!("If-Unmodified-Since: {BEFORE}\r\n")), Precondition::Failed);
        assert_eq!(eval(&format!("If-Unmodified-Since: {LM}\r\n")), Precondition::Proceed);
        // If-Match present: If-Unmodified-Since is not consulted.
        assert_eq!(eval(&format!("If-Match: \"abc\"\r\nIf-Unmodified-Since: {BEFORE}\r\n")), Precondition::Proceed);
        // 412 is decided before 304.
        assert_eq!(eval("If-Match: \"x\"\r\nIf-None-Match: \"abc\"\r\n"), Precondition::Failed);
    }

    #[test]
    fn if_range() {
        let later = V.last_modified_secs + 60;
        assert!(if_range_matches(b"\"abc\"", &V, later));
        assert!(!if_range_matches(b"W/\"abc\"", &V, later));
        assert!(!if_range_matches(b"\"x\"", &V, later));
        assert!(if_range_matches(LM.as_bytes(), &V, later));
        assert!(!if_range_matches(AFTER.as_bytes(), &V, later));
        assert!(!if_range_matches(b"garbage", &V, later));
    }

    #[test]
    fn if_range_date_must_be_strong() {
        let lm = V.last_modified_secs;
        // Modified within the current second: the date is weak, the Range is ignored.
        assert!(!if_range_matches(LM.as_bytes(), &V, lm));
        // A clock behind the file's mtime proves nothing either.
        assert!(!if_range_matches(LM.as_bytes(), &V, lm - 5));
        // One second later the date is strong.
        assert!(if_range_matches(LM.as_bytes(), &V, lm + 1));
        // An entity tag is strong whatever the time.
        assert!(if_range_matches(b"\"abc\"", &V, lm));
    }
}
