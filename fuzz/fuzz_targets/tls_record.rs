//! The user-space TLS record layer (`linerate::tls::record`, `linerate::tls::inbound`):
//! what a client sends after the handshake, opened by the server.
//!
//! Keys: fixed traffic secrets derived as TLS 1.3 does (so inputs replay the same
//! way), for each suite the server offers: TLS 1.3 with AES-128-GCM, AES-256-GCM and
//! ChaCha20-Poly1305, TLS 1.2 with the same three. Each suite has six distinct key
//! sets, used in turn as the client's keys after each KeyUpdate (the key schedule
//! the layer asks for the next key hands them out; after the last, it fails).
//!
//! Input: a suite byte, a byte choosing the first sequence number, then steps the
//! client takes, each an op byte and its arguments:
//! application data (given bytes, or up to 16 KiB of a pattern), an alert, a
//! KeyUpdate (valid with or without update_requested, or malformed), a record of any
//! content type, TLS 1.3 records with zero padding, records 1 to 4096 bytes too
//! long; and damage: garbage bytes, a raw record header, a byte of the last record
//! flipped, the last record cut short, an earlier record sent again; and cut points
//! in the byte stream. Records are sealed with the layer's own `Sealer` (padded and
//! oversized ones by the target, with aws-lc-rs directly).
//!
//! Properties, from a model of what each record must do (`tls::inbound`'s
//! documentation):
//! - up to the first damaged record, every record is handled as documented:
//!   application data appended in order, close_notify ends the stream and nothing
//!   after it is opened, user_canceled is ignored, other alerts end the connection
//!   without a reply, a KeyUpdate switches to the next key (TLS 1.3) or is refused
//!   (TLS 1.2), records too long get `record_overflow`, anything else
//!   `unexpected_message`;
//! - a damaged record is never accepted: the layer either refuses it with
//!   `decode_error`, `record_overflow` or `bad_record_mac`, or waits for more bytes,
//!   and no byte of it or after it reaches the reader (damage is judged on the
//!   bytes: a record cut short and followed by the very byte that was cut is intact);
//! - the opener's sequence number is the model's (records opened since the last
//!   key change), and `key_update_due` is set exactly when a KeyUpdate asked for it;
//! - the outcome is the same with the bytes fed whole or in pieces at the cut points
//!   (same plaintext, same error and alert, same bytes left unopened).
#![no_main]

use std::sync::OnceLock;

use aws_lc_rs::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_128_GCM, AES_256_GCM, CHACHA20_POLY1305};
use libfuzzer_sys::fuzz_target;
use linerate::tls::control::{self, Violation};
use linerate::tls::inbound::Inbound;
use linerate::tls::record::{
    Opener, Protocol, Sealer, CONTENT_ALERT, CONTENT_APPLICATION_DATA, CONTENT_HANDSHAKE, MAX_PAYLOAD,
};
use rustls::crypto::aws_lc_rs::cipher_suite as cs;
use rustls::ConnectionTrafficSecrets;

/// Key sets per suite: the first, and one for each KeyUpdate the model follows.
const KEYS_PER_SUITE: u8 = 6;

struct Suite {
    protocol: Protocol,
    keys: Vec<ConnectionTrafficSecrets>,
}

/// Traffic secrets as TLS 1.3 derives them (HKDF-Expand-Label "key" and "iv"),
/// from a fixed secret, so that every run and every replayed input sees the same
/// keys. The TLS 1.3 suite with the same AEAD gives the key length.
/// (`rustls::internal` is hidden API: should an update drop it, in-memory
/// handshakes can give the keys instead, at the cost of inputs that replay the
/// same way only within one process.)
fn secrets(aead: rustls::SupportedCipherSuite, n: u8) -> ConnectionTrafficSecrets {
    let suite = aead.tls13().expect("a TLS 1.3 suite");
    let expander = suite.hkdf_provider.extract_from_secret(None, &[n; 32]);
    let key = rustls::internal::derive_traffic_key(&*expander, suite.aead_alg);
    let iv = rustls::internal::derive_traffic_iv(&*expander);
    if aead == cs::TLS13_AES_128_GCM_SHA256 {
        ConnectionTrafficSecrets::Aes128Gcm { key, iv }
    } else if aead == cs::TLS13_AES_256_GCM_SHA384 {
        ConnectionTrafficSecrets::Aes256Gcm { key, iv }
    } else {
        ConnectionTrafficSecrets::Chacha20Poly1305 { key, iv }
    }
}

fn suites() -> &'static [Suite] {
    static S: OnceLock<Vec<Suite>> = OnceLock::new();
    S.get_or_init(|| {
        let aeads = [cs::TLS13_AES_128_GCM_SHA256, cs::TLS13_AES_256_GCM_SHA384, cs::TLS13_CHACHA20_POLY1305_SHA256];
        let mut n = 0;
        [Protocol::Tls13, Protocol::Tls12]
            .into_iter()
            .flat_map(|protocol| aeads.map(|aead| (protocol, aead)))
            .map(|(protocol, aead)| Suite {
                protocol,
                keys: (0..KEYS_PER_SUITE)
                    .map(|_| {
                        n += 1;
                        secrets(aead, n)
                    })
                    .collect(),
            })
            .collect()
    })
}

/// Seals a record without the layer's `Sealer`: for TLS 1.3 padding and for
/// payloads longer than a record may carry.
fn seal_raw(
    protocol: Protocol,
    secrets: &ConnectionTrafficSecrets,
    seq: u64,
    ty: u8,
    payload: &[u8],
    pad: usize,
) -> Vec<u8> {
    let (alg, key, iv, chacha) = match secrets {
        ConnectionTrafficSecrets::Aes128Gcm { key, iv } => (&AES_128_GCM, key, iv, false),
        ConnectionTrafficSecrets::Aes256Gcm { key, iv } => (&AES_256_GCM, key, iv, false),
        ConnectionTrafficSecrets::Chacha20Poly1305 { key, iv } => (&CHACHA20_POLY1305, key, iv, true),
        _ => unreachable!(),
    };
    let key = LessSafeKey::new(UnboundKey::new(alg, key.as_ref()).unwrap());
    let mut nonce: [u8; 12] = iv.as_ref().try_into().unwrap();
    for (n, s) in nonce[4..].iter_mut().zip(seq.to_be_bytes()) {
        *n ^= s;
    }
    let header = |ty: u8, len: usize| {
        let l = u16::try_from(len).expect("the target keeps records under 64 KiB").to_be_bytes();
        [ty, 3, 3, l[0], l[1]]
    };
    match protocol {
        Protocol::Tls13 => {
            let mut plain = payload.to_vec();
            plain.push(ty);
            plain.resize(plain.len() + pad, 0);
            let h = header(CONTENT_APPLICATION_DATA, plain.len() + 16);
            key.seal_in_place_append_tag(Nonce::assume_unique_for_key(nonce), Aad::from(h), &mut plain).unwrap();
            [&h[..], &plain].concat()
        }
        Protocol::Tls12 => {
            let explicit: &[u8] = if chacha { &[] } else { &nonce[4..] };
            let mut aad = [0u8; 13];
            aad[..8].copy_from_slice(&seq.to_be_bytes());
            aad[8..11].copy_from_slice(&[ty, 3, 3]);
            aad[11..].copy_from_slice(&(payload.len() as u16).to_be_bytes());
            let mut body = payload.to_vec();
            key.seal_in_place_append_tag(Nonce::assume_unique_for_key(nonce), Aad::from(aad), &mut body).unwrap();
            let h = header(ty, explicit.len() + body.len());
            [&h[..], explicit, &body].concat()
        }
    }
}

/// What a record must do when it arrives intact.
#[derive(Clone, Debug)]
enum Meaning {
    Data(Vec<u8>),
    Close,
    Ignore,
    /// A KeyUpdate the key schedule follows.
    KeyUpdate {
        requested: bool,
    },
    /// Opened, then refused: the connection ends with this alert (none when the
    /// peer's own alert ended it).
    Refused(Option<[u8; 2]>),
    /// Refused before or while opening: too long.
    Overflow,
}

/// The specification of a decrypted record, written from the RFCs and the module
/// documentation (not from `control::classify`).
fn meaning(ty: u8, payload: &[u8], key_update_possible: bool) -> Meaning {
    match ty {
        CONTENT_APPLICATION_DATA => Meaning::Data(payload.to_vec()),
        CONTENT_ALERT if payload.len() == 2 => match (payload[0], payload[1]) {
            (_, 0) => Meaning::Close,
            (1, 90) => Meaning::Ignore,
            _ => Meaning::Refused(None),
        },
        CONTENT_HANDSHAKE if payload.len() == 5 && payload[..4] == [24, 0, 0, 1] && payload[4] <= 1 => {
            if key_update_possible {
                Meaning::KeyUpdate { requested: payload[4] == 1 }
            } else {
                Meaning::Refused(Some(control::UNEXPECTED_MESSAGE))
            }
        }
        CONTENT_HANDSHAKE if payload.first() == Some(&1) => Meaning::Refused(Some(control::NO_RENEGOTIATION)),
        _ => Meaning::Refused(Some(control::UNEXPECTED_MESSAGE)),
    }
}

/// Bytes on the wire: a record the client sealed (as sealed, and what it must do),
/// possibly damaged since, or other bytes (garbage, a copy of an earlier record).
struct Piece {
    bytes: Vec<u8>,
    record: Option<(Vec<u8>, Meaning)>,
}

impl Piece {
    fn sealed(bytes: Vec<u8>, m: Meaning) -> Piece {
        Piece { record: Some((bytes.clone(), m)), bytes }
    }
    fn other(bytes: Vec<u8>) -> Piece {
        Piece { bytes, record: None }
    }
    /// A record as it was sealed: the target of damage.
    fn pristine(&self) -> bool {
        self.record.as_ref().is_some_and(|(r, _)| *r == self.bytes)
    }
}

/// The client: seals records with the layer's `Sealer`, and changes keys after a
/// KeyUpdate as the model's key schedule does.
struct Peer<'a> {
    suite: &'a Suite,
    sealer: Sealer,
    key: usize,
    seq_base: u64,
    sealed: u64,
}

impl Peer<'_> {
    fn seq(&self) -> u64 {
        self.seq_base + self.sealed
    }

    fn seal(&mut self, ty: u8, payload: &[u8]) -> Vec<u8> {
        let mut rec = vec![0u8; payload.len() + self.sealer.overhead()];
        let off = self.sealer.payload_offset();
        rec[off..off + payload.len()].copy_from_slice(payload);
        let before = self.sealer.seq();
        let n = self.sealer.seal(ty, &mut rec, payload.len());
        assert_eq!(n, rec.len(), "a record's length is its payload plus the overhead");
        assert_eq!(self.sealer.seq(), before + 1, "one sequence number per record");
        self.sealed += 1;
        rec
    }

    /// Seals with `seal_raw` at the current sequence number, then moves past it.
    fn seal_raw(&mut self, ty: u8, payload: &[u8], pad: usize) -> Vec<u8> {
        let rec = seal_raw(self.suite.protocol, &self.suite.keys[self.key], self.seq(), ty, payload, pad);
        self.sealed += 1;
        self.sealer = Sealer::new(self.suite.protocol, &self.suite.keys[self.key], self.seq());
        rec
    }

    fn key_update_possible(&self) -> bool {
        self.suite.protocol == Protocol::Tls13 && self.key + 1 < self.suite.keys.len()
    }

    /// Seals a record of any type with the `Sealer`; after a KeyUpdate the layer
    /// follows, changes keys.
    fn record(&mut self, ty: u8, payload: &[u8]) -> Piece {
        let m = meaning(ty, payload, self.key_update_possible());
        let bytes = self.seal(ty, payload);
        if matches!(m, Meaning::KeyUpdate { .. }) {
            self.key_update();
        }
        Piece::sealed(bytes, m)
    }

    fn key_update(&mut self) {
        self.key += 1;
        self.seq_base = 0;
        self.sealed = 0;
        self.sealer = Sealer::new(self.suite.protocol, &self.suite.keys[self.key], 0);
    }
}

struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn byte(&mut self) -> Option<u8> {
        let (&b, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(b)
    }
    fn u16(&mut self) -> Option<usize> {
        Some(usize::from(u16::from_le_bytes([self.byte()?, self.byte()?])))
    }
    fn take(&mut self, n: usize) -> Option<&[u8]> {
        let (a, b) = self.0.split_at_checked(n)?;
        self.0 = b;
        Some(a)
    }
}

fn pattern(n: usize, fill: u8) -> Vec<u8> {
    (0..n).map(|i| fill ^ (i as u8)).collect()
}

/// Builds the client's bytes. Returns `None` when the input runs out mid-step.
fn build(suite: &Suite, seq0: u64, b: &mut Bytes<'_>, pieces: &mut Vec<Piece>, cuts: &mut Vec<usize>) -> Option<()> {
    let mut peer =
        Peer { suite, sealer: Sealer::new(suite.protocol, &suite.keys[0], seq0), key: 0, seq_base: seq0, sealed: 0 };
    let tls13 = suite.protocol == Protocol::Tls13;
    let wire_len = |pieces: &Vec<Piece>| pieces.iter().map(|p| p.bytes.len()).sum::<usize>();
    loop {
        let Some(op) = b.byte() else { return Some(()) };
        match op % 13 {
            0 | 1 => {
                let payload = if op % 13 == 0 {
                    let n = usize::from(b.byte()?);
                    b.take(n)?.to_vec()
                } else {
                    pattern(b.u16()? % (MAX_PAYLOAD + 1), b.byte()?)
                };
                let bytes = peer.seal(CONTENT_APPLICATION_DATA, &payload);
                pieces.push(Piece::sealed(bytes, Meaning::Data(payload)));
            }
            2 => {
                let alert = [b.byte()?, b.byte()?];
                pieces.push(peer.record(CONTENT_ALERT, &alert));
            }
            3 => {
                let v = b.byte()?;
                let message: Vec<u8> = match (v >> 1) % 4 {
                    0 => vec![24, 0, 0, 1, v & 1],
                    1 => vec![24, 0, 0, 1, 2 + (v >> 3)],
                    2 => vec![24, 0, 0, 1, v & 1, 24],
                    _ => vec![24, 0, 0, 1],
                };
                pieces.push(peer.record(CONTENT_HANDSHAKE, &message));
            }
            4 => {
                let mut ty = b.byte()?;
                if tls13 && ty == 0 {
                    // Not a content type a TLS 1.3 sender can write (it ends the padding).
                    ty = CONTENT_APPLICATION_DATA;
                }
                let n = usize::from(b.byte()?);
                let payload = b.take(n)?.to_vec();
                pieces.push(peer.record(ty, &payload));
            }
            5 => {
                let n = usize::from(b.byte()?);
                let bytes = b.take(n)?.to_vec();
                if !bytes.is_empty() {
                    pieces.push(Piece::other(bytes));
                }
            }
            6 => pieces.push(Piece::other(b.take(5)?.to_vec())),
            7 => {
                let (pos, xor) = (b.u16()?, b.byte()?);
                if let Some(last) = pieces.last_mut().filter(|p| p.pristine()) {
                    let pos = pos % last.bytes.len();
                    last.bytes[pos] ^= xor;
                }
            }
            8 => {
                let n = b.u16()?;
                if let Some(last) = pieces.last_mut().filter(|p| p.pristine()) {
                    last.bytes.truncate(n % last.bytes.len());
                }
            }
            9 => {
                let i = usize::from(b.byte()?);
                let sealed: Vec<&Vec<u8>> = pieces.iter().filter_map(|p| p.record.as_ref().map(|r| &r.0)).collect();
                if !sealed.is_empty() {
                    let bytes = sealed[i % sealed.len()].clone();
                    pieces.push(Piece::other(bytes));
                }
            }
            10 => {
                let mut ty = b.byte()?;
                let n = b.u16()? % (MAX_PAYLOAD + 64);
                let pad = b.u16()? % 600;
                let payload = pattern(n, b.byte()?);
                if !tls13 {
                    continue;
                }
                if ty == 0 {
                    ty = CONTENT_APPLICATION_DATA;
                }
                let too_long = n > MAX_PAYLOAD || n + 1 + pad + 16 > MAX_PAYLOAD + 256;
                let m = if too_long { Meaning::Overflow } else { meaning(ty, &payload, peer.key_update_possible()) };
                let bytes = peer.seal_raw(ty, &payload, pad);
                if matches!(m, Meaning::KeyUpdate { .. }) {
                    peer.key_update();
                }
                pieces.push(Piece::sealed(bytes, m));
            }
            11 => {
                let n = MAX_PAYLOAD + 1 + b.u16()? % 4096;
                let payload = pattern(n, b.byte()?);
                let bytes = peer.seal_raw(CONTENT_APPLICATION_DATA, &payload, 0);
                pieces.push(Piece::sealed(bytes, Meaning::Overflow));
            }
            _ => {
                let back = usize::from(b.byte()?);
                let len = wire_len(pieces);
                cuts.push(len - back.min(len));
            }
        }
    }
}

/// What the layer did with some bytes.
#[derive(Debug, PartialEq)]
struct Outcome {
    /// Ok, or the alert and the error's text.
    result: Result<(), (Option<[u8; 2]>, String)>,
    plaintext: Vec<u8>,
    /// Bytes left unopened (after an error: not compared, the connection is over).
    left: Option<usize>,
    peer_closed: bool,
    key_update_due: bool,
    seq: u64,
    key_changes: usize,
}

fn feed(suite: &Suite, seq0: u64, wire: &[u8], cuts: &[usize]) -> Outcome {
    let mut inbound = Inbound::new(Opener::new(suite.protocol, &suite.keys[0], seq0));
    let mut key = 0;
    let mut rekey = |opener: &mut Opener| {
        if suite.protocol == Protocol::Tls12 || key + 1 >= suite.keys.len() {
            return Err(rustls::Error::General("no next key".into()));
        }
        key += 1;
        opener.rekey(&suite.keys[key], 0);
        Ok(())
    };
    let mut plaintext = Vec::new();
    let mut result = Ok(());
    let mut from = 0;
    for &to in cuts.iter().chain([wire.len()].iter()) {
        inbound.rx().extend_from_slice(&wire[from..to]);
        from = to;
        let before = plaintext.len();
        match inbound.open_records(&mut plaintext, &mut rekey) {
            Ok(n) => assert_eq!(n, plaintext.len() - before, "the count returned is the bytes appended"),
            Err(Violation { alert, error }) => {
                result = Err((alert, error.to_string()));
                break;
            }
        }
    }
    Outcome {
        left: result.is_ok().then(|| inbound.rx().len()),
        result,
        plaintext,
        peer_closed: inbound.peer_closed(),
        key_update_due: inbound.key_update_due(),
        seq: inbound.opener().seq(),
        key_changes: key,
    }
}

fuzz_target!(|data: &[u8]| {
    let mut b = Bytes(data);
    let (Some(s), Some(q)) = (b.byte(), b.byte()) else { return };
    let suite = &suites()[usize::from(s) % suites().len()];
    let seq0 = [0, 1, 2, 1 << 32, 1 << 62][usize::from(q) % 5];
    let mut pieces = Vec::new();
    let mut cuts = Vec::new();
    let _ = build(suite, seq0, &mut b, &mut pieces, &mut cuts);
    let wire: Vec<u8> = pieces.iter().flat_map(|p| p.bytes.iter().copied()).collect();
    // A cut made before the last record was shortened may lie past the end.
    cuts.iter_mut().for_each(|c| *c = (*c).min(wire.len()));
    cuts.sort_unstable();

    // The model: the records the client sealed, in order, each opened where the
    // bytes at that point are that record exactly (damage that happens to leave
    // them so, such as a record cut short followed by the byte that was cut, is
    // no damage), until one must stop the layer. Any other bytes are damage: no
    // record can be forged.
    let mut plaintext = Vec::new();
    let (mut seq, mut key_changes, mut due, mut consumed) = (seq0, 0, false, 0);
    let mut stop: Option<Option<Meaning>> = None; // None: every record opened
    for (record, m) in pieces.iter().filter_map(|p| p.record.as_ref()) {
        if !wire[consumed..].starts_with(record) {
            stop = Some(None);
            break;
        }
        if let Meaning::Overflow = m {
            stop = Some(Some(Meaning::Overflow));
            break;
        }
        seq += 1;
        consumed += record.len();
        match m {
            Meaning::Data(d) => plaintext.extend_from_slice(d),
            Meaning::Ignore => {}
            Meaning::KeyUpdate { requested } => {
                seq = 0;
                key_changes += 1;
                due |= requested;
            }
            Meaning::Close | Meaning::Refused(_) => {
                stop = Some(Some(m.clone()));
                break;
            }
            Meaning::Overflow => unreachable!(),
        }
    }
    if stop.is_none() && consumed < wire.len() {
        stop = Some(None);
    }

    let whole = feed(suite, seq0, &wire, &[]);
    let context = || format!("{:?} seq0 {seq0}, stop {stop:?}", suite.protocol);
    assert_eq!(whole.plaintext, plaintext, "plaintext differs from what was sealed; {}", context());
    assert_eq!(whole.seq, seq, "sequence number; {}", context());
    assert_eq!(whole.key_changes, key_changes, "key changes; {}", context());
    assert_eq!(whole.key_update_due, due, "key_update_due; {}", context());
    let left = wire.len() - consumed;
    match &stop {
        None => assert_eq!((&whole.result, whole.left, whole.peer_closed), (&Ok(()), Some(0), false), "{}", context()),
        Some(Some(Meaning::Close)) => {
            assert_eq!((&whole.result, whole.left, whole.peer_closed), (&Ok(()), Some(left), true), "{}", context())
        }
        Some(Some(Meaning::Refused(alert))) => {
            assert_eq!(whole.result.as_ref().map_err(|e| e.0), Err(*alert), "{}", context())
        }
        Some(Some(Meaning::Overflow)) => {
            assert_eq!(whole.result.as_ref().map_err(|e| e.0), Err(Some(control::RECORD_OVERFLOW)), "{}", context())
        }
        Some(None) => match &whole.result {
            Ok(()) => {
                assert_eq!((whole.left, whole.peer_closed), (Some(left), false), "damage consumed; {}", context());
            }
            Err((alert, _)) => assert!(
                [Some(control::DECODE_ERROR), Some(control::RECORD_OVERFLOW), Some(control::BAD_RECORD_MAC)]
                    .contains(alert),
                "damage refused with {alert:?}; {}",
                context()
            ),
        },
        Some(Some(m)) => unreachable!("{m:?}"),
    }

    if !cuts.is_empty() {
        let pieces = feed(suite, seq0, &wire, &cuts);
        assert_eq!(pieces, whole, "fed whole and cut at {cuts:?}: different outcomes");
    }
});
