//! What an origin's response head says about the object: its size, validators,
//! media type and freshness ([`ObjectMeta`]), whether it may be stored at all, and
//! whether a later slice's response is of the same version.

use http::header::{self, HeaderMap};
use linerate_http::freshness::{Fields, Freshness};

use crate::config::Origin;
use crate::store::ObjectMeta;

/// The first value of field `name`, when it is there and not empty.
pub(super) fn field(headers: &HeaderMap, name: header::HeaderName) -> Option<&[u8]> {
    headers.get(name).map(|v| v.as_bytes()).filter(|v| !v.is_empty())
}

/// Why a response is passed to its viewer and not stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Uncacheable {
    /// `Cache-Control: no-store` or `private`.
    NoStore,
    /// It sets a cookie: what the origin gave one requester is not for every viewer.
    SetCookie,
    /// It varies on a viewer's field the table forwards to the origin
    /// (`forward_headers`), or on everything (`Vary: *`): one stored copy could
    /// not answer every viewer.
    Vary,
    /// A part without the object's size (`Content-Range: bytes 0-99/*`), so it
    /// cannot be cut into slices. (A 200 without a length is streamed: `live`.)
    NoLength,
    /// The origin sent the whole object to a range request, and it is larger than
    /// one slice: it cannot be filled slice by slice.
    NoRanges,
}

/// Whether a response may be stored for every viewer; `Err` says why not.
///
/// `Vary` splits nothing unless it names a field of the viewer's that reaches
/// the origin (one of `forwarded`, the table's `forward_headers`) or is `*`: every
/// other field of an origin request is linerate's own, the same for every
/// viewer, so what the origin chose by it suits them all. (S3 servers answer
/// with `Vary: Origin` for CORS; linerate never sends `Origin` unless told to.)
pub(super) fn storable(headers: &HeaderMap, now_secs: i64, forwarded: &[String]) -> Result<(), Uncacheable> {
    if freshness(headers, now_secs).no_store {
        return Err(Uncacheable::NoStore);
    }
    if headers.contains_key(header::SET_COOKIE) {
        return Err(Uncacheable::SetCookie);
    }
    for v in headers.get_all(header::VARY) {
        let other = v
            .as_bytes()
            .split(|&b| b == b',')
            .map(<[u8]>::trim_ascii)
            .any(|f| f == b"*" || forwarded.iter().any(|h| f.eq_ignore_ascii_case(h.as_bytes())));
        if other {
            return Err(Uncacheable::Vary);
        }
    }
    Ok(())
}

/// The freshness fields of a response (several `Cache-Control` fields joined).
pub(super) fn freshness(headers: &HeaderMap, now_secs: i64) -> Freshness {
    let joined: Vec<u8>;
    let cache_control = {
        let mut all = headers.get_all(header::CACHE_CONTROL).iter();
        match (all.next(), all.next()) {
            (Some(one), None) => Some(one.as_bytes()),
            (None, _) => None,
            (Some(first), Some(second)) => {
                let mut v = first.as_bytes().to_vec();
                for more in std::iter::once(second).chain(all) {
                    v.push(b',');
                    v.extend_from_slice(more.as_bytes());
                }
                joined = v;
                Some(joined.as_slice())
            }
        }
    };
    Freshness::of(
        Fields {
            cache_control,
            expires: field(headers, header::EXPIRES),
            date: field(headers, header::DATE),
            age: field(headers, header::AGE),
        },
        now_secs,
    )
}

/// The metadata of an object from the head of a response that showed its size
/// (`size`), received at `now_ms` (Unix milliseconds), under `table`'s defaults:
/// fresh for the origin's lifetime or the table's `default_ttl` (`negative_ttl` for
/// a 404 or 410), stale windows from the origin's fields or the table's. The
/// origin's fields count in seconds, the table's durations to the millisecond. The
/// lifetime counts from the response's age zero, not from its arrival: one that a
/// parent or peer has held for a while (its `Age`, or an old `Date`) has that much
/// less left here ([`Freshness::age_secs`]); so does the table's default.
pub(super) fn object_meta(
    key: &[u8],
    status: u16,
    size: u64,
    headers: &HeaderMap,
    now_ms: i64,
    table: &Origin,
) -> ObjectMeta {
    let now_secs = now_ms.div_euclid(1000);
    let f = freshness(headers, now_secs);
    let negative = matches!(status, 404 | 410);
    let ms = |d: std::time::Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    let secs_ms = |s: u64| s.saturating_mul(1000);
    let lifetime_ms = if negative {
        f.lifetime_secs.map_or(ms(table.negative_ttl), secs_ms).min(ms(table.negative_ttl))
    } else {
        f.lifetime_secs.map_or(ms(table.default_ttl), secs_ms)
    };
    let after = |at: i64, d: u64| at.saturating_add(i64::try_from(d).unwrap_or(i64::MAX));
    let dated_ms = now_ms.saturating_sub(i64::try_from(secs_ms(f.age_secs)).unwrap_or(i64::MAX));
    let fresh_until_ms = after(dated_ms, lifetime_ms);
    let swr_ms = f.stale_while_revalidate_secs.map_or(ms(table.stale_while_revalidate), secs_ms);
    let sie_ms = f.stale_if_error_secs.map_or(ms(table.stale_if_error), secs_ms);
    ObjectMeta {
        key: key.to_vec(),
        status: if negative { status } else { 200 },
        size: if negative { 0 } else { size },
        etag: field(headers, header::ETAG).map(<[u8]>::to_vec),
        last_modified: field(headers, header::LAST_MODIFIED).map(<[u8]>::to_vec),
        content_type: field(headers, header::CONTENT_TYPE).map(<[u8]>::to_vec),
        dated_at_ms: dated_ms,
        fresh_until_ms,
        stale_while_revalidate_until_ms: after(fresh_until_ms, swr_ms),
        stale_if_error_until_ms: after(fresh_until_ms, sie_ms),
    }
}

/// The same metadata made fresh again by a 304 (or a response of the same
/// version) at `now_ms`, with the lifetime its fields give.
pub(super) fn refreshed(old: &ObjectMeta, headers: &HeaderMap, now_ms: i64, table: &Origin) -> ObjectMeta {
    let mut m = object_meta(&old.key, old.status, old.size, headers, now_ms, table);
    // A 304 need not repeat the validators or the media type.
    m.etag = m.etag.or_else(|| old.etag.clone());
    m.last_modified = m.last_modified.or_else(|| old.last_modified.clone());
    m.content_type = m.content_type.or_else(|| old.content_type.clone());
    m
}

/// Whether a response for part of the object is of the version `meta` describes:
/// each validator the object has is repeated unchanged. An origin that gives no
/// validator at all is checked on the size alone (by the caller).
pub(super) fn same_version(meta: &ObjectMeta, headers: &HeaderMap) -> bool {
    let same = |ours: &Option<Vec<u8>>, name| match ours {
        Some(v) => field(headers, name) == Some(v.as_slice()),
        None => true,
    };
    same(&meta.etag, header::ETAG) && same(&meta.last_modified, header::LAST_MODIFIED)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn table() -> Origin {
        toml::from_str("prefix = \"/v/\"\nurls = [\"http://127.0.0.1:1/\"]\ndefault_ttl = \"60s\"\nnegative_ttl = \"2s\"\nstale_if_error = \"1h\"").unwrap()
    }

    fn headers(fields: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (n, v) in fields {
            h.append(*n, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn lifetimes_come_from_the_origin_or_the_table() {
        let t = table();
        let m = object_meta(
            b"/v/a",
            206,
            10,
            &headers(&[("cache-control", "max-age=5"), ("etag", "\"x\"")]),
            1_000_123,
            &t,
        );
        assert_eq!((m.fresh_until_ms, m.stale_if_error_until_ms), (1_005_123, 1_005_123 + 3_600_000));
        assert_eq!((m.status, m.size, m.etag.as_deref(), m.dated_at_ms), (200, 10, Some(&b"\"x\""[..]), 1_000_123));
        let m = object_meta(b"/v/a", 200, 10, &headers(&[]), 1_000_000, &t);
        assert_eq!(m.fresh_until_ms, 1_060_000, "the table's default_ttl");
        let m = object_meta(b"/v/a", 404, 0, &headers(&[("cache-control", "max-age=600")]), 1_000_000, &t);
        assert_eq!((m.status, m.fresh_until_ms), (404, 1_002_000), "a 404 is kept for negative_ttl at most");
        let m = object_meta(b"/v/a", 200, 1, &headers(&[("cache-control", "max-age=1, stale-if-error=10")]), 0, &t);
        assert_eq!(m.stale_if_error_until_ms, 11_000, "the origin's stale-if-error wins over the table's");
    }

    /// Live tables: lifetimes under a second, to the millisecond.
    #[test]
    fn table_lifetimes_count_in_milliseconds() {
        let t: Origin = toml::from_str(
            "prefix = \"/live/\"\nurls = [\"http://127.0.0.1:1/\"]\ndefault_ttl = \"1s\"\nnegative_ttl = \"250ms\"\nstale_if_error = \"500ms\"",
        )
        .unwrap();
        let now = 1_700_000_000_999;
        let m = object_meta(b"/live/a.m3u8", 200, 10, &headers(&[]), now, &t);
        assert_eq!(m.fresh_until_ms, now + 1000);
        assert_eq!((m.stale_while_revalidate_until_ms, m.stale_if_error_until_ms), (now + 1000, now + 1500));
        let m = object_meta(b"/live/9.ts", 404, 0, &headers(&[]), now, &t);
        assert_eq!(m.fresh_until_ms, now + 250, "negative_ttl = 250ms");
        let m = object_meta(b"/live/9.ts", 404, 0, &headers(&[("cache-control", "max-age=10")]), now, &t);
        assert_eq!(m.fresh_until_ms, now + 250, "the origin's lifetime, capped by negative_ttl");
        let m = object_meta(b"/live/a.m3u8", 200, 10, &headers(&[("cache-control", "max-age=0")]), now, &t);
        assert_eq!(m.fresh_until_ms, now, "max-age=0: stale at once");
    }

    #[test]
    fn cookies_vary_and_no_store_are_not_stored() {
        let none: &[String] = &[];
        let cookie = &["Cookie".to_string()];
        assert_eq!(storable(&headers(&[("vary", "Accept-Encoding")]), 0, none), Ok(()));
        assert_eq!(storable(&headers(&[("vary", "accept-encoding, Cookie")]), 0, cookie), Err(Uncacheable::Vary));
        assert_eq!(storable(&headers(&[("vary", "Origin"), ("vary", "cookie")]), 0, cookie), Err(Uncacheable::Vary));
        assert_eq!(storable(&headers(&[("vary", "*")]), 0, none), Err(Uncacheable::Vary));
        // Fields the origin never sees from a viewer split nothing.
        assert_eq!(storable(&headers(&[("vary", "Origin, Cookie, User-Agent")]), 0, none), Ok(()));
        assert_eq!(storable(&headers(&[("vary", "Origin")]), 0, cookie), Ok(()));
        assert_eq!(storable(&headers(&[("set-cookie", "a=b")]), 0, none), Err(Uncacheable::SetCookie));
        assert_eq!(
            storable(&headers(&[("cache-control", "public"), ("cache-control", "private")]), 0, none),
            Err(Uncacheable::NoStore)
        );
    }

    #[test]
    fn a_part_of_another_version_is_told_apart() {
        let m = object_meta(b"k", 200, 1, &headers(&[("etag", "\"1\""), ("last-modified", "x")]), 0, &table());
        assert!(same_version(&m, &headers(&[("etag", "\"1\""), ("last-modified", "x")])));
        assert!(!same_version(&m, &headers(&[("etag", "\"2\""), ("last-modified", "x")])));
        assert!(!same_version(&m, &headers(&[("last-modified", "x")])), "a validator gone is a change");
        let r = refreshed(&m, &headers(&[("cache-control", "max-age=9")]), 100_000, &table());
        assert_eq!((r.etag, r.fresh_until_ms), (m.etag.clone(), 109_000), "a 304 keeps the validators");
    }

    #[test]
    fn an_aged_response_has_less_of_its_lifetime_left() {
        let t = table();
        // max-age=4 with Age: 3 (a parent held it 3 s): fresh for 1 s here.
        let m = object_meta(b"k", 206, 10, &headers(&[("cache-control", "max-age=4"), ("age", "3")]), 1_000_000, &t);
        assert_eq!((m.dated_at_ms, m.fresh_until_ms), (997_000, 1_001_000));
        assert_eq!(m.stale_if_error_until_ms, 1_001_000 + 3_600_000, "stale windows follow the freshness");
        // The table's default counts from the same point.
        let m = object_meta(b"k", 206, 10, &headers(&[("age", "25")]), 1_000_000, &t);
        assert_eq!((m.dated_at_ms, m.fresh_until_ms), (975_000, 1_035_000));
        // Older than its lifetime: stale on arrival.
        let m = object_meta(b"k", 206, 10, &headers(&[("cache-control", "max-age=4"), ("age", "9")]), 1_000_000, &t);
        assert!(m.fresh_until_ms <= 1_000_000);
        // A 304 from a parent that has held the object 5 s.
        let r = refreshed(&m, &headers(&[("cache-control", "s-maxage=60"), ("age", "5")]), 2_000_000, &t);
        assert_eq!((r.dated_at_ms, r.fresh_until_ms), (1_995_000, 2_055_000));
        // An old Date and no Age (a cache that relays the origin's Date).
        let mut date = [0u8; linerate_http::date::HTTP_DATE_LEN];
        linerate_http::date::format_secs(1000 - 30, &mut date);
        let date = std::str::from_utf8(&date).unwrap();
        let m = object_meta(b"k", 206, 10, &headers(&[("cache-control", "max-age=60"), ("date", date)]), 1_000_000, &t);
        assert_eq!((m.dated_at_ms, m.fresh_until_ms), (971_000, 1_031_000));
    }
}
