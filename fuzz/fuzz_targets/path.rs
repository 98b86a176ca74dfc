//! Request targets to paths (`linerate_http::path`): normalisation and confinement.
//!
//! Input: a request target. Properties of an accepted target's path:
//! - it is relative (no leading `/`), has no empty, `.` or `..` segment, no NUL,
//!   and every `/` in it is a separator the client wrote (an encoded `%2f` is refused);
//! - it is what a plain segment-stack model of RFC 3986 dot-segment removal gives;
//! - resolving it again (through the redirect `directory_location` writes for it) gives
//!   the same path: normalisation is idempotent, and that Location is origin-relative.
#![no_main]

use libfuzzer_sys::fuzz_target;
use linerate_http::path::{directory_location, resolve, TargetError};

fn hex(c: u8) -> Option<u8> {
    (c as char).to_digit(16).map(|d| d as u8)
}

/// A deliberately simple model of `resolve`: the segments that remain, or the error.
fn model(raw: &[u8]) -> Result<(Vec<Vec<u8>>, bool), TargetError> {
    if raw == b"*" {
        return Err(TargetError::Asterisk);
    }
    let lower = raw.to_ascii_lowercase();
    let path = if raw.first() == Some(&b'/') {
        raw
    } else {
        let after = if raw.len() > 7 && lower.starts_with(b"http://") {
            &raw[7..]
        } else if raw.len() > 8 && lower.starts_with(b"https://") {
            &raw[8..]
        } else {
            return Err(TargetError::Malformed);
        };
        match after.iter().position(|&b| b == b'/' || b == b'?') {
            Some(i) if after[i] == b'/' => &after[i..],
            _ => b"/",
        }
    };
    let path = path.split(|&b| b == b'?' || b == b'#').next().unwrap();
    let mut stack: Vec<Vec<u8>> = Vec::new();
    let mut dir = true;
    for seg in path.split(|&b| b == b'/') {
        let mut decoded = Vec::new();
        let mut i = 0;
        while i < seg.len() {
            let b = if seg[i] == b'%' {
                let (Some(h), Some(l)) = (seg.get(i + 1).and_then(|&c| hex(c)), seg.get(i + 2).and_then(|&c| hex(c)))
                else {
                    return Err(TargetError::Malformed);
                };
                i += 3;
                h * 16 + l
            } else {
                i += 1;
                seg[i - 1]
            };
            if b == b'/' || b == 0 {
                return Err(TargetError::ForbiddenByte);
            }
            decoded.push(b);
        }
        match &decoded[..] {
            b"" | b"." => dir = true,
            b".." => {
                stack.pop().ok_or(TargetError::Escapes)?;
                dir = true;
            }
            _ => {
                stack.push(decoded);
                dir = false;
            }
        }
    }
    Ok((stack, dir))
}

fuzz_target!(|raw: &[u8]| {
    let mut out = Vec::new();
    let result = resolve(raw, &mut out);
    let expected = model(raw);
    match (&result, &expected) {
        (Ok(t), Ok((segments, dir))) => {
            assert_eq!(out, segments.join(&b'/'), "path of {:?}", String::from_utf8_lossy(raw));
            assert_eq!(t.dir_syntax, *dir);
        }
        (Err(e), Err(m)) => assert_eq!(e, m),
        _ => panic!("resolve gives {result:?}, the model {expected:?}"),
    }
    let Ok(target) = result else { return };

    assert!(!out.contains(&0), "NUL in {out:?}");
    if !out.is_empty() {
        for segment in out.split(|&b| b == b'/') {
            assert!(!matches!(segment, b"" | b"." | b".."), "segment {segment:?} in {out:?}");
        }
    }
    if let Some(q) = target.query {
        assert!(!q.contains(&b'#'), "fragment in query {q:?}");
    }

    // The redirect for the directory: origin-relative, one leading slash, printable
    // ASCII only, and it resolves back to the same path.
    let mut location = Vec::new();
    directory_location(&out, None, &mut location);
    assert!(location.starts_with(b"/") && !location.starts_with(b"//"), "{location:?}");
    assert!(location.iter().all(|&b| b.is_ascii_graphic() && b != b'\\'), "{location:?}");
    let mut again = Vec::new();
    let t2 = resolve(&location, &mut again).expect("a Location resolves");
    assert_eq!(again, out, "not idempotent via {:?}", String::from_utf8_lossy(&location));
    assert!(t2.dir_syntax);
    assert_eq!(t2.query, None);
});
