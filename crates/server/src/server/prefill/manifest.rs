//! A prefill manifest: paths ranked by expected popularity (the first is kept
//! longest), and how long the manifest lasts.
//!
//! Text, one path per line, `#` comments and blank lines ignored, optionally one
//! `lifetime DURATION` (`7d`, `36h`) or `expires RFC3339` line before the paths:
//!
//! ```text
//! # tonight's releases
//! lifetime 7d
//! /vod/title-1/video.mp4
//! /vod/title-2/video.mp4
//! ```
//!
//! or JSON: `{"lifetime": "7d", "paths": ["/vod/title-1/video.mp4", ...]}` (or
//! `"expires": "2026-12-04T00:00:00Z"`). Without either, a manifest lasts
//! [`DEFAULT_LIFETIME`].

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// How long a manifest that names no lifetime lasts.
pub(crate) const DEFAULT_LIFETIME: Duration = Duration::from_secs(7 * 86400);
/// The most paths a manifest may list.
pub(crate) const MAX_PATHS: usize = 1_000_000;

/// A parsed manifest.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Manifest {
    /// Paths as served (`/vod/...`), most popular first.
    pub paths: Vec<String>,
    /// When it was submitted, and until when it lasts (Unix seconds).
    pub submitted: i64,
    pub expires: i64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Json {
    paths: Vec<String>,
    #[serde(default)]
    lifetime: Option<String>,
    #[serde(default)]
    expires: Option<String>,
}

impl Manifest {
    /// Parses `text` submitted at `now` (Unix seconds). Errors name the line (or
    /// JSON member) and the problem.
    pub(crate) fn parse(text: &str, now: i64) -> Result<Manifest, String> {
        let (paths, until) =
            if text.trim_start().starts_with('{') { from_json(text, now)? } else { from_text(text, now)? };
        if paths.is_empty() {
            return Err("the manifest lists no path".into());
        }
        if paths.len() > MAX_PATHS {
            return Err(format!("the manifest lists {} paths; at most {MAX_PATHS}", paths.len()));
        }
        let expires = until.unwrap_or(now + DEFAULT_LIFETIME.as_secs() as i64);
        if expires <= now {
            return Err("the manifest has already expired".into());
        }
        let mut seen = std::collections::HashSet::new();
        for (at, p) in &paths {
            check_path(p).map_err(|e| format!("{at}: {e}"))?;
            if !seen.insert(p.as_str()) {
                return Err(format!("{at}: {p} is listed twice"));
            }
        }
        Ok(Manifest { paths: paths.into_iter().map(|(_, p)| p).collect(), submitted: now, expires })
    }
}

type Listed = (Vec<(String, String)>, Option<i64>);

fn from_text(text: &str, now: i64) -> Result<Listed, String> {
    let mut paths = Vec::new();
    let mut until = None;
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        let at = format!("line {}", n + 1);
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let directive = line.split_once(char::is_whitespace).map(|(k, v)| (k, v.trim()));
        match directive {
            Some(("lifetime", v)) | Some(("expires", v)) if !paths.is_empty() => {
                return Err(format!("{at}: `{}` must come before the paths", &line[..line.len() - v.len()].trim()))
            }
            Some(("lifetime", v)) if until.is_none() => {
                until = Some(lifetime(v, now).map_err(|e| format!("{at}: {e}"))?)
            }
            Some(("expires", v)) if until.is_none() => until = Some(expires(v).map_err(|e| format!("{at}: {e}"))?),
            Some(("lifetime" | "expires", _)) => return Err(format!("{at}: only one `lifetime` or `expires` line")),
            _ => paths.push((at, line.to_string())),
        }
    }
    Ok((paths, until))
}

fn from_json(text: &str, now: i64) -> Result<Listed, String> {
    let j: Json = serde_json::from_str(text).map_err(|e| format!("JSON: {e}"))?;
    let until = match (&j.lifetime, &j.expires) {
        (Some(_), Some(_)) => return Err("JSON: `lifetime` and `expires` both given; give one".into()),
        (Some(l), None) => Some(lifetime(l, now).map_err(|e| format!("JSON `lifetime`: {e}"))?),
        (None, Some(x)) => Some(expires(x).map_err(|e| format!("JSON `expires`: {e}"))?),
        (None, None) => None,
    };
    Ok((j.paths.into_iter().enumerate().map(|(i, p)| (format!("paths[{i}]"), p)).collect(), until))
}

fn lifetime(v: &str, now: i64) -> Result<i64, String> {
    let d = humantime::parse_duration(v).map_err(|e| format!("{v:?} is not a duration like \"7d\" ({e})"))?;
    if d.is_zero() || d > Duration::from_secs(366 * 86400) {
        return Err(format!("{v:?}: a lifetime is more than 0 and at most a year"));
    }
    Ok(now + d.as_secs() as i64)
}

fn expires(v: &str) -> Result<i64, String> {
    chrono::DateTime::parse_from_rfc3339(v)
        .map(|t| t.timestamp())
        .map_err(|e| format!("{v:?} is not an RFC 3339 time like \"2026-12-04T00:00:00Z\" ({e})"))
}

/// A path as a viewer would ask for it, already normalised: absolute, no `.` or
/// `..` segment, no empty segment, no query, no percent-encoding, no control
/// characters or spaces.
fn check_path(p: &str) -> Result<(), String> {
    if !p.starts_with('/') {
        return Err(format!("{p:?} is not an absolute path (it starts with `/`)"));
    }
    if p.bytes().any(|b| b <= b' ' || b == 0x7f || b == b'?' || b == b'#' || b == b'%') {
        return Err(format!("{p:?}: write the path decoded, without spaces, `?`, `#` or `%`"));
    }
    if p.ends_with('/') || p[1..].split('/').any(|s| s.is_empty() || s == "." || s == "..") {
        return Err(format!("{p:?} is not a file's normalised path (empty, `.` or `..` segment, or a trailing `/`)"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_800_000_000;

    #[test]
    fn text_manifests_keep_their_order_and_lifetime() {
        let m = Manifest::parse("# tonight\n\nlifetime 2d\n/vod/b.mp4\n  /vod/a.mp4  \n# done\n", NOW).unwrap();
        assert_eq!(m.paths, ["/vod/b.mp4", "/vod/a.mp4"]);
        assert_eq!((m.submitted, m.expires), (NOW, NOW + 2 * 86400));
        let m = Manifest::parse("/vod/x\n", NOW).unwrap();
        assert_eq!(m.expires, NOW + 7 * 86400, "the default lifetime");
        let m = Manifest::parse("expires 2027-01-20T08:00:00+01:00\n/vod/x\n", NOW).unwrap();
        assert_eq!(m.expires, 1_800_428_400, "the offset is honoured");
    }

    #[test]
    fn json_manifests() {
        let m = Manifest::parse(r#"{"lifetime": "12h", "paths": ["/vod/a", "/vod/b"]}"#, NOW).unwrap();
        assert_eq!((m.paths.len(), m.expires), (2, NOW + 12 * 3600));
        let m = Manifest::parse(r#" {"expires": "2030-01-01T00:00:00Z", "paths": ["/v/a"]}"#, NOW).unwrap();
        assert_eq!(m.expires, 1_893_456_000);
        let e = Manifest::parse(r#"{"paths": ["/v/a"], "ttl": 3}"#, NOW).unwrap_err();
        assert!(e.contains("JSON") && e.contains("ttl"), "{e}");
        let e = Manifest::parse(r#"{"paths": ["/v/a", "v/b"]}"#, NOW).unwrap_err();
        assert!(e.starts_with("paths[1]:"), "{e}");
    }

    #[test]
    fn bad_manifests_name_the_line_and_the_problem() {
        let cases = [
            ("", "no path"),
            ("# only a comment\n", "no path"),
            ("/vod/a\nvod/b\n", "line 2: \"vod/b\" is not an absolute path"),
            ("/vod/a\n/vod/../etc/passwd\n", "line 2:"),
            ("/vod/a b\n", "line 1:"),
            ("/vod/a?x=1\n", "line 1:"),
            ("/vod/a\n/vod/a\n", "line 2: /vod/a is listed twice"),
            ("/vod/a\nlifetime 7d\n", "line 2: `lifetime` must come before the paths"),
            ("lifetime soon\n/vod/a\n", "line 1: \"soon\" is not a duration"),
            ("lifetime 1d\nexpires 2030-01-01T00:00:00Z\n/vod/a\n", "line 2: only one"),
            ("expires yesterday\n/vod/a\n", "line 1: \"yesterday\" is not an RFC 3339 time"),
            ("expires 2020-01-01T00:00:00Z\n/vod/a\n", "already expired"),
        ];
        for (text, want) in cases {
            let e = Manifest::parse(text, NOW).unwrap_err();
            assert!(e.contains(want), "{text:?}: {e}");
        }
    }
}
