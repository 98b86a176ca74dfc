//! From request target to a path below the content root.
//!
//! The target is split off its query, cut into segments at `/`, and each segment is
//! percent-decoded on its own. A decoded segment that contains `/` (an encoded
//! `%2f`) or NUL is refused rather than reinterpreted, `.` segments vanish, `..`
//! removes the previous segment, and a `..` with nothing left to remove is refused:
//! there is no spelling of a path that leaves the root. (Symlinks are the file
//! layer's business: the server opens the result with `RESOLVE_BENEATH`.)

/// What the target turned out to be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Target<'a> {
    /// The target names a directory syntactically (ends in `/`, `/.` or `/..`), or is the root.
    pub dir_syntax: bool,
    /// The raw query, without the `?`.
    pub query: Option<&'a [u8]>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TargetError {
    /// Not an origin-form or absolute-form target, or a bad percent escape.
    Malformed,
    /// `..` above the root.
    Escapes,
    /// A percent-encoded `/` or NUL inside a segment.
    ForbiddenByte,
    /// The asterisk form `*` (only meaningful for OPTIONS).
    Asterisk,
}

/// Decodes and normalises `raw` (a request target) into `out`, a path relative to
/// the content root with `/` separators and no leading slash (empty for the root).
pub fn resolve<'a>(raw: &'a [u8], out: &mut Vec<u8>) -> Result<Target<'a>, TargetError> {
    out.clear();
    if raw == b"*" {
        return Err(TargetError::Asterisk);
    }
    let path_and_query =
        if raw.first() == Some(&b'/') { raw } else { absolute_form_path(raw).ok_or(TargetError::Malformed)? };
    let end = path_and_query.iter().position(|&b| b == b'?' || b == b'#').unwrap_or(path_and_query.len());
    let raw_path = &path_and_query[..end];
    let query = match path_and_query.get(end) {
        Some(b'?') => {
            let q = &path_and_query[end + 1..];
            Some(&q[..q.iter().position(|&b| b == b'#').unwrap_or(q.len())])
        }
        _ => None,
    };
    let mut dir_syntax = true;
    for segment in raw_path.split(|&b| b == b'/') {
        let start = out.len();
        if start > 0 {
            out.push(b'/');
        }
        let seg_start = out.len();
        decode_into(segment, out)?;
        match &out[seg_start..] {
            b"" | b"." => {
                out.truncate(start);
                // An empty segment is only "directory syntax" when it is the last one.
                dir_syntax = true;
            }
            b".." => {
                out.truncate(start);
                if start == 0 {
                    return Err(TargetError::Escapes);
                }
                let parent = out.iter().rposition(|&b| b == b'/').unwrap_or(0);
                out.truncate(parent);
                dir_syntax = true;
            }
            _ => dir_syntax = false,
        }
    }
    Ok(Target { dir_syntax, query })
}

/// Bytes of a decoded path that are percent-encoded again in a `Location`: all but
/// `pchar` (RFC 3986 section 3.3) and the `/` separator. `%`, `\`, `?`, `#`,
/// controls, spaces and non-ASCII bytes are all encoded.
const PATH_ENCODE: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~')
    .remove(b'!')
    .remove(b'$')
    .remove(b'&')
    .remove(b'\'')
    .remove(b'(')
    .remove(b')')
    .remove(b'*')
    .remove(b'+')
    .remove(b',')
    .remove(b';')
    .remove(b'=')
    .remove(b':')
    .remove(b'@')
    .remove(b'/');

/// Writes into `out` (cleared first) the redirect target that adds the missing
/// slash to the directory `path` (a path as [`resolve`] produces it), keeping the
/// raw `query`. The result is always origin-relative and starts with exactly one
/// `/`, whatever the request target looked like (`//host/..`, `/\host/..`), so a
/// redirect can never send a client to another host.
pub fn directory_location(path: &[u8], query: Option<&[u8]>, out: &mut Vec<u8>) {
    out.clear();
    out.push(b'/');
    for piece in percent_encoding::percent_encode(path, PATH_ENCODE) {
        out.extend_from_slice(piece.as_bytes());
    }
    if !path.is_empty() {
        out.push(b'/');
    }
    if let Some(q) = query {
        out.push(b'?');
        out.extend_from_slice(q);
    }
}

/// `http://authority/path?q` -> `/path?q` (absolute-form, RFC 9112 section 3.2.2).
fn absolute_form_path(raw: &[u8]) -> Option<&[u8]> {
    let after_scheme = if raw.len() > 7 && raw[..7].eq_ignore_ascii_case(b"http://") {
        &raw[7..]
    } else if raw.len() > 8 && raw[..8].eq_ignore_ascii_case(b"https://") {
        &raw[8..]
    } else {
        return None;
    };
    match after_scheme.iter().position(|&b| b == b'/' || b == b'?') {
        Some(i) if after_scheme[i] == b'/' => Some(&after_scheme[i..]),
        // "http://host?q" or "http://host": the path is "/".
        _ => Some(b"/"),
    }
}

fn decode_into(segment: &[u8], out: &mut Vec<u8>) -> Result<(), TargetError> {
    let mut i = 0;
    while i < segment.len() {
        let b = segment[i];
        let byte = if b == b'%' {
            let hi = segment.get(i + 1).and_then(|&c| hex_digit(c));
            let lo = segment.get(i + 2).and_then(|&c| hex_digit(c));
            match (hi, lo) {
                (Some(h), Some(l)) => {
                    i += 3;
                    h << 4 | l
                }
                _ => return Err(TargetError::Malformed),
            }
        } else {
            i += 1;
            b
        };
        if byte == b'/' || byte == 0 {
            return Err(TargetError::ForbiddenByte);
        }
        out.push(byte);
    }
    Ok(())
}

/// The value of one hex digit, either case.
pub fn hex_digit(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(raw: &str) -> (String, bool) {
        let mut out = Vec::new();
        let t = resolve(raw.as_bytes(), &mut out).unwrap_or_else(|e| panic!("{raw}: {e:?}"));
        (String::from_utf8(out).unwrap(), t.dir_syntax)
    }

    fn err(raw: &str) -> TargetError {
        let mut out = Vec::new();
        resolve(raw.as_bytes(), &mut out).unwrap_err()
    }

    #[test]
    fn normalises() {
        assert_eq!(ok("/"), ("".into(), true));
        assert_eq!(ok("/a/b.mp4"), ("a/b.mp4".into(), false));
        assert_eq!(ok("/a//b/./c"), ("a/b/c".into(), false));
        assert_eq!(ok("/a/b/../c"), ("a/c".into(), false));
        assert_eq!(ok("/a/b/.."), ("a".into(), true));
        assert_eq!(ok("/a/"), ("a".into(), true));
        assert_eq!(ok("/a%20b/c%2Ed"), ("a b/c.d".into(), false));
        assert_eq!(ok("/a/%2e%2e/b"), ("b".into(), false));
        assert_eq!(ok("/a.mp4?x=/../..&y"), ("a.mp4".into(), false));
        assert_eq!(ok("http://example.com/v/x.ts?q"), ("v/x.ts".into(), false));
        assert_eq!(ok("HTTPS://example.com"), ("".into(), true));
    }

    #[test]
    fn query_is_split_off() {
        let mut out = Vec::new();
        let t = resolve(b"/d%20x?a=1#f", &mut out).unwrap();
        assert_eq!(out, b"d x");
        assert_eq!(t.query, Some(&b"a=1"[..]));
    }

    fn location(raw: &str) -> String {
        let mut path = Vec::new();
        let t = resolve(raw.as_bytes(), &mut path).unwrap();
        let mut out = Vec::new();
        directory_location(&path, t.query, &mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn redirect_is_never_protocol_relative() {
        assert_eq!(location("//evil.example/../videos"), "/videos/");
        assert_eq!(location("/\\evil.example/../videos"), "/videos/");
        assert_eq!(location("///evil.example/%2e%2e/videos?q=1"), "/videos/?q=1");
        assert_eq!(location("http://evil.example//x/../videos"), "/videos/");
        // Whatever the target, one leading slash and no backslash.
        for raw in ["//a/../b", "/%5c%5cx/../y", "/.//\\z", "/a/./b//c"] {
            let l = location(raw);
            assert!(l.starts_with('/') && !l.starts_with("//") && !l.contains('\\'), "{raw} -> {l}");
        }
    }

    #[test]
    fn redirect_path_is_reencoded() {
        assert_eq!(location("/d%20x/%C3%A9t%C3%A9?a=1&b"), "/d%20x/%C3%A9t%C3%A9/?a=1&b");
        assert_eq!(location("/100%25/a%3Fb%23c"), "/100%25/a%3Fb%23c/");
        assert_eq!(location("/keep-._~!$&'()*+,;=:@"), "/keep-._~!$&'()*+,;=:@/");
    }

    #[test]
    fn refuses_escapes() {
        for raw in ["/..", "/../etc/passwd", "/a/../../etc", "/%2e%2e/x", "/a/%2E%2E/%2e%2e/x", "/.%2e/x"] {
            assert_eq!(err(raw), TargetError::Escapes, "{raw}");
        }
        for raw in ["/a%2fb", "/..%2f..%2fetc", "/a%00.mp4", "/%2F"] {
            assert_eq!(err(raw), TargetError::ForbiddenByte, "{raw}");
        }
        for raw in ["/a%zz", "/a%4", "a/b", "ftp://x/y", "example.com:80"] {
            assert_eq!(err(raw), TargetError::Malformed, "{raw}");
        }
        assert_eq!(err("*"), TargetError::Asterisk);
    }

    /// Whatever the input, the output never contains a `..` or `.` segment, a NUL,
    /// or a leading slash.
    #[test]
    fn output_is_always_clean() {
        let alphabet: &[&str] = &["/", ".", "..", "%2e", "%2f", "a", "%00", "%", "?", "//"];
        let mut out = Vec::new();
        // Every sequence of 5 tokens from the alphabet (10^5 targets).
        for n in 0..100_000u32 {
            let mut raw = String::from("/");
            let mut k = n;
            for _ in 0..5 {
                raw.push_str(alphabet[(k % 10) as usize]);
                k /= 10;
            }
            if resolve(raw.as_bytes(), &mut out).is_ok() {
                assert!(!out.starts_with(b"/"), "{raw}");
                assert!(!out.contains(&0), "{raw}");
                for seg in out.split(|&b| b == b'/') {
                    assert!(seg != b".." && seg != b".", "{raw} -> {:?}", String::from_utf8_lossy(&out));
                }
            }
        }
    }
}
