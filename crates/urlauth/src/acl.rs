//! Token ACLs: `!`-separated path patterns in which `*` matches any run of bytes
//! (`/` included) and `%XX` stands for the byte XX, matched against the decoded,
//! normalised path.
//!
//! A pattern without `*` names one path exactly; `/title/*` covers everything under
//! `/title/`. A literal `*`, `!`, `~`, `%` or `;` in a path is written `%2A`, `%21`, `%7E`,
//! `%25`, `%3B`.

/// One step of a pattern.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Tok {
    Star,
    Byte(u8),
}

/// The token at `pattern[i..]` and its length in the pattern; `None` for a bad escape.
fn tok(pattern: &[u8], i: usize) -> Option<(Tok, usize)> {
    match pattern[i] {
        b'*' => Some((Tok::Star, 1)),
        b'%' => {
            let hi = hex(*pattern.get(i + 1)?)?;
            let lo = hex(*pattern.get(i + 2)?)?;
            Some((Tok::Byte(hi << 4 | lo), 3))
        }
        b => Some((Tok::Byte(b), 1)),
    }
}

fn hex(b: u8) -> Option<u8> {
    (b as char).to_digit(16).map(|d| d as u8)
}

/// Whether `acl` is well formed: one or more non-empty patterns, each starting with `/`
/// or `*`, with only valid `%XX` escapes.
pub(crate) fn valid(acl: &[u8]) -> bool {
    acl.split(|&b| b == b'!').all(|pattern| {
        if !matches!(pattern.first(), Some(b'/' | b'*')) {
            return false;
        }
        let mut i = 0;
        while i < pattern.len() {
            match tok(pattern, i) {
                Some((_, len)) => i += len,
                None => return false,
            }
        }
        true
    })
}

/// Whether some pattern of `acl` (already [`valid`]) matches all of `path`.
pub(crate) fn covers(acl: &[u8], path: &[u8]) -> bool {
    acl.split(|&b| b == b'!').any(|pattern| matches(pattern, path))
}

/// Wildcard matching with backtracking to the last `*` only: linear in the path for
/// one `*`, at worst (path length × pattern length) for several. Patterns come from
/// tokens whose HMAC has already been verified.
fn matches(pattern: &[u8], path: &[u8]) -> bool {
    let (mut p, mut s) = (0, 0);
    // After the last `*` seen: where the pattern resumes and which path byte it took last.
    let mut star: Option<(usize, usize)> = None;
    while s < path.len() {
        match (p < pattern.len()).then(|| tok(pattern, p)).flatten() {
            Some((Tok::Byte(b), len)) if b == path[s] => {
                p += len;
                s += 1;
            }
            Some((Tok::Star, len)) => {
                p += len;
                star = Some((p, s));
            }
            _ => match star {
                Some((resume, taken)) => {
                    p = resume;
                    s = taken + 1;
                    star = Some((resume, taken + 1));
                }
                None => return false,
            },
        }
    }
    while p < pattern.len() && pattern[p] == b'*' {
        p += 1;
    }
    p == pattern.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validity() {
        for good in [&b"/*"[..], b"*", b"/a/b.mp4", b"/a/*!/b/*.m4s", b"/a%20b/*", b"/%2A"] {
            assert!(valid(good), "{}", String::from_utf8_lossy(good));
        }
        for bad in [&b""[..], b"a/*", b"/a!", b"!/a", b"/a!!/b", b"/%2", b"/%zz", b"/a%"] {
            assert!(!valid(bad), "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn a_title_wildcard_covers_its_manifest_and_segments_only() {
        let acl = b"/premium/title1/*";
        for path in [&b"/premium/title1/master.m3u8"[..], b"/premium/title1/v720/seg-00001.m4s", b"/premium/title1/"] {
            assert!(covers(acl, path), "{}", String::from_utf8_lossy(path));
        }
        for path in [&b"/premium/title1"[..], b"/premium/title10/a.m4s", b"/premium/title2/master.m3u8", b"/premium/"] {
            assert!(!covers(acl, path), "{}", String::from_utf8_lossy(path));
        }
    }

    #[test]
    fn patterns() {
        let cases: &[(&[u8], &[u8], bool)] = &[
            (b"/a.mp4", b"/a.mp4", true),
            (b"/a.mp4", b"/a.mp4x", false),
            (b"/a.mp4", b"/a.mp", false),
            (b"*", b"/anything/at/all", true),
            (b"/*", b"/", true),
            (b"/b/*.m4s", b"/b/v1/seg-1.m4s", true),
            (b"/b/*.m4s", b"/b/v1/seg-1.m4s.bak", false),
            (b"/b/*.m4s", b"/b/.m4s", true),
            (b"/*/seg-*.ts", b"/t/720/seg-9.ts", true),
            (b"/*/seg-*.ts", b"/t/720/init.ts", false),
            (b"/a*b*c", b"/abbbcbc", true),
            (b"/a*b*c", b"/abbbcb", false),
            (b"/**", b"/x", true),
            (b"/a%20b/*", b"/a b/c", true),
            (b"/a%20b/*", b"/a%20b/c", false),
            (b"/%2a", b"/*", true),
            (b"/%2a", b"/x", false),
            (b"/a/*!/b.mp4", b"/b.mp4", true),
            (b"/a/*!/b.mp4", b"/c.mp4", false),
        ];
        for &(acl, path, want) in cases {
            assert!(valid(acl));
            assert_eq!(
                covers(acl, path),
                want,
                "{} on {}",
                String::from_utf8_lossy(acl),
                String::from_utf8_lossy(path)
            );
        }
    }

    #[test]
    fn matches_agrees_with_a_naive_matcher() {
        fn naive(p: &[u8], s: &[u8]) -> bool {
            match p.split_first() {
                None => s.is_empty(),
                Some((b'*', rest)) => (0..=s.len()).any(|k| naive(rest, &s[k..])),
                Some((c, rest)) => s.first() == Some(c) && naive(rest, &s[1..]),
            }
        }
        // Every pattern and path of up to 5 bytes over {/, a, b, *} (paths without `*`).
        let alphabet = [b'/', b'a', b'b', b'*'];
        let mut words: Vec<Vec<u8>> = vec![Vec::new()];
        for len in 1..=5 {
            let mut next = Vec::new();
            for w in words.iter().filter(|w| w.len() == len - 1) {
                for &c in &alphabet {
                    let mut n = w.clone();
                    n.push(c);
                    next.push(n);
                }
            }
            words.extend(next);
        }
        for pattern in &words {
            for path in words.iter().filter(|w| !w.contains(&b'*')) {
                assert_eq!(
                    matches(pattern, path),
                    naive(pattern, path),
                    "{} on {}",
                    String::from_utf8_lossy(pattern),
                    String::from_utf8_lossy(path)
                );
            }
        }
    }
}
