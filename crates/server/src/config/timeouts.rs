//! `[timeouts]`: the bound on every wait of a connection and of the process (see
//! "Invariants" in ARCHITECTURE.md).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{bad, duration, Bad};

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Timeouts {
    /// From a request's first byte (or the connection's accept) to its complete head.
    #[serde(with = "humantime_serde")]
    pub header: Duration,
    /// Idle time allowed between requests on a keep-alive connection.
    #[serde(with = "humantime_serde")]
    pub keepalive: Duration,
    /// Longest wait for the client to accept more response bytes.
    #[serde(with = "humantime_serde")]
    pub send: Duration,
    /// On SIGTERM/SIGINT, how long in-flight responses may take to finish.
    #[serde(with = "humantime_serde")]
    pub drain: Duration,
    /// At a binary upgrade, how long the new process may take to start serving
    /// before it is stopped and the running one carries on.
    #[serde(with = "humantime_serde")]
    pub upgrade: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            header: Duration::from_secs(10),
            keepalive: Duration::from_secs(60),
            send: Duration::from_secs(60),
            drain: Duration::from_secs(30),
            upgrade: Duration::from_secs(60),
        }
    }
}

impl Timeouts {
    pub(super) fn validate(&self) -> Result<(), Bad> {
        for (key, d) in [
            ("timeouts.header", self.header),
            ("timeouts.keepalive", self.keepalive),
            ("timeouts.send", self.send),
            ("timeouts.upgrade", self.upgrade),
        ] {
            if d.is_zero() {
                return bad(key, "must be longer than 0s");
            }
        }
        for (key, d) in [
            ("timeouts.header", self.header),
            ("timeouts.keepalive", self.keepalive),
            ("timeouts.send", self.send),
            ("timeouts.drain", self.drain),
            ("timeouts.upgrade", self.upgrade),
        ] {
            duration(key, d)?;
        }
        Ok(())
    }
}
