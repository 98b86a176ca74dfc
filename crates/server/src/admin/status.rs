//! `/status`: totals and one object per worker, as JSON.

use std::sync::atomic::Ordering;

use serde::Serialize;

use super::AdminState;
use crate::counters::{ConnState, ErrorKind, TransportKind, WorkerCounters};

#[derive(Serialize)]
struct Status<'a> {
    version: &'static str,
    uptime_secs: f64,
    shutting_down: bool,
    tls_mode: Option<&'a str>,
    steering: &'a str,
    /// Body throughput over the last second.
    gbps: f64,
    load: String,
    /// Served Gb/s against the capacity model, when one is configured.
    #[serde(skip_serializing_if = "Option::is_none")]
    capacity: Option<Capacity>,
    totals: Numbers,
    /// Page-cache hits, fills, disks and memory pressure.
    cold: super::cold::Cold,
    /// The pull-through cache, when `[[origin]]` tables are configured.
    #[serde(skip_serializing_if = "Option::is_none")]
    cache: Option<super::cache::CacheView>,
    /// The prefill job's progress, with the cache.
    #[serde(skip_serializing_if = "Option::is_none")]
    prefill: Option<crate::server::prefill::Progress>,
    workers: Vec<Worker>,
}

#[derive(Serialize)]
struct Capacity {
    /// `network` or `loopback`: which of the model's ceilings apply.
    clients: crate::capacity::Path,
    /// The model's ceiling for the transport mix of the last second served.
    ceiling_gbps: Option<f64>,
    /// `gbps` / `ceiling_gbps`.
    share: Option<f64>,
}

#[derive(Serialize)]
struct Worker {
    index: usize,
    cpu: Option<usize>,
    node: Option<usize>,
    domain: usize,
    /// The node of the worker's own buffers, as the kernel reports it.
    buffer_node: Option<i64>,
    cpu_seconds: Option<f64>,
    #[serde(flatten)]
    numbers: Numbers,
}

#[derive(Serialize, Default)]
struct Numbers {
    connections_open: u64,
    connections_reading: i64,
    connections_sending: i64,
    connections_idle: i64,
    connections_accepted: u64,
    cross_domain_connections: u64,
    page_sampled_bytes: u64,
    remote_page_bytes: u64,
    crossing_bytes: u64,
    body_resident_bytes: u64,
    body_filled_bytes: u64,
    requests: u64,
    responses_2xx: u64,
    responses_3xx: u64,
    responses_4xx: u64,
    responses_5xx: u64,
    body_bytes_plain: u64,
    body_bytes_ktls: u64,
    body_bytes_usertls: u64,
    head_bytes: u64,
    tls_handshakes: u64,
    tls_handshake_failures: u64,
    ktls_sessions: u64,
    ktls_device_sessions: u64,
    usertls_sessions: u64,
    errors_timeout: u64,
    errors_reset: u64,
    errors_bad_request: u64,
    errors_accept: u64,
    errors_truncated: u64,
    errors_disk: u64,
    errors_slow_client: u64,
    errors_origin: u64,
    client_limit_refusals: u64,
}

impl Numbers {
    fn add(&mut self, w: &WorkerCounters) {
        self.connections_open += w.connections_open();
        self.connections_reading += w.connections_in(ConnState::Reading);
        self.connections_sending += w.connections_in(ConnState::Sending);
        self.connections_idle += w.connections_in(ConnState::Idle);
        self.connections_accepted += w.connections_accepted.get();
        self.cross_domain_connections += w.cross_domain_connections.get();
        self.page_sampled_bytes += w.page_sampled_bytes.get();
        self.remote_page_bytes += w.remote_page_bytes.get();
        self.crossing_bytes += w.crossing_bytes.get();
        self.body_resident_bytes += w.cold.resident_bytes.get();
        self.body_filled_bytes += w.cold.filled_bytes.get();
        self.requests += w.requests();
        self.responses_2xx += w.responses_in_class(2);
        self.responses_3xx += w.responses_in_class(3);
        self.responses_4xx += w.responses_in_class(4);
        self.responses_5xx += w.responses_in_class(5);
        self.body_bytes_plain += w.body_bytes_of(TransportKind::Plain);
        self.body_bytes_ktls += w.body_bytes_of(TransportKind::Ktls);
        self.body_bytes_usertls += w.body_bytes_of(TransportKind::UserTls);
        self.head_bytes += w.head_bytes.get();
        self.tls_handshakes += w.tls_handshakes.get();
        self.tls_handshake_failures += w.tls_handshake_failures.get();
        self.ktls_sessions += w.ktls_sessions.get();
        self.ktls_device_sessions += w.ktls_device_sessions.get();
        self.usertls_sessions += w.usertls_sessions.get();
        self.errors_timeout += w.errors_of(ErrorKind::Timeout);
        self.errors_reset += w.errors_of(ErrorKind::Reset);
        self.errors_bad_request += w.errors_of(ErrorKind::BadRequest);
        self.errors_accept += w.errors_of(ErrorKind::Accept);
        self.errors_truncated += w.errors_of(ErrorKind::Truncated);
        self.errors_disk += w.errors_of(ErrorKind::Disk);
        self.errors_slow_client += w.errors_of(ErrorKind::SlowClient);
        self.errors_origin += w.errors_of(ErrorKind::Origin);
        self.client_limit_refusals += w.client_limit_refusals.iter().map(|c| c.get()).sum::<u64>();
    }
}

pub(super) fn json(state: &AdminState, gbps: f64) -> String {
    let mut totals = Numbers::default();
    let workers = state
        .workers
        .iter()
        .map(|w| {
            totals.add(w);
            let mut numbers = Numbers::default();
            numbers.add(w);
            Worker {
                index: w.index,
                cpu: w.cpu,
                node: w.node,
                domain: w.domain,
                buffer_node: Some(w.buffer_node.get()).filter(|n| *n >= 0),
                cpu_seconds: super::thread_cpu_seconds(w.tid.load(Ordering::Relaxed)),
                numbers,
            }
        })
        .collect();
    let status = Status {
        version: env!("CARGO_PKG_VERSION"),
        uptime_secs: state.started.elapsed().as_secs_f64(),
        shutting_down: state.shutting_down.load(Ordering::Relaxed),
        tls_mode: state.tls_mode,
        steering: state.steering,
        gbps,
        load: state.load_line(gbps),
        capacity: state.capacity_model.as_ref().map(|(_, clients)| {
            let ceiling = state.model_ceiling();
            Capacity { clients: *clients, ceiling_gbps: ceiling, share: ceiling.map(|c| gbps / c) }
        }),
        totals,
        cold: super::cold::snapshot(state),
        cache: super::cache::snapshot(state),
        prefill: state.prefill.as_ref().map(|p| p.progress()),
        workers,
    };
    serde_json::to_string_pretty(&status).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}")) + "\n"
}
