//! How long a shared cache may keep an origin's response (RFC 9111), read from the
//! response's `Cache-Control`, `Expires`, `Date` and `Age` fields, with the
//! `stale-while-revalidate` and `stale-if-error` extensions (RFC 5861).
//!
//! A shared cache prefers `s-maxage` to `max-age`, and either to `Expires`; with
//! none of them the caller's default lifetime applies. `no-store` and `private`
//! forbid storing for a shared cache; `no-cache` allows storing but requires
//! revalidation before every use (a lifetime of zero). Unknown directives are
//! ignored, and a directive with a malformed value is treated as absent, except
//! `max-age` and `s-maxage`, whose malformed values make the response stale at
//! once (RFC 9111 section 4.2.1: a cache should not reuse it unvalidated).
//!
//! **Age.** A response may already be old when it arrives: a parent or peer
//! cache held it for a while. Its age at arrival ([`Freshness::age_secs`]) is
//! RFC 9111 section 4.2.3's corrected initial age, simplified: the larger of its
//! `Age` field and its apparent age, the time since its `Date` (less one second:
//! `Date` has a resolution of one second, so a response generated at 12:00:00.9
//! and received at 12:00:01.1 would otherwise look a second old, which would take
//! a whole lifetime from a `max-age=1` live playlist). The response is fresh while
//! its age (age at arrival plus the time since) is under its lifetime.
//!
//! [`only_if_cached`] reads a request's `Cache-Control` for `only-if-cached`
//! (RFC 9111 section 5.2.1.7): answer from the store or with 504.

/// What the fields say about one response.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Freshness {
    /// The response must not be stored (`no-store`, or `private` in a shared cache).
    pub no_store: bool,
    /// Its freshness lifetime in seconds, counted from when it was generated
    /// (its age zero, [`Freshness::age_secs`] before it arrived), when the fields
    /// say; `None` when they say nothing (the caller's default applies).
    pub lifetime_secs: Option<u64>,
    /// How old the response was when it arrived, in seconds: the larger of its
    /// `Age` field and its apparent age (`now_secs` less its `Date`, less one
    /// second of the field's rounding).
    pub age_secs: u64,
    /// `stale-while-revalidate=N`: seconds past its lifetime a stale response may
    /// still be served while it is revalidated in the background.
    pub stale_while_revalidate_secs: Option<u64>,
    /// `stale-if-error=N`: seconds past its lifetime a stale response may be
    /// served when the origin fails.
    pub stale_if_error_secs: Option<u64>,
}

/// The raw field values of a response that bear on freshness (any may be absent;
/// several `Cache-Control` fields are passed joined with commas).
#[derive(Clone, Copy, Debug, Default)]
pub struct Fields<'a> {
    pub cache_control: Option<&'a [u8]>,
    pub expires: Option<&'a [u8]>,
    pub date: Option<&'a [u8]>,
    pub age: Option<&'a [u8]>,
}

impl Freshness {
    /// Reads `fields` of a response received at `now_secs` (Unix time), which is
    /// also used for `Expires` when the response has no usable `Date`.
    pub fn of(fields: Fields<'_>, now_secs: i64) -> Freshness {
        let mut f = Freshness::default();
        let (mut max_age, mut s_maxage, mut bad_age) = (None, None, false);
        for (name, value) in fields.cache_control.map(directives).into_iter().flatten() {
            let secs = value.and_then(parse_delta);
            match name.to_ascii_lowercase().as_slice() {
                b"no-store" | b"private" => f.no_store = true,
                b"no-cache" => max_age = Some(0),
                b"max-age" => match secs {
                    Some(s) => max_age = Some(max_age.map_or(s, |m: u64| m.min(s))),
                    None => bad_age = true,
                },
                b"s-maxage" => match secs {
                    Some(s) => s_maxage = Some(s),
                    None => bad_age = true,
                },
                b"stale-while-revalidate" => f.stale_while_revalidate_secs = secs,
                b"stale-if-error" => f.stale_if_error_secs = secs,
                _ => {}
            }
        }
        let age = fields.age.and_then(parse_delta).unwrap_or(0);
        let date = fields.date.and_then(crate::date::parse_secs);
        let apparent = date.map_or(0, |d| now_secs.saturating_sub(d).saturating_sub(1).max(0) as u64);
        f.age_secs = age.max(apparent);
        let lifetime = if bad_age {
            Some(0)
        } else if let Some(s) = s_maxage.or(max_age) {
            Some(s)
        } else if let Some(expires) = fields.expires {
            // An invalid Expires (such as "0") means already expired.
            let date = date.unwrap_or(now_secs);
            Some(crate::date::parse_secs(expires).map_or(0, |e| (e - date).max(0) as u64))
        } else {
            None
        };
        f.lifetime_secs = lifetime;
        f
    }

    /// Seconds the response stays fresh from its arrival: its lifetime less its
    /// age then, when the fields give a lifetime.
    pub fn remaining_secs(&self) -> Option<u64> {
        self.lifetime_secs.map(|l| l.saturating_sub(self.age_secs))
    }
}

/// Whether a request's `Cache-Control` value (several fields joined with commas)
/// has `only-if-cached`: the requester wants a stored response or a 504, never a
/// request onwards.
pub fn only_if_cached(cache_control: &[u8]) -> bool {
    directives(cache_control).any(|(name, _)| name.eq_ignore_ascii_case(b"only-if-cached"))
}

/// The directives of a `Cache-Control` value: name, and value if any (quotes
/// removed). Empty members (`a,,b`) are skipped.
fn directives(value: &[u8]) -> impl Iterator<Item = (&[u8], Option<&[u8]>)> {
    value.split(|&b| b == b',').filter_map(|d| {
        let d = d.trim_ascii();
        if d.is_empty() {
            return None;
        }
        Some(match d.iter().position(|&b| b == b'=') {
            Some(i) => {
                let v = d[i + 1..].trim_ascii();
                let v = v.strip_prefix(b"\"").and_then(|v| v.strip_suffix(b"\"")).unwrap_or(v);
                (d[..i].trim_ascii(), Some(v))
            }
            None => (d, None),
        })
    })
}

/// A delta-seconds value: digits only; values past 2^31 are clamped to it, as
/// RFC 9111 section 1.2.2 asks.
fn parse_delta(v: &[u8]) -> Option<u64> {
    if v.is_empty() || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let clamp = 1u64 << 31;
    Some(
        v.iter()
            .try_fold(0u64, |n, &d| n.checked_mul(10)?.checked_add(u64::from(d - b'0')))
            .unwrap_or(clamp)
            .min(clamp),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cc(value: &str) -> Freshness {
        Freshness::of(Fields { cache_control: Some(value.as_bytes()), ..Fields::default() }, 0)
    }

    #[test]
    fn a_shared_cache_prefers_s_maxage_and_honours_no_store_and_private() {
        assert_eq!(cc("max-age=60").lifetime_secs, Some(60));
        assert_eq!(cc("public, max-age=60, s-maxage=600").lifetime_secs, Some(600));
        assert_eq!(cc("s-maxage=\"30\"").lifetime_secs, Some(30), "quoted values are read");
        assert!(cc("no-store").no_store);
        assert!(cc("private, max-age=60").no_store);
        assert_eq!(cc("no-cache").lifetime_secs, Some(0), "stored, revalidated before each use");
        assert_eq!(cc("immutable").lifetime_secs, None, "unknown directives: the default applies");
        assert_eq!(cc("").lifetime_secs, None);
    }

    #[test]
    fn malformed_ages_make_the_response_stale_and_large_ones_are_clamped() {
        assert_eq!(cc("max-age=-1").lifetime_secs, Some(0));
        assert_eq!(cc("max-age=abc, s-maxage=60").lifetime_secs, Some(0));
        assert_eq!(cc("max-age=99999999999999999999999").lifetime_secs, Some(1 << 31));
        assert_eq!(cc("max-age=10, max-age=20").lifetime_secs, Some(10), "conflicting: the shorter");
    }

    #[test]
    fn stale_extensions_are_read() {
        let f = cc("max-age=1, stale-while-revalidate=30, stale-if-error=86400");
        assert_eq!((f.stale_while_revalidate_secs, f.stale_if_error_secs), (Some(30), Some(86400)));
        assert_eq!(cc("stale-if-error").stale_if_error_secs, None, "no value: absent");
    }

    #[test]
    fn expires_counts_from_the_date_field_and_age_is_taken_off() {
        let date = b"Sun, 06 Nov 1994 08:49:37 GMT";
        let expires = b"Sun, 06 Nov 1994 08:59:37 GMT";
        let f = Freshness::of(Fields { expires: Some(expires), date: Some(date), ..Fields::default() }, 0);
        assert_eq!(f.lifetime_secs, Some(600));
        let aged = Fields { expires: Some(expires), date: Some(date), age: Some(b"100"), cache_control: None };
        let f = Freshness::of(aged, 0);
        assert_eq!((f.lifetime_secs, f.age_secs, f.remaining_secs()), (Some(600), 100, Some(500)));
        let invalid = Fields { expires: Some(b"0"), ..Fields::default() };
        assert_eq!(Freshness::of(invalid, 0).lifetime_secs, Some(0), "an invalid Expires is in the past");
        let both = Fields { expires: Some(expires), date: Some(date), cache_control: Some(b"max-age=5"), age: None };
        assert_eq!(Freshness::of(both, 0).lifetime_secs, Some(5), "max-age wins over Expires");
        let past = Fields { expires: Some(date), date: Some(expires), ..Fields::default() };
        assert_eq!(Freshness::of(past, 0).lifetime_secs, Some(0));
    }

    #[test]
    fn the_age_at_arrival_is_the_larger_of_age_and_the_apparent_age() {
        let date = b"Sun, 06 Nov 1994 08:49:37 GMT";
        let at = crate::date::parse_secs(date).unwrap();
        let f = |age: Option<&'static [u8]>, now: i64| {
            Freshness::of(Fields { cache_control: Some(b"max-age=4"), date: Some(date), age, expires: None }, now)
        };
        // A parent held it 3 s: of its 4 s, 1 is left.
        assert_eq!((f(Some(b"3"), at).age_secs, f(Some(b"3"), at).remaining_secs()), (3, Some(1)));
        // A cache that relays the origin's Date and sends no Age (nginx): the
        // apparent age, one second of rounding forgiven.
        assert_eq!(f(None, at + 1).age_secs, 0, "one second apart is Date's rounding");
        assert_eq!(f(None, at + 3).age_secs, 2);
        assert_eq!(f(Some(b"10"), at + 3).age_secs, 10, "Age wins when larger");
        assert_eq!(f(None, at - 50).age_secs, 0, "a Date in the future is no age");
        assert_eq!(f(Some(b"x"), at).age_secs, 0, "a malformed Age is ignored");
        assert_eq!(f(Some(b"9"), at).remaining_secs(), Some(0), "older than its lifetime: stale at once");
        let none = Freshness::of(Fields { age: Some(b"7"), ..Fields::default() }, 0);
        assert_eq!((none.lifetime_secs, none.age_secs, none.remaining_secs()), (None, 7, None));
    }

    #[test]
    fn only_if_cached_is_found_among_the_directives() {
        assert!(only_if_cached(b"only-if-cached"));
        assert!(only_if_cached(b"max-age=0, Only-If-Cached"));
        assert!(!only_if_cached(b"no-cache"));
        assert!(!only_if_cached(b"only-if-cachedx"));
        assert!(!only_if_cached(b""));
    }
}
