//! HTTP dates (IMF-fixdate), through the `httpdate` crate.

use std::io::Write;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Length of an IMF-fixdate: `Sun, 06 Nov 1994 08:49:37 GMT`.
pub const HTTP_DATE_LEN: usize = 29;

/// Parses any of the three HTTP date formats into seconds since the Unix epoch.
pub fn parse_secs(value: &[u8]) -> Option<i64> {
    let s = std::str::from_utf8(crate::request::trim(value)).ok()?;
    let t = httpdate::parse_http_date(s).ok()?;
    Some(match t.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_secs() as i64,
        Err(e) => -(e.duration().as_secs() as i64),
    })
}

/// The last second an IMF-fixdate can express: `Fri, 31 Dec 9999 23:59:59 GMT`.
pub const MAX_SECS: i64 = 253_402_300_799;

/// Formats `secs` since the epoch as an IMF-fixdate. Times are clamped to the
/// years 1970..=9999: before the epoch to the epoch, from year 10000 on to
/// [`MAX_SECS`] (a file's mtime can be set that far; httpdate panics on it, and
/// a four-digit year is all the format and most clients allow).
pub fn format_secs(secs: i64, out: &mut [u8; HTTP_DATE_LEN]) {
    let t = UNIX_EPOCH + Duration::from_secs(secs.clamp(0, MAX_SECS) as u64);
    let mut cursor = &mut out[..];
    // An IMF-fixdate is always exactly HTTP_DATE_LEN bytes for years 1970..=9999.
    let _ = write!(cursor, "{}", httpdate::HttpDate::from(t));
}

/// The current time as an HTTP date, formatted at most once per second. Each worker
/// owns one, so formatting the Date field costs one clock read per response.
#[derive(Debug)]
pub struct DateCache {
    secs: i64,
    text: [u8; HTTP_DATE_LEN],
}

impl Default for DateCache {
    fn default() -> Self {
        DateCache { secs: i64::MIN, text: [b' '; HTTP_DATE_LEN] }
    }
}

impl DateCache {
    pub fn now(&mut self) -> &[u8] {
        self.refresh();
        &self.text
    }

    /// The current time in seconds since the epoch, as the next [`DateCache::now`]
    /// will format it.
    pub fn now_secs(&mut self) -> i64 {
        self.refresh();
        self.secs
    }

    fn refresh(&mut self) {
        let secs = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64);
        if secs != self.secs {
            self.secs = secs;
            format_secs(secs, &mut self.text);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_formats() {
        let mut buf = [0u8; HTTP_DATE_LEN];
        format_secs(784_111_777, &mut buf);
        assert_eq!(&buf, b"Sun, 06 Nov 1994 08:49:37 GMT");
        assert_eq!(parse_secs(&buf), Some(784_111_777));
        assert_eq!(parse_secs(b"Sunday, 06-Nov-94 08:49:37 GMT"), Some(784_111_777));
        assert_eq!(parse_secs(b"Sun Nov  6 08:49:37 1994"), Some(784_111_777));
        assert_eq!(parse_secs(b"not a date"), None);
    }

    #[test]
    fn dates_beyond_year_9999_are_clamped() {
        let mut buf = [0u8; HTTP_DATE_LEN];
        for secs in [MAX_SECS + 1, 300_000_000_000, i64::MAX] {
            format_secs(secs, &mut buf);
            assert_eq!(&buf, b"Fri, 31 Dec 9999 23:59:59 GMT", "{secs}");
        }
        format_secs(-5, &mut buf);
        assert_eq!(&buf, b"Thu, 01 Jan 1970 00:00:00 GMT");
    }

    #[test]
    fn cache_gives_a_well_formed_date() {
        let mut c = DateCache::default();
        let now = c.now().to_vec();
        assert!(parse_secs(&now).is_some());
        assert!(now.ends_with(b" GMT"));
    }
}
