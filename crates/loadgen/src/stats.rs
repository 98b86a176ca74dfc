//! What a worker measures, kept by that worker alone and merged at the end.
//!
//! Histograms, counters and the per-second timeline are plain fields owned by one
//! worker thread (no atomics, no sharing). Only [`Live`] is read by another thread,
//! for the progress bar: single-writer counters on a cache line of their own.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use hdrhistogram::Histogram;

/// Kinds of failed requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ErrorKind {
    /// No connection: refused, reset, unreachable, TLS handshake failed, out of
    /// descriptors, or not connected within `--connect-timeout`.
    Connect = 0,
    /// Connected, but the response was not complete within `--timeout`.
    Timeout,
    /// A status other than the one asked for (206 to a range request).
    Status,
    /// The connection closed or broke after the response had started.
    ShortBody,
    /// The connection closed or broke before any byte of the response.
    Closed,
    /// A malformed head, a wrong Content-Range or Content-Length, bytes after the end.
    Protocol,
    /// Body bytes differ from the file under `--verify DIR`.
    Verify,
    /// A live playlist that is not a usable media playlist, or lists a segment on
    /// another origin (`--live`).
    Playlist,
}

pub(crate) const ERROR_KINDS: usize = 8;
pub(crate) const ERROR_NAMES: [&str; ERROR_KINDS] =
    ["connect", "timeout", "status", "short_body", "closed", "protocol", "verify", "playlist"];

/// Histogram range: 1 µs to one hour, 3 significant digits.
const HIST_MAX_USECS: u64 = 3_600_000_000;

pub(crate) fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, HIST_MAX_USECS, 3).expect("valid histogram bounds")
}

/// The per-second TTFB histograms: up to a minute (slower counts as a minute), two
/// significant digits, 32-bit counts: about 10 KiB each, one per second of the run.
const SECOND_HIST_MAX_USECS: u64 = 60_000_000;

fn second_histogram() -> Histogram<u32> {
    Histogram::new_with_bounds(1, SECOND_HIST_MAX_USECS, 2).expect("valid histogram bounds")
}

/// One second of the run.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub(crate) struct Bucket {
    pub bytes: u64,
    pub requests: u64,
    pub errors: u64,
    pub rebuffers: u64,
    /// Session-seconds spent watching (after start-up, stalls included) within this
    /// second: its average number of sessions watching.
    pub watching_s: f64,
    /// Session-seconds spent stalled (rebuffering) within this second.
    pub stalled_s: f64,
}

/// Everything one worker measured.
pub(crate) struct WorkerStats {
    pub ttfb_usecs: Histogram<u64>,
    /// TTFB of the requests for hot titles only (`--hot-titles`).
    pub hot_ttfb_usecs: Histogram<u64>,
    pub segment_usecs: Histogram<u64>,
    pub play_delay_usecs: Histogram<u64>,
    /// Live: from a segment's `EXT-X-PROGRAM-DATE-TIME` to its last byte.
    pub live_latency_usecs: Histogram<u64>,
    /// Live: from the arrival of the first playlist that listed a segment to the
    /// segment's last byte.
    pub listed_usecs: Histogram<u64>,
    /// Live: playlist requests, answered or not.
    pub playlist_requests: u64,
    /// Live: segments that left the playlist before the viewer fetched them.
    pub skipped_segments: u64,
    /// Live: the fewest and most segments one viewer fetched (`None`: no viewer yet).
    pub viewer_segments: Option<(u64, u64)>,
    pub requests: u64,
    pub body_bytes: u64,
    pub verified_bytes: u64,
    pub errors: [u64; ERROR_KINDS],
    pub rebuffers: u64,
    pub stall: Duration,
    pub watch: Duration,
    pub plays_started: u64,
    pub plays_not_started: u64,
    pub connections: u64,
    /// Requests retried once on a new connection because a kept-alive one had been
    /// closed by the server before the request arrived (not an error).
    pub reconnects: u64,
    /// Connections reset or refused by the server (ECONNRESET, ECONNABORTED,
    /// ECONNREFUSED), whether or not the request was then retried.
    pub resets: u64,
    /// Segments a session fetched after one or more failed attempts (each failure
    /// is also an error): the player's retries that worked.
    pub retried_segments: u64,
    /// Segments whose every attempt had failed when their play ended (the run's
    /// end): bytes the viewer never got.
    pub unrecovered_segments: u64,
    /// The most attempts one segment took, the one that worked included (1 when
    /// nothing failed, 0 when no segment arrived).
    pub max_segment_attempts: u64,
    /// TLS handshakes completed in full (no session resumed).
    pub handshakes_full: u64,
    /// TLS handshakes that resumed a session (ticket or TLS 1.2 session ID).
    pub handshakes_resumed: u64,
    pub timeline: Vec<Bucket>,
    /// TTFB of the requests completed in each second (allocated on first use).
    pub ttfb_timeline: Vec<Option<Histogram<u32>>>,
    pub first_failure: Option<String>,
}

impl WorkerStats {
    pub(crate) fn new(seconds: usize) -> WorkerStats {
        WorkerStats {
            ttfb_usecs: histogram(),
            hot_ttfb_usecs: histogram(),
            segment_usecs: histogram(),
            play_delay_usecs: histogram(),
            live_latency_usecs: histogram(),
            listed_usecs: histogram(),
            playlist_requests: 0,
            skipped_segments: 0,
            viewer_segments: None,
            requests: 0,
            body_bytes: 0,
            verified_bytes: 0,
            errors: [0; ERROR_KINDS],
            rebuffers: 0,
            stall: Duration::ZERO,
            watch: Duration::ZERO,
            plays_started: 0,
            plays_not_started: 0,
            connections: 0,
            reconnects: 0,
            resets: 0,
            retried_segments: 0,
            unrecovered_segments: 0,
            max_segment_attempts: 0,
            handshakes_full: 0,
            handshakes_resumed: 0,
            timeline: vec![Bucket::default(); seconds.max(1)],
            ttfb_timeline: vec![None; seconds.max(1)],
            first_failure: None,
        }
    }

    /// The timeline bucket for an offset into the run (the last one absorbs overrun).
    pub(crate) fn bucket(&mut self, since_start: Duration) -> &mut Bucket {
        let i = (since_start.as_secs() as usize).min(self.timeline.len() - 1);
        &mut self.timeline[i]
    }

    /// Adds the span `from..to` (offsets into the run) to the buckets it overlaps,
    /// second by second, through `field`; what lies past the last bucket is dropped.
    pub(crate) fn spread(&mut self, from: Duration, to: Duration, field: fn(&mut Bucket) -> &mut f64) {
        let (from, to) = (from.as_secs_f64(), to.as_secs_f64().min(self.timeline.len() as f64));
        let mut t = from;
        while t < to {
            let i = t as usize;
            let next = ((i + 1) as f64).min(to);
            *field(&mut self.timeline[i]) += next - t;
            t = next;
        }
    }

    /// A live viewer fetched `n` segments in all.
    pub(crate) fn count_viewer_segments(&mut self, n: u64) {
        self.viewer_segments = Some(self.viewer_segments.map_or((n, n), |(lo, hi)| (lo.min(n), hi.max(n))));
    }

    pub(crate) fn record(hist: &mut Histogram<u64>, d: Duration) {
        hist.saturating_record((d.as_micros() as u64).clamp(1, HIST_MAX_USECS));
    }

    /// The time to first byte of a completed request, also counted among the hot
    /// titles' when its title is one of them.
    /// It is also counted in the second it completed, `at` (an offset into the run).
    pub(crate) fn record_ttfb(&mut self, hot: bool, d: Duration, at: Duration) {
        WorkerStats::record(&mut self.ttfb_usecs, d);
        let i = (at.as_secs() as usize).min(self.ttfb_timeline.len() - 1);
        let h = self.ttfb_timeline[i].get_or_insert_with(second_histogram);
        h.saturating_record((d.as_micros() as u64).clamp(1, SECOND_HIST_MAX_USECS));
        if hot {
            WorkerStats::record(&mut self.hot_ttfb_usecs, d);
        }
    }

    pub(crate) fn merge(&mut self, other: &WorkerStats) {
        self.ttfb_usecs.add(&other.ttfb_usecs).expect("same bounds");
        self.hot_ttfb_usecs.add(&other.hot_ttfb_usecs).expect("same bounds");
        self.segment_usecs.add(&other.segment_usecs).expect("same bounds");
        self.play_delay_usecs.add(&other.play_delay_usecs).expect("same bounds");
        self.live_latency_usecs.add(&other.live_latency_usecs).expect("same bounds");
        self.listed_usecs.add(&other.listed_usecs).expect("same bounds");
        self.playlist_requests += other.playlist_requests;
        self.skipped_segments += other.skipped_segments;
        if let Some((lo, hi)) = other.viewer_segments {
            self.count_viewer_segments(lo);
            self.count_viewer_segments(hi);
        }
        self.requests += other.requests;
        self.body_bytes += other.body_bytes;
        self.verified_bytes += other.verified_bytes;
        for (a, b) in self.errors.iter_mut().zip(other.errors) {
            *a += b;
        }
        self.rebuffers += other.rebuffers;
        self.stall += other.stall;
        self.watch += other.watch;
        self.plays_started += other.plays_started;
        self.plays_not_started += other.plays_not_started;
        self.connections += other.connections;
        self.reconnects += other.reconnects;
        self.resets += other.resets;
        self.retried_segments += other.retried_segments;
        self.unrecovered_segments += other.unrecovered_segments;
        self.max_segment_attempts = self.max_segment_attempts.max(other.max_segment_attempts);
        self.handshakes_full += other.handshakes_full;
        self.handshakes_resumed += other.handshakes_resumed;
        if self.timeline.len() < other.timeline.len() {
            self.timeline.resize(other.timeline.len(), Bucket::default());
        }
        for (a, b) in self.timeline.iter_mut().zip(&other.timeline) {
            a.bytes += b.bytes;
            a.requests += b.requests;
            a.errors += b.errors;
            a.rebuffers += b.rebuffers;
            a.watching_s += b.watching_s;
            a.stalled_s += b.stalled_s;
        }
        if self.ttfb_timeline.len() < other.ttfb_timeline.len() {
            self.ttfb_timeline.resize(other.ttfb_timeline.len(), None);
        }
        for (a, b) in self.ttfb_timeline.iter_mut().zip(&other.ttfb_timeline) {
            match (a.as_mut(), b) {
                (Some(a), Some(b)) => a.add(b).expect("same bounds"),
                (None, Some(b)) => *a = Some(b.clone()),
                (_, None) => {}
            }
        }
        if self.first_failure.is_none() {
            self.first_failure.clone_from(&other.first_failure);
        }
    }
}

/// Running totals of one worker for the progress display: written by that worker
/// only (a relaxed load and store, no locked instruction), read by the main thread.
#[derive(Debug, Default)]
#[repr(align(128))]
pub(crate) struct Live {
    bytes: AtomicU64,
    requests: AtomicU64,
    errors: AtomicU64,
}

impl Live {
    fn bump(c: &AtomicU64, n: u64) {
        c.store(c.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
    }

    pub(crate) fn add_bytes(&self, n: u64) {
        Live::bump(&self.bytes, n);
    }

    pub(crate) fn add_request(&self) {
        Live::bump(&self.requests, 1);
    }

    pub(crate) fn add_error(&self) {
        Live::bump(&self.errors, 1);
    }

    /// (bytes, requests, errors) as last written.
    pub(crate) fn read(&self) -> (u64, u64, u64) {
        (self.bytes.load(Ordering::Relaxed), self.requests.load(Ordering::Relaxed), self.errors.load(Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merging_adds_counts_histograms_and_timelines() {
        let mut a = WorkerStats::new(2);
        let mut b = WorkerStats::new(3);
        WorkerStats::record(&mut a.ttfb_usecs, Duration::from_millis(1));
        WorkerStats::record(&mut b.ttfb_usecs, Duration::from_millis(9));
        a.errors[ErrorKind::Timeout as usize] = 2;
        (a.handshakes_full, a.handshakes_resumed) = (1, 4);
        (b.handshakes_full, b.handshakes_resumed) = (2, 8);
        (a.retried_segments, a.unrecovered_segments, a.max_segment_attempts) = (1, 0, 3);
        (b.retried_segments, b.unrecovered_segments, b.max_segment_attempts) = (2, 1, 2);
        (a.playlist_requests, b.playlist_requests, b.skipped_segments) = (3, 4, 1);
        a.count_viewer_segments(7);
        b.count_viewer_segments(9);
        b.count_viewer_segments(5);
        b.errors[ErrorKind::Timeout as usize] = 3;
        b.bucket(Duration::from_secs(2)).bytes = 7;
        a.bucket(Duration::from_millis(500)).bytes = 5;
        a.merge(&b);
        assert_eq!(a.ttfb_usecs.len(), 2);
        assert_eq!(a.errors[ErrorKind::Timeout as usize], 5);
        assert_eq!((a.handshakes_full, a.handshakes_resumed), (3, 12));
        assert_eq!((a.retried_segments, a.unrecovered_segments, a.max_segment_attempts), (3, 1, 3));
        assert_eq!((a.playlist_requests, a.skipped_segments, a.viewer_segments), (7, 1, Some((5, 9))));
        assert_eq!(a.timeline.len(), 3);
        assert_eq!(a.timeline[0].bytes, 5);
        assert_eq!(a.timeline[2].bytes, 7);
        // Past the end lands in the last bucket.
        a.bucket(Duration::from_secs(99)).requests += 1;
        assert_eq!(a.timeline[2].requests, 1);
    }

    #[test]
    fn hot_ttfb_counts_only_hot_titles_and_merges() {
        let mut a = WorkerStats::new(1);
        let mut b = WorkerStats::new(1);
        a.record_ttfb(true, Duration::from_millis(2), Duration::ZERO);
        a.record_ttfb(false, Duration::from_millis(500), Duration::ZERO);
        b.record_ttfb(true, Duration::from_millis(4), Duration::ZERO);
        a.merge(&b);
        assert_eq!(a.ttfb_usecs.len(), 3);
        assert_eq!(a.hot_ttfb_usecs.len(), 2);
        // The slow request was for a cold title: it is not among the hot ones.
        assert!(a.hot_ttfb_usecs.max() < 5_000, "{}", a.hot_ttfb_usecs.max());
        assert!(a.ttfb_usecs.max() >= 500_000);
    }

    #[test]
    fn spans_are_spread_over_the_seconds_they_cover() {
        let mut a = WorkerStats::new(3);
        a.spread(Duration::from_millis(500), Duration::from_millis(2250), |b| &mut b.watching_s);
        a.spread(Duration::from_millis(2900), Duration::from_secs(9), |b| &mut b.stalled_s);
        let w: Vec<f64> = a.timeline.iter().map(|b| b.watching_s).collect();
        assert!((w[0] - 0.5).abs() < 1e-9 && (w[1] - 1.0).abs() < 1e-9 && (w[2] - 0.25).abs() < 1e-9, "{w:?}");
        // Past the run's last second is dropped, not piled into it.
        assert!((a.timeline[2].stalled_s - 0.1).abs() < 1e-9, "{}", a.timeline[2].stalled_s);
        assert_eq!(a.timeline[1].stalled_s, 0.0);
        let mut b = WorkerStats::new(3);
        b.spread(Duration::ZERO, Duration::from_secs(1), |b| &mut b.watching_s);
        a.merge(&b);
        assert!((a.timeline[0].watching_s - 1.5).abs() < 1e-9);
    }

    #[test]
    fn ttfb_is_also_kept_per_second_and_merged() {
        let mut a = WorkerStats::new(2);
        let mut b = WorkerStats::new(2);
        a.record_ttfb(false, Duration::from_millis(3), Duration::from_millis(1500));
        b.record_ttfb(false, Duration::from_millis(80), Duration::from_millis(1200));
        b.record_ttfb(false, Duration::from_millis(7), Duration::from_millis(100));
        a.merge(&b);
        let second = a.ttfb_timeline[1].as_ref().expect("two requests in second 1");
        assert_eq!(second.len(), 2);
        assert!(second.max() >= 79_000, "{}", second.max());
        assert_eq!(a.ttfb_timeline[0].as_ref().map(|h| h.len()), Some(1));
    }
}
