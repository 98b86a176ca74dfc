//! `[client_limits]`: what one client (an address or a prefix) may open, and how
//! slowly a response may be sent to it (`server::client_limits` enforces them).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{bad, duration, range, Bad};

/// Limits per client: connections at once and new connections per second per
/// address or prefix, and the lowest average rate a response may be sent at.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ClientLimits {
    /// Connections open at once per client prefix; 0 = no limit.
    pub max_connections: u32,
    /// Leading bits of an IPv4 address that name a client (32: each address).
    pub ipv4_prefix: u8,
    /// Leading bits of an IPv6 address that name a client (64: each /64).
    pub ipv6_prefix: u8,
    /// New connections per second per client prefix (token bucket); 0 = no limit.
    pub max_new_connections_per_second: u32,
    /// New connections a client may open at once before the rate applies.
    pub new_connections_burst: u32,
    /// Lowest average rate (bytes per second) a response may be sent at once
    /// `min_send_rate_after` has passed; 0 = no minimum.
    pub min_send_rate: u64,
    /// How long a response may take before its average rate is checked.
    #[serde(with = "humantime_serde")]
    pub min_send_rate_after: Duration,
}

impl Default for ClientLimits {
    fn default() -> Self {
        ClientLimits {
            max_connections: 256,
            ipv4_prefix: 32,
            ipv6_prefix: 64,
            max_new_connections_per_second: 100,
            new_connections_burst: 200,
            min_send_rate: 4096,
            min_send_rate_after: Duration::from_secs(20),
        }
    }
}

impl ClientLimits {
    pub(super) fn validate(&self) -> Result<(), Bad> {
        range("client_limits.max_connections", self.max_connections, 0, 1 << 24)?;
        range("client_limits.ipv4_prefix", self.ipv4_prefix, 1, 32)?;
        range("client_limits.ipv6_prefix", self.ipv6_prefix, 1, 128)?;
        range("client_limits.max_new_connections_per_second", self.max_new_connections_per_second, 0, 1 << 24)?;
        if self.max_new_connections_per_second > 0 {
            range("client_limits.new_connections_burst", self.new_connections_burst, 1, 1 << 24)?;
        }
        range("client_limits.min_send_rate", self.min_send_rate, 0, 1 << 40)?;
        if self.min_send_rate > 0 && self.min_send_rate_after < Duration::from_millis(100) {
            return bad("client_limits.min_send_rate_after", "must be at least 100ms");
        }
        duration("client_limits.min_send_rate_after", self.min_send_rate_after)?;
        Ok(())
    }
}
