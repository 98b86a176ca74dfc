//! Addresses and numbers written as text without `core::fmt`: the formatter cost
//! more than the rest of a `combined` line.

/// cost more than the rest of a `combined` line.
pub(super) fn client_ip(ip: std::net::IpAddr, out: &mut Vec<u8>) {
    match ip {
        std::net::IpAddr::V4(v4) => ipv4(v4.octets(), out),
        std::net::IpAddr::V6(v6) => ipv6(v6, out),
    }
}

/// Dotted decimal, `192.0.2.1`.
fn ipv4(octets: [u8; 4], out: &mut Vec<u8>) {
    for (i, octet) in octets.into_iter().enumerate() {
        if i > 0 {
            out.push(b'.');
        }
        if octet >= 100 {
            out.push(b'0' + octet / 100);
        }
        if octet >= 10 {
            out.push(b'0' + octet / 10 % 10);
        }
        out.push(b'0' + octet % 10);
    }
}

/// RFC 5952's text form, as std's `Display` writes it: lowercase hex without leading
/// zeros; the longest run of two or more zero groups (the first of equal runs) as
/// `::`; an IPv4-mapped address as `::ffff:a.b.c.d`.
fn ipv6(ip: std::net::Ipv6Addr, out: &mut Vec<u8>) {
    if let Some(v4) = ip.to_ipv4_mapped() {
        out.extend_from_slice(b"::ffff:");
        return ipv4(v4.octets(), out);
    }
    let groups = ip.segments();
    let (mut best, mut best_len, mut run, mut run_len) = (0, 0, 0, 0);
    for (i, &g) in groups.iter().enumerate() {
        if g == 0 {
            if run_len == 0 {
                run = i;
            }
            run_len += 1;
            if run_len > best_len {
                (best, best_len) = (run, run_len);
            }
        } else {
            run_len = 0;
        }
    }
    let hex_groups = |groups: &[u16], out: &mut Vec<u8>| {
        for (i, &g) in groups.iter().enumerate() {
            if i > 0 {
                out.push(b':');
            }
            hex16(g, out);
        }
    };
    if best_len > 1 {
        hex_groups(&groups[..best], out);
        out.extend_from_slice(b"::");
        hex_groups(&groups[best + best_len..], out);
    } else {
        hex_groups(&groups, out);
    }
}

/// A group in lowercase hex without leading zeros.
fn hex16(g: u16, out: &mut Vec<u8>) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let digits = (16 - g.leading_zeros()).div_ceil(4).max(1);
    for k in (0..digits).rev() {
        out.push(HEX[usize::from(g >> (4 * k)) & 15]);
    }
}

pub(super) fn num(out: &mut Vec<u8>, n: u64) {
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

/// Microseconds as milliseconds with three decimals (`1.500`), without floats.
pub(super) fn millis(out: &mut Vec<u8>, micros: u128) {
    let micros = u64::try_from(micros).unwrap_or(u64::MAX);
    num(out, micros / 1000);
    let frac = micros % 1000;
    out.extend_from_slice(&[b'.', b'0' + (frac / 100) as u8, b'0' + (frac / 10 % 10) as u8, b'0' + (frac % 10) as u8]);
}

#[cfg(test)]
mod tests {
    use super::super::testing::Rng;
    use super::*;

    fn shown(ip: std::net::IpAddr) -> String {
        let mut out = Vec::new();
        client_ip(ip, &mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn addresses_are_written_as_std_displays_them() {
        use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        for n in 0..200_000u32 {
            let r = rng.next();
            let v4 = Ipv4Addr::from(if n < 256 { u32::from_be_bytes([n as u8, 10, 100, 255]) } else { r as u32 });
            assert_eq!(shown(IpAddr::V4(v4)), v4.to_string());
            // Groups are zero half the time, so that every shape of zero runs (none,
            // one group, ties, leading, trailing, all) comes up often.
            let mut groups = [0u16; 8];
            let (mask, values) = (rng.next(), rng.next());
            for (k, g) in groups.iter_mut().enumerate() {
                if mask >> k & 1 == 1 {
                    // Any width: 1 to 4 hex digits.
                    *g = (values >> (8 * k)) as u16 >> (4 * ((mask >> (8 + 2 * k)) & 3));
                }
            }
            let v6 = Ipv6Addr::from(groups);
            assert_eq!(shown(IpAddr::V6(v6)), v6.to_string(), "{groups:x?}");
            let mapped = v4.to_ipv6_mapped();
            assert_eq!(shown(IpAddr::V6(mapped)), mapped.to_string());
            let compatible = v4.to_ipv6_compatible();
            assert_eq!(shown(IpAddr::V6(compatible)), compatible.to_string());
        }
        for text in ["::", "::1", "1::", "1:0:0:1:0:0:0:1", "1:0:0:0:1:0:0:1", "0:1:0:1:0:1:0:1", "ffff::ffff:0:0"] {
            let v6: Ipv6Addr = text.parse().unwrap();
            assert_eq!(shown(IpAddr::V6(v6)), v6.to_string());
        }
    }
}
