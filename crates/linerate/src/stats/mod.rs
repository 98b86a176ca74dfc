//! Per-worker counters.
//!
//! Each worker owns one [`WorkerCounters`], alone on its cache lines, and is the
//! only thread that writes it; a reader (the supervisor, later the admin endpoint)
//! sums all workers' counters when asked. Writes are a relaxed load and store of the
//! worker's own line, with no locked instruction and no line shared between cores,
//! which is the cheapest counting there is. Readers may see a value a few
//! increments old, never a torn one.

use std::sync::atomic::{AtomicU64, Ordering};

use linerate_http::Status;

/// One counter, written by a single thread.
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    /// Adds `n`. Only the owning worker may call this (single writer).
    #[inline]
    pub fn add(&self, n: u64) {
        self.0.store(self.0.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
    }

    #[inline]
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Why a connection ended abnormally, or a request failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// Head read, body read or send timed out.
    Timeout,
    /// The peer reset or broke the connection mid-response.
    Reset,
    /// Malformed or oversized request (4xx and close).
    BadRequest,
    /// `accept` failed (out of descriptors, memory...).
    Accept,
    /// A file shrank while being sent.
    Truncated,
}

#[derive(Debug, Default)]
#[repr(align(128))] // two cache lines: no false sharing with the next worker's counters
pub struct WorkerCounters {
    pub connections_accepted: Counter,
    pub connections_closed: Counter,
    /// Responses by status class: index 0 = 1xx ... 4 = 5xx.
    pub responses: [Counter; 5],
    pub body_bytes: Counter,
    pub head_bytes: Counter,
    pub timeouts: Counter,
    pub resets: Counter,
    pub bad_requests: Counter,
    pub accept_errors: Counter,
    pub truncated: Counter,
    pub tls_handshakes: Counter,
    pub tls_handshake_failures: Counter,
    /// Connections whose records the kernel protects (kTLS).
    pub ktls_sessions: Counter,
    /// Of those, the ones the NIC seals (TLS offload).
    pub ktls_device_sessions: Counter,
    /// Connections whose records are protected in user space.
    pub usertls_sessions: Counter,
}

impl WorkerCounters {
    pub fn response(&self, status: Status) {
        let class = (status.code() / 100).clamp(1, 5) as usize - 1;
        self.responses[class].add(1);
    }

    pub fn error(&self, kind: ErrorKind) {
        match kind {
            ErrorKind::Timeout => &self.timeouts,
            ErrorKind::Reset => &self.resets,
            ErrorKind::BadRequest => &self.bad_requests,
            ErrorKind::Accept => &self.accept_errors,
            ErrorKind::Truncated => &self.truncated,
        }
        .add(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_by_class_and_kind() {
        let c = WorkerCounters::default();
        c.response(Status::Ok);
        c.response(Status::PartialContent);
        c.response(Status::NotFound);
        c.error(ErrorKind::Timeout);
        c.connections_accepted.add(3);
        c.connections_closed.add(1);
        assert_eq!(c.responses[1].get(), 2);
        assert_eq!(c.responses[3].get(), 1);
        assert_eq!(c.timeouts.get(), 1);
        assert_eq!(std::mem::align_of::<WorkerCounters>(), 128);
    }
}
