//! A rate cap on the origin body bytes a background fill reads (the prefill's):
//! a token bucket the fill takes from after each chunk it reads, sleeping off
//! any debt before it reads the next. Reading slower keeps the socket's receive
//! window closed, so the origin sends at the capped rate (TCP flow control), not
//! in bursts between pauses.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::Tally;

/// The credit a paced fill may build up while it reads nothing (between two
/// slices, waiting for the next answer): over a whole fill the average holds at
/// the rate, and it stays within this much of it over any stretch.
pub(crate) const BURST: Duration = Duration::from_millis(100);

/// The bucket's arithmetic, apart from the clock and the sleeping.
#[derive(Debug)]
pub(crate) struct Bucket {
    /// Bytes per second.
    rate: f64,
    /// The most credit that may build up while nothing is read.
    burst: f64,
    /// Credit in bytes; negative: a debt to sleep off.
    tokens: f64,
    at: Instant,
}

impl Bucket {
    /// A bucket of `rate` bytes a second, holding at most `burst` bytes of credit
    /// (starting full).
    pub(crate) fn new(rate: f64, burst: f64, now: Instant) -> Bucket {
        Bucket { rate, burst, tokens: burst, at: now }
    }

    /// Takes `n` bytes at `now`; returns how long to wait before reading more
    /// (zero while there is credit).
    pub(crate) fn take(&mut self, n: u64, now: Instant) -> Duration {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.at = now.max(self.at);
        self.tokens = (self.tokens + elapsed * self.rate).min(self.burst) - n as f64;
        if self.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-self.tokens / self.rate)
        }
    }
}

/// A shared rate cap (one per prefill job), with the bytes read under it.
pub(crate) struct Pace {
    bucket: Mutex<Bucket>,
    /// Origin body bytes read under this cap.
    pub bytes: Tally,
}

impl Pace {
    /// A cap of `bits_per_second`; the burst is [`BURST`] of it (at least 64 KiB):
    /// enough to make up for the round trip between one slice and the next.
    pub(crate) fn new(bits_per_second: u64) -> Pace {
        let rate = (bits_per_second as f64 / 8.0).max(1.0);
        let burst = (rate * BURST.as_secs_f64()).max(65536.0);
        Pace { bucket: Mutex::new(Bucket::new(rate, burst, Instant::now())), bytes: Tally::default() }
    }

    /// Counts `n` bytes read, then waits until reading on keeps to the rate.
    pub(crate) async fn take(&self, n: u64) {
        self.bytes.add(n);
        let wait = super::lock(&self.bucket).take(n, Instant::now());
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }

    /// Counts `n` bytes read without waiting (a viewer waits on this fill too).
    pub(crate) fn count(&self, n: u64) {
        self.bytes.add(n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debt_is_slept_off_at_the_rate() {
        let t0 = Instant::now();
        let mut b = Bucket::new(1000.0, 100.0, t0);
        assert_eq!(b.take(100, t0), Duration::ZERO, "the burst is free");
        assert_eq!(b.take(500, t0), Duration::from_millis(500), "500 bytes of debt at 1000 B/s");
        // Half a second later the debt is paid; 250 more cost a quarter second.
        assert_eq!(b.take(250, t0 + Duration::from_millis(500)), Duration::from_millis(250));
        // Idle for long: credit tops out at the burst.
        let later = t0 + Duration::from_secs(60);
        assert_eq!(b.take(100, later), Duration::ZERO);
        assert_eq!(b.take(100, later), Duration::from_millis(100));
    }

    #[test]
    fn a_reader_that_sleeps_as_told_keeps_the_rate() {
        // 25 MB/s (200 Mb/s) read in 16 KiB chunks: 160 MiB takes 160 MiB / 25 MB/s.
        let t0 = Instant::now();
        let rate = 25e6;
        let mut b = Bucket::new(rate, rate / 50.0, t0);
        let (mut now, mut read) = (t0, 0u64);
        while read < 160 << 20 {
            now += b.take(16384, now);
            read += 16384;
        }
        let secs = now.duration_since(t0).as_secs_f64();
        let expected = (read as f64 - rate / 50.0) / rate;
        assert!((secs - expected).abs() < 0.001, "{secs} s, expected {expected} s");
        assert!((read as f64 / secs / rate - 1.0).abs() < 0.01);
    }
}
