//! `TCP_INFO` on a sample of connections.
//!
//! Reading `TCP_INFO` costs a syscall and a copy of ~250 bytes; doing it for every
//! connection is the kind of statistics cost that once took 5-10% of a serving box's
//! CPU. So a configurable fraction of connections is chosen at accept (default 1%),
//! and only those are read: every `stats.tcp_info_interval` while a response is being
//! sent, after each response, and at close.

use std::cell::Cell;
use std::os::fd::{AsFd, OwnedFd};

use super::TcpHistograms;

/// Picks connections to sample, with a per-worker xorshift generator.
pub(crate) struct Chooser {
    state: Cell<u64>,
    /// Sample when the next random number is below this.
    threshold: u64,
}

impl Chooser {
    /// `fraction` in [0, 1]; `seed` should differ per worker.
    pub(crate) fn new(fraction: f64, seed: u64) -> Chooser {
        let threshold = if fraction >= 1.0 { u64::MAX } else { (fraction.max(0.0) * u64::MAX as f64) as u64 };
        Chooser { state: Cell::new(seed | 1), threshold }
    }

    pub(crate) fn choose(&self) -> bool {
        if self.threshold == 0 {
            return false;
        }
        let mut x = self.state.get();
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.state.set(x);
        x < self.threshold || self.threshold == u64::MAX
    }
}

/// The TCP_INFO figures an access-log record carries for a sampled connection.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct TcpFigures {
    pub rtt_us: u32,
    /// Segments retransmitted over the connection's life.
    pub total_retransmits: u32,
    /// The kernel's estimate of the delivery rate, in bits per second.
    pub delivery_rate_bps: u64,
}

/// A sampled connection's own handle on its socket (a duplicate descriptor, so
/// sampling never borrows the transport that is busy sending).
pub(crate) struct Sampler {
    sock: OwnedFd,
}

impl Sampler {
    pub(crate) fn new(sock: impl AsFd) -> Option<Sampler> {
        sock.as_fd().try_clone_to_owned().ok().map(|sock| Sampler { sock })
    }

    /// Reads TCP_INFO and records it; returns the figures an access log keeps.
    pub(crate) fn sample(&self, h: &TcpHistograms) -> Option<TcpFigures> {
        let i = linerate_sys::tcp::tcp_info(self.sock.as_fd()).ok()?;
        h.samples.add(1);
        h.rtt_seconds.observe(f64::from(i.rtt_usecs) / 1e6);
        h.rtt_variance_seconds.observe(f64::from(i.rtt_var_usecs) / 1e6);
        h.cwnd_segments.observe(f64::from(i.snd_cwnd_segments));
        h.retransmits.observe(f64::from(i.retransmits));
        h.total_retransmits.observe(f64::from(i.total_retrans));
        if i.delivery_rate_bytes > 0 {
            h.delivery_rate_bits.observe(i.delivery_rate_bytes as f64 * 8.0);
        }
        if i.pacing_rate_bytes > 0 && i.pacing_rate_bytes != u64::MAX {
            h.pacing_rate_bits.observe(i.pacing_rate_bytes as f64 * 8.0);
        }
        Some(TcpFigures {
            rtt_us: i.rtt_usecs,
            total_retransmits: i.total_retrans,
            delivery_rate_bps: i.delivery_rate_bytes.saturating_mul(8),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chooses_about_the_fraction() {
        let c = Chooser::new(0.01, 42);
        let n = (0..100_000).filter(|_| c.choose()).count();
        assert!((800..1200).contains(&n), "{n}");
        assert!(!(0..1000).any(|_| Chooser::new(0.0, 1).choose()));
        let all = Chooser::new(1.0, 7);
        assert!((0..1000).all(|_| all.choose()));
    }

    #[test]
    fn samples_a_live_socket() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let h = TcpHistograms::default();
        let s = Sampler::new(&client).unwrap();
        s.sample(&h);
        s.sample(&h);
        assert_eq!(h.samples.get(), 2);
        let mut acc = (0.0, 0, Vec::new());
        h.cwnd_segments.accumulate(&mut acc);
        assert_eq!(acc.1, 2);
        assert!(acc.0 > 0.0);
    }
}
