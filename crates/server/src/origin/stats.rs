//! Per origin URL counters: written with atomic adds by whichever origin thread
//! runs the request (no lock), read by [`super::Origins::stats`].

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use super::error::{OriginError, KINDS};

/// Upper bounds, in seconds, of the first-byte histogram: a warm origin answers
/// in milliseconds, a cold one from its disks in up to seconds, and the default
/// `first_byte_timeout` is 15 s.
pub(super) const FIRST_BYTE_SECONDS: &[f64] =
    &[0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];

/// One origin URL's counters, for /metrics and /status (which shows the
/// first-byte times as quantiles, not buckets).
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub(crate) struct UrlStats {
    /// Index of the `[[origin]]` table.
    pub table: usize,
    pub url: String,
    /// Requests sent to this URL (a retry on a fresh connection after a pooled
    /// one turned out closed counts once).
    pub requests: u64,
    /// Response heads received, by status class: 1xx, 2xx, 3xx, 4xx, 5xx.
    pub responses_by_class: [u64; 5],
    /// Body bytes received.
    pub body_bytes: u64,
    /// Failures by [`OriginError::kind`], every kind listed (zeros included).
    pub errors: Vec<(&'static str, u64)>,
    /// Connections open now, idle or busy.
    pub open_connections: u64,
    /// Time from sending the request to its head received: each bucket's own
    /// count (not cumulative, as prometheus-client's `encode_histogram` wants),
    /// the last one `+Inf`.
    #[serde(skip)]
    pub first_byte_buckets: Vec<(f64, u64)>,
    #[serde(skip)]
    pub first_byte_sum_secs: f64,
    #[serde(skip)]
    pub first_byte_count: u64,
}

/// One parent's counters (its requests, answers and errors, as an origin URL's)
/// and its state.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub(crate) struct ParentStats {
    #[serde(flatten)]
    pub stats: UrlStats,
    /// Not marked down: requests go to it.
    pub up: bool,
    /// Times it was marked down.
    pub marked_down: u64,
}

/// One peer's counters (its requests, answers and errors, as an origin URL's),
/// its state, and its misses.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub(crate) struct PeerStats {
    #[serde(flatten)]
    pub stats: UrlStats,
    /// Not marked down: requests go to it.
    pub up: bool,
    /// Times it was marked down.
    pub marked_down: u64,
    /// Its 504s (and other 3xx or 4xx) to `only-if-cached`: it did not have what was asked.
    pub misses: u64,
}

#[derive(Debug, Default)]
pub(super) struct Counters {
    requests: AtomicU64,
    responses_by_class: [AtomicU64; 5],
    body_bytes: AtomicU64,
    errors: [AtomicU64; KINDS.len()],
    pub(super) open_connections: AtomicU64,
    /// One per bound of [`FIRST_BYTE_SECONDS`], then `+Inf`.
    first_byte_buckets: [AtomicU64; FIRST_BYTE_SECONDS.len() + 1],
    first_byte_sum_nanos: AtomicU64,
}

impl Counters {
    pub(super) fn count_request(&self) {
        self.requests.fetch_add(1, Relaxed);
    }

    pub(super) fn count_head(&self, status: u16, first_byte: Duration) {
        if let Some(class) = (status / 100).checked_sub(1).filter(|&c| c < 5) {
            self.responses_by_class[usize::from(class)].fetch_add(1, Relaxed);
        }
        let secs = first_byte.as_secs_f64();
        let i = FIRST_BYTE_SECONDS.iter().position(|&b| secs <= b).unwrap_or(FIRST_BYTE_SECONDS.len());
        self.first_byte_buckets[i].fetch_add(1, Relaxed);
        let nanos = u64::try_from(first_byte.as_nanos()).unwrap_or(u64::MAX);
        self.first_byte_sum_nanos.fetch_add(nanos, Relaxed);
    }

    pub(super) fn count_body(&self, bytes: usize) {
        self.body_bytes.fetch_add(bytes as u64, Relaxed);
    }

    pub(super) fn count_error(&self, e: &OriginError) {
        self.errors[e.kind_index()].fetch_add(1, Relaxed);
    }

    pub(super) fn snapshot(&self, table: usize, url: &str) -> UrlStats {
        let buckets: Vec<(f64, u64)> = FIRST_BYTE_SECONDS
            .iter()
            .chain(std::iter::once(&f64::INFINITY))
            .zip(&self.first_byte_buckets)
            .map(|(&bound, n)| (bound, n.load(Relaxed)))
            .collect();
        UrlStats {
            table,
            url: url.to_string(),
            requests: self.requests.load(Relaxed),
            responses_by_class: std::array::from_fn(|i| self.responses_by_class[i].load(Relaxed)),
            body_bytes: self.body_bytes.load(Relaxed),
            errors: KINDS.iter().zip(&self.errors).map(|(&k, n)| (k, n.load(Relaxed))).collect(),
            open_connections: self.open_connections.load(Relaxed),
            first_byte_count: buckets.iter().map(|b| b.1).sum(),
            first_byte_buckets: buckets,
            first_byte_sum_secs: self.first_byte_sum_nanos.load(Relaxed) as f64 / 1e9,
        }
    }
}
