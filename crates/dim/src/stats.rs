//! Samples, the rates of one measuring window, and how two windows compare.

/// Cumulative counters of one queue and direction at one moment.
///
/// Counters are 64-bit and only ever grow while the queue lives; a counter that goes
/// down means the queue (or driver) was reset, and the instance starts a new window
/// instead of computing a huge or negative delta.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sample {
    /// Monotonic time in microseconds.
    pub time_usecs: u64,
    pub packets: u64,
    pub bytes: u64,
    /// Hardware interrupts (or completion events) of this queue.
    pub events: u64,
}

impl Sample {
    /// True if any counter or the clock is below the one in `earlier`.
    pub fn went_back_from(&self, earlier: &Sample) -> bool {
        self.time_usecs < earlier.time_usecs
            || self.packets < earlier.packets
            || self.bytes < earlier.bytes
            || self.events < earlier.events
    }
}

/// Rates over one window, each rounded up so that any traffic at all is non-zero.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WindowStats {
    pub packets_per_ms: u64,
    pub bytes_per_ms: u64,
    /// Interrupts per millisecond. Drivers compute it from the fixed window size
    /// (64) rather than the count, which is the same thing when every window closes
    /// at exactly 64 events; a user-space controller samples on a timer, its windows
    /// overshoot by any amount, and only the real count measures the rate.
    pub events_per_ms: u64,
}

/// Per-millisecond rate of `count` over `usecs`, rounded up, saturating at `u64::MAX`.
fn per_ms(count: u64, usecs: u64) -> u64 {
    let scaled = u128::from(count) * 1000;
    let usecs = u128::from(usecs);
    u64::try_from(scaled.div_ceil(usecs)).unwrap_or(u64::MAX)
}

impl WindowStats {
    /// Rates between two samples; `None` when no time passed (no decision can be
    /// taken on an empty interval) or the counters went back.
    pub fn between(start: &Sample, end: &Sample) -> Option<WindowStats> {
        if end.went_back_from(start) {
            return None;
        }
        let usecs = end.time_usecs - start.time_usecs;
        if usecs == 0 {
            return None;
        }
        Some(WindowStats {
            packets_per_ms: per_ms(end.packets - start.packets, usecs),
            bytes_per_ms: per_ms(end.bytes - start.bytes, usecs),
            events_per_ms: per_ms(end.events - start.events, usecs),
        })
    }
}

/// How the current window compares with the previous one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Better,
    Same,
    Worse,
}

/// A change counts when the reference is non-zero and the difference is more than
/// 10 % of it (integer percent, as drivers compute it).
fn changed_significantly(now: u64, reference: u64) -> bool {
    if reference == 0 {
        return false;
    }
    let diff = u128::from(now.abs_diff(reference));
    diff * 100 / u128::from(reference) > 10
}

/// Compares `now` with `before`: more bytes is better, then more packets, then
/// fewer interrupts for the same traffic. The first rule that applies decides.
pub fn compare(now: &WindowStats, before: &WindowStats) -> Verdict {
    let more_is_better = |now: u64, before: u64| if now > before { Verdict::Better } else { Verdict::Worse };
    if before.bytes_per_ms == 0 {
        return if now.bytes_per_ms > 0 { Verdict::Better } else { Verdict::Same };
    }
    if changed_significantly(now.bytes_per_ms, before.bytes_per_ms) {
        return more_is_better(now.bytes_per_ms, before.bytes_per_ms);
    }
    if before.packets_per_ms == 0 {
        return if now.packets_per_ms > 0 { Verdict::Better } else { Verdict::Same };
    }
    if changed_significantly(now.packets_per_ms, before.packets_per_ms) {
        return more_is_better(now.packets_per_ms, before.packets_per_ms);
    }
    if before.events_per_ms == 0 {
        return Verdict::Same;
    }
    if changed_significantly(now.events_per_ms, before.events_per_ms) {
        return if now.events_per_ms < before.events_per_ms { Verdict::Better } else { Verdict::Worse };
    }
    Verdict::Same
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(packets: u64, bytes: u64, events: u64) -> WindowStats {
        WindowStats { packets_per_ms: packets, bytes_per_ms: bytes, events_per_ms: events }
    }

    #[test]
    fn rates_round_up_and_need_time() {
        let a = Sample { time_usecs: 1000, packets: 0, bytes: 0, events: 0 };
        let b = Sample { time_usecs: 4000, packets: 1, bytes: 1500, events: 64 };
        let s = WindowStats::between(&a, &b).unwrap();
        assert_eq!(s, stats(1, 500, 22)); // 1/3 -> 1, 1500/3 = 500, 64/3 -> 22
        assert_eq!(WindowStats::between(&a, &Sample { time_usecs: 1000, ..b }), None);
        assert_eq!(WindowStats::between(&b, &a), None);
    }

    #[test]
    fn huge_counters_saturate_instead_of_overflowing() {
        let a = Sample::default();
        let b = Sample { time_usecs: 1, packets: u64::MAX, bytes: u64::MAX, events: u64::MAX };
        let s = WindowStats::between(&a, &b).unwrap();
        assert_eq!(s, stats(u64::MAX, u64::MAX, u64::MAX));
    }

    #[test]
    fn comparison_order_is_bytes_packets_events() {
        let base = stats(100, 100_000, 50);
        // 10 % exactly is not significant, 11 % is.
        assert_eq!(compare(&stats(100, 110_000, 50), &base), Verdict::Same);
        assert_eq!(compare(&stats(100, 111_000, 50), &base), Verdict::Better);
        assert_eq!(compare(&stats(100, 89_000, 50), &base), Verdict::Worse);
        // Bytes decide before packets even when packets move the other way.
        assert_eq!(compare(&stats(10, 120_000, 50), &base), Verdict::Better);
        // Same bytes: packets decide.
        assert_eq!(compare(&stats(120, 100_000, 50), &base), Verdict::Better);
        assert_eq!(compare(&stats(80, 100_000, 50), &base), Verdict::Worse);
        // Same traffic: fewer interrupts is better.
        assert_eq!(compare(&stats(100, 100_000, 40), &base), Verdict::Better);
        assert_eq!(compare(&stats(100, 100_000, 60), &base), Verdict::Worse);
        assert_eq!(compare(&stats(100, 100_000, 55), &base), Verdict::Same);
    }

    #[test]
    fn zero_references() {
        assert_eq!(compare(&stats(1, 1, 1), &stats(0, 0, 0)), Verdict::Better);
        assert_eq!(compare(&stats(0, 0, 1), &stats(0, 0, 0)), Verdict::Same);
        assert_eq!(compare(&stats(5, 100, 1), &stats(0, 100, 9)), Verdict::Better);
        assert_eq!(compare(&stats(0, 100, 1), &stats(0, 100, 9)), Verdict::Same);
        assert_eq!(compare(&stats(5, 100, 1), &stats(5, 100, 0)), Verdict::Same);
    }
}
