//! One receive queue on one CPU: a ring, an interrupt-coalescing timer and frame
//! cap, NAPI polling with a budget, and a coalescing policy (a fixed profile or a
//! DIM tuner fed at the end of every poll, as drivers do, or on a slower tick, as a
//! user-space controller does).

use std::collections::VecDeque;

use hdrhistogram::Histogram;
use linerate_dim::{Profile, Sample, Tuner};

use super::traffic::{Packet, Traffic};

/// CPU cost model of the receive path.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Costs {
    /// Hard interrupt, softirq raise and NAPI schedule, cache misses included.
    pub irq_ns: u64,
    /// Driver, GRO and protocol work per packet.
    pub packet_ns: u64,
    /// One NAPI poll call (budget bookkeeping, re-arming).
    pub poll_ns: u64,
    /// Programming a new profile into the NIC.
    pub apply_ns: u64,
}

impl Default for Costs {
    fn default() -> Costs {
        Costs { irq_ns: 3_000, packet_ns: 400, poll_ns: 200, apply_ns: 20_000 }
    }
}

/// NAPI budget: packets one poll may take before it yields and polls again.
const NAPI_BUDGET: usize = 64;

/// How the queue's coalescing is chosen.
pub(crate) enum Coalescing {
    Static(Profile),
    /// `sample_every_ns == 0`: a sample after every poll (in-driver DIM);
    /// otherwise at most one sample per period (a user-space controller).
    Adaptive {
        tuner: Box<Tuner>,
        sample_every_ns: u64,
    },
}

impl Coalescing {
    fn profile(&self) -> Profile {
        match self {
            Coalescing::Static(p) => *p,
            Coalescing::Adaptive { tuner, .. } => tuner.profile(),
        }
    }
}

/// What one run measured.
pub(crate) struct Outcome {
    pub duration_ns: u64,
    pub packets: u64,
    pub bytes: u64,
    pub interrupts: u64,
    pub busy_ns: u64,
    pub profile_changes: u64,
    /// Receive latency of every packet: arrival in the ring to delivery to the socket.
    pub rx_latency_ns: Histogram<u64>,
    /// Ping-pong transaction times as the client sees them.
    pub transaction_ns: Histogram<u64>,
    /// (time, profile index) after every change, starting with the initial index.
    pub profile_trace: Vec<(u64, usize)>,
}

impl Outcome {
    pub(crate) fn cpu_ns_per_packet(&self) -> f64 {
        self.busy_ns as f64 / self.packets.max(1) as f64
    }

    pub(crate) fn cpu_share(&self) -> f64 {
        self.busy_ns as f64 / self.duration_ns.max(1) as f64
    }

    pub(crate) fn transactions_per_sec(&self) -> f64 {
        self.transaction_ns.len() as f64 / (self.duration_ns as f64 / 1e9)
    }
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 100_000_000_000, 3).expect("static histogram bounds are valid")
}

struct Queue<'a> {
    traffic: &'a mut Traffic,
    costs: Costs,
    coalescing: Coalescing,
    ring: VecDeque<Packet>,
    timer_ns: Option<u64>,
    cpu_free_ns: u64,
    next_sample_ns: u64,
    out: Outcome,
}

/// Runs the queue until `duration_ns` of simulated time.
pub(crate) fn simulate(traffic: &mut Traffic, costs: Costs, coalescing: Coalescing, duration_ns: u64) -> Outcome {
    let initial = match &coalescing {
        Coalescing::Static(_) => 0,
        Coalescing::Adaptive { tuner, .. } => tuner.index(),
    };
    let mut q = Queue {
        traffic,
        costs,
        coalescing,
        ring: VecDeque::new(),
        timer_ns: None,
        cpu_free_ns: 0,
        next_sample_ns: 0,
        out: Outcome {
            duration_ns,
            packets: 0,
            bytes: 0,
            interrupts: 0,
            busy_ns: 0,
            profile_changes: 0,
            rx_latency_ns: histogram(),
            transaction_ns: histogram(),
            profile_trace: vec![(0, initial)],
        },
    };
    q.run(duration_ns);
    q.out
}

impl Queue<'_> {
    fn run(&mut self, end_ns: u64) {
        loop {
            let arrival = self.traffic.peek_ns();
            match (self.timer_ns, arrival) {
                (Some(t), a) if a.is_none_or(|a| t <= a) => {
                    if t >= end_ns {
                        return;
                    }
                    self.interrupt(t);
                }
                (_, Some(a)) => {
                    if a >= end_ns {
                        return;
                    }
                    let packet = self.traffic.pop().expect("peeked an arrival");
                    self.ring.push_back(packet);
                    self.arm(a);
                }
                (None, None) => return,
                (Some(_), None) => unreachable!("covered by the first arm"),
            }
        }
    }

    /// Interrupts are enabled and packets wait: start the timer if it is not
    /// running (it starts with the first packet of a batch), or make it due now when
    /// the frame cap is reached or there is no timer at all. The main loop fires it,
    /// so an overloaded queue never recurses.
    fn arm(&mut self, now_ns: u64) {
        if self.ring.is_empty() {
            return;
        }
        let p = self.coalescing.profile();
        if p.usecs == 0 || self.ring.len() >= p.max_frames.max(1) as usize {
            self.timer_ns = Some(now_ns);
        } else if self.timer_ns.is_none() {
            self.timer_ns = Some(now_ns + u64::from(p.usecs) * 1000);
        }
    }

    fn pull_arrivals(&mut self, up_to_ns: u64) {
        while self.traffic.peek_ns().is_some_and(|t| t <= up_to_ns) {
            let p = self.traffic.pop().expect("peeked an arrival");
            self.ring.push_back(p);
        }
    }

    fn interrupt(&mut self, at_ns: u64) {
        self.timer_ns = None;
        self.out.interrupts += 1;
        let start = at_ns.max(self.cpu_free_ns);
        let mut now = start + self.costs.irq_ns;
        // NAPI: poll with a budget; a full budget means more work, poll again
        // without a new interrupt; less than the budget re-enables interrupts.
        loop {
            self.pull_arrivals(now);
            let take = self.ring.len().min(NAPI_BUDGET);
            for _ in 0..take {
                let p = self.ring.pop_front().expect("ring holds `take` packets");
                now += self.costs.packet_ns;
                self.deliver(&p, now);
            }
            now += self.costs.poll_ns;
            if take < NAPI_BUDGET {
                break;
            }
        }
        now = self.sample(now);
        self.out.busy_ns += now - start;
        self.cpu_free_ns = now;
        // Packets that came in while we were busy start the timer now.
        self.pull_arrivals(now);
        self.arm(now);
    }

    fn deliver(&mut self, p: &Packet, at_ns: u64) {
        self.out.packets += 1;
        self.out.bytes += u64::from(p.bytes);
        let _ = self.out.rx_latency_ns.record((at_ns - p.arrival_ns).max(1));
        if let Some(t) = self.traffic.delivered(p, at_ns) {
            let _ = self.out.transaction_ns.record(t.max(1));
        }
    }

    /// Feeds the tuner at the end of a poll; applies a new profile at once (the CPU
    /// pays for the write). Returns the time after any apply.
    fn sample(&mut self, now_ns: u64) -> u64 {
        let Coalescing::Adaptive { tuner, sample_every_ns } = &mut self.coalescing else {
            return now_ns;
        };
        if now_ns < self.next_sample_ns {
            return now_ns;
        }
        self.next_sample_ns = now_ns + *sample_every_ns;
        let sample = Sample {
            time_usecs: now_ns / 1000,
            packets: self.out.packets,
            bytes: self.out.bytes,
            events: self.out.interrupts,
        };
        if tuner.feed(sample).is_none() {
            return now_ns;
        }
        tuner.applied();
        self.out.profile_changes += 1;
        self.out.profile_trace.push((now_ns, tuner.index()));
        now_ns + self.costs.apply_ns
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::traffic::{Flow, TrafficModel};

    fn ping_pong(profile: Profile) -> Outcome {
        let mut t = Traffic::new(TrafficModel::default(), 3);
        t.add(Flow::PingPong, 0, u64::MAX);
        simulate(&mut t, Costs::default(), Coalescing::Static(profile), 100_000_000)
    }

    #[test]
    fn a_lone_request_waits_for_the_timer() {
        let fast = ping_pong(Profile::new(1, 256));
        let slow = ping_pong(Profile::new(64, 256));
        // One packet per interrupt either way; the timer adds to every request.
        assert_eq!(fast.packets, fast.interrupts);
        let (f, s) = (fast.rx_latency_ns.value_at_quantile(0.5), slow.rx_latency_ns.value_at_quantile(0.5));
        assert!((4_000..5_000).contains(&f), "1 us timer: {f} ns");
        assert!((67_000..68_000).contains(&s), "64 us timer: {s} ns");
        assert!(fast.transactions_per_sec() > 1.8 * slow.transactions_per_sec());
    }

    #[test]
    fn the_frame_cap_fires_before_the_timer() {
        let mut t = Traffic::new(TrafficModel { bulk_max_train: 1, ..TrafficModel::default() }, 3);
        t.add(Flow::Bulk { packets_per_sec: 200_000.0 }, 0, u64::MAX);
        let out = simulate(&mut t, Costs::default(), Coalescing::Static(Profile::new(10_000, 8)), 100_000_000);
        // Eight wait for the cap; the poll also takes what arrived while the
        // interrupt was being entered. Had the 10 ms timer fired, it would be ~2000.
        let per_irq = out.packets as f64 / out.interrupts as f64;
        assert!((8.0..9.0).contains(&per_irq), "{per_irq} packets per interrupt");
    }

    #[test]
    fn cpu_accounts_for_interrupts_and_packets() {
        let out = ping_pong(Profile::new(1, 256));
        let c = Costs::default();
        let expected = out.interrupts * (c.irq_ns + c.poll_ns) + out.packets * c.packet_ns;
        assert_eq!(out.busy_ns, expected);
    }
}
