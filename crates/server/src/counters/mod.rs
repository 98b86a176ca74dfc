//! Per-worker counters, gauges and histograms (`[stats]` configures the `TCP_INFO` sampling).
//!
//! Each worker owns one [`WorkerCounters`], alone on its cache lines (histogram
//! buckets included: they are held inline, not in heap blocks that could sit beside
//! another worker's), and is the only thread that writes it; readers (the admin endpoint, the supervisor) sum all
//! workers' values when asked. Writes are a relaxed load and store of the worker's
//! own line: no locked instruction, no line shared between cores, which is the
//! cheapest counting there is. A reader may see a value a few increments old, never
//! a torn one.
//!
//! Detailed TCP statistics (`TCP_INFO`) are kept for a sample of connections only
//! ([`tcp_info`]), into per-worker histograms with fixed buckets.

pub(crate) mod tcp_info;

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use linerate_http::Status;

/// A monotonically increasing count, written by a single thread.
#[derive(Debug, Default)]
pub(crate) struct Counter(AtomicU64);

impl Counter {
    /// Adds `n`. Only the owning worker may call this (single writer).
    #[inline]
    pub(crate) fn add(&self, n: u64) {
        self.0.store(self.0.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
    }

    #[inline]
    pub(crate) fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// A value that goes up and down, written by a single thread: a [`Counter`] read as
/// two's complement (adding `n as u64` wraps to the very bits adding `n` would).
#[derive(Debug, Default)]
pub(crate) struct Gauge(Counter);

impl Gauge {
    #[inline]
    pub(crate) fn add(&self, n: i64) {
        self.0.add(n as u64);
    }

    #[inline]
    pub(crate) fn get(&self) -> i64 {
        self.0.get() as i64
    }
}

/// The most buckets a histogram has: its bounds (see [`buckets`]) and +Inf.
const MAX_BUCKETS: usize = 16;

/// A histogram with fixed upper bounds, written by a single thread.
#[derive(Debug)]
pub(crate) struct Histogram {
    bounds: &'static [f64],
    /// One count per bound, then the +Inf bucket (not cumulative), then unused ones.
    /// Inline, so that they lie inside the owner's `WorkerCounters` and on its cache
    /// lines: bucket vectors allocated one after another for each worker would share
    /// lines between workers.
    buckets: [Counter; MAX_BUCKETS],
    /// The sum of observations, as f64 bits.
    sum: AtomicU64,
    count: Counter,
}

impl Histogram {
    pub(crate) fn new(bounds: &'static [f64]) -> Histogram {
        assert!(bounds.len() < MAX_BUCKETS, "{} bounds: raise MAX_BUCKETS", bounds.len());
        Histogram {
            bounds,
            buckets: std::array::from_fn(|_| Counter::default()),
            sum: AtomicU64::new(0f64.to_bits()),
            count: Counter::default(),
        }
    }

    pub(crate) fn observe(&self, v: f64) {
        let i = self.bounds.iter().position(|&b| v <= b).unwrap_or(self.bounds.len());
        self.buckets[i].add(1);
        let sum = f64::from_bits(self.sum.load(Ordering::Relaxed)) + v;
        self.sum.store(sum.to_bits(), Ordering::Relaxed);
        self.count.add(1);
    }

    pub(crate) fn bounds(&self) -> &'static [f64] {
        self.bounds
    }

    /// Adds this histogram into `acc`: (sum, count, per-bucket counts incl. +Inf).
    pub(crate) fn accumulate(&self, acc: &mut (f64, u64, Vec<u64>)) {
        acc.0 += f64::from_bits(self.sum.load(Ordering::Relaxed));
        acc.1 += self.count.get();
        let buckets = &self.buckets[..=self.bounds.len()];
        if acc.2.len() < buckets.len() {
            acc.2.resize(buckets.len(), 0);
        }
        for (a, b) in acc.2.iter_mut().zip(buckets) {
            *a += b.get();
        }
    }
}

/// Which send path carried body bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TransportKind {
    Plain,
    Ktls,
    UserTls,
}

impl TransportKind {
    pub(crate) const ALL: [TransportKind; 3] = [TransportKind::Plain, TransportKind::Ktls, TransportKind::UserTls];

    pub(crate) fn label(self) -> &'static str {
        match self {
            TransportKind::Plain => "plain",
            TransportKind::Ktls => "ktls",
            TransportKind::UserTls => "usertls",
        }
    }
}

/// Why a connection ended abnormally, or a request failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ErrorKind {
    /// Head read, body read, handshake or send timed out.
    Timeout,
    /// The peer reset or broke the connection mid-response.
    Reset,
    /// Malformed or oversized request (4xx and close).
    BadRequest,
    /// `accept` failed (out of descriptors, memory...).
    Accept,
    /// A file shrank while being sent.
    Truncated,
    /// A disk read a response needed failed, timed out or was refused (queue full).
    Disk,
    /// A response was sent slower on average than `client_limits.min_send_rate`.
    SlowClient,
    /// An origin failed (unreachable, 5xx, late, cut short, a wrong answer) while
    /// its bytes were being relayed: the response was cut.
    Origin,
}

impl ErrorKind {
    pub(crate) const ALL: [ErrorKind; 8] = [
        ErrorKind::Timeout,
        ErrorKind::Reset,
        ErrorKind::BadRequest,
        ErrorKind::Accept,
        ErrorKind::Truncated,
        ErrorKind::Disk,
        ErrorKind::SlowClient,
        ErrorKind::Origin,
    ];

    pub(crate) fn label(self) -> &'static str {
        match self {
            ErrorKind::Timeout => "timeout",
            ErrorKind::Reset => "reset",
            ErrorKind::BadRequest => "bad_request",
            ErrorKind::Accept => "accept",
            ErrorKind::Truncated => "truncated",
            ErrorKind::Disk => "disk",
            ErrorKind::SlowClient => "slow_client",
            ErrorKind::Origin => "origin",
        }
    }
}

/// Which per-client limit refused a new connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The client already had `client_limits.max_connections` open.
    Connections,
    /// The client opened new connections faster than its token bucket allows.
    Rate,
}

impl Refusal {
    pub(crate) const ALL: [Refusal; 2] = [Refusal::Connections, Refusal::Rate];

    pub(crate) fn label(self) -> &'static str {
        match self {
            Refusal::Connections => "connections",
            Refusal::Rate => "rate",
        }
    }
}

/// What a connection is doing, for the connection-state gauges.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ConnState {
    /// Waiting for or reading a request head (the first, or one already begun).
    Reading,
    /// Writing a response.
    Sending,
    /// Keep-alive, between requests.
    Idle,
}

impl ConnState {
    pub(crate) const ALL: [ConnState; 3] = [ConnState::Reading, ConnState::Sending, ConnState::Idle];

    pub(crate) fn label(self) -> &'static str {
        match self {
            ConnState::Reading => "reading",
            ConnState::Sending => "sending",
            ConnState::Idle => "idle",
        }
    }
}

/// Fixed histogram bounds.
pub(crate) mod buckets {
    /// Seconds, for RTT and RTT variance.
    pub(crate) const SECONDS: &[f64] =
        &[0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5];
    /// Bits per second, for delivery and pacing rates.
    pub(crate) const BITS_PER_SECOND: &[f64] =
        &[1e6, 2.5e6, 5e6, 1e7, 2.5e7, 5e7, 1e8, 2.5e8, 5e8, 1e9, 2.5e9, 1e10, 2.5e10, 1e11];
    /// Segments, for the congestion window.
    pub(crate) const SEGMENTS: &[f64] = &[4.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0];
    /// Seconds, for disk fills (a window read from disk: milliseconds to seconds).
    pub(crate) const FILL_SECONDS: &[f64] =
        &[0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];
    /// Counts, for retransmissions per connection.
    pub(crate) const COUNTS: &[f64] = &[0.0, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 1000.0];
}

/// Histograms of sampled TCP_INFO readings.
#[derive(Debug)]
pub(crate) struct TcpHistograms {
    pub rtt_seconds: Histogram,
    pub rtt_variance_seconds: Histogram,
    pub delivery_rate_bits: Histogram,
    pub pacing_rate_bits: Histogram,
    pub cwnd_segments: Histogram,
    /// Unrecovered retransmission timeouts at the time of the sample.
    pub retransmits: Histogram,
    /// Segments retransmitted over the connection's life so far.
    pub total_retransmits: Histogram,
    pub samples: Counter,
}

impl Default for TcpHistograms {
    fn default() -> Self {
        TcpHistograms {
            rtt_seconds: Histogram::new(buckets::SECONDS),
            rtt_variance_seconds: Histogram::new(buckets::SECONDS),
            delivery_rate_bits: Histogram::new(buckets::BITS_PER_SECOND),
            pacing_rate_bits: Histogram::new(buckets::BITS_PER_SECOND),
            cwnd_segments: Histogram::new(buckets::SEGMENTS),
            retransmits: Histogram::new(buckets::COUNTS),
            total_retransmits: Histogram::new(buckets::COUNTS),
            samples: Counter::default(),
        }
    }
}

/// The page-cache view of the bytes served (see `server::pagecache`).
#[derive(Debug)]
pub(crate) struct ColdCounters {
    /// Body bytes found in the page cache when they were about to be sent.
    pub resident_bytes: Counter,
    /// Body bytes that had to be read from disk by a fill first.
    pub filled_bytes: Counter,
    /// How long connections waited for fills (one observation per window).
    pub fill_wait_seconds: Histogram,
}

impl Default for ColdCounters {
    fn default() -> Self {
        ColdCounters {
            resident_bytes: Counter::default(),
            filled_bytes: Counter::default(),
            fill_wait_seconds: Histogram::new(buckets::FILL_SECONDS),
        }
    }
}

#[derive(Debug, Default)]
#[repr(align(128))] // whole cache lines: no false sharing with the next worker's counters
pub(crate) struct WorkerCounters {
    /// The worker's index, its CPU, that CPU's NUMA node and silo (fixed at start).
    pub index: usize,
    pub cpu: Option<usize>,
    pub node: Option<usize>,
    pub domain: usize,
    /// The node holding the worker's own buffers, as the kernel reports it (-1 unknown).
    pub buffer_node: Gauge,
    /// The worker thread's kernel id, for its CPU time (set when it starts).
    pub tid: AtomicU32,
    pub connections_accepted: Counter,
    pub connections_closed: Counter,
    /// Connections by state, indexed like [`ConnState::ALL`].
    pub connections: [Gauge; 3],
    /// Responses by status, indexed like [`Status::ALL`].
    pub responses: [Counter; Status::ALL.len()],
    /// Body bytes by transport, indexed like [`TransportKind::ALL`].
    pub body_bytes: [Counter; 3],
    pub head_bytes: Counter,
    /// Errors, indexed like [`ErrorKind::ALL`].
    pub errors: [Counter; ErrorKind::ALL.len()],
    /// Requests under a signed-URL rule, by verdict, indexed like
    /// [`linerate_urlauth::Verdict::LABELS`].
    pub signed: [Counter; linerate_urlauth::Verdict::LABELS.len()],
    pub tls_handshakes: Counter,
    pub tls_handshake_failures: Counter,
    /// Connections whose records the kernel protects (kTLS).
    pub ktls_sessions: Counter,
    /// Of those, the ones the NIC seals (TLS offload).
    pub ktls_device_sessions: Counter,
    /// Connections whose records are protected in user space.
    pub usertls_sessions: Counter,
    /// Connections whose SYN was received on a CPU of another NUMA node than the
    /// worker's (`SO_INCOMING_CPU`).
    pub cross_domain_connections: Counter,
    /// Connections closed right after accept by a per-client limit, indexed like
    /// [`Refusal::ALL`] (not counted in `connections_accepted`).
    pub client_limit_refusals: [Counter; 2],
    /// Body bytes of responses whose page-cache pages were checked for their node.
    pub page_sampled_bytes: Counter,
    /// Of those, the share (in bytes) on another node than the worker's.
    pub remote_page_bytes: Counter,
    /// Of those, bytes times the domain crossings they made on their way out: from
    /// a page on another node, and through a connection accepted from another domain.
    pub crossing_bytes: Counter,
    pub cold: ColdCounters,
    pub tcp: TcpHistograms,
}

impl WorkerCounters {
    pub(crate) fn new(index: usize, cpu: Option<usize>, node: Option<usize>, domain: usize) -> WorkerCounters {
        let c = WorkerCounters { index, cpu, node, domain, ..WorkerCounters::default() };
        c.buffer_node.add(-1);
        c
    }

    pub(crate) fn response(&self, status: Status) {
        self.responses[status.index()].add(1);
    }

    pub(crate) fn error(&self, kind: ErrorKind) {
        self.errors[kind as usize].add(1);
    }

    pub(crate) fn errors_of(&self, kind: ErrorKind) -> u64 {
        self.errors[kind as usize].get()
    }

    pub(crate) fn body_bytes_of(&self, kind: TransportKind) -> u64 {
        self.body_bytes[kind as usize].get()
    }

    pub(crate) fn connections_in(&self, state: ConnState) -> i64 {
        self.connections[state as usize].get()
    }

    /// Connections open right now.
    pub(crate) fn connections_open(&self) -> u64 {
        self.connections_accepted.get().saturating_sub(self.connections_closed.get())
    }

    pub(crate) fn requests(&self) -> u64 {
        self.responses.iter().map(Counter::get).sum()
    }

    /// Responses whose status is in the class `class` (2 for 2xx...).
    pub(crate) fn responses_in_class(&self, class: u16) -> u64 {
        Status::ALL.iter().filter(|s| s.code() / 100 == class).map(|s| self.responses[s.index()].get()).sum()
    }
}

/// Moves a connection between the state gauges; leaves the last state on drop.
pub(crate) struct StateTracker<'a> {
    counters: &'a WorkerCounters,
    current: ConnState,
}

impl<'a> StateTracker<'a> {
    pub(crate) fn new(counters: &'a WorkerCounters, state: ConnState) -> StateTracker<'a> {
        counters.connections[state as usize].add(1);
        StateTracker { counters, current: state }
    }

    #[inline]
    pub(crate) fn set(&mut self, state: ConnState) {
        if state != self.current {
            self.counters.connections[self.current as usize].add(-1);
            self.counters.connections[state as usize].add(1);
            self.current = state;
        }
    }
}

impl Drop for StateTracker<'_> {
    fn drop(&mut self) {
        self.counters.connections[self.current as usize].add(-1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_by_status_kind_and_transport() {
        let c = WorkerCounters::new(0, Some(0), Some(0), 0);
        c.response(Status::Ok);
        c.response(Status::PartialContent);
        c.response(Status::NotFound);
        c.error(ErrorKind::Timeout);
        c.body_bytes[TransportKind::UserTls as usize].add(5);
        c.connections_accepted.add(3);
        c.connections_closed.add(1);
        assert_eq!(c.responses_in_class(2), 2);
        assert_eq!(c.responses_in_class(4), 1);
        assert_eq!(c.requests(), 3);
        assert_eq!(c.errors_of(ErrorKind::Timeout), 1);
        assert_eq!(c.body_bytes_of(TransportKind::UserTls), 5);
        assert_eq!(c.connections_open(), 2);
        assert_eq!(std::mem::align_of::<WorkerCounters>(), 128);
    }

    #[test]
    fn state_tracker_moves_one_connection() {
        let c = WorkerCounters::default();
        {
            let mut t = StateTracker::new(&c, ConnState::Reading);
            assert_eq!(c.connections_in(ConnState::Reading), 1);
            t.set(ConnState::Sending);
            t.set(ConnState::Sending);
            assert_eq!((c.connections_in(ConnState::Reading), c.connections_in(ConnState::Sending)), (0, 1));
            t.set(ConnState::Idle);
        }
        assert!(ConnState::ALL.iter().all(|s| c.connections_in(*s) == 0));
    }

    #[test]
    fn histogram_buckets_and_sum() {
        let h = Histogram::new(buckets::COUNTS);
        for v in [0.0, 1.0, 3.0, 5000.0] {
            h.observe(v);
        }
        let mut acc = (0.0, 0, Vec::new());
        h.accumulate(&mut acc);
        h.accumulate(&mut acc);
        assert_eq!(acc.1, 8);
        assert_eq!(acc.0, 2.0 * 5004.0);
        assert_eq!(acc.2[0], 2); // <= 0
        assert_eq!(acc.2[1], 2); // <= 1
        assert_eq!(acc.2[3], 2); // <= 5
        assert_eq!(*acc.2.last().unwrap(), 2); // +Inf
    }

    /// No two workers' written data share a 64-byte cache line (nor a 128-byte pair
    /// of lines, which adjacent-line prefetchers fetch together): each worker's lies
    /// inside its own `WorkerCounters`, which starts and ends on a 128-byte boundary.
    #[test]
    fn a_workers_counters_share_no_cache_line_with_another_workers() {
        let workers: Vec<_> = (0..4).map(|i| std::sync::Arc::new(WorkerCounters::new(i, None, None, 0))).collect();
        let size = std::mem::size_of::<WorkerCounters>();
        assert_eq!(size % 128, 0);
        let span = |c: &WorkerCounters| {
            let start = std::ptr::from_ref(c).addr();
            assert_eq!(start % 128, 0);
            start..start + size
        };
        for c in &workers {
            let own = span(c);
            let t = &c.tcp;
            for h in [
                &c.cold.fill_wait_seconds,
                &t.rtt_seconds,
                &t.rtt_variance_seconds,
                &t.delivery_rate_bits,
                &t.pacing_rate_bits,
                &t.cwnd_segments,
                &t.retransmits,
                &t.total_retransmits,
            ] {
                let buckets = h.buckets.as_ptr_range();
                assert!(
                    own.contains(&buckets.start.addr()) && buckets.end.addr() <= own.end,
                    "{buckets:?} outside {own:?}"
                );
            }
        }
        for (i, a) in workers.iter().enumerate() {
            for b in &workers[i + 1..] {
                let (a, b) = (span(a), span(b));
                let lines = |r: &std::ops::Range<usize>| r.start / 64..r.end.div_ceil(64);
                let (la, lb) = (lines(&a), lines(&b));
                assert!(la.end <= lb.start || lb.end <= la.start, "{a:?} and {b:?} share a line");
            }
        }
    }
}
