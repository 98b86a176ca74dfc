//! Escaping of the bytes a client sent (method, path, Referer, User-Agent) so that
//! no record can be forged or broken by them, as nginx escapes its log variables.

/// A JSON string of `v`, escaped, or `null`.
pub(super) fn opt_bytes(v: Option<&[u8]>, out: &mut Vec<u8>) {
    match v {
        Some(v) => {
            out.push(b'"');
            escape(v, out);
            out.push(b'"');
        }
        None => out.extend_from_slice(b"null"),
    }
}

/// Printable ASCII as is; `"`, `\`, control bytes and bytes above 0x7e as the four
/// characters `\xHH` (nginx's escaping). In JSON the backslash is itself escaped, so
/// a JSON reader gets the same four characters.
fn escape_to(bytes: &[u8], out: &mut Vec<u8>, json: bool) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let plain = |b: u8| (0x20..0x7f).contains(&b) && b != b'"' && b != b'\\';
    let mut rest = bytes;
    // Runs of bytes written as they are go in one copy: most fields are all one run.
    while !rest.is_empty() {
        let run = rest.iter().position(|&b| !plain(b)).unwrap_or(rest.len());
        out.extend_from_slice(&rest[..run]);
        let Some((&b, tail)) = rest[run..].split_first() else { break };
        out.extend_from_slice(if json { b"\\\\x" } else { b"\\x" });
        out.extend_from_slice(&[HEX[(b >> 4) as usize], HEX[(b & 15) as usize]]);
        rest = tail;
    }
}

pub(super) fn escape(bytes: &[u8], out: &mut Vec<u8>) {
    escape_to(bytes, out, true);
}

pub(super) fn escape_clf(bytes: &[u8], out: &mut Vec<u8>) {
    escape_to(bytes, out, false);
}

#[cfg(test)]
mod tests {
    use super::super::testing::Rng;
    use super::*;

    #[test]
    fn escaping_matches_a_byte_by_byte_reference() {
        fn reference(bytes: &[u8], json: bool) -> Vec<u8> {
            let mut out = Vec::new();
            for &b in bytes {
                if (0x20..0x7f).contains(&b) && b != b'"' && b != b'\\' {
                    out.push(b);
                } else {
                    out.extend_from_slice(format!("{}x{b:02X}", if json { "\\\\" } else { "\\" }).as_bytes());
                }
            }
            out
        }
        let mut rng = Rng(7);
        for _ in 0..20_000 {
            let len = (rng.next() % 40) as usize;
            // Mostly printable, as real fields are, with escapes anywhere.
            let bytes: Vec<u8> = (0..len)
                .map(|_| match rng.next() % 8 {
                    0 => rng.next() as u8,
                    1 => b"\"\\"[(rng.next() % 2) as usize],
                    _ => b' ' + (rng.next() % 95) as u8,
                })
                .collect();
            for json in [true, false] {
                let mut out = b"prefix".to_vec();
                escape_to(&bytes, &mut out, json);
                assert_eq!(&out[6..], reference(&bytes, json), "{bytes:?}");
            }
        }
    }
}
