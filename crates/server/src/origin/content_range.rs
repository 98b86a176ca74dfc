//! `Content-Range` (RFC 9110 section 14.4) as an origin sends it: read, and
//! checked against the response it came with.

/// A `Content-Range` field: `bytes first-last/total`, `bytes first-last/*` (total
/// unknown) or `bytes */total` (a 416's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ContentRange {
    /// The range sent, inclusive.
    pub first: Option<(u64, u64)>,
    /// The length of the whole object.
    pub total: Option<u64>,
}

impl ContentRange {
    /// Reads one field value (RFC 9110 section 14.4): the unit `bytes` (in any
    /// case), a range with `last >= first`, a total past `last`.
    pub(crate) fn parse(value: &[u8]) -> Result<ContentRange, String> {
        let bad = |why: &str| format!("Content-Range {:?}: {why}", value.escape_ascii().to_string());
        let text = std::str::from_utf8(value).map_err(|_| bad("not ASCII"))?.trim();
        let (unit, rest) = text.split_once(' ').ok_or_else(|| bad("no unit"))?;
        if !unit.eq_ignore_ascii_case("bytes") {
            return Err(bad("not in bytes"));
        }
        let (range, total) = rest.trim_start().split_once('/').ok_or_else(|| bad("no `/`"))?;
        let number = |s: &str| -> Result<u64, String> {
            if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad("not a number"));
            }
            s.parse().map_err(|_| bad("number too large"))
        };
        let total = if total == "*" { None } else { Some(number(total)?) };
        let first = match range {
            "*" => None,
            range => {
                let (first, last) = range.split_once('-').ok_or_else(|| bad("no `-` in the range"))?;
                Some((number(first)?, number(last)?))
            }
        };
        match (first, total) {
            (None, None) => return Err(bad("neither a range nor a length")),
            (Some((first, last)), _) if last < first => return Err(bad("last byte before the first")),
            (Some((_, last)), Some(total)) if total <= last => return Err(bad("length not past the last byte")),
            _ => {}
        }
        Ok(ContentRange { first, total })
    }

    /// Checks it against the response: a 206 names a range, and its
    /// `Content-Length` (when sent) is the range's; a 416 names none.
    pub(crate) fn check(&self, status: u16, content_length: Option<u64>) -> Result<(), String> {
        match (status, self.first) {
            (206, None) => Err("a 206 with Content-Range `bytes */...`".into()),
            (206, Some((first, last))) => match content_length {
                Some(n) if n != last - first + 1 => {
                    Err(format!("a 206 of bytes {first}-{last} with Content-Length {n}"))
                }
                _ => Ok(()),
            },
            (416, Some(_)) => Err("a 416 with a range in its Content-Range".into()),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_ranges_are_parsed_and_checked() {
        let ok = |v: &str| ContentRange::parse(v.as_bytes()).unwrap();
        assert_eq!(ok("bytes 0-99/1000"), ContentRange { first: Some((0, 99)), total: Some(1000) });
        assert_eq!(ok("BYTES 5-5/6"), ContentRange { first: Some((5, 5)), total: Some(6) });
        assert_eq!(ok("bytes 0-99/*"), ContentRange { first: Some((0, 99)), total: None });
        assert_eq!(ok("bytes */1000"), ContentRange { first: None, total: Some(1000) });
        for bad in [
            "",
            "bytes",
            "items 0-1/2",
            "bytes 0-99",
            "bytes 0_99/100",
            "bytes -1-99/100",
            "bytes 0-+9/100",
            "bytes */*",
            "bytes 0-99/99999999999999999999999",
            "bytes 10-9/100",
            "bytes 0-99/99",
            "bytes 0-99/100x",
        ] {
            assert!(ContentRange::parse(bad.as_bytes()).is_err(), "{bad:?} accepted");
        }
        assert!(ContentRange::parse(b"bytes 0-99/100").is_ok(), "total just past last");
        let e = ContentRange::parse(b"bytes 10-9/100").unwrap_err();
        assert!(e.contains("last byte before the first"), "{e}");

        assert_eq!(ok("bytes 0-99/1000").check(206, Some(100)), Ok(()));
        assert_eq!(ok("bytes 0-99/1000").check(206, None), Ok(()));
        assert!(ok("bytes 0-99/1000").check(206, Some(99)).is_err());
        assert!(ok("bytes */1000").check(206, None).is_err());
        assert_eq!(ok("bytes */1000").check(416, None), Ok(()));
        assert!(ok("bytes 0-1/1000").check(416, None).is_err());
    }
}
