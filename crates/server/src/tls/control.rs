//! Records that are not application data, after the handshake: alerts and TLS 1.3
//! post-handshake messages. Shared by the kernel-TLS and user-space transports.

use std::io;

use super::record::{CONTENT_ALERT, CONTENT_HANDSHAKE};

/// What a control record asks of the connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Control {
    /// The peer closed its sending side (close_notify): end of stream.
    CloseNotify,
    /// A warning to ignore (user_canceled, which RFC 8446 says precedes a close_notify).
    Ignore,
    /// TLS 1.3 KeyUpdate: the peer's next records use new keys; if `requested`, it
    /// asks for ours to change too.
    KeyUpdate { requested: bool },
}

/// A KeyUpdate handshake message with `update_not_requested`.
pub const KEY_UPDATE_NOT_REQUESTED: [u8; 5] = [24, 0, 0, 1, 0];

/// The close_notify alert (warning level).
pub const CLOSE_NOTIFY: [u8; 2] = [1, 0];

/// Alerts this side sends before closing on a protocol violation.
pub const UNEXPECTED_MESSAGE: [u8; 2] = [2, 10];
pub const BAD_RECORD_MAC: [u8; 2] = [2, 20];
pub const RECORD_OVERFLOW: [u8; 2] = [2, 22];
pub const DECODE_ERROR: [u8; 2] = [2, 50];
/// RFC 5746: renegotiation refused (always a warning; the connection then closes).
pub const NO_RENEGOTIATION: [u8; 2] = [1, 100];

/// Why a connection must end: the error, and the alert to send the peer first
/// (none when the peer's own alert ended it).
#[derive(Debug)]
pub struct Violation {
    pub alert: Option<[u8; 2]>,
    pub error: io::Error,
}

impl Violation {
    fn new(alert: Option<[u8; 2]>, what: String) -> Violation {
        Violation { alert, error: io::Error::new(io::ErrorKind::InvalidData, what) }
    }
}

/// Interprets one decrypted control record.
pub fn classify(content_type: u8, payload: &[u8]) -> Result<Control, Violation> {
    match (content_type, payload) {
        (CONTENT_ALERT, [_, 0]) => Ok(Control::CloseNotify),
        (CONTENT_ALERT, [1, 90]) => Ok(Control::Ignore),
        (CONTENT_ALERT, [level, desc]) => Err(Violation::new(None, format!("peer sent alert {desc} (level {level})"))),
        (CONTENT_HANDSHAKE, [24, 0, 0, 1, req @ (0 | 1)]) => Ok(Control::KeyUpdate { requested: *req == 1 }),
        // A TLS 1.2 ClientHello on an established connection: renegotiation.
        (CONTENT_HANDSHAKE, [1, ..]) => {
            Err(Violation::new(Some(NO_RENEGOTIATION), "client tried to renegotiate".into()))
        }
        (CONTENT_HANDSHAKE, [typ, ..]) => Err(Violation::new(
            Some(UNEXPECTED_MESSAGE),
            format!("unexpected handshake message {typ} after the handshake"),
        )),
        (t, _) => Err(Violation::new(Some(UNEXPECTED_MESSAGE), format!("unexpected record type {t}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies() {
        assert_eq!(classify(21, &[1, 0]).unwrap(), Control::CloseNotify);
        assert_eq!(classify(21, &[1, 90]).unwrap(), Control::Ignore);
        assert!(classify(21, &[2, 40]).unwrap_err().alert.is_none(), "no alert answers an alert");
        assert_eq!(classify(21, &[1]).unwrap_err().alert, Some(UNEXPECTED_MESSAGE));
        assert_eq!(classify(22, &[1, 0, 0, 5]).unwrap_err().alert, Some(NO_RENEGOTIATION));
        assert_eq!(classify(22, &[24, 0, 0, 1, 1]).unwrap(), Control::KeyUpdate { requested: true });
        assert_eq!(classify(22, &KEY_UPDATE_NOT_REQUESTED).unwrap(), Control::KeyUpdate { requested: false });
        assert!(classify(22, &[24, 0, 0, 1, 2]).is_err());
        assert!(classify(22, &[4, 0, 0, 0]).is_err(), "a client never sends NewSessionTicket");
        assert!(classify(20, &[1]).is_err());
    }
}
