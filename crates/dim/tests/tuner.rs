//! Behaviour of a tuner against synthetic queues, and the "never out of range, never
//! panics" property for arbitrary sample sequences.

use linerate_dim::{Direction, Profile, ProfileTable, Sample, TimerMode, TuneState, Tuner, TunerConfig};
use proptest::prelude::*;

fn rx_table() -> ProfileTable {
    ProfileTable::default_for(Direction::Rx, TimerMode::FromFirstEvent)
}

/// A queue whose rates depend on the programmed profile, fed in windows of a fixed
/// number of interrupts.
struct FakeQueue {
    now: Sample,
}

impl FakeQueue {
    fn new() -> FakeQueue {
        FakeQueue { now: Sample { time_usecs: 1_000_000, packets: 0, bytes: 0, events: 0 } }
    }

    /// Advances by `usecs`, adding the given totals, and returns the sample.
    fn advance(&mut self, usecs: u64, packets: u64, bytes: u64, events: u64) -> Sample {
        self.now.time_usecs += usecs;
        self.now.packets += packets;
        self.now.bytes += bytes;
        self.now.events += events;
        self.now
    }
}

/// Runs `windows` windows of 100 interrupts each. `rates(profile)` gives packets/s,
/// bytes/s and interrupts/s under a profile. Returns the index after each window.
fn run(tuner: &mut Tuner, q: &mut FakeQueue, windows: usize, rates: impl Fn(Profile) -> (f64, f64, f64)) -> Vec<usize> {
    let mut trace = Vec::new();
    for _ in 0..windows {
        let (pps, bps, ips) = rates(tuner.profile());
        let usecs = (100.0 / ips * 1e6) as u64;
        let secs = usecs as f64 / 1e6;
        let s = q.advance(usecs, (pps * secs) as u64, (bps * secs) as u64, 100);
        if tuner.feed(s).is_some() {
            tuner.applied();
            // The next sample opens the window under the new profile.
            tuner.feed(q.advance(1, 0, 0, 0));
        }
        trace.push(tuner.index());
    }
    trace
}

/// Bulk: the link delivers `pps` whatever the profile, so only the interrupt rate
/// changes: one interrupt per timer period or per frame cap, whichever comes first.
fn bulk(pps: f64) -> impl Fn(Profile) -> (f64, f64, f64) {
    move |p: Profile| {
        let per_timer = 1e6 / f64::from(p.usecs.max(1));
        let per_cap = pps / f64::from(p.max_frames);
        (pps, pps * 1500.0, per_timer.min(pps).max(per_cap))
    }
}

/// Request/response ping-pong: each transaction waits for the timer, so the
/// transaction rate falls as the timer grows; one interrupt per request.
fn ping_pong(base_rtt_usecs: f64) -> impl Fn(Profile) -> (f64, f64, f64) {
    move |p: Profile| {
        let tps = 1e6 / (base_rtt_usecs + f64::from(p.usecs));
        (tps, tps * 100.0, tps)
    }
}

#[test]
fn bulk_load_moves_right_and_parks() {
    let mut t = Tuner::new(rx_table(), TunerConfig::default());
    let mut q = FakeQueue::new();
    let trace = run(&mut t, &mut q, 60, bulk(800_000.0));
    assert_eq!(*trace.last().unwrap(), 4, "{trace:?}");
    assert_eq!(t.state(), TuneState::ParkedOnTop);
    // Parked: the last twenty windows did not move.
    assert!(trace[40..].iter().all(|&i| i == 4), "{trace:?}");
}

#[test]
fn ping_pong_moves_left_from_the_bulk_end_and_parks() {
    let mut t = Tuner::starting_at(rx_table(), TunerConfig::default(), 4);
    let mut q = FakeQueue::new();
    let trace = run(&mut t, &mut q, 60, ping_pong(20.0));
    assert_eq!(*trace.last().unwrap(), 0, "{trace:?}");
    assert!(trace[40..].iter().all(|&i| i == 0), "{trace:?}");
    assert_eq!(t.state(), TuneState::ParkedOnTop);
}

#[test]
fn rr_then_bulk_then_rr_follows_the_traffic() {
    let mut t = Tuner::new(rx_table(), TunerConfig::default());
    let mut q = FakeQueue::new();
    let rr = run(&mut t, &mut q, 40, ping_pong(20.0));
    assert_eq!(*rr.last().unwrap(), 0, "{rr:?}");
    let bulk_trace = run(&mut t, &mut q, 60, bulk(800_000.0));
    assert_eq!(*bulk_trace.last().unwrap(), 4, "{bulk_trace:?}");
    let back = run(&mut t, &mut q, 80, ping_pong(20.0));
    assert!(*back.last().unwrap() <= 1, "{back:?}");
}

#[test]
fn steady_traffic_parks_wherever_it_starts() {
    for start in 0..5 {
        let mut t = Tuner::starting_at(rx_table(), TunerConfig::default(), start);
        let mut q = FakeQueue::new();
        // The same rates whatever the profile: nothing to gain by moving.
        let trace = run(&mut t, &mut q, 40, |_| (100_000.0, 1.5e8, 20_000.0));
        assert!(trace[3..].windows(2).all(|w| w[0] == w[1]), "start {start}: {trace:?}");
        assert_eq!(t.state(), TuneState::ParkedOnTop);
    }
}

#[test]
fn driver_rules_bounce_under_unreactive_traffic_then_rest_tired() {
    let mut t = Tuner::new(rx_table(), TunerConfig::DRIVER);
    let mut q = FakeQueue::new();
    let trace = run(&mut t, &mut q, 40, |_| (100_000.0, 1.5e8, 20_000.0));
    let moves = trace.windows(2).filter(|w| w[0] != w[1]).count();
    // Ten steps, ten windows of rest, ten steps...: about half the windows move,
    // and never more than the tired limit in a row.
    assert!((10..=25).contains(&moves), "{moves} moves: {trace:?}");
    assert!(trace.windows(10).any(|w| w.iter().all(|&i| i == w[0])), "never rested: {trace:?}");
}

#[test]
fn a_counter_going_down_starts_a_new_window_instead_of_deciding() {
    let mut t = Tuner::starting_at(rx_table(), TunerConfig::default(), 2);
    let s0 = Sample { time_usecs: 100, packets: 1_000_000, bytes: 1_000_000_000, events: 10_000 };
    assert_eq!(t.feed(s0), None);
    // Queue reset: every counter restarts near zero. Without the reset rule this
    // window would look like 2^64 packets.
    let reset = Sample { time_usecs: 200, packets: 5, bytes: 500, events: 70 };
    assert_eq!(t.feed(reset), None);
    assert_eq!(t.index(), 2);
    // The next window is measured from the reset sample: 64 events, same rates as
    // "nothing before", which compares as better than the zero previous stats.
    let next = Sample { time_usecs: 1200, packets: 1005, bytes: 1_500_500, events: 134 };
    assert!(t.feed(next).is_some());
    assert_eq!(t.index(), 1, "left from a non-zero index when leaving parking");
}

#[test]
fn samples_are_ignored_while_applying() {
    let mut t = Tuner::new(rx_table(), TunerConfig::default());
    t.feed(Sample { time_usecs: 0, packets: 0, bytes: 0, events: 0 });
    let p = t.feed(Sample { time_usecs: 1000, packets: 100, bytes: 150_000, events: 64 });
    assert_eq!(p, Some(Profile::new(8, 256)));
    assert!(t.is_applying());
    for i in 0..10 {
        assert_eq!(t.feed(Sample { time_usecs: 2000 + i, packets: 10_000, bytes: 1 << 30, events: 1000 }), None);
    }
    t.applied();
    assert!(!t.is_applying());
}

#[test]
fn a_failed_apply_returns_to_the_previous_profile() {
    let mut t = Tuner::new(rx_table(), TunerConfig::default());
    t.feed(Sample::default());
    assert!(t.feed(Sample { time_usecs: 1000, packets: 100, bytes: 150_000, events: 64 }).is_some());
    t.apply_failed();
    assert_eq!(t.index(), 0);
    assert_eq!(t.state(), TuneState::ParkedOnTop);
    assert!(!t.is_applying());
}

#[test]
fn idle_decays_one_step_per_idle_period_down_to_zero() {
    let config = TunerConfig { idle_decay_usecs: Some(500_000), ..TunerConfig::default() };
    let mut t = Tuner::starting_at(rx_table(), config, 4);
    let mut now = Sample { time_usecs: 10, packets: 7, bytes: 700, events: 3 };
    t.feed(now);
    let mut seen = Vec::new();
    for _ in 0..40 {
        now.time_usecs += 100_000; // a poll every 100 ms, one stray interrupt each
        now.events += 1;
        if let Some(p) = t.feed(now) {
            seen.push(p.usecs);
            t.applied();
        }
    }
    assert_eq!(seen, vec![128, 64, 8, 1]);
    assert_eq!(t.index(), 0);
}

#[test]
fn without_idle_decay_an_idle_queue_keeps_its_profile() {
    let config = TunerConfig { idle_decay_usecs: None, ..TunerConfig::default() };
    let mut t = Tuner::starting_at(rx_table(), config, 4);
    for i in 0..100 {
        assert_eq!(t.feed(Sample { time_usecs: i * 1_000_000, ..Sample::default() }), None);
    }
    assert_eq!(t.index(), 4);
}

#[test]
fn endless_worsening_gets_tired_and_holds() {
    // Every window is worse than the last (traffic keeps shrinking), so every step
    // turns around; after 2 x len steps without finding a top the tuner parks tired
    // and then holds for that many windows whatever the traffic does.
    let mut t = Tuner::new(rx_table(), TunerConfig::default());
    let mut now = Sample::default();
    t.feed(now);
    let mut bytes_per_window = 1u64 << 50;
    let mut trace = Vec::new();
    for _ in 0..40 {
        now.time_usecs += 1000;
        now.events += 64;
        now.packets += bytes_per_window / 1000;
        now.bytes += bytes_per_window;
        bytes_per_window = bytes_per_window * 4 / 5;
        if t.feed(now).is_some() {
            t.applied();
            now.time_usecs += 1;
            t.feed(now);
        }
        trace.push((t.index(), t.state()));
    }
    let first_tired = trace.iter().position(|&(_, s)| s == TuneState::ParkedTired).expect("never got tired");
    let held = &trace[first_tired..first_tired + 10];
    assert!(held.iter().all(|&(i, _)| i == held[0].0), "{trace:?}");
}

fn any_table() -> impl Strategy<Value = ProfileTable> {
    prop::collection::vec((0u32..1000, 0u32..512), 1..=ProfileTable::MAX_LEN)
        .prop_map(|v| ProfileTable::new(v.into_iter().map(|(u, f)| Profile::new(u, f)).collect()).unwrap())
}

#[derive(Clone, Debug)]
enum Op {
    Feed(Sample),
    /// Moves forward from the last sample by these deltas (realistic sequences).
    Advance(u64, u64, u64, u64),
    Applied,
    Failed,
}

fn any_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (any::<u64>(), any::<u64>(), any::<u64>(), any::<u64>()).prop_map(|(t, p, b, e)| Op::Feed(Sample {
            time_usecs: t,
            packets: p,
            bytes: b,
            events: e
        })),
        (0u64..2_000_000, 0u64..100_000, 0u64..200_000_000, 0u64..200).prop_map(|(t, p, b, e)| Op::Advance(t, p, b, e)),
        (any::<u64>(), any::<u64>(), any::<u64>(), any::<u64>()).prop_map(|(t, p, b, e)| Op::Advance(t, p, b, e)),
        Just(Op::Applied),
        Just(Op::Failed),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn no_sequence_panics_or_leaves_the_table(
        table in any_table(),
        start in 0usize..20,
        events_per_window in 0u64..130,
        idle in prop::option::of(0u64..3_000_000),
        park in any::<bool>(),
        ops in prop::collection::vec(any_op(), 0..300),
    ) {
        let len = table.len();
        let config = TunerConfig { events_per_window, idle_decay_usecs: idle, park_when_unchanged: park };
        let mut t = Tuner::starting_at(table.clone(), config, start);
        let mut last = Sample::default();
        for op in ops {
            match op {
                Op::Feed(s) => { last = s; if let Some(p) = t.feed(s) { prop_assert!(table.profiles().contains(&p)); } }
                Op::Advance(dt, dp, db, de) => {
                    last = Sample {
                        time_usecs: last.time_usecs.wrapping_add(dt),
                        packets: last.packets.wrapping_add(dp),
                        bytes: last.bytes.wrapping_add(db),
                        events: last.events.wrapping_add(de),
                    };
                    if let Some(p) = t.feed(last) { prop_assert_eq!(p, t.profile()); }
                }
                Op::Applied => t.applied(),
                Op::Failed => t.apply_failed(),
            }
            prop_assert!(t.index() < len);
        }
    }
}
