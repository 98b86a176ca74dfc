//! Blocking playlist requests (LL-HLS): the origin holds a request whose key
//! carries `_HLS_msn` or `_HLS_part` until the playlist has that segment or part
//! ([`super::Key::hold`]). The request itself is an ordinary head request (one
//! for every viewer asking the same key, `hold_timeout` for its first byte);
//! this module counts them per `[[origin]]` table: holds in progress, how long
//! each took, and those that timed out (the viewers got 504).

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant};

use super::Tally;

/// Upper bounds of the hold time histogram's buckets, in seconds (and +Inf).
pub(crate) const HOLD_BOUNDS_SECS: [f64; 10] = [0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0];

/// One table's blocking requests.
#[derive(Default)]
pub(crate) struct HoldStats {
    /// Held origin requests under way.
    pub in_progress: AtomicI64,
    /// Held origin requests ended (answered, failed or timed out), and the sum of
    /// their durations in microseconds.
    pub count: Tally,
    pub sum_us: Tally,
    /// Per bucket of [`HOLD_BOUNDS_SECS`] (the last: past the last bound), each
    /// its own count (not cumulative).
    pub buckets: [Tally; HOLD_BOUNDS_SECS.len() + 1],
    /// Held requests that reached `hold_timeout`.
    pub timeouts: Tally,
}

impl HoldStats {
    /// Counts a hold starting now; it ends when the returned guard is dropped
    /// (after [`Hold::timed_out`] if it did).
    pub(crate) fn start(&self) -> Hold<'_> {
        self.in_progress.fetch_add(1, Ordering::Relaxed);
        Hold { stats: self, started: Instant::now(), timed_out: false }
    }

    fn end(&self, took: Duration, timed_out: bool) {
        self.in_progress.fetch_sub(1, Ordering::Relaxed);
        self.count.add(1);
        self.sum_us.add(took.as_micros() as u64);
        self.buckets[bucket(took)].add(1);
        if timed_out {
            self.timeouts.add(1);
        }
    }

    /// `(upper bound, count)` per bucket, the last +Inf, each its own count.
    pub(crate) fn buckets(&self) -> Vec<(f64, u64)> {
        HOLD_BOUNDS_SECS
            .iter()
            .chain(std::iter::once(&f64::INFINITY))
            .zip(&self.buckets)
            .map(|(&b, n)| (b, n.get()))
            .collect()
    }
}

/// The bucket of [`HOLD_BOUNDS_SECS`] holding `took`.
fn bucket(took: Duration) -> usize {
    let secs = took.as_secs_f64();
    HOLD_BOUNDS_SECS.iter().position(|&b| secs <= b).unwrap_or(HOLD_BOUNDS_SECS.len())
}

/// A hold in progress; counted as ended when dropped.
pub(crate) struct Hold<'a> {
    stats: &'a HoldStats,
    started: Instant,
    timed_out: bool,
}

impl Hold<'_> {
    /// The origin did not answer within `hold_timeout`.
    pub(crate) fn timed_out(&mut self) {
        self.timed_out = true;
    }
}

impl Drop for Hold<'_> {
    fn drop(&mut self) {
        self.stats.end(self.started.elapsed(), self.timed_out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hold_is_in_progress_until_dropped_then_timed_and_counted() {
        let s = HoldStats::default();
        let mut h = s.start();
        let h2 = s.start();
        assert_eq!(s.in_progress.load(Ordering::Relaxed), 2);
        h.timed_out();
        drop(h);
        drop(h2);
        assert_eq!(s.in_progress.load(Ordering::Relaxed), 0);
        assert_eq!((s.count.get(), s.timeouts.get()), (2, 1));
        assert_eq!(s.buckets().iter().map(|b| b.1).sum::<u64>(), 2);
    }

    #[test]
    fn durations_fall_in_the_bucket_of_their_upper_bound() {
        assert_eq!(bucket(Duration::from_millis(10)), 0);
        assert_eq!(bucket(Duration::from_millis(50)), 0);
        assert_eq!(bucket(Duration::from_millis(51)), 1);
        assert_eq!(bucket(Duration::from_millis(1500)), 5);
        assert_eq!(bucket(Duration::from_secs(60)), HOLD_BOUNDS_SECS.len());
    }
}
