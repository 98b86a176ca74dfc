//! Dates: HTTP dates (IMF-fixdate, through the `httpdate` crate) and the timestamps
//! of access-log records (RFC 3339 and nginx's CLF), worked out once a second from a
//! civil date of their own.

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

/// Proleptic Gregorian date (year, month 1..=12, day 1..=31) of a day count since
/// 1970-01-01 (Howard Hinnant's `civil_from_days`).
pub fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// Access-log timestamps in UTC: RFC 3339 with milliseconds and nginx's CLF
/// (`$time_local`). The second is rendered in both forms when it changes, so a
/// record costs a copy, not a calendar computation; the buffers grow once.
#[derive(Debug)]
pub struct Timestamps {
    /// Seconds since the epoch of the rendered second; `u64::MAX` before the first.
    secs: u64,
    /// `2026-11-23T22:30:00`.
    rfc3339: Vec<u8>,
    /// `23/Nov/2026:22:30:00 +0000`.
    clf: Vec<u8>,
}

impl Default for Timestamps {
    fn default() -> Self {
        Timestamps::new()
    }
}

impl Timestamps {
    /// Nothing rendered yet (a `const fn`, for a `thread_local!` with no lazy set-up).
    pub const fn new() -> Timestamps {
        Timestamps { secs: u64::MAX, rfc3339: Vec::new(), clf: Vec::new() }
    }

    /// Appends `2026-11-23T22:30:00.123Z` (times before the epoch are written as the
    /// epoch).
    pub fn write_rfc3339_millis(&mut self, t: SystemTime, out: &mut Vec<u8>) {
        let since = self.render(t);
        out.extend_from_slice(&self.rfc3339);
        let ms = since.subsec_millis();
        out.extend_from_slice(&[
            b'.',
            b'0' + (ms / 100) as u8,
            b'0' + (ms / 10 % 10) as u8,
            b'0' + (ms % 10) as u8,
            b'Z',
        ]);
    }

    /// Appends `23/Nov/2026:22:30:00 +0000` (times before the epoch are written as
    /// the epoch).
    pub fn write_clf(&mut self, t: SystemTime, out: &mut Vec<u8>) {
        self.render(t);
        out.extend_from_slice(&self.clf);
    }

    /// Renders the second holding `t`, unless it is the one already rendered; returns
    /// `t` as time since the epoch.
    fn render(&mut self, t: SystemTime) -> Duration {
        let since = t.duration_since(UNIX_EPOCH).unwrap_or_default();
        let secs = since.as_secs();
        if self.secs == secs {
            return since;
        }
        const MONTHS: [&[u8; 3]; 12] =
            [b"Jan", b"Feb", b"Mar", b"Apr", b"May", b"Jun", b"Jul", b"Aug", b"Sep", b"Oct", b"Nov", b"Dec"];
        let two = |n: u64| [b'0' + (n / 10 % 10) as u8, b'0' + (n % 10) as u8];
        let (year, month, day) = civil_from_days(i64::try_from(secs / 86_400).unwrap_or(i64::MAX / 2));
        let in_day = secs % 86_400;
        let (h, m, s) = (two(in_day / 3600), two(in_day / 60 % 60), two(in_day % 60));
        // At least four digits: years before 1000 get leading zeros.
        let mut digits = itoa::Buffer::new();
        let digits = digits.format(year).as_bytes();
        let mut padded = [b'0'; 4];
        let year_text: &[u8] = if digits.len() < 4 {
            padded[4 - digits.len()..].copy_from_slice(digits);
            &padded
        } else {
            digits
        };
        let (mo, d) = (two(month.into()), two(day.into()));
        let r = &mut self.rfc3339;
        r.clear();
        for part in [year_text, b"-", &mo, b"-", &d, b"T", &h, b":", &m, b":", &s] {
            r.extend_from_slice(part);
        }
        let c = &mut self.clf;
        c.clear();
        for part in [&d[..], b"/", MONTHS[month as usize - 1], b"/", year_text, b":", &h, b":", &m, b":", &s, b" +0000"]
        {
            c.extend_from_slice(part);
        }
        self.secs = secs;
        since
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

    #[test]
    fn log_timestamps_match_humantime_in_both_formats() {
        const MONTHS: [&str; 12] = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
        // A linear congruential generator (Knuth's MMIX constants): reproducible seconds.
        let mut state = 42u64;
        let mut next = move || {
            state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            state >> 11
        };
        // Every day boundary around leap days and years, and random seconds up to 9999.
        let edges = [0u64, 951_782_399, 951_782_400, 951_868_799, 951_868_800, 4_107_542_399, 4_107_542_400];
        let random = (0..100_000).map(|_| next() % 253_402_300_800);
        let mut stamps = Timestamps::new();
        for secs in edges.into_iter().chain(random) {
            let t = SystemTime::UNIX_EPOCH + Duration::from_millis(secs * 1000 + secs % 1000);
            let want = humantime::format_rfc3339_millis(t).to_string();
            let mut got = Vec::new();
            stamps.write_rfc3339_millis(t, &mut got);
            assert_eq!(String::from_utf8(got).unwrap(), want);
            let (y, mo, d, hms) = (&want[0..4], &want[5..7], &want[8..10], &want[11..19]);
            let mut clf = Vec::new();
            stamps.write_clf(t, &mut clf);
            let month = MONTHS[mo.parse::<usize>().unwrap() - 1];
            assert_eq!(String::from_utf8(clf).unwrap(), format!("{d}/{month}/{y}:{hms} +0000"));
        }
    }
}
