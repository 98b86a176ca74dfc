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

fn protocol_error(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

/// Interprets one decrypted control record.
pub fn classify(content_type: u8, payload: &[u8]) -> io::Result<Control> {
    match (content_type, payload) {
        (CONTENT_ALERT, [_, 0]) => Ok(Control::CloseNotify),
        (CONTENT_ALERT, [1, 90]) => Ok(Control::Ignore),
        (CONTENT_ALERT, [level, desc]) => Err(protocol_error(format!("peer sent alert {desc} (level {level})"))),
        (CONTENT_HANDSHAKE, [24, 0, 0, 1, req @ (0 | 1)]) => Ok(Control::KeyUpdate { requested: *req == 1 }),
        (CONTENT_HANDSHAKE, [typ, ..]) => {
            Err(protocol_error(format!("unexpected handshake message {typ} after the handshake")))
        }
        (t, _) => Err(protocol_error(format!("unexpected record type {t}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies() {
        assert_eq!(classify(21, &[1, 0]).unwrap(), Control::CloseNotify);
        assert_eq!(classify(21, &[1, 90]).unwrap(), Control::Ignore);
        assert!(classify(21, &[2, 40]).is_err());
        assert!(classify(21, &[1]).is_err());
        assert_eq!(classify(22, &[24, 0, 0, 1, 1]).unwrap(), Control::KeyUpdate { requested: true });
        assert_eq!(classify(22, &KEY_UPDATE_NOT_REQUESTED).unwrap(), Control::KeyUpdate { requested: false });
        assert!(classify(22, &[24, 0, 0, 1, 2]).is_err());
        assert!(classify(22, &[4, 0, 0, 0]).is_err(), "a client never sends NewSessionTicket");
        assert!(classify(20, &[1]).is_err());
    }
}
