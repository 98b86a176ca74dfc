//! A run's immutable plan, shared by all workers: the catalogue, the popularity
//! model, the pacing parameters, the clock, and the bounds.

use std::time::{Duration, Instant};

use super::catalogue::Catalogue;
use super::zipf::Zipf;

pub(crate) struct Plan {
    pub catalogue: Catalogue,
    /// Title popularity (`None` in live mode, which has no titles).
    pub zipf: Option<Zipf>,
    /// The stream every viewer follows (`--live`).
    pub live: Option<LiveStream>,
    /// `None` in closed-loop mode (`--max-rate`).
    pub bitrate_bps: Option<f64>,
    pub segment_bytes: u64,
    /// Playback time of one full segment at the bitrate (zero in closed-loop mode).
    pub segment_duration: Duration,
    pub startup_segments: u32,
    pub start: Instant,
    pub duration: Duration,
    pub end: Instant,
    /// Sessions started per second; `None` starts them all at once.
    pub ramp_per_second: Option<f64>,
    pub connect_timeout: Duration,
    pub request_timeout: Duration,
    pub seed: u64,
    /// Resume TLS sessions (tickets, TLS 1.2 session IDs); off with `--no-resume`.
    pub resume: bool,
    /// Open a new connection for every request (`--connection-per-request`).
    pub connection_per_request: bool,
    /// Titles of rank below this count as hot (`--hot-titles`; 0 = none).
    pub hot_titles: usize,
}

/// A live stream's media playlist (`--live URL`).
pub(crate) struct LiveStream {
    pub url: String,
    /// `http` or `https`.
    pub scheme: &'static str,
    /// `host[:port]` as in the URL.
    pub authority: String,
    /// The playlist's request target (path and query).
    pub target: String,
    /// Its origin in the catalogue.
    pub origin: usize,
}

impl LiveStream {
    /// A `GET` of the whole resource at request target `target` on the stream's origin.
    pub(crate) fn request_for(&self, target: &str) -> Vec<u8> {
        format!("GET {target} HTTP/1.1\r\nHost: {}\r\nUser-Agent: linerate-bench\r\n\r\n", self.authority).into_bytes()
    }
}

impl Plan {
    /// Paced (player-like) rather than closed-loop.
    pub(crate) fn paced(&self) -> bool {
        self.bitrate_bps.is_some()
    }

    pub(crate) fn since_start(&self, t: Instant) -> Duration {
        t.saturating_duration_since(self.start)
    }

    pub(crate) fn at(&self, since_start: Duration) -> Instant {
        self.start + since_start
    }

    /// When session `id` begins, if the sessions are ramped.
    pub(crate) fn session_start(&self, id: u32) -> Option<Instant> {
        let rate = self.ramp_per_second?;
        Some(self.start + Duration::from_secs_f64(f64::from(id) / rate))
    }

    /// Segments of a title (the last one may be short).
    pub(crate) fn segments_of(&self, title: usize) -> u32 {
        let size = self.catalogue.titles[title].size_bytes;
        u32::try_from(size.div_ceil(self.segment_bytes)).unwrap_or(u32::MAX)
    }
}

/// Playback time of `segment_bytes` at `bitrate_bps`.
pub(crate) fn segment_duration(segment_bytes: u64, bitrate_bps: f64) -> Duration {
    Duration::from_secs_f64(segment_bytes as f64 * 8.0 / bitrate_bps)
}

#[cfg(test)]
mod tests {
    #[test]
    fn two_mib_at_five_mbps_lasts_3_36_s() {
        let d = super::segment_duration(2 << 20, 5e6);
        assert!((d.as_secs_f64() - 3.355_443_2).abs() < 1e-9);
    }
}
