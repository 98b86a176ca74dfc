//! The run's results: a human table by default, JSON with `--json`.
//!
//! JSON keys (the interface scripts rely on): `gbps`, `requests`, `requests_per_s`,
//! `bytes`, `errors` (an object of counts by kind), `ttfb_ms`, `segment_ms`,
//! `play_delay_ms` (objects with `p50`, `p90`, `p99`, `max`, `count`),
//! `hot_ttfb_ms` (the same for the `--hot-titles` most popular titles, null
//! without that option), `hot_ttfb_p99_ms` (its p99, for scripts),
//! `rebuffers`, `rebuffer_ratio`, `stall_s`, `watch_s`, `client_cpu_s`,
//! `client_cpu_s_per_gb`, `handshakes_full`, `handshakes_resumed` (TLS handshakes
//! by kind), `handshakes_per_s` (both kinds), `retried_segments`,
//! `unrecovered_segments` and `max_segment_attempts` (a failed request is retried,
//! as a player retries its segment: how many segments needed that, how many never
//! arrived, the most attempts one took), and `timeline` (one object per second:
//! `t_s`, `gbps`, `requests`, `errors`, `rebuffers`, `sessions_playing`,
//! `sessions_stalled` (each the average over that second), `ttfb_p99_ms`).
//!
//! Live mode (`--live`, `mode` = `"live"`, `live_url`) adds `playlist_requests`,
//! `skipped_segments`, `live_latency_ms` and `listed_to_last_byte_ms` (percentile
//! objects, null outside live mode) and `viewer_segments_min`/`_max` (the fewest and
//! most segments one viewer fetched); `requests`, `bytes`, `ttfb_ms` and
//! `segment_ms` count segments only, not playlists.

use std::fmt::Write as _;

use hdrhistogram::Histogram;
use serde::Serialize;

use super::stats::{Bucket, WorkerStats, ERROR_NAMES};

#[derive(Serialize)]
pub(crate) struct Percentiles {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
    pub count: u64,
}

impl Percentiles {
    fn of(h: &Histogram<u64>) -> Percentiles {
        let ms = |v: u64| v as f64 / 1000.0;
        if h.is_empty() {
            return Percentiles { p50: 0.0, p90: 0.0, p99: 0.0, max: 0.0, count: 0 };
        }
        Percentiles {
            p50: ms(h.value_at_quantile(0.50)),
            p90: ms(h.value_at_quantile(0.90)),
            p99: ms(h.value_at_quantile(0.99)),
            max: ms(h.max()),
            count: h.len(),
        }
    }
}

#[derive(Serialize)]
pub(crate) struct Second {
    pub t_s: usize,
    pub gbps: f64,
    pub requests: u64,
    pub errors: u64,
    pub rebuffers: u64,
    /// Sessions playing (watching and not stalled), on average over the second.
    pub sessions_playing: f64,
    /// Sessions stalled (rebuffering), on average over the second.
    pub sessions_stalled: f64,
    /// TTFB p99 of the requests completed in this second (`null` if none).
    pub ttfb_p99_ms: Option<f64>,
}

/// What the run was asked to do.
#[derive(Serialize)]
pub(crate) struct Setup {
    pub mode: &'static str,
    /// The media playlist every viewer follows (live mode).
    pub live_url: Option<String>,
    pub sessions: u32,
    pub workers: usize,
    pub duration_s: f64,
    pub titles: usize,
    /// `None` in live mode (segments are whole files).
    pub segment_bytes: Option<u64>,
    pub bitrate_mbps: Option<f64>,
    pub segment_s: Option<f64>,
    pub startup_segments: u32,
    pub zipf_exponent: f64,
    /// `--hot-titles`, at most the catalogue's size.
    pub hot_titles: Option<usize>,
    /// TLS session resumption on (not `--no-resume`).
    pub resume: bool,
    pub connection_per_request: bool,
}

#[derive(Serialize)]
pub(crate) struct Summary {
    #[serde(flatten)]
    pub setup: Setup,
    pub elapsed_s: f64,
    pub gbps: f64,
    pub bytes: u64,
    pub requests: u64,
    pub requests_per_s: f64,
    pub errors: serde_json::Map<String, serde_json::Value>,
    pub errors_total: u64,
    pub first_error: Option<String>,
    pub ttfb_ms: Percentiles,
    pub segment_ms: Percentiles,
    pub play_delay_ms: Percentiles,
    pub hot_ttfb_ms: Option<Percentiles>,
    pub hot_ttfb_p99_ms: Option<f64>,
    pub live_latency_ms: Option<Percentiles>,
    pub listed_to_last_byte_ms: Option<Percentiles>,
    pub playlist_requests: u64,
    pub skipped_segments: u64,
    pub viewer_segments_min: Option<u64>,
    pub viewer_segments_max: Option<u64>,
    pub plays_started: u64,
    pub plays_not_started: u64,
    pub rebuffers: u64,
    pub rebuffer_ratio: f64,
    pub stall_s: f64,
    pub watch_s: f64,
    pub connections: u64,
    pub reconnects: u64,
    /// Connections reset or refused by the server, retried or not.
    pub resets: u64,
    /// Segments fetched after failed attempts, segments never fetched because every
    /// attempt failed before the run ended, and the most attempts one segment took.
    pub retried_segments: u64,
    pub unrecovered_segments: u64,
    pub max_segment_attempts: u64,
    pub handshakes_full: u64,
    pub handshakes_resumed: u64,
    pub handshakes_per_s: f64,
    pub verified_bytes: u64,
    pub client_cpu_s: f64,
    pub client_cpu_s_per_gb: f64,
    pub sessions_dropped_at_backstop: usize,
    pub timeline: Vec<Second>,
}

impl Summary {
    pub(crate) fn new(setup: Setup, stats: &WorkerStats, elapsed_s: f64, cpu_s: f64, dropped: usize) -> Summary {
        let gb = stats.body_bytes as f64 / 1e9;
        let errors = ERROR_NAMES.iter().zip(stats.errors).map(|(k, v)| (k.to_string(), v.into())).collect();
        let watch_s = stats.watch.as_secs_f64();
        let hot_ttfb_ms = setup.hot_titles.map(|_| Percentiles::of(&stats.hot_ttfb_usecs));
        let stall_s = stats.stall.as_secs_f64();
        let live = setup.live_url.is_some();
        Summary {
            setup,
            elapsed_s,
            gbps: stats.body_bytes as f64 * 8.0 / elapsed_s.max(1e-9) / 1e9,
            bytes: stats.body_bytes,
            requests: stats.requests,
            requests_per_s: stats.requests as f64 / elapsed_s.max(1e-9),
            errors,
            errors_total: stats.errors.iter().sum(),
            first_error: stats.first_failure.clone(),
            ttfb_ms: Percentiles::of(&stats.ttfb_usecs),
            segment_ms: Percentiles::of(&stats.segment_usecs),
            play_delay_ms: Percentiles::of(&stats.play_delay_usecs),
            hot_ttfb_p99_ms: hot_ttfb_ms.as_ref().map(|p| p.p99),
            hot_ttfb_ms,
            live_latency_ms: live.then(|| Percentiles::of(&stats.live_latency_usecs)),
            listed_to_last_byte_ms: live.then(|| Percentiles::of(&stats.listed_usecs)),
            playlist_requests: stats.playlist_requests,
            skipped_segments: stats.skipped_segments,
            viewer_segments_min: stats.viewer_segments.map(|v| v.0),
            viewer_segments_max: stats.viewer_segments.map(|v| v.1),
            plays_started: stats.plays_started,
            plays_not_started: stats.plays_not_started,
            rebuffers: stats.rebuffers,
            rebuffer_ratio: if watch_s > 0.0 { stall_s / watch_s } else { 0.0 },
            stall_s,
            watch_s,
            connections: stats.connections,
            reconnects: stats.reconnects,
            resets: stats.resets,
            retried_segments: stats.retried_segments,
            unrecovered_segments: stats.unrecovered_segments,
            max_segment_attempts: stats.max_segment_attempts,
            handshakes_full: stats.handshakes_full,
            handshakes_resumed: stats.handshakes_resumed,
            handshakes_per_s: (stats.handshakes_full + stats.handshakes_resumed) as f64 / elapsed_s.max(1e-9),
            verified_bytes: stats.verified_bytes,
            client_cpu_s: cpu_s,
            client_cpu_s_per_gb: if gb > 0.0 { cpu_s / gb } else { 0.0 },
            sessions_dropped_at_backstop: dropped,
            timeline: stats
                .timeline
                .iter()
                .zip(&stats.ttfb_timeline)
                .enumerate()
                .map(|(i, (b, ttfb))| Second::of(i, b, ttfb.as_ref(), elapsed_s))
                .collect(),
        }
    }

    pub(crate) fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a summary always serialises")
    }

    pub(crate) fn to_table(&self) -> String {
        let s = &self.setup;
        let mut o = String::new();
        let bytes = s.segment_bytes.unwrap_or_default();
        let pacing = match (s.bitrate_mbps, s.segment_s) {
            (Some(r), Some(d)) => format!("paced at {r} Mb/s, segments of {bytes} bytes = {d:.2} s"),
            _ => format!("closed loop, segments of {bytes} bytes"),
        };
        match &s.live_url {
            Some(url) => writeln!(
                o,
                "linerate bench: {} live viewers of {url}, joining {} target durations behind the edge, {} workers, {:.1} s",
                s.sessions, s.startup_segments, s.workers, self.elapsed_s
            ),
            None => writeln!(
                o,
                "linerate bench: {} sessions over {} titles (Zipf {}), {pacing}, start-up {} segments, {} workers, {:.1} s",
                s.sessions, s.titles, s.zipf_exponent, s.startup_segments, s.workers, self.elapsed_s
            ),
        }
        .expect("writing to a String");
        let _ = writeln!(
            o,
            "throughput   {:.3} Gb/s  {} bytes  {} requests ({:.1}/s)  {} connections",
            self.gbps, self.bytes, self.requests, self.requests_per_s, self.connections
        );
        if self.handshakes_full + self.handshakes_resumed > 0 {
            let _ = writeln!(
                o,
                "handshakes   {} full  {} resumed  {:.1}/s  (resumption {}{})",
                self.handshakes_full,
                self.handshakes_resumed,
                self.handshakes_per_s,
                if s.resume { "on" } else { "off" },
                if s.connection_per_request { ", a new connection per request" } else { "" }
            );
        }
        let errors: Vec<String> = self.errors.iter().map(|(k, v)| format!("{k} {v}")).collect();
        let _ = writeln!(o, "errors       {}", errors.join("  "));
        if let Some(e) = &self.first_error {
            let _ = writeln!(o, "first error  {e}");
        }
        let _ = writeln!(o, "{:<14}{:>10}{:>10}{:>10}{:>10}{:>9}", "", "p50", "p90", "p99", "max", "count");
        let hot = self.hot_ttfb_ms.as_ref().map(|p| ("hot ttfb ms", p));
        let latency = self.live_latency_ms.as_ref().map(|p| ("latency ms", p));
        let listed = self.listed_to_last_byte_ms.as_ref().map(|p| ("listed-end ms", p));
        for (name, p) in
            [("ttfb ms", &self.ttfb_ms), ("segment ms", &self.segment_ms), ("play delay ms", &self.play_delay_ms)]
                .into_iter()
                .chain(hot)
                .chain(latency)
                .chain(listed)
        {
            let _ = writeln!(o, "{name:<14}{:>10.1}{:>10.1}{:>10.1}{:>10.1}{:>9}", p.p50, p.p90, p.p99, p.max, p.count);
        }
        if s.live_url.is_some() {
            let _ = writeln!(
                o,
                "live         {} segments ({} to {} a viewer)  {} skipped  {} playlist requests",
                self.requests,
                self.viewer_segments_min.unwrap_or_default(),
                self.viewer_segments_max.unwrap_or_default(),
                self.skipped_segments,
                self.playlist_requests
            );
        }
        let _ = writeln!(
            o,
            "plays        {} started, {} still starting at the end (in play delay with their wait so far)",
            self.plays_started, self.plays_not_started
        );
        let _ = writeln!(
            o,
            "rebuffers    {}  stalled {:.2} s of {:.1} s watched  rebuffer ratio {:.5}",
            self.rebuffers, self.stall_s, self.watch_s, self.rebuffer_ratio
        );
        if self.verified_bytes > 0 {
            let _ = writeln!(o, "verified     {} bytes equal to the files", self.verified_bytes);
        }
        let _ = writeln!(o, "client cpu   {:.2} s  {:.4} s/GB", self.client_cpu_s, self.client_cpu_s_per_gb);
        if self.sessions_dropped_at_backstop > 0 {
            let _ =
                writeln!(o, "warning      {} sessions did not stop by themselves", self.sessions_dropped_at_backstop);
        }
        let _ = writeln!(o, "timeline     second: Gb/s requests errors rebuffers");
        for t in &self.timeline {
            let _ =
                writeln!(o, "  {:>4}  {:>8.3}  {:>7}  {:>5}  {:>5}", t.t_s, t.gbps, t.requests, t.errors, t.rebuffers);
        }
        o
    }
}

impl Second {
    /// Second `i` of a run that lasted `elapsed_s` (the last one may be partial).
    fn of(i: usize, b: &Bucket, ttfb: Option<&Histogram<u32>>, elapsed_s: f64) -> Second {
        let span_s = (elapsed_s - i as f64).clamp(1e-3, 1.0);
        Second {
            t_s: i,
            gbps: b.bytes as f64 * 8.0 / span_s / 1e9,
            requests: b.requests,
            errors: b.errors,
            rebuffers: b.rebuffers,
            sessions_playing: (b.watching_s - b.stalled_s).max(0.0) / span_s,
            sessions_stalled: b.stalled_s / span_s,
            ttfb_p99_ms: ttfb.filter(|h| !h.is_empty()).map(|h| h.value_at_quantile(0.99) as f64 / 1000.0),
        }
    }
}
