//! HLS media playlists (RFC 8216), as far as a live viewer needs them: the target
//! duration, the media sequence number of the first segment, and each segment's
//! URI, duration and program date-time.
//!
//! Pure: text in, [`MediaPlaylist`] out. A multivariant (master) playlist, a
//! playlist without `EXT-X-TARGETDURATION` or a segment without `EXTINF` is an
//! error with the reason.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// One media segment of a playlist.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Segment {
    /// Media sequence number.
    pub seq: u64,
    /// The URI as written (relative to the playlist's URL, or absolute).
    pub uri: String,
    /// `EXTINF` duration.
    pub duration: Duration,
    /// When its first sample was captured: `EXT-X-PROGRAM-DATE-TIME` on it, or
    /// extrapolated from an earlier one in the same playlist by the durations
    /// between (RFC 8216 section 4.3.2.6).
    pub program_date_time: Option<SystemTime>,
}

#[derive(Clone, Debug, PartialEq)]
pub(crate) struct MediaPlaylist {
    pub target_duration: Duration,
    pub segments: Vec<Segment>,
    /// `EXT-X-ENDLIST`: no segment will be added.
    pub ended: bool,
}

/// Parses a media playlist.
pub(crate) fn parse(text: &str) -> Result<MediaPlaylist, String> {
    let mut lines = text.lines().map(str::trim).filter(|l| !l.is_empty());
    if lines.next() != Some("#EXTM3U") {
        return Err("does not start with #EXTM3U".into());
    }
    let mut target = None;
    let mut seq = 0u64;
    let mut ended = false;
    let mut segments = Vec::new();
    let mut extinf: Option<Duration> = None;
    let mut pdt: Option<SystemTime> = None;
    for line in lines {
        if let Some(tag) = line.strip_prefix('#') {
            let (name, value) = tag.split_once(':').unwrap_or((tag, ""));
            match name {
                "EXT-X-TARGETDURATION" => {
                    let t: u64 =
                        value.parse().map_err(|_| format!("EXT-X-TARGETDURATION {value:?} is not an integer"))?;
                    if t == 0 {
                        return Err("EXT-X-TARGETDURATION is 0".into());
                    }
                    target = Some(Duration::from_secs(t));
                }
                "EXT-X-MEDIA-SEQUENCE" => {
                    if !segments.is_empty() {
                        return Err("EXT-X-MEDIA-SEQUENCE after the first segment".into());
                    }
                    seq = value.parse().map_err(|_| format!("EXT-X-MEDIA-SEQUENCE {value:?} is not an integer"))?;
                }
                "EXTINF" => {
                    let secs = value.split(',').next().unwrap_or("").trim();
                    let d: f64 = secs.parse().map_err(|_| format!("EXTINF {secs:?} is not a number"))?;
                    if !(0.0..86_400.0).contains(&d) {
                        return Err(format!("EXTINF {secs:?} is out of range"));
                    }
                    extinf = Some(Duration::from_secs_f64(d));
                }
                "EXT-X-PROGRAM-DATE-TIME" => {
                    pdt = Some(parse_date_time(value).ok_or_else(|| format!("EXT-X-PROGRAM-DATE-TIME {value:?}"))?);
                }
                "EXT-X-ENDLIST" => ended = true,
                "EXT-X-STREAM-INF" => return Err("a multivariant playlist: give a media playlist".into()),
                _ => {} // other tags (and comments) do not change what a viewer fetches
            }
            continue;
        }
        let duration = extinf.take().ok_or_else(|| format!("segment {line:?} has no EXTINF"))?;
        let program_date_time = pdt.take().or_else(|| {
            let prev: &Segment = segments.last()?;
            Some(prev.program_date_time? + prev.duration)
        });
        segments.push(Segment { seq, uri: line.to_owned(), duration, program_date_time });
        seq += 1;
    }
    let target_duration = target.ok_or("no EXT-X-TARGETDURATION")?;
    Ok(MediaPlaylist { target_duration, segments, ended })
}

/// An RFC 3339 / ISO 8601 date-time with a time zone: `2026-11-27T18:50:05.123Z`,
/// `…+00:00` or `…+0000` (as ffmpeg writes it).
pub(crate) fn parse_date_time(s: &str) -> Option<SystemTime> {
    let s = s.trim();
    let b = s.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') || b[13] != b':' {
        return None;
    }
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let part = s.get(r)?;
        part.bytes().all(|c| c.is_ascii_digit()).then(|| part.parse().ok())?
    };
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hour, minute) = (num(11..13)?, num(14..16)?);
    if b[16] != b':' {
        return None;
    }
    let second = num(17..19)?;
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || minute > 59 || second > 60 {
        return None;
    }
    let mut rest = &s[19..];
    let mut nanos = 0u64;
    if let Some(frac) = rest.strip_prefix('.') {
        let digits = frac.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return None;
        }
        for (i, c) in frac[..digits].bytes().take(9).enumerate() {
            nanos += u64::from(c - b'0') * 10u64.pow(8 - i as u32);
        }
        rest = &frac[digits..];
    }
    let offset_s = match rest {
        "Z" | "z" => 0,
        _ => {
            let sign = match rest.as_bytes().first()? {
                b'+' => 1,
                b'-' => -1,
                _ => return None,
            };
            let hm = rest[1..].replace(':', "");
            if hm.len() != 4 || !hm.bytes().all(|c| c.is_ascii_digit()) {
                return None;
            }
            let (h, m): (i64, i64) = (hm[..2].parse().ok()?, hm[2..].parse().ok()?);
            sign * (h * 3600 + m * 60)
        }
    };
    let secs = days_from_civil(year, month, day) * 86_400 + hour * 3600 + minute * 60 + second - offset_s;
    let secs = u64::try_from(secs).ok()?;
    UNIX_EPOCH.checked_add(Duration::from_secs(secs) + Duration::from_nanos(nanos))
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The request target (path and query) of `uri`, a segment URI of a playlist whose
/// request target is `base`, on origin `scheme://authority`. A URI on another
/// origin is an error (a viewer here keeps one connection).
pub(crate) fn resolve(scheme: &str, authority: &str, base: &str, uri: &str) -> Result<String, String> {
    if let Some((s, rest)) = uri.split_once("://").filter(|(s, _)| s.bytes().all(|c| c.is_ascii_alphabetic())) {
        let (auth, path) = rest.find('/').map_or((rest, "/"), |i| (&rest[..i], &rest[i..]));
        if !s.eq_ignore_ascii_case(scheme) || !auth.eq_ignore_ascii_case(authority) {
            return Err(format!("segment {uri:?} is on another origin than the playlist"));
        }
        return Ok(normalize(path));
    }
    if let Some(rest) = uri.strip_prefix("//") {
        return resolve(scheme, authority, base, &format!("{scheme}://{rest}"));
    }
    if uri.starts_with('/') {
        return Ok(normalize(uri));
    }
    let base_path = base.split(['?', '#']).next().unwrap_or("/");
    let dir = &base_path[..base_path.rfind('/').map_or(0, |i| i + 1)];
    Ok(normalize(&format!("{}{uri}", if dir.is_empty() { "/" } else { dir })))
}

/// Removes `.` and `..` path segments (RFC 3986 section 5.2.4) before the query.
fn normalize(target: &str) -> String {
    let (path, query) = match target.find(['?', '#']) {
        Some(i) => (&target[..i], &target[i..]),
        None => (target, ""),
    };
    let mut out: Vec<&str> = Vec::new();
    let parts: Vec<&str> = path.split('/').skip(1).collect();
    for (i, p) in parts.iter().enumerate() {
        let last = i + 1 == parts.len();
        match *p {
            "." => {
                if last {
                    out.push("");
                }
            }
            ".." => {
                out.pop();
                if last {
                    out.push("");
                }
            }
            p => out.push(p),
        }
    }
    let query = query.split('#').next().unwrap_or("");
    format!("/{}{query}", out.join("/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const FFMPEG: &str = "#EXTM3U
#EXT-X-VERSION:3
#EXT-X-TARGETDURATION:2
#EXT-X-MEDIA-SEQUENCE:41
#EXT-X-INDEPENDENT-SEGMENTS
#EXTINF:2.000000,
#EXT-X-PROGRAM-DATE-TIME:2026-11-27T18:50:05.120+0000
seg00041.ts
#EXT-X-PROGRAM-DATE-TIME:2026-11-27T18:50:07.120+0000
#EXTINF:2.000000,
seg00042.ts
#EXTINF:1.960000,
seg00043.ts
";

    fn at(secs: u64, millis: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs) + Duration::from_millis(millis)
    }

    /// ffmpeg writes `EXTINF` before `EXT-X-PROGRAM-DATE-TIME`; other packagers
    /// the other way round: both apply to the next URI.
    #[test]
    fn a_live_media_playlist_as_ffmpeg_writes_it() {
        let p = parse(FFMPEG).unwrap();
        assert_eq!(p.target_duration, Duration::from_secs(2));
        assert!(!p.ended);
        let seqs: Vec<u64> = p.segments.iter().map(|s| s.seq).collect();
        assert_eq!(seqs, [41, 42, 43]);
        assert_eq!(p.segments[2].uri, "seg00043.ts");
        assert_eq!(p.segments[2].duration, Duration::from_millis(1960));
        // 2026-11-27T18:50:05Z is 1_795_805_405 s after the epoch.
        assert_eq!(p.segments[0].program_date_time, Some(at(1_795_805_405, 120)));
        assert_eq!(p.segments[1].program_date_time, Some(at(1_795_805_407, 120)));
        // No tag on the third: extrapolated from the second by its duration.
        assert_eq!(p.segments[2].program_date_time, Some(at(1_795_805_409, 120)));
    }

    #[test]
    fn defaults_endlist_and_no_program_date_time() {
        let p = parse("#EXTM3U\n#EXT-X-TARGETDURATION:6\n#EXTINF:5.5,title\na.ts\n#EXT-X-ENDLIST\n").unwrap();
        assert!(p.ended);
        assert_eq!(p.segments.len(), 1);
        // No EXT-X-MEDIA-SEQUENCE: the first segment is number 0.
        assert_eq!(p.segments[0].seq, 0);
        assert_eq!(p.segments[0].program_date_time, None);
        assert_eq!(p.segments[0].duration, Duration::from_millis(5500));
    }

    #[test]
    fn what_is_not_a_usable_media_playlist_says_why() {
        for (text, why) in [
            ("", "#EXTM3U"),
            ("#EXTM3U\n#EXTINF:2,\na.ts\n", "no EXT-X-TARGETDURATION"),
            ("#EXTM3U\n#EXT-X-TARGETDURATION:2\na.ts\n", "no EXTINF"),
            ("#EXTM3U\n#EXT-X-STREAM-INF:BANDWIDTH=1\nv.m3u8\n", "multivariant"),
            ("#EXTM3U\n#EXT-X-TARGETDURATION:two\n", "not an integer"),
            ("#EXTM3U\n#EXT-X-TARGETDURATION:2\n#EXT-X-PROGRAM-DATE-TIME:yesterday\n", "PROGRAM-DATE-TIME"),
        ] {
            let e = parse(text).unwrap_err();
            assert!(e.contains(why), "{text:?}: {e}");
        }
    }

    #[test]
    fn date_times_in_the_forms_packagers_write() {
        let t = at(1_795_805_405, 0);
        assert_eq!(parse_date_time("2026-11-27T18:50:05Z"), Some(t));
        assert_eq!(parse_date_time("2026-11-27T19:50:05+01:00"), Some(t));
        assert_eq!(parse_date_time("2026-11-27T17:50:05-0100"), Some(t));
        assert_eq!(parse_date_time("2026-11-27T18:50:05.5Z"), Some(t + Duration::from_millis(500)));
        assert_eq!(parse_date_time("1970-01-01T00:00:00Z"), Some(UNIX_EPOCH));
        assert_eq!(parse_date_time("2000-02-29T00:00:00Z"), Some(UNIX_EPOCH + Duration::from_secs(951_782_400)));
        for bad in ["2026-11-27", "2026-13-01T00:00:00Z", "2026-11-27T18:50:05", "2026-11-27T18:50:05.Z"] {
            assert_eq!(parse_date_time(bad), None, "{bad}");
        }
    }

    #[test]
    fn segment_uris_resolve_against_the_playlist_url() {
        let r = |uri| resolve("http", "h:8080", "/live/a/stream.m3u8?token=1", uri);
        assert_eq!(r("seg1.ts").unwrap(), "/live/a/seg1.ts");
        assert_eq!(r("v/seg1.ts?x=2").unwrap(), "/live/a/v/seg1.ts?x=2");
        assert_eq!(r("../b/seg1.ts").unwrap(), "/live/b/seg1.ts");
        assert_eq!(r("./seg1.ts").unwrap(), "/live/a/seg1.ts");
        assert_eq!(r("/other/seg1.ts").unwrap(), "/other/seg1.ts");
        assert_eq!(r("http://H:8080/x/seg1.ts").unwrap(), "/x/seg1.ts");
        assert_eq!(r("//h:8080/y.ts").unwrap(), "/y.ts");
        assert!(r("http://cdn.example/seg1.ts").unwrap_err().contains("another origin"));
        assert!(r("https://h:8080/seg1.ts").is_err());
        assert_eq!(resolve("http", "h", "/stream.m3u8", "s.ts").unwrap(), "/s.ts");
    }
}
