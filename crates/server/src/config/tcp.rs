//! What the server does with its TCP sockets: the options set on them (`[tcp]`) and
//! the `TCP_INFO` read from a sample of them (`[stats]`).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{bad, duration, fraction, range, Bad, MAX_INTEGER};

/// Socket settings applied to the listening sockets, which accepted connections
/// inherit (so they cost nothing per connection).
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Tcp {
    /// Congestion control, e.g. `bbr`; empty keeps the kernel default.
    pub congestion_control: String,
    /// `SO_MAX_PACING_RATE` per connection in megabits per second; 0 = no cap.
    pub max_pacing_rate_mbps: u64,
    /// `SO_SNDBUF`; 0 leaves the kernel's autotuning on.
    pub send_buffer_bytes: u32,
    /// `TCP_NOTSENT_LOWAT`; 0 keeps the system default.
    pub notsent_lowat_bytes: u32,
}

impl Tcp {
    pub(super) fn validate(&self) -> Result<(), Bad> {
        range("tcp.max_pacing_rate_mbps", self.max_pacing_rate_mbps, 0, MAX_INTEGER)?;
        let cc = &self.congestion_control;
        if cc.len() > 15 || !cc.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
            return bad("tcp.congestion_control", format!("{cc:?} is not a congestion control name like `bbr`"));
        }
        Ok(())
    }
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Stats {
    /// Fraction of connections whose TCP_INFO is sampled (0 to 1).
    pub tcp_info_sample: f64,
    /// How often a sampled connection is read while a response is being sent.
    #[serde(with = "humantime_serde")]
    pub tcp_info_interval: Duration,
}

impl Default for Stats {
    fn default() -> Self {
        Stats { tcp_info_sample: 0.01, tcp_info_interval: Duration::from_secs(1) }
    }
}

impl Stats {
    pub(super) fn validate(&self) -> Result<(), Bad> {
        duration("stats.tcp_info_interval", self.tcp_info_interval)?;
        fraction("stats.tcp_info_sample", self.tcp_info_sample)?;
        if self.tcp_info_interval.is_zero() {
            return bad("stats.tcp_info_interval", "must be longer than 0s");
        }
        Ok(())
    }
}
