//! The TLS record layer in user space: what the kernel does for kTLS, done here
//! when the kernel cannot.
//!
//! rustls performs the handshake and keeps the key schedule (including TLS 1.3 key
//! updates, through its `kernel` API); once the session is established, records are
//! sealed and opened by this module with the AEADs of aws-lc-rs. The reason is the
//! body path: rustls's own writers copy plaintext into a freshly allocated record
//! before encrypting it, while here a batch of file data is read with one `preadv`
//! straight into the payload slots of records laid out in a reused buffer, sealed in
//! place, and written with one `write`: one copy of each body byte (page cache to
//! record), no allocation per record.
//!
//! Record formats (RFC 8446 section 5, RFC 5246 section 6.2.3.3, RFC 7905):
//!
//! ```text
//! TLS 1.3            23 03 03 len | payload | content type | tag(16)
//!                    nonce = iv ^ seq, aad = the 5 header bytes
//! TLS 1.2 AES-GCM    type 03 03 len | explicit nonce(8) | payload | tag(16)
//!                    nonce = salt(4) || explicit, aad = seq || type || 03 03 || payload len
//! TLS 1.2 ChaCha20   type 03 03 len | payload | tag(16)
//!                    nonce = iv ^ seq, aad as for TLS 1.2 AES-GCM
//! ```
//!
//! The explicit nonce this side sends for TLS 1.2 AES-GCM is `(iv ^ seq)[4..]`,
//! unique per record because the sequence number is.

use std::ops::Range;

use aws_lc_rs::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_128_GCM, AES_256_GCM, CHACHA20_POLY1305};
use linerate_sys::ktls::Cipher;
use rustls::ConnectionTrafficSecrets;

pub const HEADER_LEN: usize = 5;
pub const MAX_PAYLOAD: usize = 16384;
const TAG_LEN: usize = 16;
const EXPLICIT_NONCE_LEN: usize = 8;

pub const CONTENT_ALERT: u8 = 21;
pub const CONTENT_HANDSHAKE: u8 = 22;
pub const CONTENT_APPLICATION_DATA: u8 = 23;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    Tls12,
    Tls13,
}

/// A record that cannot be accepted; each maps to the alert a peer would be sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    #[error("malformed record")]
    Malformed,
    #[error("record too large")]
    Overflow,
    #[error("record failed authentication")]
    BadMac,
}

/// The key material of one direction.
struct Keys {
    key: LessSafeKey,
    iv: [u8; 12],
    /// AES-GCM under TLS 1.2 carries an explicit nonce in each record.
    explicit_nonce: bool,
}

impl Keys {
    fn new(protocol: Protocol, secrets: &ConnectionTrafficSecrets) -> Keys {
        let (cipher, key, iv) = cipher_parts(secrets);
        let algorithm = match cipher {
            Cipher::Aes128Gcm => &AES_128_GCM,
            Cipher::Aes256Gcm => &AES_256_GCM,
            Cipher::Chacha20Poly1305 => &CHACHA20_POLY1305,
        };
        // The key length comes from the negotiated suite, so it always fits.
        let key = LessSafeKey::new(UnboundKey::new(algorithm, key).expect("key length matches the AEAD"));
        let explicit_nonce = protocol == Protocol::Tls12 && cipher != Cipher::Chacha20Poly1305;
        Keys { key, iv: *iv, explicit_nonce }
    }

    fn xor_nonce(&self, seq: u64) -> [u8; 12] {
        let mut nonce = self.iv;
        for (n, s) in nonce[4..].iter_mut().zip(seq.to_be_bytes()) {
            *n ^= s;
        }
        nonce
    }
}

/// The cipher, key and 12-byte IV of extracted traffic secrets.
pub fn cipher_parts(secrets: &ConnectionTrafficSecrets) -> (Cipher, &[u8], &[u8; 12]) {
    let (cipher, key, iv) = match secrets {
        ConnectionTrafficSecrets::Aes128Gcm { key, iv } => (Cipher::Aes128Gcm, key, iv),
        ConnectionTrafficSecrets::Aes256Gcm { key, iv } => (Cipher::Aes256Gcm, key, iv),
        ConnectionTrafficSecrets::Chacha20Poly1305 { key, iv } => (Cipher::Chacha20Poly1305, key, iv),
        // The provider offers only the three suites above (see tls::config).
        _ => unreachable!("cipher suite outside the configured provider"),
    };
    let iv: &[u8; 12] = iv.as_ref().try_into().expect("TLS AEAD IVs are 12 bytes");
    (cipher, key.as_ref(), iv)
}

fn aad12(seq: u64, content_type: u8, len: usize) -> [u8; 13] {
    let mut aad = [0u8; 13];
    aad[..8].copy_from_slice(&seq.to_be_bytes());
    aad[8] = content_type;
    aad[9] = 3;
    aad[10] = 3;
    aad[11..].copy_from_slice(&(len as u16).to_be_bytes());
    aad
}

/// Seals outgoing records.
pub struct Sealer {
    protocol: Protocol,
    keys: Keys,
    seq: u64,
}

impl Sealer {
    pub fn new(protocol: Protocol, secrets: &ConnectionTrafficSecrets, seq: u64) -> Sealer {
        Sealer { protocol, keys: Keys::new(protocol, secrets), seq }
    }

    /// Switches to new keys (TLS 1.3 key update); the sequence restarts at `seq`.
    pub fn rekey(&mut self, secrets: &ConnectionTrafficSecrets, seq: u64) {
        self.keys = Keys::new(self.protocol, secrets);
        self.seq = seq;
    }

    /// Where the payload starts within a record.
    pub fn payload_offset(&self) -> usize {
        HEADER_LEN + if self.keys.explicit_nonce { EXPLICIT_NONCE_LEN } else { 0 }
    }

    /// Bytes a record adds around its payload.
    pub fn overhead(&self) -> usize {
        self.payload_offset() + TAG_LEN + usize::from(self.protocol == Protocol::Tls13)
    }

    /// Records sealed with the current keys.
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// Takes back the last `records` sequence numbers, for records that were
    /// sealed but dropped before any byte of them was written: the next records
    /// reuse their nonces. Only for records no peer can ever see.
    pub fn rewind(&mut self, records: u64) {
        self.seq = self.seq.checked_sub(records).expect("rewinding only records sealed under the current keys");
    }

    /// Seals a record in place. Its `len`-byte payload is at
    /// `record[self.payload_offset()..]`; `record` must hold `len + self.overhead()`
    /// bytes. Writes the header, nonce, inner content type and tag; returns the
    /// record's length.
    pub fn seal(&mut self, content_type: u8, record: &mut [u8], len: usize) -> usize {
        debug_assert!(len <= MAX_PAYLOAD);
        let total = len + self.overhead();
        let start = self.payload_offset();
        let seq = self.seq;
        self.seq += 1;
        let nonce = self.keys.xor_nonce(seq);
        let sealing = |key: &LessSafeKey, aad: &[u8], data: &mut [u8]| {
            key.seal_in_place_separate_tag(Nonce::assume_unique_for_key(nonce), Aad::from(aad), data)
                .expect("sealing cannot fail for records within the size limit")
        };
        let (sealed_end, tag) = match self.protocol {
            Protocol::Tls13 => {
                record[start + len] = content_type;
                let h = header(CONTENT_APPLICATION_DATA, total - HEADER_LEN);
                record[..HEADER_LEN].copy_from_slice(&h);
                (start + len + 1, sealing(&self.keys.key, &h, &mut record[start..start + len + 1]))
            }
            Protocol::Tls12 => {
                record[..HEADER_LEN].copy_from_slice(&header(content_type, total - HEADER_LEN));
                if self.keys.explicit_nonce {
                    record[HEADER_LEN..start].copy_from_slice(&nonce[4..]);
                }
                let aad = aad12(seq, content_type, len);
                (start + len, sealing(&self.keys.key, &aad, &mut record[start..start + len]))
            }
        };
        record[sealed_end..sealed_end + TAG_LEN].copy_from_slice(tag.as_ref());
        total
    }
}

fn header(content_type: u8, len: usize) -> [u8; 5] {
    let l = (len as u16).to_be_bytes();
    [content_type, 3, 3, l[0], l[1]]
}

/// Opens incoming records.
pub struct Opener {
    protocol: Protocol,
    keys: Keys,
    seq: u64,
}

impl Opener {
    pub fn new(protocol: Protocol, secrets: &ConnectionTrafficSecrets, seq: u64) -> Opener {
        Opener { protocol, keys: Keys::new(protocol, secrets), seq }
    }

    pub fn rekey(&mut self, secrets: &ConnectionTrafficSecrets, seq: u64) {
        self.keys = Keys::new(self.protocol, secrets);
        self.seq = seq;
    }

    /// Records opened with the current keys: the sequence number of the next one.
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// The length of the record starting at `buf[0]`, once its header has arrived.
    pub fn record_len(&self, buf: &[u8]) -> Result<Option<usize>, RecordError> {
        let Some(h) = buf.get(..HEADER_LEN) else { return Ok(None) };
        // Every record after the handshake says 03 03 (TLS 1.2, and TLS 1.3's
        // legacy_record_version), as kernel TLS requires. The TLS 1.2 AAD is built
        // with 03 03, not from these bytes, so another value would otherwise pass.
        if h[1..3] != [3, 3] {
            return Err(RecordError::Malformed);
        }
        let len = u16::from_be_bytes([h[3], h[4]]) as usize;
        let max = match self.protocol {
            Protocol::Tls13 => MAX_PAYLOAD + 256,
            Protocol::Tls12 => MAX_PAYLOAD + 2048,
        };
        if len > max {
            return Err(RecordError::Overflow);
        }
        Ok(Some(HEADER_LEN + len))
    }

    /// Opens the one complete record in `record`, in place. Returns its content
    /// type and where its plaintext now lies within `record`.
    pub fn open(&mut self, record: &mut [u8]) -> Result<(u8, Range<usize>), RecordError> {
        let outer_type = record[0];
        let min = TAG_LEN + if self.keys.explicit_nonce { EXPLICIT_NONCE_LEN } else { 0 };
        if record.len() < HEADER_LEN + min {
            return Err(RecordError::Malformed);
        }
        let seq = self.seq;
        let (content_type, range) = match self.protocol {
            Protocol::Tls13 => {
                if outer_type != CONTENT_APPLICATION_DATA {
                    return Err(RecordError::Malformed);
                }
                let header: [u8; 5] = record[..HEADER_LEN].try_into().expect("5 bytes");
                let nonce = Nonce::assume_unique_for_key(self.keys.xor_nonce(seq));
                let plain = self
                    .keys
                    .key
                    .open_in_place(nonce, Aad::from(header), &mut record[HEADER_LEN..])
                    .map_err(|_| RecordError::BadMac)?;
                // Inner plaintext: content, type, then zero padding.
                let end = plain.iter().rposition(|&b| b != 0).ok_or(RecordError::Malformed)?;
                (plain[end], HEADER_LEN..HEADER_LEN + end)
            }
            Protocol::Tls12 => {
                let body_start = HEADER_LEN + if self.keys.explicit_nonce { EXPLICIT_NONCE_LEN } else { 0 };
                let nonce = if self.keys.explicit_nonce {
                    let mut n = [0u8; 12];
                    n[..4].copy_from_slice(&self.keys.iv[..4]);
                    n[4..].copy_from_slice(&record[HEADER_LEN..HEADER_LEN + EXPLICIT_NONCE_LEN]);
                    n
                } else {
                    self.keys.xor_nonce(seq)
                };
                let payload_len = record.len() - body_start - TAG_LEN;
                let aad = aad12(seq, outer_type, payload_len);
                let plain = self
                    .keys
                    .key
                    .open_in_place(Nonce::assume_unique_for_key(nonce), Aad::from(aad), &mut record[body_start..])
                    .map_err(|_| RecordError::BadMac)?;
                (outer_type, body_start..body_start + plain.len())
            }
        };
        if range.len() > MAX_PAYLOAD {
            return Err(RecordError::Overflow);
        }
        self.seq += 1;
        Ok((content_type, range))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tls::testing::{establish, ALL_SUITES};
    use std::io::{Read, Write};

    /// Our sealer's records decrypt in a real rustls client, and the client's
    /// records open with our opener, for every version and suite we offer.
    #[test]
    fn interoperates_with_rustls_for_every_suite() {
        for &(suite, protocol) in ALL_SUITES {
            let (mut client, secrets) = establish(suite);
            let mut sealer = Sealer::new(protocol, &secrets.tx.1, secrets.tx.0);
            let mut opener = Opener::new(protocol, &secrets.rx.1, secrets.rx.0);

            // Server to client: a full record, a small one, and an alert-free close.
            let mut wire = Vec::new();
            for payload in [vec![7u8; MAX_PAYLOAD], b"hello".to_vec(), Vec::new()] {
                let mut rec = vec![0u8; payload.len() + sealer.overhead()];
                let off = sealer.payload_offset();
                rec[off..off + payload.len()].copy_from_slice(&payload);
                let n = sealer.seal(CONTENT_APPLICATION_DATA, &mut rec, payload.len());
                assert_eq!(n, rec.len());
                wire.extend_from_slice(&rec);
            }
            let mut cursor = &wire[..];
            while !cursor.is_empty() {
                client.read_tls(&mut cursor).unwrap();
                client.process_new_packets().unwrap_or_else(|e| panic!("{suite:?}: {e}"));
            }
            let mut got = vec![0u8; MAX_PAYLOAD + 5];
            client.reader().read_exact(&mut got).unwrap();
            assert!(got[..MAX_PAYLOAD].iter().all(|&b| b == 7));
            assert_eq!(&got[MAX_PAYLOAD..], b"hello");

            // Client to server.
            client.writer().write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
            let mut out = Vec::new();
            client.write_tls(&mut out).unwrap();
            let len = opener.record_len(&out).unwrap().unwrap();
            assert_eq!(len, out.len(), "{suite:?}");
            let (ty, range) = opener.open(&mut out).unwrap();
            assert_eq!(ty, CONTENT_APPLICATION_DATA);
            assert_eq!(&out[range], b"GET / HTTP/1.1\r\n\r\n");

            // A tampered record is refused.
            client.writer().write_all(b"x").unwrap();
            let mut out = Vec::new();
            client.write_tls(&mut out).unwrap();
            let last = out.len() - 1;
            out[last] ^= 1;
            assert_eq!(opener.open(&mut out), Err(RecordError::BadMac));

            // close_notify from the client arrives as an alert record.
            let mut opener2 = Opener::new(protocol, &secrets.rx.1, secrets.rx.0 + 2); // after GET and "x"
            client.send_close_notify();
            let mut out = Vec::new();
            client.write_tls(&mut out).unwrap();
            let (ty, range) = opener2.open(&mut out).unwrap();
            assert_eq!((ty, &out[range]), (CONTENT_ALERT, &[1u8, 0][..]));
        }
    }

    #[test]
    fn oversized_and_malformed_headers() {
        let (_, secrets) = establish(ALL_SUITES[0].0);
        let opener = Opener::new(Protocol::Tls13, &secrets.rx.1, 0);
        assert_eq!(opener.record_len(&[23, 3, 3, 0]), Ok(None));
        assert_eq!(opener.record_len(&[23, 3, 3, 0x41, 0x01]), Err(RecordError::Overflow));
        assert_eq!(opener.record_len(&[23, 9, 3, 0, 1]), Err(RecordError::Malformed));
        assert_eq!(opener.record_len(&[23, 3, 1, 0, 17]), Err(RecordError::Malformed));
        assert_eq!(opener.record_len(&[23, 3, 3, 0, 17]), Ok(Some(22)));
    }

    /// The TLS 1.2 AAD holds 03 03 whatever the header says, so a record whose
    /// version byte was changed on the way opened to the sender's plaintext.
    #[test]
    fn a_record_with_another_version_is_refused() {
        for &(suite, protocol) in ALL_SUITES {
            let (_, secrets) = establish(suite);
            let mut sealer = Sealer::new(protocol, &secrets.rx.1, secrets.rx.0);
            let mut rec = vec![0u8; 4 + sealer.overhead()];
            let off = sealer.payload_offset();
            rec[off..off + 4].copy_from_slice(b"data");
            sealer.seal(CONTENT_APPLICATION_DATA, &mut rec, 4);
            for (byte, value) in [(1, 2), (2, 1), (2, 4), (2, 0x33)] {
                let opener = Opener::new(protocol, &secrets.rx.1, secrets.rx.0);
                let mut changed = rec.clone();
                changed[byte] = value;
                assert_eq!(opener.record_len(&changed), Err(RecordError::Malformed), "{suite:?} {byte} {value}");
            }
            let mut opener = Opener::new(protocol, &secrets.rx.1, secrets.rx.0);
            assert_eq!(opener.record_len(&rec), Ok(Some(rec.len())));
            let (_, range) = opener.open(&mut rec).unwrap();
            assert_eq!(&rec[range], b"data");
        }
    }
}
