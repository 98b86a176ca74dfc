//! The receiving half of the user-space record layer: bytes read from the socket
//! are kept until a whole record has arrived, each record is opened in place,
//! application data goes to the reader, and control records act on the session.
//!
//! How each record is handled (the same whatever the read boundaries were):
//!
//! - application data: its plaintext is appended, in order;
//! - close_notify: end of stream; nothing after it is opened;
//! - user_canceled: ignored;
//! - any other alert: the connection ends, without an alert in reply;
//! - TLS 1.3 KeyUpdate: the next records open with the peer's next key (from the
//!   key schedule); when the peer asks, [`Inbound::key_update_due`] is set so that
//!   the sending side renews its own key before its next record;
//! - a record that does not open (bad header, too long, failed authentication) or
//!   any other content: the connection ends with the alert that says why.
//!
//! It owns no socket, so the transport (`transport::usertls`) and the fuzz target
//! drive it the same way: append received bytes to [`Inbound::rx`], then call
//! [`Inbound::open_records`].

use std::io;

use super::control::{self, Control, Violation};
use super::record::{self, Opener, RecordError};

/// Records received but not yet opened, and what the opened ones asked for.
pub struct Inbound {
    opener: Opener,
    /// Received bytes not yet opened (at most one partial record after a call to
    /// [`Inbound::open_records`], plus anything after a close_notify); freed when
    /// empty.
    rx: Vec<u8>,
    peer_closed: bool,
    key_update_due: bool,
}

/// A record that cannot be opened, and the alert that tells the peer why.
fn record_violation(e: RecordError) -> Violation {
    let alert = match e {
        RecordError::BadMac => control::BAD_RECORD_MAC,
        RecordError::Overflow => control::RECORD_OVERFLOW,
        RecordError::Malformed => control::DECODE_ERROR,
    };
    Violation { alert: Some(alert), error: io::Error::new(io::ErrorKind::InvalidData, e) }
}

impl Inbound {
    pub fn new(opener: Opener) -> Inbound {
        Inbound { opener, rx: Vec::new(), peer_closed: false, key_update_due: false }
    }

    /// Where received bytes go before they are opened.
    pub fn rx(&mut self) -> &mut Vec<u8> {
        &mut self.rx
    }

    /// The peer sent close_notify.
    pub fn peer_closed(&self) -> bool {
        self.peer_closed
    }

    /// The peer asked for our sending key to change (KeyUpdate with update_requested).
    pub fn key_update_due(&self) -> bool {
        self.key_update_due
    }

    /// Our KeyUpdate has been sent.
    pub fn key_update_sent(&mut self) {
        self.key_update_due = false;
    }

    /// The opener, for its sequence number.
    pub fn opener(&self) -> &Opener {
        &self.opener
    }

    /// Opens every complete record in [`Inbound::rx`], appending application data
    /// to `buf`, and stops after a close_notify. `rekey` switches the opener to the
    /// peer's next key on a KeyUpdate (from rustls's key schedule; it fails under TLS
    /// 1.2). Returns the bytes appended.
    ///
    /// On an error the connection is over: `buf` may hold data that arrived before
    /// the offending record, and `rx` is left as it was.
    pub fn open_records(
        &mut self,
        buf: &mut Vec<u8>,
        rekey: &mut dyn FnMut(&mut Opener) -> Result<(), rustls::Error>,
    ) -> Result<usize, Violation> {
        let mut appended = 0;
        let mut consumed = 0;
        while !self.peer_closed {
            let rest = &mut self.rx[consumed..];
            let Some(len) = self.opener.record_len(rest).map_err(record_violation)? else { break };
            if rest.len() < len {
                break;
            }
            let (content_type, range) = self.opener.open(&mut rest[..len]).map_err(record_violation)?;
            let payload = &rest[range];
            consumed += len;
            if content_type == record::CONTENT_APPLICATION_DATA {
                buf.extend_from_slice(payload);
                appended += payload.len();
                continue;
            }
            match control::classify(content_type, payload)? {
                Control::CloseNotify => self.peer_closed = true,
                Control::Ignore => {}
                Control::KeyUpdate { requested } => {
                    rekey(&mut self.opener).map_err(|e| Violation {
                        alert: Some(control::UNEXPECTED_MESSAGE),
                        error: io::Error::other(e),
                    })?;
                    self.key_update_due |= requested;
                }
            }
        }
        self.rx.drain(..consumed);
        if self.rx.is_empty() {
            // Nothing partial is left: free the buffer, so that an idle connection
            // holds none (the next read makes room again, see `read_size`).
            self.rx = Vec::new();
        }
        Ok(appended)
    }

    /// How much room the next read needs: the rest of the record being received
    /// once its header is in, `first` before that. Room is then made only as
    /// bytes arrive, and only as much as one record needs.
    pub fn read_size(&self, first: usize) -> usize {
        match self.opener.record_len(&self.rx) {
            Ok(Some(len)) => len.saturating_sub(self.rx.len()).max(1),
            _ => first,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tls::record::{Protocol, Sealer, CONTENT_ALERT, CONTENT_APPLICATION_DATA, CONTENT_HANDSHAKE};
    use crate::tls::testing::{establish, ALL_SUITES};

    fn seal(sealer: &mut Sealer, ty: u8, payload: &[u8]) -> Vec<u8> {
        let mut rec = vec![0u8; payload.len() + sealer.overhead()];
        let off = sealer.payload_offset();
        rec[off..off + payload.len()].copy_from_slice(payload);
        sealer.seal(ty, &mut rec, payload.len());
        rec
    }

    fn no_key_update(_: &mut Opener) -> Result<(), rustls::Error> {
        Err(rustls::Error::General("no key update expected".into()))
    }

    /// Data split across reads arrives once and in order; close_notify ends the
    /// stream and what follows it stays unopened.
    #[test]
    fn data_in_pieces_then_close_notify() {
        for &(suite, protocol) in ALL_SUITES {
            let (_, secrets) = establish(suite);
            let mut peer = Sealer::new(protocol, &secrets.rx.1, secrets.rx.0);
            let mut wire = seal(&mut peer, CONTENT_APPLICATION_DATA, b"GET / HTTP/1.1\r\n");
            wire.extend(seal(&mut peer, CONTENT_ALERT, &control::CLOSE_NOTIFY));
            let after = seal(&mut peer, CONTENT_APPLICATION_DATA, b"late");
            wire.extend(&after);
            let mut inbound = Inbound::new(Opener::new(protocol, &secrets.rx.1, secrets.rx.0));
            let mut got = Vec::new();
            for piece in wire.chunks(7) {
                inbound.rx().extend_from_slice(piece);
                inbound.open_records(&mut got, &mut no_key_update).unwrap();
            }
            assert_eq!(got, b"GET / HTTP/1.1\r\n", "{suite:?}");
            assert!(inbound.peer_closed());
            assert_eq!(inbound.rx().len(), after.len(), "nothing is opened after close_notify");
            assert_eq!(inbound.opener().seq(), secrets.rx.0 + 2);
        }
    }

    /// A KeyUpdate switches to the key the schedule gives; one that asks for ours
    /// sets `key_update_due`; under TLS 1.2 it ends the connection.
    #[test]
    fn key_updates() {
        for &(suite, protocol) in ALL_SUITES {
            let (_, secrets) = establish(suite);
            let (_, next) = establish(suite);
            let mut peer = Sealer::new(protocol, &secrets.rx.1, secrets.rx.0);
            let mut wire = seal(&mut peer, CONTENT_HANDSHAKE, &[24, 0, 0, 1, 1]);
            peer.rekey(&next.rx.1, 0);
            wire.extend(seal(&mut peer, CONTENT_APPLICATION_DATA, b"new key"));
            let mut inbound = Inbound::new(Opener::new(protocol, &secrets.rx.1, secrets.rx.0));
            inbound.rx().extend_from_slice(&wire);
            let mut got = Vec::new();
            let result = inbound.open_records(&mut got, &mut |opener| {
                opener.rekey(&next.rx.1, 0);
                match protocol {
                    Protocol::Tls13 => Ok(()),
                    Protocol::Tls12 => Err(rustls::Error::General("TLS 1.2 has no key update".into())),
                }
            });
            match protocol {
                Protocol::Tls13 => {
                    assert_eq!(result.unwrap(), 7);
                    assert_eq!(got, b"new key");
                    assert!(inbound.key_update_due());
                    assert_eq!(inbound.opener().seq(), 1);
                    inbound.key_update_sent();
                    assert!(!inbound.key_update_due());
                }
                Protocol::Tls12 => {
                    assert_eq!(result.unwrap_err().alert, Some(control::UNEXPECTED_MESSAGE));
                    assert!(got.is_empty());
                }
            }
        }
    }

    /// A damaged record is refused with the alert that says why, after the data
    /// before it.
    #[test]
    fn damaged_records_are_refused() {
        let (suite, protocol) = ALL_SUITES[0];
        let (_, secrets) = establish(suite);
        let mut peer = Sealer::new(protocol, &secrets.rx.1, secrets.rx.0);
        let mut wire = seal(&mut peer, CONTENT_APPLICATION_DATA, b"ok");
        let mut bad = seal(&mut peer, CONTENT_APPLICATION_DATA, b"flipped");
        bad[8] ^= 1;
        wire.extend(bad);
        let mut inbound = Inbound::new(Opener::new(protocol, &secrets.rx.1, secrets.rx.0));
        inbound.rx().extend_from_slice(&wire);
        let mut got = Vec::new();
        let v = inbound.open_records(&mut got, &mut no_key_update).unwrap_err();
        assert_eq!(v.alert, Some(control::BAD_RECORD_MAC));
        assert_eq!(got, b"ok");
        let mut inbound = Inbound::new(Opener::new(protocol, &secrets.rx.1, secrets.rx.0));
        inbound.rx().extend_from_slice(&[23, 3, 3, 0xff, 0xff]);
        let v = inbound.open_records(&mut got, &mut no_key_update).unwrap_err();
        assert_eq!(v.alert, Some(control::RECORD_OVERFLOW));
    }
}
