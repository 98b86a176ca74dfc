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
    /// No length, so it cannot be cut into slices.
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
/// (`size`), received at `now_secs`, under `table`'s defaults: fresh for the
/// origin's lifetime or the table's `default_ttl` (`negative_ttl` for a 404 or
/// 410), stale windows from the origin's fields or the table's. The lifetime
/// counts from the response's age zero, not from its arrival: one that a parent
/// or peer has held for a while (its `Age`, or an old `Date`) has that much less
/// left here ([`Freshness::age_secs`]); so does the table's default.
pub(super) fn object_meta(
    key: &[u8],
    status: u16,
    size: u64,
    headers: &HeaderMap,
    now_secs: i64,
    table: &Origin,
) -> ObjectMeta {
    let f = freshness(headers, now_secs);
    let negative = matches!(status, 404 | 410);
    let lifetime = if negative {
        f.lifetime_secs.unwrap_or(table.negative_ttl.as_secs()).min(table.negative_ttl.as_secs())
    } else {
        f.lifetime_secs.unwrap_or(table.default_ttl.as_secs())
    };
    let dated_at = now_secs.saturating_sub(f.age_secs.min(i64::MAX as u64) as i64);
    let fresh_until = dated_at.saturating_add(lifetime.min(i64::MAX as u64) as i64);
    let swr = f.stale_while_revalidate_secs.unwrap_or(table.stale_while_revalidate.as_secs());
    let sie = f.stale_if_error_secs.unwrap_or(table.stale_if_error.as_secs());
    ObjectMeta {
        key: key.to_vec(),
        status: if negative { status } else { 200 },
        size: if negative { 0 } else { size },
        etag: field(headers, header::ETAG).map(<[u8]>::to_vec),
        last_modified: field(headers, header::LAST_MODIFIED).map(<[u8]>::to_vec),
        content_type: field(headers, header::CONTENT_TYPE).map(<[u8]>::to_vec),
        dated_at,
        fresh_until,
        stale_while_revalidate_until: fresh_until.saturating_add(swr as i64),
        stale_if_error_until: fresh_until.saturating_add(sie as i64),
    }
}

/// The same metadata made fresh again by a 304 (or a response of the same
/// version) at `now_secs`, with the lifetime its fields give.
pub(super) fn refreshed(old: &ObjectMeta, headers: &HeaderMap, now_secs: i64, table: &Origin) -> ObjectMeta {
    let mut m = object_meta(&old.key, old.status, old.size, headers, now_secs, table);
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
        let m = object_meta(b"/v/a", 206, 10, &headers(&[("cache-control", "max-age=5"), ("etag", "\"x\"")]), 1000, &t);
        assert_eq!((m.fresh_until, m.stale_if_error_until), (1005, 1005 + 3600));
        assert_eq!((m.status, m.size, m.etag.as_deref()), (200, 10, Some(&b"\"x\""[..])));
        let m = object_meta(b"/v/a", 200, 10, &headers(&[]), 1000, &t);
        assert_eq!(m.fresh_until, 1060, "the table's default_ttl");
        let m = object_meta(b"/v/a", 404, 0, &headers(&[("cache-control", "max-age=600")]), 1000, &t);
        assert_eq!((m.status, m.fresh_until), (404, 1002), "a 404 is kept for negative_ttl at most");
        let m = object_meta(b"/v/a", 200, 1, &headers(&[("cache-control", "max-age=1, stale-if-error=10")]), 0, &t);
        assert_eq!(m.stale_if_error_until, 11, "the origin's stale-if-error wins over the table's");
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
        let r = refreshed(&m, &headers(&[("cache-control", "max-age=9")]), 100, &table());
        assert_eq!((r.etag, r.fresh_until), (m.etag.clone(), 109), "a 304 keeps the validators");
    }

    #[test]
    fn an_aged_response_has_less_of_its_lifetime_left() {
        let t = table();
        // max-age=4 with Age: 3 (a parent held it 3 s): fresh for 1 s here.
        let m = object_meta(b"k", 206, 10, &headers(&[("cache-control", "max-age=4"), ("age", "3")]), 1000, &t);
        assert_eq!((m.dated_at, m.fresh_until), (997, 1001));
        assert_eq!(m.stale_if_error_until, 1001 + 3600, "stale windows follow the freshness");
        // The table's default counts from the same point.
        let m = object_meta(b"k", 206, 10, &headers(&[("age", "25")]), 1000, &t);
        assert_eq!((m.dated_at, m.fresh_until), (975, 1035));
        // Older than its lifetime: stale on arrival.
        let m = object_meta(b"k", 206, 10, &headers(&[("cache-control", "max-age=4"), ("age", "9")]), 1000, &t);
        assert!(m.fresh_until <= 1000);
        // A 304 from a parent that has held the object 5 s.
        let r = refreshed(&m, &headers(&[("cache-control", "s-maxage=60"), ("age", "5")]), 2000, &t);
        assert_eq!((r.dated_at, r.fresh_until), (1995, 2055));
        // An old Date and no Age (a cache that relays the origin's Date).
        let mut date = [0u8; linerate_http::date::HTTP_DATE_LEN];
        linerate_http::date::format_secs(1000 - 30, &mut date);
        let date = std::str::from_utf8(&date).unwrap();
        let m = object_meta(b"k", 206, 10, &headers(&[("cache-control", "max-age=60"), ("date", date)]), 1000, &t);
        assert_eq!((m.dated_at, m.fresh_until), (971, 1031));
    }
}
